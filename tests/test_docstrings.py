"""Docstrings say what and why; measurements live in docs/benchmarks.md. No module, class or function docstring
under the four packages quotes a timing: a number followed by a time unit, a rate unit or an `x` of a speedup."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "draft_service", "deployments", "autoscale")

# A number that is not part of a name or of a longer number (timeout_s, v2s, 1.5 are not matched at "5").
_NUMBER = r"(?<![\w.])\d+(?:,\d{3})*(?:\.\d+)?"
_TIME = r"(?:ms|µs|us|ns|s|secs?|seconds?|minutes?|hours?)"
_RATE = r"(?:[A-Za-z]+ ?/ ?s(?:ec)?|[A-Za-z]+ per second)"  # tok/s, GB/s, GFLOP/s, req/s, tokens per second
TIMING = re.compile(
    _NUMBER + r"(?:"
    + r"[ -]?" + _TIME + r"(?![\w/])"  # 12 ms, 0.5s, a 30-second wait
    + r"|[ -]?" + _RATE + r"(?![\w/])"  # 30 tok/s, 27 GB/s
    + r"|[x×](?!\w)"  # 1.3x, 2×; not 0x1F, 4x4 or "64 x 110"
    + r")"
)


def docstrings(path: Path):
    """(line, name, docstring) of the module and of every class and function in it."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    for node in nodes:
        doc = ast.get_docstring(node, clean=False)
        if doc:
            yield getattr(node, "lineno", 1), getattr(node, "name", "<module>"), doc


def timings(text: str) -> list[str]:
    return [m.group() for m in TIMING.finditer(text)]


@pytest.mark.parametrize("text", [
    "a step takes 12 ms", "about 5 us of 6.5 us", "8 µs", "probed every 30 s", "0.5s", "a 30-second wait",
    "2-4 ms", "31 / 37 / 42 ms", "30 tok/s", "1,200 tokens/s", "27-35 GB/s", "3 GFLOP/s", "64 tokens per second",
    "1.2-1.4x faster", "2x within minutes", "0.83-0.91x `off`", "3 seconds", "(0.31x)",
])
def test_a_timing_is_found(text):
    assert timings(text), text


@pytest.mark.parametrize("text", [
    "timeout_s", "`target_tpot_s`", "128 tokens", "a [T, d] tensor", "0x1F", "4x4 tiles", "64 x 110 keys",
    "tiles of 8 rows x 32 columns", "HTTP 4xx/5xx", "the last 64 sequence-steps", "v2s", "requests_per_s sustained",
    "Ray 2.60 passes it", "Retry-After in whole seconds (RFC 9110)", "gamma + 1 tokens", "a one-minute grid",
    "sm_90 GPUs", "1.5 * 2^23", "within minutes", "x = 1.5",
])
def test_a_non_timing_is_not(text):
    assert not timings(text), (text, timings(text))


def test_no_docstring_quotes_a_timing():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, name, doc in docstrings(path):
                found += [f"{path.relative_to(ROOT)}:{line} {name}: {t!r}" for t in timings(doc)]
    assert not found, ("docstrings say what and why; move these measurements to docs/benchmarks.md, or name the "
                       "constant instead of quoting its value:\n" + "\n".join(found))
