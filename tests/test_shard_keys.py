"""A test that would miss a real bug: a sharded checkpoint (``model-0000x-of-0000y.safetensors`` + its
index) is keyed on every shard, so changing any one shard recomputes every result keyed on the model folder —
training resume (debias), evaluate, the study's stages, measure. Dropping the shards from the content key
(:func:`rbjax.model.hf.model_files_key`) fails each test here.

The sharded folder is the tiny rbjax-saved GPT-2 split into two shards with an index, the layout ``transformers``'
``save_pretrained(max_shard_size=...)`` writes, loaded through rbjax's real loader.
"""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from rbjax.core.reuse import OutputExists
from tests.conftest import small_train_config

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")

SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


def make_sharded(src: Path, dst: Path, names=SHARDS) -> Path:
    """Copy the model folder ``src`` to ``dst`` with its ``model.safetensors`` split into two shards + index."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(src, dst)
    state = load_file(dst / "model.safetensors")
    keys = sorted(state)
    halves = (keys[: len(keys) // 2], keys[len(keys) // 2:])
    weight_map = {}
    for name, part in zip(names, halves):
        save_file({k: state[k] for k in part}, dst / name, metadata={"format": "np"})
        weight_map.update({k: name for k in part})
    (dst / "model.safetensors").unlink()
    total = sum(v.nbytes for v in state.values())
    (dst / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return dst


def change_shard(folder: Path, name: str, delta: float = 0.25) -> None:
    """Rewrite one shard with one weight moved by ``delta`` (same names, shapes and size: still loadable)."""
    from safetensors.numpy import load_file, save_file

    state = load_file(folder / name)
    k = sorted(state)[0]
    a = state[k].copy()
    a.flat[0] += delta
    state[k] = a
    save_file(state, folder / name, metadata={"format": "np"})


@pytest.fixture
def sharded(tiny_model_dir, tmp_path) -> Path:
    return make_sharded(tiny_model_dir, tmp_path / "sharded")


def test_sharded_folder_loads_as_the_original(tiny_model_dir, sharded):
    import jax

    from rbjax.model.hf import load_pretrained

    _, a = load_pretrained(tiny_model_dir)
    _, b = load_pretrained(sharded)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("names", [SHARDS, ("part-a.safetensors", "part-b.safetensors")], ids=["hf-names", "own"])
def test_model_key_changes_with_any_one_shard(tiny_model_dir, tmp_path, names):
    """Every shard counts, also shards whose names only the index gives."""
    from rbjax.model.hf import model_files_key

    folder = make_sharded(tiny_model_dir, tmp_path / "m", names)
    key = model_files_key(folder)
    assert set(names) <= set(key) and "model.safetensors.index.json" in key
    for name in names:
        change_shard(folder, name)
        new = model_files_key(folder)
        assert new != key and new[name] != key[name]
        key = new


def test_training_resume_refuses_checkpoints_of_a_changed_shard(sharded, tokenizer_dir, redditbias_dir, tmp_path):
    """debias: a checkpoint taken from the sharded model is not resumed once one shard changed (the starting model
    is another), and a finished run of it is not reused."""
    from rbjax.debias.run import debias_trainer
    from rbjax.debias.run import debias

    cfg = small_train_config(sharded, tokenizer_dir, redditbias_dir, tmp_path / "run", max_steps=2, save_every=1,
                             dropout=False)
    debias_trainer(cfg).run(stop_after=1)
    change_shard(sharded, SHARDS[1])
    with pytest.raises(ValueError, match=r"different run .*model"):
        debias_trainer(cfg).run()
    # a finished run: rerunning the same command refuses to reuse it for the changed model
    done = cfg.replace(out_dir=str(tmp_path / "done"))
    debias(done)
    change_shard(sharded, SHARDS[0])
    with pytest.raises(ValueError, match="finished run with other inputs"):
        debias(done)


def test_evaluate_recomputes_after_a_shard_change(sharded, tmp_path, capsys):
    from rbjax.dialog.evaluate import evaluate

    lines = tmp_path / "ref.txt"
    lines.write_text("i think so too\nthat is a great idea , thanks !\nno way\nlol same\n")
    out = tmp_path / "out"
    r1 = evaluate("lmp", sharded, out, lmp_file=lines, progress=False)
    assert evaluate("lmp", sharded, out, lmp_file=lines, progress=False)["reused"] is True
    for name in SHARDS:  # either shard
        change_shard(sharded, name)
        with pytest.raises(OutputExists, match=r"lmp result of other inputs \(inputs differ: model: "):
            evaluate("lmp", sharded, out, lmp_file=lines, progress=False)  # never relabelled as the old result
        capsys.readouterr()
        r2 = evaluate("lmp", sharded, out, lmp_file=lines, progress=False, overwrite=True)
        assert r2["reused"] is False and r2["key"]["model"] != r1["key"]["model"]
        r1 = r2


def test_study_stages_keyed_on_the_model_change_with_any_shard(sharded, tokenizer_dir, redditbias_dir, tmp_path):
    """Every stage of a study whose key reads the starting model (baseline measure and dialog checks, the sweeps,
    the single-method training runs) gets a new key when one shard changes: `rbjax run` recomputes them."""
    from rbjax.study.config import load_study
    from rbjax.study.run import plan_study

    f = tmp_path / "s.toml"
    f.write_text(f'''[study]
model = "{sharded}"
tokenizer = "{tokenizer_dir}"
data_dir = "{redditbias_dir}"
bias_types = ["religion1"]
debias_types = ["religion1"]
methods = ["lmd", "cda"]
seeds = [42]

[training]
max_steps = 1

[sweep]
methods = ["lmd"]
batch_size = [4]
grad_accum = [1]
lambda_lm = [0.01]
lambda_d = [10.0]

[dialog]
tasks = ["lmp"]
''')
    stages = plan_study(load_study(f), tmp_path / "out", progress=False)
    on_start = {"baseline/lmb_test", "baseline/dialog", "seed42/sweeps", "seed42/religion1/cda/run"}
    assert on_start <= {s.name for s in stages}
    keys = {s.name: json.dumps(s.key(), sort_keys=True) for s in stages if s.name in on_start}
    for name in SHARDS:
        change_shard(sharded, name)
        new = {s.name: json.dumps(s.key(), sort_keys=True) for s in stages if s.name in on_start}
        assert all(new[n] != keys[n] for n in on_start), [n for n in on_start if new[n] == keys[n]]
        keys = new


def test_measure_resume_rescores_after_a_shard_change(sharded, redditbias_dir, tmp_path, capsys):
    from rbjax.lmb.measure import measure_bias

    out = tmp_path / "m"
    kw = dict(bias_types="religion1", split="valid", data_dir=redditbias_dir, out_dir=out, n_bootstrap=0,
              plot=False, progress=False)
    (a,) = measure_bias(sharded, **kw)
    change_shard(sharded, SHARDS[1], delta=1.0)
    with pytest.raises(OutputExists, match="model"):
        measure_bias(sharded, resume=True, **kw)  # the old scores are never resumed as this model's
    capsys.readouterr()
    (b,) = measure_bias(sharded, resume=True, overwrite=True, **kw)
    assert "reusing" not in capsys.readouterr().err
    assert b["t_value"] != a["t_value"]
