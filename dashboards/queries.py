"""The PromQL of every panel of grafana_dspark.json, ready to run against a Prometheus (Grafana's variables
replaced by concrete values), e.g. to check each query parses and returns data:

    from dashboards.queries import panel_queries
    for title, promql in panel_queries():
        requests.get(f"{prometheus}/api/v1/query", params={"query": promql})
"""
from __future__ import annotations

import json
from pathlib import Path

DASHBOARD = Path(__file__).resolve().parent / "grafana_dspark.json"
# Grafana variables -> what a plain Prometheus query needs instead. Longest names first, so $__rate_interval is
# not read as $__rate... and $replica matches every replica.
DEFAULT_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$replica": ".*"}


def _panels(panels: list[dict]):
    for p in panels:
        yield p
        yield from _panels(p.get("panels", []))  # panels inside collapsed rows


def panel_queries(path: Path | str = DASHBOARD, variables: dict[str, str] | None = DEFAULT_VARIABLES
                  ) -> list[tuple[str, str]]:
    """[(panel title, promql), ...] in dashboard order, one entry per query (a panel may have several).
    `variables` None keeps the expressions exactly as in the JSON."""
    dashboard = json.loads(Path(path).read_text())
    out = []
    for panel in _panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in sorted((variables or {}).items(), key=lambda kv: -len(kv[0])):
                expr = expr.replace(name, value)
            out.append((panel["title"], expr))
    return out


if __name__ == "__main__":
    for title, promql in panel_queries():
        print(f"{title}: {promql}")
