"""The dialog tasks' registry and settings dataclasses (rbjax.dialog.tasks), and the `rbjax evaluate` options generated
from them. No model is loaded."""
import argparse
import dataclasses

import pytest

from rbjax.commands import evaluate as cmd
from rbjax.core.errors import SettingError
from rbjax.dialog.tasks import TASKS, get_task
from rbjax.dialog.tasks.crg import CRGSettings
from rbjax.dialog.tasks.dst import DSTSettings
from rbjax.dialog.tasks.lmp import LMPSettings

#: the settings that enter each task's result key with their defaults: a change here changes every user's keys
#: (their results are recomputed, their fine-tuning restarts), so it must be deliberate (and bump RESULT_FORMAT)
KEY_DEFAULTS = {
    "lmp": {"lmp_max_lines": None, "lmp_block_size": 36, "eval_batch_size": 64},
    "dst": {"max_steps": None, "max_examples": None, "seed": 42, "semantics": "paper", "joint_goal": False,
            "jga_max_dialogues": None, "batch_size": 12, "grad_accum": 4, "epochs": 1, "learning_rate": 5e-5,
            "block_size": 128, "eval_batch_size": 64, "dropout": True, "layout": "packed"},
    "crg": {"max_steps": None, "max_examples": None, "seed": 42, "semantics": "paper", "batch_size": 16,
            "grad_accum": 5, "epochs": 1, "learning_rate": 5e-5, "block_size": 128, "gen_batch_size": 16,
            "greedy": False, "max_new_tokens": None, "clean": True, "meteor": True, "meteor_norm": True,
            "meteor_jar": None, "java": None, "dropout": True, "layout": "packed"},
}


def test_registry_order_and_unknown_task():
    assert TASKS == ("lmp", "dst", "crg")
    assert [get_task(t).settings for t in TASKS] == [LMPSettings, DSTSettings, CRGSettings]
    assert get_task("crg").outputs[0] == "crg.json"
    with pytest.raises(ValueError, match="unknown dialog task 'bleu'; expected one of lmp, dst, crg"):
        get_task("bleu")


@pytest.mark.parametrize("task", TASKS)
def test_key_settings_of_the_defaults(task):
    s = get_task(task).settings()
    assert s.key_settings() == KEY_DEFAULTS[task]
    assert {"progress", "keep_checkpoints"} <= set(s.to_dict()) and not set(s.path_fields) & set(s.key_settings())


def test_settings_are_frozen_typed_and_named_by_field(tmp_path):
    s = DSTSettings.from_settings({"batch_size": 4, "seed": None, "gen_batch_size": 3})  # not dst's: ignored
    assert (s.trainer.batch_size, s.seed) == (4, 42) and "gen_batch_size" not in s.to_dict()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.seed = 1
    with pytest.raises(SettingError, match="^greedy must be true or false, got 'yes'$"):
        CRGSettings(greedy="yes")
    with pytest.raises(SettingError, match="^learning_rate must be > 0, got 'x'$"):
        CRGSettings.from_settings({"learning_rate": "x"})
    ref = tmp_path / "r.txt"
    ref.write_text("a\n")
    assert CRGSettings(refs=ref).refs == (str(ref),) and CRGSettings(refs=[ref, ref]).refs == (str(ref),) * 2


def _parser():
    p = argparse.ArgumentParser()
    cmd.register(p.add_subparsers(dest="command"))
    return p


def test_every_setting_is_an_option_or_named_as_not_one():
    names = {name for t in TASKS for name in get_task(t).settings.names()}
    assert set(cmd._option_fields()) | set(cmd.NOT_OPTIONS) == names
    args = _parser().parse_args(["evaluate", "--task", "dst"])
    given = {k: v for k, v in cmd._settings(args).items() if v is not None}
    assert given == {}  # nothing given: every task's own defaults


def test_generated_options_give_the_settings():
    args = _parser().parse_args(["evaluate", "--task", "all", "--batch-size", "4", "--lr", "1e-4", "--no-dropout",
                                 "--no-meteor", "--no-clean", "--keep-checkpoints", "--layout", "padded",
                                 "--no-progress"])
    given = {k: v for k, v in cmd._settings(args).items() if v is not None}
    assert given == {"batch_size": 4, "learning_rate": 1e-4, "dropout": False, "meteor": False, "clean": False,
                     "keep_checkpoints": True, "layout": "padded", "progress": False}
    (bs,) = [a for a in _parser()._subparsers._group_actions[0].choices["evaluate"]._actions
             if a.dest == "batch_size"]
    assert bs.default is None and bs.help.endswith("(default: dst 12, crg 16)")


@pytest.mark.parametrize("task", TASKS)
def test_mesh_is_checked_recorded_and_not_keyed(task):
    """--mesh: its syntax is checked with the settings, a grid axis is refused (one model), and it is not
    part of the result key (a mesh changes the float32 rounding only: tests/test_sharding.py compares the numbers)."""
    cls = get_task(task).settings
    s = cls(mesh="data=2,fsdp=4")
    assert s.to_dict()["mesh"] == "data=2,fsdp=4" and s.key_settings() == cls().key_settings()
    with pytest.raises(SettingError, match="^mesh 'data=2,pipe=2': unknown axis 'pipe'"):
        cls(mesh="data=2,pipe=2")
    with pytest.raises(SettingError, match="^mesh 'grid=2,fsdp=2': a dialog task runs one model"):
        cls(mesh="grid=2,fsdp=2")


