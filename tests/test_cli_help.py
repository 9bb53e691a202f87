"""`rbjax <command> --help` for every subcommand (and nested ones such as `annotate export`): every option is
explained, and no default is shown twice or as "(default: None)"."""
import argparse
import re

import pytest

from rbjax.cli import COMMANDS, build_parser


def _subcommands(parser: argparse.ArgumentParser, prefix=()):
    """``(words, parser)`` for every (nested) subcommand parser."""
    for act in parser._actions:
        if isinstance(act, argparse._SubParsersAction):
            for name, sub in act.choices.items():
                yield prefix + (name,), sub
                yield from _subcommands(sub, prefix + (name,))


ALL = [((), build_parser())] + list(_subcommands(build_parser()))


def test_every_subcommand_is_covered():
    top = {words[0] for words, _ in ALL if words}
    assert top == set(COMMANDS)
    assert ("annotate", "export") in {w for w, _ in ALL} and ("annotate", "import") in {w for w, _ in ALL}


@pytest.mark.parametrize("words,parser", ALL, ids=[" ".join(w) or "rbjax" for w, _ in ALL])
def test_help_explains_every_option_once(words, parser, capsys):
    for act in parser._actions:
        if isinstance(act, argparse._SubParsersAction):
            for choice in act._choices_actions:  # the listed subcommands need a line of help too
                assert choice.help, f"rbjax {' '.join(words)}: subcommand {choice.dest} has no help"
            continue
        assert act.help and act.help.strip(), f"rbjax {' '.join(words)} {act.option_strings or act.dest} has no help"
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([*words, "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert text.startswith(" ".join(["usage: rbjax", *words]))
    assert "(default: None)" not in text
    assert not re.search(r"default[^()]*\)\s*\(default:", text), text  # "(default: X) (default: X)"
    assert not re.search(r"\(default: [^)]*\)\s*\(default:", text), text


# ------------------------------------------------------------------------------------------ entry points
HOOK = '''
import sys, types
import rbjax.commands


def register(sub):
    p = sub.add_parser("plot", help="planted subcommand that raises rbjax.cli.CLIError")

    def run(args):
        from rbjax.cli import CLIError
        raise CLIError("planted: a problem the user can fix")

    p.set_defaults(func=run)


m = types.ModuleType("rbjax.commands.plot")
m.register = register
sys.modules["rbjax.commands.plot"] = m
'''


@pytest.mark.parametrize("module", ["rbjax", "rbjax.cli"])
def test_cli_error_of_a_subcommand_prints_cleanly(module, tmp_path):
    """`python -m rbjax.cli` runs cli.py as `__main__`, a second copy of the module: a subcommand's
    `rbjax.cli.CLIError` was not the class that copy's `main` caught, so the user saw a traceback."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "sitecustomize.py").write_text(HOOK, encoding="utf-8")  # replaces `rbjax plot` in the subprocess
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(tmp_path)])}
    r = subprocess.run([sys.executable, "-m", module, "plot"], cwd=root, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip() == "rbjax plot: error: planted: a problem the user can fix", r.stderr
    r = subprocess.run([sys.executable, "-m", module, "--version"], cwd=root, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("rbjax "), r.stderr
