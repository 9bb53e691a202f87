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


# ------------------------------------------------------------------------------------------ --no-... switches
def _run_config(command: str, argv: list[str]) -> dict:
    """The flat settings a ``debias`` / ``sweep`` command line gives (``DebiasRun.to_dict``)."""
    from rbjax.commands.debias import config_from_args

    args = build_parser().parse_args([command, "--method", "hd", "--model", "m", "--out", "o", *argv,
                                      *(["--bias", "religion1"] if command == "debias" else ["--bias-type", "religion1"])])
    return config_from_args(args, **({"bias_type": "religion1"} if command == "sweep" else {})).to_dict()


@pytest.mark.parametrize("command", ["debias", "sweep"])
def test_no_switches_say_what_they_turn_off(command):
    """Every ``--no-...`` switch of debias and sweep: its help is "turn off: <the setting, described when on> (on by
    default)", and it turns exactly that setting off (the help once said the opposite of what the switch did)."""
    from rbjax.commands.options import negated_help
    from rbjax.core.config import leaves
    from rbjax.debias.config import DebiasRun

    (parser,) = [p for words, p in ALL if words == (command,)]
    switches = [a for a in parser._actions if any(o.startswith("--no-") for o in a.option_strings)]
    want = {"debias": {"--no-export", "--no-dropout", "--no-progress", "--no-eval", "--no-lmp"},
            "sweep": {"--no-dropout", "--no-progress", "--no-lmp"}}[command]
    assert {a.option_strings[0] for a in switches} == want
    setting_help = {leaf.name: leaf.help for leaf in leaves(DebiasRun)}
    default = _run_config(command, [])
    for a in switches:
        flag = a.option_strings[0]
        assert a.help == negated_help(setting_help[a.dest]) and a.help.startswith("turn off: "), flag
        assert default[a.dest] is True, flag  # on by default, as the help says
        changed = {k for k, v in _run_config(command, [flag]).items() if v != default[k]}
        assert changed == ({"export", "evaluate"} if flag == "--no-export" else {a.dest}), (flag, changed)
