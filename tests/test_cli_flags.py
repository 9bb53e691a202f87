"""Flags and messages: an option that takes a value requires one, a switch takes none, a malformed flag
exits non-zero; errors name the flag (CLI), the field (Python API) or the file, section and key (study) the user
wrote."""
from pathlib import Path

import pytest

from rbjax.cli import main
from rbjax.debias.config import DebiasRun

RUN = ["debias", "--method", "hd", "--bias", "religion1"]


@pytest.mark.parametrize("argv,msg", [
    (RUN + ["--max-steps"], "argument --max-steps: expected one argument"),
    (RUN + ["--no-dropout", "false"], "unrecognized arguments: false"),
    (RUN + ["--epochs", "one"], "argument --epochs: invalid int value: 'one'"),
    (["sweep", "--method", "hd", "--bias", "religion1", "--seed"], "argument --seed: expected one argument"),
    (["debias", "--bias", "religion1"], "the following arguments are required: --method"),
])
def test_malformed_flags_exit_non_zero(argv, msg, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert msg in capsys.readouterr().err


@pytest.mark.parametrize("command", ["debias", "sweep"])
def test_training_help_has_plain_titles_and_switches(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    for leak in ("RunSettings", "SweepSettings", "['config']", "[bool]", "config.", "--config"):
        assert leak not in out, leak
    assert "--no-dropout " in out and "--max-steps N" in out and "--lr X" in out
    assert ("settings shared by every grid point" if command == "sweep" else "training settings") in out


@pytest.mark.parametrize("flags,cli_msg,field_kw,api_msg", [
    (["--lr", "-1"], "--lr must be > 0, got -1.0", {"learning_rate": -1.0}, "learning_rate must be > 0, got -1.0"),
    (["--max-grad-norm", "0"], "--max-grad-norm must be > 0, got 0.0", {"max_grad_norm": 0.0},
     "max_grad_norm must be > 0, got 0.0"),
    (["--adam-eps=-1e-8"], "--adam-eps must be >= 0, got -1e-08", {"adam_eps": -1e-8},
     "adam_eps must be >= 0, got -1e-08"),
    (["--batch-size", "0"], "--batch-size must be >= 1, got 0", {"batch_size": 0}, "batch_size must be >= 1, got 0"),
    (["--lambda-d", "nan"], "--lambda-d must be a finite number, got nan", {"lambda_d": float("nan")},
     "lambda_d must be a finite number, got nan"),
])
def test_one_validation_names_the_flag_on_the_cli_and_the_field_in_python(flags, cli_msg, field_kw, api_msg, capsys,
                                                                           tmp_path):
    assert main(RUN + ["--out", str(tmp_path / "o"), *flags]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"rbjax debias: error: {cli_msg}"
    with pytest.raises(ValueError) as e:
        DebiasRun.from_flat(method="hd", bias_type="religion1", **field_kw)
    assert str(e.value) == api_msg
    assert not (tmp_path / "o").exists()  # refused before anything was written


def test_measure_batch_size_names_the_flag(capsys, tmp_path):
    assert main(["measure", "--stored-perplexities", "--batch-size", "0", "--out", str(tmp_path / "m")]) == 1
    assert capsys.readouterr().err.strip() == "rbjax measure: error: --batch-size must be >= 1, got 0"


def test_study_values_name_file_section_and_key(tmp_path):
    from rbjax.study.config import load_study

    f = tmp_path / "s.toml"
    f.write_text('[study]\nmodel = "m"\n\n[training]\nepochs = "one"\n', encoding="utf-8")
    with pytest.raises(ValueError) as e:
        load_study(f)
    assert str(e.value) == f"{f.resolve()}: [training] epochs: training.epochs must be an integer, got 'one'"
    f.write_text('[study]\nmodel = "m"\n', encoding="utf-8")
    with pytest.raises(ValueError) as e:
        load_study(f, ["sweep.batch_size=[0]"])  # the value came from --set: named, not the file
    assert str(e.value).startswith("--set 'sweep.batch_size=[0]': sweep.batch_size must be")
    assert "GridPoint" not in str(e.value)
    # a range DebiasRun checks (SettingError): the key named, from the file or from --set
    f.write_text('[study]\nmodel = "m"\n\n[training]\nadam_b2 = 1.0\n', encoding="utf-8")
    with pytest.raises(ValueError) as e:
        load_study(f)
    assert str(e.value) == f"{f.resolve()}: [training] adam_b2: adam_b2 must be in [0, 1), got 1.0"
    with pytest.raises(ValueError) as e:
        load_study(f, ["training.learning_rate=-1"])
    assert str(e.value) == "--set 'training.learning_rate=-1': learning_rate must be > 0, got -1"


def test_own_bias_type_without_data_dir_names_the_missing_phrases(tmp_path, monkeypatch, capsys):
    """Field case: a spec-file bias type without --data-dir complained about downloading the LMP file."""
    import shutil
    from pathlib import Path

    import rbjax.specs

    monkeypatch.delenv("RBJAX_DATA_DIR", raising=False)
    monkeypatch.setenv("RBJAX_REDDITBIAS_URL", "http://127.0.0.1:9/nothing")  # a download attempt would fail
    monkeypatch.setenv("RBJAX_CACHE_DIR", str(tmp_path / "cache"))
    spec = tmp_path / "mine.json"
    shutil.copy(Path(rbjax.specs.__file__).parent / "religion1.json", spec)
    assert main(["debias", "--method", "hd", "--bias", str(spec), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert f"--bias {spec}: a bias type of your own trains on its phrases" in err
    assert "_bias_manual_train.txt" in err and "--data-dir" in err and "download" not in err


@pytest.mark.parametrize("mesh,why", [("fsdp=2,grid=2", "a measurement scores one model, it has no grid points"),
                                      ("fsdp=2,pipe=2", "unknown axis 'pipe'")])
def test_measure_mesh_takes_data_fsdp_tensor_only(mesh, why, capsys, tmp_path):
    """``measure --mesh`` documents data/fsdp/tensor: a grid axis (or an unknown one) is refused by the settings,
    naming --mesh on the command line and ``mesh`` in Python, before any plan or model."""
    from rbjax.core.errors import SettingError
    from rbjax.lmb.config import MeasureConfig

    with pytest.raises(SettingError, match=why) as e:
        MeasureConfig(mesh=mesh)
    assert e.value.field == "mesh"
    llama = Path(__file__).parent / "fixtures" / "llama3_8b"
    assert main(["measure", "--model", str(llama), "--mesh", mesh, "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("rbjax measure: error: --mesh") and why in err
    assert MeasureConfig(mesh="grid=1,data=2").mesh == "grid=1,data=2"  # a grid of one is no grid


def test_evaluate_settings_name_the_flag(tmp_path, capsys):
    from rbjax.dialog.evaluate import task_settings

    with pytest.raises(ValueError, match="^learning_rate must be > 0, got -1.0$"):
        task_settings("dst", {"learning_rate": -1.0})
    assert main(["evaluate", "--task", "dst", "--model", "m", "--out", str(tmp_path / "o"), "--lr", "-1"]) == 1
    assert capsys.readouterr().err.strip() == "rbjax evaluate: error: --lr must be > 0, got -1.0"


def test_measure_options_are_the_measure_config():
    """``rbjax measure``'s options are generated from :class:`MeasureConfig`: each field has its option, the parsed
    defaults build the default config, and given values reach the config unchanged."""
    import dataclasses

    from rbjax.cli import build_parser
    from rbjax.commands.measure import CHAT_OPTIONS, MEASURE_OPTIONS
    from rbjax.commands.options import config_values
    from rbjax.lmb.config import MeasureConfig

    parser = build_parser()
    args = parser.parse_args(["measure", "--stored-perplexities"])
    assert set(MEASURE_OPTIONS + CHAT_OPTIONS) | {"outlier_removal"} == {
        f.name for f in dataclasses.fields(MeasureConfig)}
    assert MeasureConfig(**config_values(args, MeasureConfig, MEASURE_OPTIONS + CHAT_OPTIONS)) == MeasureConfig()
    args = parser.parse_args(["measure", "--model", "m", "--format", "chat", "--role", "user", "--system", "Be kind.",
                              "--score-end-of-turn", "--chat-template", "t.jinja"])
    assert MeasureConfig(**config_values(args, MeasureConfig, MEASURE_OPTIONS + CHAT_OPTIONS)) == MeasureConfig(
        format="chat", role="user", system="Be kind.", score_end_of_turn=True, chat_template="t.jinja")
    args = parser.parse_args(["measure", "--stored-perplexities", "--split", "valid", "--n-std", "2.5", "--ddof", "1",
                              "--no-bos", "--skip-unscorable", "--n-bootstrap", "7", "--param-dtype", "bf16",
                              "--mesh", "data=1"])
    got = MeasureConfig(**config_values(args, MeasureConfig, MEASURE_OPTIONS))
    assert got == MeasureConfig(split="valid", n_std=2.5, ddof=1, bos=False, skip_unscorable=True, n_bootstrap=7,
                                param_dtype="bf16", mesh="data=1")
    with pytest.raises(TypeError, match="unknown measurement setting.*n_boot"):
        MeasureConfig().replace(n_boot=3)  # a misspelt keyword of measure_bias is an error, never ignored


def test_sweep_options_are_the_sweep_config(tmp_path):
    """``rbjax sweep``'s selection/execution options are :class:`SweepConfig`'s fields (defaults and values reach
    the config); the study file's [sweep] is checked by the same class and named by section and key."""
    from rbjax.cli import build_parser
    from rbjax.commands.options import config_values
    from rbjax.debias.sweep_config import SweepConfig
    from rbjax.study.config import load_study

    parser = build_parser()
    base = ["sweep", "--method", "lmd", "--bias", "religion1", "--out", str(tmp_path)]
    assert SweepConfig(**config_values(parser.parse_args(base), SweepConfig)) == SweepConfig()
    args = parser.parse_args(base + ["--lmp-tolerance", "0.2", "--grid-chunk", "3", "--final", "both",
                                     "--keep-point-checkpoints", "--executor", "ray", "--jobs", "2"])
    assert SweepConfig(**config_values(args, SweepConfig)) == SweepConfig(
        lmp_tolerance=0.2, grid_chunk=3, final="both", keep_point_checkpoints=True, executor="ray", jobs=2)
    f = tmp_path / "s.toml"
    f.write_text('[study]\nmodel = "m"\n[sweep]\nlmp_tolerance = -0.5\n')
    with pytest.raises(ValueError, match=r"\[sweep\] lmp_tolerance: sweep.lmp_tolerance must be a number >= 0"):
        load_study(f)
    f.write_text('[study]\nmodel = "m"\n[sweep]\nselection = "reference"\ngrid_chunk = 2\n')
    assert load_study(f).sweep_config() == SweepConfig(grid_chunk=2, final="reference")
