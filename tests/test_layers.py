"""The packages import one way: engine <- draft_service <- deployments, and autoscale beside deployments.

engine imports none of the others; draft_service imports engine only; autoscale never imports deployments. Every
import counts: top-level or inside a function, absolute or relative (resolved against the importing module).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "draft_service", "deployments", "autoscale")
FORBIDDEN = {
    "engine": {"draft_service", "deployments", "autoscale"},
    "draft_service": {"deployments", "autoscale"},
    "autoscale": {"deployments"},
}


def imported_modules(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file of `module`, relative ones resolved."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module
            # `from pkg import name` may name a submodule: count pkg.name too
            found += [(node.lineno, stem)] + [(node.lineno, f"{stem}.{alias.name}") for alias in node.names]
    return found


def layer_violations(root: Path = ROOT) -> list[str]:
    out = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            for line, name in imported_modules(path, module):
                if name.split(".")[0] in FORBIDDEN.get(package, ()):
                    out.append(f"{path.relative_to(root)}:{line} imports {name}")
    return sorted(set(out))


def test_packages_import_one_way():
    assert layer_violations() == []


def test_a_planted_import_is_caught_wherever_it_hides(tmp_path):
    files = {
        "engine/__init__.py": "",
        "engine/ok.py": "import torch\nfrom engine.model import DecoderLM\nfrom . import sampler\n",
        "engine/sub/__init__.py": "",
        "engine/sub/local.py": "def f():\n    from draft_service.service import DraftService\n",
        "draft_service/__init__.py": "from . import model\n",
        "draft_service/top.py": "import deployments.server\n",
        "deployments/__init__.py": "",
        "deployments/ok.py": "from draft_service.actor import DraftServiceProxy\nimport autoscale.policy\n",
        "autoscale/__init__.py": "",
        "autoscale/bad.py": "if True:\n    from deployments import config\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert layer_violations(tmp_path) == [
        "autoscale/bad.py:2 imports deployments",
        "autoscale/bad.py:2 imports deployments.config",
        "draft_service/top.py:1 imports deployments.server",
        "engine/sub/local.py:2 imports draft_service.service",
        "engine/sub/local.py:2 imports draft_service.service.DraftService",
    ]


def test_relative_imports_resolve_against_the_package():
    path = ROOT / "draft_service" / "model.py"
    names = {name for _, name in imported_modules(path, "draft_service.model")}
    assert "draft_service.config" in names  # `from .config import DSparkConfig`
