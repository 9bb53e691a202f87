"""The docs point at things that exist (`../shared/reference-*.md` was cited where the files are in
`../shared/docs/`, a script citing a test file that does not exist, a README count of slow tests that was wrong, one
option described three ways), and the README's first screen holds the commands CI runs."""
import re
from pathlib import Path

from rbjax.cli import build_parser
from rbjax.lmb import SCORING_BATCH_HELP

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCES = DOCS + sorted((ROOT / "scripts").glob("*.py")) + sorted((ROOT / "rbjax").rglob("*.py"))


def test_cited_shared_paths_exist(shared_dir):
    missing = []
    for doc in DOCS:
        for m in re.finditer(r"\.\./shared/([A-Za-z0-9_./*-]+)", doc.read_text(encoding="utf-8")):
            rel = m.group(1).rstrip(".")
            if "*" in rel or "<" in rel:
                continue
            if not (shared_dir / rel).exists():
                missing.append(f"{doc.name}: ../shared/{rel}")
    assert not missing, missing


def test_cited_test_files_and_functions_exist():
    missing = []
    for src in SOURCES:
        for m in re.finditer(r"tests/(test_[a-z0-9_]+\.py)(?:::([A-Za-z0-9_]+))?", src.read_text(encoding="utf-8")):
            f = ROOT / "tests" / m.group(1)
            if not f.exists() or (m.group(2) and f"def {m.group(2)}(" not in f.read_text(encoding="utf-8")):
                missing.append(f"{src.relative_to(ROOT)}: {m.group(0)}")
    assert not missing, missing


def test_testing_doc_counts_the_slow_tests():
    n = sum(len(re.findall(r"^@pytest\.mark\.slow\b", f.read_text(encoding="utf-8"), re.M))
            for f in (ROOT / "tests").glob("test_*.py"))
    m = re.search(r"Tests marked `slow` \((\d+):",
                  " ".join((ROOT / "docs" / "testing.md").read_text(encoding="utf-8").split()))
    assert m, "docs/testing.md: the sentence counting the slow tests is gone"
    assert int(m.group(1)) == n


#: the lines of a first screen: a newcomer sees what rbjax is, how to install it, the main command and the tests
FIRST_SCREEN = 45


def test_readme_first_screen_holds_the_ci_commands_and_the_main_command():
    """`.ci/run` runs the README's install command and its test command: the very lines, on the README's first
    screen, with the main command (`rbjax measure` on DialoGPT-small) between them."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    ci = [ln for ln in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
          if ln.startswith(("python3 -m venv", ".venv/bin/python -m pytest"))]
    assert len(ci) == 2, ci
    main = "rbjax measure --model microsoft/DialoGPT-small --bias all --split test --out results/dialogpt-small"
    for line in (*ci, main):
        assert line in readme, f"README.md lacks the line {line!r}"
        assert readme.index(line) < FIRST_SCREEN, f"README.md: {line!r} is at line {readme.index(line) + 1}"
    # the test command CI runs is the README's first test command
    assert [ln for ln in readme if ln.startswith(".venv/bin/python -m pytest")][0] == ci[1]


def test_relative_links_resolve():
    """A section moved from the README into docs/ keeps working links (`[x](docs/y.md)` in the README,
    `[x](y.md)` between docs)."""
    broken = []
    for doc in DOCS:
        for m in re.finditer(r"\]\(([^)#\s]+\.(?:md|py|json|toml))(?:#[^)]*)?\)", doc.read_text(encoding="utf-8")):
            if not m.group(1).startswith("http") and not (doc.parent / m.group(1)).exists():
                broken.append(f"{doc.relative_to(ROOT)}: {m.group(1)}")
    assert not broken, broken


def test_scoring_batch_size_has_one_description():
    subs = {name: p for a in build_parser()._actions if hasattr(a, "choices") and isinstance(a.choices, dict)
            for name, p in a.choices.items()}
    helps = {}
    for cmd, opt in (("measure", "--batch-size"), ("splits", "--batch-size"), ("debias", "--eval-batch-size")):
        (act,) = [a for a in subs[cmd]._actions if opt in a.option_strings]
        helps[cmd] = act.help
        assert SCORING_BATCH_HELP in act.help, (cmd, act.help)
    lmb = " ".join((ROOT / "docs" / "lmb.md").read_text(encoding="utf-8").split())
    assert SCORING_BATCH_HELP.removeprefix("nominal phrases") in lmb.replace("`", "")


#: developers' notes that live outside the repository (the code explains itself and points into docs/ instead)
OUTSIDE_NOTES = re.compile(r"reference-(?:debias|data)\.md|ref-(?:debias|data) §|FAMILY_" + r"INTERFACE")
ISSUE_NUMBER = re.compile(r"\b[Ii]ssues?\s*#?\s*\d+")


def test_code_cites_no_outside_notes_and_no_issue_numbers():
    code = [f for d in ("rbjax", "tests", "benchmarks", "scripts") for f in sorted((ROOT / d).rglob("*"))
            if f.suffix in (".py", ".json", ".toml") and "__pycache__" not in f.parts]
    found = [f"{f.relative_to(ROOT)}:{i}: {line.strip()[:80]}" for f in code
             for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), start=1)
             if OUTSIDE_NOTES.search(line) or ISSUE_NUMBER.search(line)]
    assert not found, found
