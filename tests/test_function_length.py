"""No function of the package is longer than :data:`MAX_LINES` lines unless its docstring says why: a long
function reads as the sequence of its named steps instead (docs/architecture.md, "Long functions")."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: the most lines a function (``def`` to its last line, docstring included) may have without a reason
MAX_LINES = 120
#: the words that give the reason, in the function's docstring
MARKER = "Long because:"

def long_functions(source: str, max_lines: int = MAX_LINES) -> list[tuple[str, int]]:
    """``[(qualified name, lines)]`` of the functions of ``source`` longer than ``max_lines`` whose docstring does not
    contain :data:`MARKER` (nested functions and methods included, named ``outer.inner``)."""
    found = []

    def walk(node, prefix: str) -> None:
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{ch.name}"
                if not isinstance(ch, ast.ClassDef):
                    n = ch.end_lineno - ch.lineno + 1
                    if n > max_lines and MARKER not in (ast.get_docstring(ch) or ""):
                        found.append((name, n))
                walk(ch, f"{name}.")
            else:
                walk(ch, prefix)

    walk(ast.parse(source), "")
    return found


def test_the_rule_finds_a_long_function_and_accepts_a_reason():
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES))
    short = "def f():\n    return 1\n"
    long_ = f"def g():\n{body}"
    reasoned = f'def h():\n    """One table.\n\n    {MARKER} one literal table, split it and it reads worse."""\n{body}'
    nested = f"class C:\n    def m(self):\n        def inner():\n{''.join('        ' + ln for ln in body.splitlines(True))}"
    assert long_functions(short) == []
    assert long_functions(long_) == [("g", MAX_LINES + 1)]
    assert long_functions(reasoned) == []
    assert [name for name, _ in long_functions(nested)] == ["C.m", "C.m.inner"]


def test_no_function_is_longer_than_the_limit_without_a_reason():
    found = []
    for path in sorted((ROOT / "rbjax").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        found += [f"{rel}::{name} ({n} lines)" for name, n in long_functions(path.read_text(encoding="utf-8"))]
    assert not found, (f"functions longer than {MAX_LINES} lines without {MARKER!r} in their docstring: split them "
                       "into named steps, or say why not:\n" + "\n".join(found))
