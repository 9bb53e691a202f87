"""Every command's settings are one dataclass: the options of retrieve, splits, annotate, compare, plot and export are
generated from their settings class (the parsed defaults are the class's defaults, written values reach it), one
validation names the flag on the command line and the field in Python, the Python functions take the class or its
fields (an unknown keyword is a TypeError); the study's [study] section is a settings class checked by the same type
check; "given" means written on the command line (the one precedence rule)."""
from __future__ import annotations

import argparse
import dataclasses
import math

import pytest

from rbjax.cli import build_parser, main
from rbjax.commands.options import config_values, given_options, negated_help
from rbjax.commands.splits import SPLITS_OPTIONS
from rbjax.core.config import check_types, check_value, field, option_name, precedence
from rbjax.core.errors import SettingError
from rbjax.data.annotation import AnnotationExportConfig, AnnotationImportConfig, read_annotations
from rbjax.data.retrieval import RetrieveConfig, retrieve
from rbjax.data.splits import SplitsConfig, make_splits
from rbjax.lmb.compare import compare_runs
from rbjax.lmb.config import CompareConfig, MeasureConfig, PlotConfig
from rbjax.lmb.plot import figure_lmb
from rbjax.specs import load_spec
from rbjax.study.config import StudySettings, load_study
from rbjax.study.export import ExportConfig, export_model

#: (command words, required arguments, settings class, the fields that are options)
COMMANDS = [
    (["retrieve"], ["--bias", "religion1", "--dump", "d.zst", "--out", "o"], RetrieveConfig, None),
    (["splits"], ["--bias", "religion1", "--annotated", "a.csv", "--out-dir", "o", "--model", "m"], SplitsConfig,
     SPLITS_OPTIONS),
    (["annotate", "export"], ["--candidates", "c.csv", "--out-dir", "o"], AnnotationExportConfig, None),
    (["annotate", "import"], ["a.csv"], AnnotationImportConfig, None),
    (["compare"], ["A", "B", "--out", "o"], CompareConfig, None),
    (["plot"], ["F", "--out", "p.png"], PlotConfig, None),
    (["export"], ["RUN", "--out", "o"], ExportConfig, None),
]


def _subparser(words):
    p = build_parser()
    for w in words:
        (sub,) = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        p = sub.choices[w]
    return p


@pytest.mark.parametrize("words,required,cls,names", COMMANDS, ids=[" ".join(c[0]) for c in COMMANDS])
def test_options_are_the_settings_class(words, required, cls, names):
    """Each field (of ``names``) is an option spelt as the field says, with the field's help (a switch that turns a
    setting off: "turn off: <the setting's help>"); parsing only the required arguments gives the class's
    defaults."""
    fields = [f for f in dataclasses.fields(cls) if names is None or f.name in names]
    actions = {a.dest: a for a in _subparser(words)._actions}
    for f in fields:
        assert f.name in actions, f"{' '.join(words)}: no option for {cls.__name__}.{f.name}"
        assert actions[f.name].option_strings == [option_name(cls, f.name)]  # the spelling of before, no other
        want = negated_help(f.metadata["help"]) if f.metadata["negate"] else f.metadata["help"]
        assert actions[f.name].help == want  # a --no-... switch says what it turns off
    args = build_parser().parse_args([*words, *required])
    assert cls(**config_values(args, cls, names)) == cls()


@pytest.mark.parametrize("argv,cls,expected", [
    (["retrieve", "--bias", "religion1", "--dump", "d.zst", "--out", "o", "--subreddit", "a", "--subreddit", "b",
      "--clean", "reference", "--keep-duplicates", "--no-prefilter", "--attribute-in-window-only", "--start",
      "2020-01-01", "--window", "3"], RetrieveConfig,
     RetrieveConfig(subreddits=("a", "b"), clean_mode="reference", dedupe=False, prefilter=False,
                    require_attribute_in_window=True, start="2020-01-01", window=3)),
    (["splits", "--bias", "religion1", "--annotated", "a", "--out-dir", "o", "--model", "m", "--train-size", "0.5",
      "--unknown-labels", "skip", "--swap-mode", "reference", "--ddof", "1"], SplitsConfig,
     SplitsConfig(train_size=0.5, unknown="skip", swap_mode="reference", ddof=1)),
    (["annotate", "export", "--candidates", "c", "--out-dir", "o", "--annotators", "x", "y", "--sample", "10",
      "--overlap", "2"], AnnotationExportConfig, AnnotationExportConfig(annotators=("x", "y"), sample=10, overlap=2)),
    (["annotate", "import", "a.csv", "--unknown-labels", "skip"], AnnotationImportConfig,
     AnnotationImportConfig(unknown="skip")),
    (["compare", "A", "B", "--out", "o", "--labels", "debiased, base", "--alpha", "0.01", "--n-bootstrap", "0"],
     CompareConfig, CompareConfig(labels=("debiased", "base"), alpha=0.01, n_bootstrap=0)),
    (["plot", "F", "--out", "p.png", "--alpha", "0.1", "--title", "t", "--allow-mixed"], PlotConfig,
     PlotConfig(alpha=0.1, title="t", allow_mixed=True)),
    (["export", "RUN", "--out", "o", "--rule", "reference", "--license", "mit"], ExportConfig,
     ExportConfig(rule="reference", license="mit")),
])
def test_written_values_reach_the_settings(argv, cls, expected):
    args = build_parser().parse_args(argv)
    names = SPLITS_OPTIONS if cls is SplitsConfig else None
    assert cls(**config_values(args, cls, names)) == expected


