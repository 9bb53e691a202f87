"""The package's layer contract (docs/architecture.md, pyproject.toml [tool.importlinter]) and the import rule.

import-linter reads every import statement of the package, those inside functions included, so a cycle hidden by a
function-local import breaks the contract as well.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_layers_point_down():
    pytest.importorskip("importlinter")
    code = ("import sys; from importlinter.cli import lint_imports; "
            f"sys.exit(lint_imports(config_filename={str(ROOT / 'pyproject.toml')!r}, no_cache=True, no_logo=True))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rbjax layers point down KEPT" in r.stdout, r.stdout
    assert "retrieval modules point down KEPT" in r.stdout, r.stdout  # no cycle inside rbjax.data.retrieval


#: function-local imports that stay: optional heavy dependencies only (never an rbjax module)
def _local_rbjax_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []

    def walk(node, in_func):
        for ch in ast.iter_child_nodes(node):
            inner = in_func or isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef))
            if in_func and isinstance(ch, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in ch.names] if isinstance(ch, ast.Import) else [ch.module or ""]
                if any(m == "rbjax" or m.startswith("rbjax.") for m in mods):
                    found.append(f"{path.relative_to(ROOT)}:{ch.lineno}: {ast.unparse(ch)}")
            walk(ch, inner)

    walk(tree, False)
    return found


def test_internal_imports_at_module_top():
    """Internal imports sit at the top of a module; the one exception is the `python -m rbjax.cli` shim, which must
    dispatch through the imported module (tests/test_cli_help.py)."""
    allowed = {"rbjax/cli.py"}
    found = [f for p in sorted((ROOT / "rbjax").rglob("*.py")) if str(p.relative_to(ROOT)) not in allowed
             for f in _local_rbjax_imports(p)]
    assert not found, "function-local rbjax imports:\n" + "\n".join(found)


def test_benchmarks_import_what_exists():
    """Every `from rbjax… import name` of benchmarks/ resolves: a module moved by a refactor breaks a benchmark only
    when someone runs it on a quiet machine, so it is checked here (importing, not running, the benchmarks)."""
    import importlib

    missing = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "rbjax"):
                continue
            try:
                module = importlib.import_module(node.module)
            except ImportError as e:
                missing.append(f"{path.name}:{node.lineno}: {node.module} ({e})")
                continue
            for alias in node.names:
                if not hasattr(module, alias.name):
                    try:
                        importlib.import_module(f"{node.module}.{alias.name}")
                    except ImportError:
                        missing.append(f"{path.name}:{node.lineno}: {node.module}.{alias.name}")
    assert not missing, "benchmarks import names that do not exist:\n" + "\n".join(missing)
