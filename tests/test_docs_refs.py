"""The docs point at things that exist (`../shared/reference-*.md` was cited where the files are in
`../shared/docs/`, a script citing a test file that does not exist, a README count of slow tests that was wrong, one
option described three ways)."""
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


def test_readme_counts_the_slow_tests():
    n = sum(len(re.findall(r"^@pytest\.mark\.slow\b", f.read_text(encoding="utf-8"), re.M))
            for f in (ROOT / "tests").glob("test_*.py"))
    m = re.search(r"Tests marked `slow` \((\d+):", " ".join((ROOT / "README.md").read_text(encoding="utf-8").split()))
    assert m, "README.md: the sentence counting the slow tests is gone"
    assert int(m.group(1)) == n


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