@pytest.mark.parametrize("argv,cli_msg,cls,kw,api_msg", [
    (["retrieve", "--bias", "religion1", "--dump", "d.zst", "--out", "o", "--window", "0"],
     "--window must be at least 1, got 0", RetrieveConfig, {"window": 0}, "window must be at least 1, got 0"),
    (["splits", "--bias", "religion1", "--annotated", "a.csv", "--out-dir", "o", "--model", "m", "--train-size",
      "1.5"], "--train-size must be between 0 and 1, got 1.5", SplitsConfig, {"train_size": 1.5},
     "train_size must be between 0 and 1, got 1.5"),
    (["annotate", "export", "--candidates", "c.csv", "--out-dir", "o", "--sample", "0"],
     "--sample must be >= 1, got 0", AnnotationExportConfig, {"sample": 0}, "sample must be >= 1, got 0"),
    (["annotate", "export", "--candidates", "c.csv", "--out-dir", "o", "--annotators", "x", "x"],
     "--annotators must be distinct, non-empty names", AnnotationExportConfig, {"annotators": ["x", "x"]},
     "annotators must be distinct, non-empty names"),
    (["compare", "A", "B", "--out", "o", "--alpha", "2"], "--alpha must be between 0 and 1, got 2.0", CompareConfig,
     {"alpha": 2.0}, "alpha must be between 0 and 1, got 2.0"),
    (["compare", "A", "B", "--out", "o", "--labels", "A"], "--labels must be two names, LABEL_A,LABEL_B, got ('A',)",
     CompareConfig, {"labels": ("A",)}, "labels must be two names, LABEL_A,LABEL_B, got ('A',)"),
    (["compare", "A", "B", "--out", "o", "--n-bootstrap", "-1"], "--n-bootstrap must be >= 0, got -1", CompareConfig,
     {"n_bootstrap": -1}, "n_bootstrap must be >= 0, got -1"),
    (["plot", "F", "--out", "p.png", "--alpha", "0"], "--alpha must be between 0 and 1, got 0.0", PlotConfig,
     {"alpha": 0.0}, "alpha must be between 0 and 1, got 0.0"),
])
def test_one_validation_names_the_flag_on_the_cli_and_the_field_in_python(argv, cli_msg, cls, kw, api_msg, capsys,
                                                                           tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # (nothing may be written: the settings are refused first)
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"rbjax {argv[0]}: error: {cli_msg}"), err
    with pytest.raises(SettingError) as e:
        cls(**kw)
    assert str(e.value).startswith(api_msg) and e.value.field == next(iter(kw))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cls,kw,msg", [
    (RetrieveConfig, {"subreddits": "askreddit"}, "subreddits must be a list of strings, got 'askreddit'"),
    (RetrieveConfig, {"start": [2020]}, "start must be a string or an integer or a finite number, got [2020]"),
    (SplitsConfig, {"swap_direction": "up"}, "swap_direction must be one of None, t1_to_t2, t2_to_t1, both"),
    (AnnotationImportConfig, {"unknown": "drop"}, "unknown must be error or skip, got 'drop'"),
    (CompareConfig, {"seed": 1.5}, "seed must be an integer, got 1.5"),
    (PlotConfig, {"allow_mixed": "yes"}, "allow_mixed must be true or false, got 'yes'"),
    (ExportConfig, {"rule": "best"}, "rule must be default or reference, got 'best'"),
    (ExportConfig, {"license": 3}, "license must be a string, got 3"),
])
def test_python_values_are_checked_by_field(cls, kw, msg):
    with pytest.raises(SettingError, match="^" + msg.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
                       .replace("]", r"\]")):
        cls(**kw)