def test_mesh_that_does_not_fit_the_devices_is_refused_before_loading(tmp_path):
    import jax

    from rbjax.dialog.tasks.common import task_mesh

    n = jax.device_count()
    with pytest.raises(ValueError, match=f"multiply to {2 * n}"):
        task_mesh(LMPSettings(mesh=f"data=2,fsdp={n}"))
    assert task_mesh(LMPSettings()) is None
    assert dict(task_mesh(LMPSettings(mesh=f"fsdp={n}")).shape) == {"grid": 1, "data": 1, "fsdp": n, "tensor": 1}


def test_dry_run_plans_every_computation_from_config_json(capsys):
    """rbjax evaluate --dry-run: one memory plan per computation of each task (fine-tuning, scoring, the generation's
    KV cache), from the Llama-3-8B config.json alone (no weights); the mesh may name devices this machine lacks."""
    from pathlib import Path

    from rbjax.cli import main
    from rbjax.dialog.evaluate import evaluate

    llama = Path(__file__).parent / "fixtures" / "llama3_8b"
    plans = evaluate("all", llama, None, mesh="fsdp=8", device_memory_gb=16, dry_run=True, crg_train_file=llama /
                     "config.json")
    kinds = {t: [(p.settings["training"], "kv_cache" in p.parts) for p in ps] for t, ps in plans.items()}
    assert kinds == {"lmp": [(False, False)], "dst": [(True, False), (False, False)],
                     "crg": [(True, False), (False, True)]}
    dst_train = plans["dst"][0]
    assert not dst_train.fits and dst_train.largest in ("gradients", "optimizer")  # 160 GB with Adam over 8 × 16 GB
    assert plans["lmp"][0].fits and plans["crg"][1].fits
    assert main(["evaluate", "--task", "crg", "--model", str(llama), "--mesh", "fsdp=8", "--device-memory-gb", "16",
                 "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("crg: memory plan: ") and "kv_cache" in out and "training" not in out
    assert "parameters), generation, mesh fsdp=8" in out.replace("grid=1,data=1,", "").replace(",tensor=1", "")
    # DST's fine-tuning does not fit 8 × 16 GB: both plans are printed, then the error (exit status 1)
    assert main(["evaluate", "--task", "dst", "--model", str(llama), "--mesh", "fsdp=8", "--device-memory-gb", "16",
                 "--dry-run"]) == 1
    cap = capsys.readouterr()
    assert cap.out.count("dst: memory plan: ") == 2 and "DOES NOT FIT" in cap.out and "(the plan above)" in cap.err
    assert main(["evaluate", "--task", "crg-metrics", "--dry-run", "--hyp", "h", "--refs", "r", "--out", "o"]) == 1
    assert "--dry-run concerns a model task" in capsys.readouterr().err
    assert main(["evaluate", "--task", "crg-metrics", "--mesh", "fsdp=4", "--hyp", "h", "--refs", "r", "--out",
                 "o"]) == 1
    assert "--mesh concerns a model task" in capsys.readouterr().err


def test_a_plan_that_does_not_fit_is_refused_before_the_weights_are_loaded(tiny_model_dir, redditbias_dir, tmp_path,
                                                                           monkeypatch):
    from rbjax.dialog.evaluate import evaluate
    from rbjax.model.handle import ModelHandle
    from rbjax.model.memory import PlanError

    def no_loading(self):
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr(ModelHandle, "load", no_loading)
    with pytest.raises(PlanError, match=r"model: needs .* GB per device .* the largest part is activations"):
        evaluate("lmp", tiny_model_dir, tmp_path / "out", data_dir=redditbias_dir, device_memory_gb=1e-6)
    assert not (tmp_path / "out" / "lmp.json").exists()
    with pytest.raises(SettingError, match="^device_memory_gb must be > 0, got 0"):
        LMPSettings(device_memory_gb=0)


def test_a_plan_suggestion_names_the_evaluate_options(tiny_model_dir):
    """The memory plan's suggestion names the options `rbjax evaluate` has (--eval-batch-size, --gen-batch-size),
    never measure's --param-dtype, which evaluate does not take."""
    from rbjax.dialog.evaluate import evaluate

    lmp = evaluate("lmp", tiny_model_dir, None, dry_run=True, device_memory_gb=0.05)["lmp"][0]
    assert not lmp.fits and "(--eval-batch-size " in lmp.suggestion and "--param-dtype" not in lmp.suggestion
    crg = evaluate("crg", tiny_model_dir, None, dry_run=True, device_memory_gb=0.01)["crg"][-1]
    assert not crg.fits and "kv_cache" in crg.parts and "--param-dtype" not in crg.suggestion
    assert "(--gen-batch-size " in crg.suggestion or crg.suggestion.startswith("No mesh or batch")