def test_python_functions_take_the_class_or_its_fields(tmp_path):
    """A list for a tuple field is stored as the tuple; a misspelt keyword is a TypeError, never ignored (before any
    file is read)."""
    assert RetrieveConfig(subreddits=["a", "b"]) == RetrieveConfig(subreddits=("a", "b"))
    assert RetrieveConfig(subreddits={"a"}).subreddits == ("a",)
    assert CompareConfig(labels=["x", "y"]).labels == ("x", "y")
    assert AnnotationExportConfig(annotators=["a", "b"]).annotators == ("a", "b")
    spec = load_spec("religion1")
    with pytest.raises(TypeError, match="unknown retrieval setting.*windw"):
        retrieve(spec, tmp_path / "none.zst", tmp_path / "o", windw=3)
    with pytest.raises(TypeError, match="unknown splits setting.*trainsize"):
        make_splits(tmp_path / "a.csv", spec, tmp_path / "o", lambda p: None, trainsize=0.5)
    with pytest.raises(TypeError, match="unknown annotation import setting.*unknown_labels"):
        read_annotations([tmp_path / "a.csv"], unknown_labels="skip")
    with pytest.raises(TypeError, match="unknown comparison setting.*n_boot"):
        compare_runs(tmp_path, tmp_path, n_boot=3)
    with pytest.raises(TypeError, match="unknown plot setting.*titel"):
        figure_lmb({}, titel="x")
    with pytest.raises(TypeError, match="unknown export setting.*licence"):
        export_model(tmp_path, tmp_path / "o", licence="mit")
    assert not (tmp_path / "o").exists()


def test_study_section_is_a_settings_class(tmp_path):
    """[study] is StudySettings: a bad value is named by the field in Python, by file, section and key in a study file,
    by the --set that gave it on the command line — one type check for all three."""
    with pytest.raises(SettingError, match=r"^seeds must be an integer or a list of integers, got 'x'$"):
        StudySettings(seeds="x")
    with pytest.raises(SettingError, match=r"^methods has unknown method\(s\) \['xyz'\]"):
        StudySettings(methods=["lmd", "xyz"])
    assert StudySettings(methods=["lmd"], seeds=[1, 2]) == StudySettings(methods=("lmd",), seeds=(1, 2))
    f = tmp_path / "s.toml"
    f.write_text('[study]\nmodel = "m"\nseeds = ["a"]\n', encoding="utf-8")
    with pytest.raises(ValueError) as e:
        load_study(f)
    assert str(e.value) == (f"{f.resolve()}: [study] seeds: study.seeds must be an integer or a list of integers, "
                            "got ['a']")
    f.write_text('[study]\nmodel = "m"\nrandom_model = 3\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"\[study\] random_model: study.random_model must be a table, got 3"):
        load_study(f)
    f.write_text('[study]\nmodel = "m"\n', encoding="utf-8")
    with pytest.raises(ValueError) as e:
        load_study(f, ["study.seeds=x"])
    assert str(e.value) == "--set 'study.seeds=x': study.seeds must be an integer or a list of integers, got 'x'"
    with pytest.raises(ValueError) as e:
        load_study(f, ["study.precision=fp16"])
    assert str(e.value) == "--set 'study.precision=fp16': study.precision must be one of fp32, bf16, got 'fp16'"
    cfg = load_study(f, ["study.seeds=[1, 2]", "study.methods=['cda']"])
    assert cfg.seeds == [1, 2] and cfg.methods == ["cda"] and cfg.settings.seeds == (1, 2)
    assert load_study(f).settings == StudySettings(model="m")


def test_check_value_types():
    assert check_value("x", int | None, None) is None
    assert check_value("x", tuple[int, ...], [1, 2]) == (1, 2)
    assert check_value("x", str | tuple[str, ...], "all") == "all"
    assert check_value("x", float, 3) == 3 and check_value("x", dict | None, {"a": 1}) == {"a": 1}
    for hint, v, words in ((int, True, "an integer"), (float, math.inf, "a finite number"),
                           (tuple[str, ...], ["a", 1], "a list of strings"),
                           (tuple[str, str], ["a"], "a list of 2 strings"),
                           (dict, [], "a table"), (bool | None, 0, "true or false")):
        with pytest.raises(SettingError, match=f"^x must be {words}, got "):
            check_value("x", hint, v)

    @dataclasses.dataclass(frozen=True)
    class S:
        names: tuple[str, ...] = field((), "names")

        def __post_init__(self):
            check_types(self)

    assert S(["a"]).names == ("a",) and S(["a"]) == S(("a",)) and hash(S(["a"])) == hash(S(("a",)))


def test_given_means_written():
    """The one precedence rule: a value written on the command line is given, also when it is the default; an option
    not written is not given, whatever its value."""
    args = build_parser().parse_args(["measure", "--stored-perplexities", "--n-std", "3.0", "--no-bos"])
    assert {"n_std", "bos"} <= given_options(args) and "split" not in given_options(args)
    assert config_values(args, MeasureConfig, ["n_std", "bos", "split"], given_only=True) == {"n_std": 3.0,
                                                                                            "bos": False}
    args = build_parser().parse_args(["sweep", "--method", "lmd", "--bias", "religion1", "--out", "o", "--lr", "5e-5",
                                      "--lambda-ds", "10,50,100"])
    assert {"learning_rate", "lambda_ds"} <= given_options(args) and "epochs" not in given_options(args)
    assert precedence({"lr": 1, "epochs": 2}, {"lr": 3, "epochs": 4}, {"lr": 1}) == {"lr": 1, "epochs": 4}
    assert precedence({"lr": 1, "epochs": 2}, {}, {}) == {"lr": 1, "epochs": 2}


# ------------------------------------------------------------------------------ options from settings, everywhere
def _options(parser, words=()):
    """``(command words, action)`` of every option and positional argument of ``rbjax`` and its subcommands."""
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from _options(sub, (*words, name))
        elif not isinstance(a, argparse._HelpAction):
            yield " ".join(words), a


def test_options_are_generated_not_hand_written():
    """At most 10 ``add_argument`` calls are written by hand in rbjax/commands (there were 98): every other option is
    a field of a settings dataclass (the shared blocks of rbjax.commands.settings, each command's own class)."""
    from pathlib import Path

    import rbjax.commands

    calls = {p.name: p.read_text(encoding="utf-8").count("add_argument(")
             for p in Path(rbjax.commands.__file__).parent.glob("*.py")}
    assert sum(calls.values()) <= 10, calls


#: the options of the shared blocks, and the commands that must have each
SHARED = {"--overwrite": {"measure", "pairs", "retrieve", "splits", "annotate export", "annotate import", "export",
                          "plot", "report", "evaluate", "debias", "sweep"},
          "--no-progress": {"measure", "retrieve", "run", "evaluate", "debias", "sweep"},
          "--dry-run": {"measure", "evaluate", "debias", "sweep", "run"},
          "--device-memory-gb": {"measure", "evaluate", "debias", "sweep", "run"},
          "--model": {"measure", "evaluate", "splits", "debias", "sweep"},
          "--tokenizer": {"measure", "evaluate", "splits", "debias", "sweep"},
          "--executor": {"retrieve", "sweep"}, "--jobs": {"retrieve", "sweep"}, "--ray-address": {"retrieve", "sweep"}}


def test_shared_options_have_one_help_text():
    """Each option of a shared block has one help text, type and metavar in every command that takes it
    (``--overwrite`` had eleven helps, ``--dry-run`` three)."""
    seen: dict[str, dict[str, argparse.Action]] = {flag: {} for flag in SHARED}
    for cmd, a in _options(build_parser()):
        for flag in set(a.option_strings) & set(SHARED):
            seen[flag][cmd] = a
    for flag, commands in SHARED.items():
        assert commands <= set(seen[flag]), (flag, commands - set(seen[flag]))
        described = {(a.help, a.type, a.metavar, a.nargs)
                     for a in seen[flag].values()}
        assert len(described) == 1, (flag, described)


def test_generated_options_keep_their_behaviour():
    """The options that moved from hand-written calls to fields parse as before: spelling, defaults, choices,
    required, positional and repeated arguments."""
    from rbjax.debias.sweep import PAPER_GRID

    parse = build_parser().parse_args
    args = parse(["measure", "--stored-perplexities"])
    assert (args.out, args.progress, args.overwrite, args.outlier_removal, args.benchmark, args.bias, args.dry_run,
            args.device_memory_gb) == ("results", True, False, "auto", "redditbias", None, False, None)
    args = parse(["measure", "--model", "m", "--bias", "race", "--bias", "gender", "--no-progress", "--overwrite",
                  "--device-memory-gb", "8", "--tokenizer", "t", "--adapter", "a"])
    assert (args.bias, args.progress, args.overwrite, args.device_memory_gb, args.tokenizer, args.adapter) == (
        ["race", "gender"], False, True, 8.0, "t", "a")
    args = parse(["retrieve", "--bias", "race", "--bias", "gender", "--dump", "a", "b", "--dump", "c", "--out", "o",
                  "--executor", "ray", "--jobs", "3", "--fresh"])
    assert (args.bias, args.dump, args.executor, args.jobs, args.fresh, args.progress) == (
        ["race", "gender"], ["a", "b", "c"], "ray", 3, True, True)
    args = parse(["run", "s.toml", "--out", "o", "--set", "a=1", "--set", "b=2", "--no-report", "--seeds", "2"])
    assert (args.study, args.overrides, args.report, args.seeds, args.progress) == ("s.toml", ["a=1", "b=2"], False,
                                                                                     2, True)
    assert parse(["run", "s.toml", "--out", "o"]).overrides is None  # read as no override
    args = parse(["compare", "A1,A2", "B", "--out", "o", "--bias", "race"])
    assert (args.a, args.b, args.bias) == ("A1,A2", "B", ["race"])
    assert parse(["plot", "x=F", "G", "--out", "p.png"]).folders == ["x=F", "G"]
    assert parse(["report", "D1", "D2"]).folders == ["D1", "D2"] and parse(["report", "D"]).out is None
    assert parse(["annotate", "import", "a.csv", "b.csv"]).files == ["a.csv", "b.csv"]
    args = parse(["export", "RUN", "--out", "o", "--bbq-after", "B"])
    assert (args.run, args.bbq_after, args.baseline) == ("RUN", "B", None)
    args = parse(["sweep", "--method", "lmd", "--bias", "religion1", "--out", "o", "--batch-sizes", "4,8",
                  "--grid-config", "g.toml"])
    assert (args.batch_sizes, args.grad_accums, args.grid_config, args.distributed) == (
        (4, 8), PAPER_GRID["grad_accum"], ["g.toml"], False)
    args = parse(["evaluate", "--task", "all", "--dst-train-file", "d.json", "--hyp", "h.txt"])
    assert (args.dst_train_file, args.hyp, args.train_file) == ("d.json", "h.txt", None)
    args = parse(["pairs", "--out", "p.csv"])
    assert (args.benchmark, args.split, args.crows_pairs_csv) == ("redditbias", "test", None)
    for argv in (["measure"], ["measure", "--model", "m", "--stored-perplexities"],  # one of the two, required
                 ["pairs", "--out", "p.csv", "--benchmark", "bbq"],  # pairs writes redditbias or crows-pairs only
                 ["splits", "--bias", "race", "--annotated", "a", "--out-dir", "o"],  # --model required
                 ["retrieve", "--bias", "race", "--out", "o"], ["evaluate", "--model", "m"], ["report"],
                 ["compare", "A", "--out", "o"], ["run", "s.toml"], ["sweep", "--method", "lmd", "--bias", "race",
                                                                     "--batch-sizes", "0"]):
        with pytest.raises(SystemExit) as e:
            parse(argv)
        assert e.value.code == 2, argv


def test_add_config_arguments_required_overrides_positional():
    """A shared block's option may be made required and have its help, default, choices or metavar specialised by
    a command — nothing else; a positional field is a required argument; ``repeat="extend"`` takes several values,
    several times."""
    from rbjax.commands.options import add_config_arguments

    @dataclasses.dataclass(frozen=True)
    class S:
        folders: tuple[str, ...] | None = field(None, "folders", positional=True, metavar="DIR")
        kind: str = field("a", "kind", choices=("a", "b", "c"))
        files: tuple[str, ...] | None = field(None, "files", repeat="extend", metavar="FILE")

    p = argparse.ArgumentParser()
    add_config_arguments(p, S, required=("files",), overrides={"kind": {"choices": ("a", "b"), "default": "b",
                                                                        "help": "which"}})
    args = p.parse_args(["x", "y", "--files", "1", "2", "--files", "3"])
    assert (args.folders, args.kind, args.files) == (["x", "y"], "b", ["1", "2", "3"])
    kind = next(a for a in p._actions if a.dest == "kind")
    assert kind.help == "which" and kind.choices == ["a", "b"]
    for argv in (["--files", "1"], ["x"], ["x", "--files", "1", "--kind", "c"]):
        with pytest.raises(SystemExit):
            p.parse_args(argv)
    with pytest.raises(TypeError, match="cannot override type"):
        add_config_arguments(argparse.ArgumentParser(), S, overrides={"kind": {"type": int}})
    with pytest.raises(TypeError, match="not added: files"):
        add_config_arguments(argparse.ArgumentParser(), S, ("kind",), required=("files",))
