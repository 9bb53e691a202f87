"""Shared setup of the scripts in ``benchmarks/``: the load monitor that voids a figure taken beside another job, and
the pieces several scripts time (no script imports another ``bench_`` script):

* the DialoGPT-small-shape model pair: :func:`dialogpt_config`, :func:`random_params` (rbjax's initialiser) and
  :func:`torch_gpt2` (``transformers.GPT2LMHeadModel`` holding the same weights);
* :func:`torch_sorted_mean_nll`: PyTorch's scoring of phrases in length-sorted, right-padded batches;
* :func:`interleaved`: timed calls in interleaved rounds inside one monitor section, and :func:`medians`;
* :func:`dst_arrays` / :func:`dst_array_data`: binary DST examples of the offline MultiWOZ 2.0 test split;
* the train-step pair of ``bench_train_step.py`` and ``on_device.py``: :func:`build_batch` (religion1 phrases with
  their triggers), :class:`RbjaxStep`, :class:`TorchStep` (the same update in PyTorch, :func:`torch_losses`).

A speed ratio taken while another job runs on the machine measures the scheduler as much as our code: PyTorch's
thread pool degrades more under contention than XLA's, so such a ratio flatters rbjax. Every benchmark script
therefore wraps each timed section in :meth:`LoadMonitor.section`, which records

* the section's wall time;
* the **foreign CPU**: the machine's busy CPU seconds (``psutil.cpu_times()``: all CPU time but idle and iowait)
  minus the CPU seconds of this process tree over the same interval, reported in cores (foreign seconds / wall
  seconds). The tree is this process (all its threads), the children it has waited for, and every live descendant
  with the children *it* has waited for: the worker processes a script starts are its own work, not foreign load;
* the load average when the section starts (``os.getloadavg()``), beside the one when the monitor was made.

:meth:`LoadMonitor.finish` adds a ``"load"`` block to the script's JSON and files its ratios under ``"ratios"`` only
when no section they depend on had more foreign CPU than the threshold; otherwise under ``"void_ratios"``, with a
``VOID`` line on stderr naming the section and its foreign CPU. Printed ratios go through
:meth:`LoadMonitor.ratio_text`, which marks them ``VOID`` the same way.

The threshold is :data:`DEFAULT_THRESHOLD` (0.10 cores: a tenth of one core, on average over the section), or the
environment variable :data:`THRESHOLD_ENV` (cores, a number >= 0), or the ``threshold`` argument.

Accuracy: the kernel counts CPU time in clock ticks (usually 10 ms), so a section of a second or less can read a few
hundredths of a core of foreign CPU from rounding alone; the scripts' timed sections last many seconds. ``steal``
(time the hypervisor gave another guest) counts as busy, hence foreign: it is contention too. A descendant that
detaches itself from the tree (a daemon re-parented to init) counts as foreign: the section is then void, never
flattered. The own tree is read before the list of descendants, so a child reaped between the two reads is missed
(counted foreign) rather than counted twice.
"""
from __future__ import annotations

import math
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, NamedTuple

try:
    import psutil
except ImportError as e:  # pragma: no cover - psutil is in the test extra, with torch and transformers
    raise ImportError("benchmarks/ needs psutil to measure foreign CPU load: pip install 'rbjax[test]'") from e

#: the shared read-only data (tokenizers, RedditBias, MultiWOZ): ``$RBJAX_SHARED``, else ``../shared`` beside the checkout
SHARED = Path(os.environ.get("RBJAX_SHARED", Path(__file__).resolve().parents[2] / "shared"))
#: environment variable overriding :data:`DEFAULT_THRESHOLD` (cores of foreign CPU, a number >= 0)
THRESHOLD_ENV = "RBJAX_BENCH_MAX_FOREIGN_CPU"
#: foreign CPU, in cores averaged over a section, above which the section's figures are void
DEFAULT_THRESHOLD = 0.10


class Reading(NamedTuple):
    """One reading of the clocks: wall time, the machine's busy CPU seconds, this process tree's CPU seconds."""

    wall: float
    busy: float
    own: float


def busy_seconds(times) -> float:
    """Busy CPU seconds of the whole machine (all CPUs) in a ``psutil.cpu_times()`` reading.

    All fields but ``idle`` and ``iowait``; on Linux ``guest`` and ``guest_nice`` are left out because the kernel
    already counts them in ``user`` and ``nice`` (psutil's own ``cpu_percent`` does the same).
    """
    total = sum(times)
    for f in ("guest", "guest_nice", "idle", "iowait"):
        total -= getattr(times, f, 0.0)
    return total


def own_tree_seconds(proc: "psutil.Process | None" = None) -> float:
    """CPU seconds (user + system) of ``proc`` (default: this process) and its tree.

    The process itself (every thread), the children it has waited for (``children_user``/``children_system``), and
    each live descendant (``children(recursive=True)``) with the children that descendant has waited for. A
    descendant that vanishes while it is read is skipped (its time is then counted foreign: the safe side).
    """
    proc = proc or psutil.Process()
    t = proc.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    try:
        kids = proc.children(recursive=True)
    except psutil.Error:
        kids = []
    for kid in kids:
        try:
            c = kid.cpu_times()
        except psutil.Error:  # gone, a zombie without times, or not ours to read
            continue
        total += c.user + c.system + c.children_user + c.children_system
    return total


def read_clocks() -> Reading:
    """The clocks now: the own tree first, then the machine (see the module docstring on races)."""
    own = own_tree_seconds()
    return Reading(time.perf_counter(), busy_seconds(psutil.cpu_times()), own)


def load_average() -> list[float] | None:
    """``os.getloadavg()`` as a list (1, 5, 15 minutes), or None where the platform has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def threshold_from_env(default: float = DEFAULT_THRESHOLD) -> float:
    """The foreign-CPU threshold in cores: :data:`THRESHOLD_ENV` when set, else ``default``.

    Raises ValueError naming the variable when its value is not a number >= 0.
    """
    raw = os.environ.get(THRESHOLD_ENV, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{THRESHOLD_ENV}={raw!r}: the foreign-CPU threshold must be a number of cores >= 0")
    return value


@dataclass
class Section:
    """One timed section's figures: wall seconds, foreign CPU seconds, load average at its start."""

    name: str
    wall_s: float
    foreign_cpu_s: float
    load_average_start: list[float] | None
    threshold: float

    @property
    def foreign_cores(self) -> float:
        """Foreign CPU in cores, averaged over the section (0 for an empty section; never negative)."""
        return max(self.foreign_cpu_s, 0.0) / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def void(self) -> bool:
        """True when the section's foreign CPU exceeds the threshold."""
        return self.foreign_cores > self.threshold

    def describe(self) -> str:
        return (f"section {self.name!r}: foreign CPU {self.foreign_cores:.2f} cores over {self.wall_s:.3g} s "
                f"(threshold {self.threshold:.2f})")

    def as_dict(self) -> dict:
        return {"name": self.name, "wall_s": round(self.wall_s, 3), "foreign_cpu_s": round(self.foreign_cpu_s, 3),
                "foreign_cores": round(self.foreign_cores, 3), "load_average_start": self.load_average_start,
                "void": self.void}


class LoadMonitor:
    """Records the foreign CPU of a script's timed sections and voids the ratios taken under foreign load.

    ``threshold``: cores of foreign CPU (averaged over a section) above which it is void; default
    :func:`threshold_from_env`. ``read`` and ``loadavg`` replace the clocks (tests inject readings); ``stream``
    receives the VOID lines (default stderr).

    Typical use::

        mon = LoadMonitor()
        with mon.section("rounds"):      # both sides' interleaved rounds, or one section per side
            ...
        print(f"rbjax / PyTorch: {mon.ratio_text(r)}", file=sys.stderr)
        mon.finish(result, {"rbjax_over_torch": r})   # result["load"], result["ratios"] or ["void_ratios"]
    """

    def __init__(self, threshold: float | None = None, *, read: Callable[[], Reading] = read_clocks,
                 loadavg: Callable[[], list[float] | None] = load_average, stream=None):
        self.threshold = threshold_from_env() if threshold is None else float(threshold)
        if not math.isfinite(self.threshold) or self.threshold < 0:
            raise ValueError(f"threshold must be a number of cores >= 0, got {threshold!r}")
        self._read, self._loadavg, self._stream = read, loadavg, stream
        self.load_average_start = loadavg()
        self.sections: list[Section] = []

    @property
    def stream(self):
        return self._stream if self._stream is not None else sys.stderr

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        """Time the body as one section named ``name`` (names may repeat; sections may nest)."""
        load = self._loadavg()
        start = self._read()
        try:
            yield
        finally:
            end = self._read()
            sec = Section(name, end.wall - start.wall, (end.busy - start.busy) - (end.own - start.own), load,
                          self.threshold)
            self.sections.append(sec)
            if sec.void:
                print(f"[load] {sec.describe()}: figures timed here are VOID", file=self.stream, flush=True)

    def void_sections(self, names=None) -> list[Section]:
        """The void sections among those named ``names`` (an iterable of names; None: every section so far)."""
        wanted = None if names is None else set(names)
        return [s for s in self.sections if s.void and (wanted is None or s.name in wanted)]

    @property
    def void(self) -> bool:
        """True when any section so far is void."""
        return bool(self.void_sections())

    def ratio_text(self, value: float, spec: str = ".2f", unit: str = "×", sections=None) -> str:
        """``value`` formatted for printing, marked VOID when a section of ``sections`` (default all) is void."""
        text = f"{value:{spec}}{unit}"
        bad = self.void_sections(sections)
        if not bad:
            return text
        worst = max(bad, key=lambda s: s.foreign_cores)
        return f"VOID {text} (foreign CPU {worst.foreign_cores:.2f} cores in section {worst.name!r})"

    def report(self) -> dict:
        """The ``"load"`` block: load average at the start, every section, the threshold, void flag and reason."""
        bad = self.void_sections()
        return {"load_average_start": self.load_average_start, "cpus": os.cpu_count(),
                "threshold_cores": self.threshold, "sections": [s.as_dict() for s in self.sections],
                "void": bool(bad), "reason": "; ".join(s.describe() for s in bad) or None}

    def split(self, ratios: dict, depends: dict | None = None) -> tuple[dict, dict]:
        """``(kept, void)``: the ratios none of whose sections is void, and the others.

        ``depends`` maps a ratio's name to the names of the sections it was timed in; a ratio missing from it (or
        every ratio, when ``depends`` is None) depends on every section.
        """
        kept, void = {}, {}
        for k, v in ratios.items():
            names = None if depends is None or k not in depends else depends[k]
            (void if self.void_sections(names) else kept)[k] = v
        return kept, void

    def finish(self, result: dict, ratios: dict | None = None, depends: dict | None = None) -> dict:
        """Add the ``"load"`` block to ``result`` and file ``ratios`` (see :meth:`split`): the kept ones under
        ``result["ratios"]`` (set, maybe empty, unless ``ratios`` is None: a script without ratios), the void ones
        under ``result["void_ratios"]`` (set only when there are any; a ``ratios`` dict already in ``result`` is
        replaced). Prints a VOID line to stderr per void section and names
        the ratios set aside. Returns ``result``."""
        result["load"] = self.report()
        kept, void = self.split(ratios or {}, depends)
        if ratios is not None:
            result.pop("void_ratios", None)
            result["ratios"] = kept
        if void:
            result["void_ratios"] = void
        for s in self.void_sections():
            print(f"VOID: {s.describe()}", file=self.stream, flush=True)
        if void:
            print(f"VOID: ratios kept out of 'ratios' (see 'void_ratios'): {', '.join(void)}", file=self.stream,
                  flush=True)
        return result


# ------------------------------------------------------------------------------ the DialoGPT-small-shape pair
def dialogpt_config(smoke: bool = False):
    """rbjax's GPT-2 config of DialoGPT-small (12 layers, width 768, vocabulary 50,257), or a 2-layer width-64 one
    for a smoke run."""
    from rbjax.model.gpt2 import GPT2Config

    return GPT2Config(n_layer=2, n_embd=64, n_head=2) if smoke else GPT2Config()


def random_params(config, seed: int = 0):
    """rbjax's random weights for a GPT-2 ``config`` (:func:`rbjax.model.gpt2.init_params`), on the host."""
    import jax

    from rbjax.model.gpt2 import init_params

    return jax.device_get(init_params(config, seed=seed))


def torch_gpt2(config, params):
    """``transformers.GPT2LMHeadModel`` holding rbjax's GPT-2 ``params`` (tied head), in training mode.

    Raises AssertionError when a weight other than the attention-mask buffers and the tied head is missing."""
    import numpy as np
    import torch
    import transformers

    from rbjax.model.hf import params_to_state_dict

    tcfg = transformers.GPT2Config(vocab_size=config.vocab_size, n_positions=config.n_positions,
                                   n_embd=config.n_embd, n_layer=config.n_layer, n_head=config.n_head)
    model = transformers.GPT2LMHeadModel(tcfg)
    sd = {k: torch.tensor(np.asarray(v)) for k, v in params_to_state_dict(params, config).items()}
    missing, _ = model.load_state_dict(sd, strict=False)
    assert not [k for k in missing if not k.endswith(("attn.bias", "attn.masked_bias", "lm_head.weight"))], missing
    model.tie_weights()
    return model


# ------------------------------------------------------------------------------ PyTorch sorted-batch scoring
def torch_sorted_mean_nll(model, ids: list, batch: int, device, *, bf16: bool = False):
    """Mean NLL per phrase of ``model`` (a transformers causal LM) on token-id lists ``ids``: length-sorted (stable)
    batches of ``batch`` phrases, right-padded, on ``device``; ``bf16``: under bf16 autocast. Returns a float64
    ``(len(ids),)`` array in the order of ``ids``."""
    import numpy as np
    import torch

    n = len(ids)
    order = list(np.argsort([len(s) for s in ids], kind="stable"))
    out = np.zeros(n)
    dev = torch.device(device).type
    ctx = torch.autocast(dev, dtype=torch.bfloat16) if bf16 else torch.autocast(dev, enabled=False)
    with torch.inference_mode(), ctx:
        for k in range(0, n, batch):
            rows = order[k:k + batch]
            L = max(len(ids[i]) for i in rows)
            x = torch.zeros((len(rows), L), dtype=torch.long)
            m = torch.zeros((len(rows), L), dtype=torch.long)
            for r, i in enumerate(rows):
                x[r, :len(ids[i])] = torch.tensor(ids[i])
                m[r, :len(ids[i])] = 1
            x, m = x.to(device), m.to(device)
            logits = model(x, attention_mask=m).logits[:, :-1].float()
            nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")
            tm = (m[:, 1:] * m[:, :-1]).float()
            out[rows] = ((nll * tm).sum(1) / tm.sum(1)).cpu().numpy()
    return out


# ------------------------------------------------------------------------------ DST examples
def dst_arrays(n: int, tokenizer):
    """The first ``n`` binary DST examples of the offline MultiWOZ 2.0 test split, encoded at block 128."""
    from rbjax.dialog import multiwoz as mw
    from rbjax.dialog import state_tracking

    base = SHARED / "dialog-data" / "multiwoz"
    mapping = base / "budzianowski-multiwoz" / "utils" / "mapping.pair"
    test = mw.load_multiwoz(base / "ConvLab-ConvLab" / "data" / "multiwoz" / "test.json.zip", "test", mapping=mapping)
    onto = mw.SlotOntology(mw.load_ontology(base / "thu-coai-tatk"), mw.Normalizer(mw.load_mapping_pairs(mapping)))
    ex = state_tracking.build_examples(test.dialogues, onto, semantics="paper", seed=42)[:n]
    return state_tracking.encode_examples(ex, tokenizer, block_size=128)


def dst_array_data(n: int, tokenizer):
    """:func:`dst_arrays` as the trainer's data (ids, mask, labels; columns past the longest example trimmed)."""
    from rbjax.dialog.tasks.dst import trim_columns
    from rbjax.train.batching import ArrayData

    a = dst_arrays(n, tokenizer)
    a = trim_columns({k: a[k] for k in ("input_ids", "attention_mask", "labels")})
    return ArrayData(a, pad_id=tokenizer.eos_id, info={"bench": "dst"})


# ------------------------------------------------------------------------------ interleaved timing
def interleaved(mon: LoadMonitor, section: str, rounds: int, calls: dict[str, Callable[[], float]],
                after_round: Callable[[int, dict], None] | None = None) -> dict[str, list[float]]:
    """Time ``calls`` (name → a call returning its own seconds) in ``rounds`` interleaved rounds — every call once
    per round, in order, so that a drift of the machine's load hits each alike — as one section of ``mon``.
    ``after_round(k, times)`` is called after round ``k`` (0-based; e.g. to print it). Returns name → seconds per
    round."""
    times: dict[str, list[float]] = {k: [] for k in calls}
    with mon.section(section):
        for k in range(rounds):
            for name, call in calls.items():
                times[name].append(call())
            if after_round is not None:
                after_round(k, times)
    return times


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    """The median of each name's timings."""
    import statistics

    return {k: statistics.median(v) for k, v in times.items()}


# ------------------------------------------------------------------------------ the train-step pair
#: the train-step batch: phrases × tokens
B, L = 8, 36


def build_batch(method: str, semantics: str, tokenizer, data_dir: Path):
    """``(batch, shared)``: the first :data:`B` religion1 training phrases, right-padded to :data:`L` tokens, with
    the triggers of ``method`` (``lm``, ``lmd``, ``add``, ``hd``) in ``semantics``, as numpy arrays."""
    import numpy as np

    from rbjax.debias.cda import read_train_phrases
    from rbjax.debias.triggers import TriggerBuilder, pad_occurrences
    from rbjax.specs import load_spec
    from rbjax.train.batching import tokenize_lines

    texts = read_train_phrases("religion1", str(data_dir))[:B]
    ids, mask, _ = tokenize_lines(texts, tokenizer, L, tokenizer.eos_id)
    batch = {"input_ids": ids, "attention_mask": mask}
    shared = {}
    if method in ("lmd", "add", "hd"):
        tb = TriggerBuilder(load_spec("religion1"), tokenizer, semantics=semantics)
        pid, pmask = tb.pair_ids("lmd" if method == "lmd" else "add_hd")
        shared = {"pair_ids": pid.astype(np.int32), "pair_mask": pmask}
        if method == "lmd":
            t = tb.lmd(ids, mask)
            batch.update(lmd_mask=t.mask, norm=t.norm)
        else:
            o = tb.attributes(ids, mask)
            o = tb.attributes(ids, mask, max_occurrences=pad_occurrences(int(o.mask.sum(1).max())))
            batch.update(occ_weights=o.weights, occ_mask=o.mask)
    return batch, shared


class RbjaxStep:
    """The trainer's update at accumulation 1: :func:`rbjax.train.step.train_step` (gradient, clip, Adam)."""

    def __init__(self, config, params, lambdas=(0.01, 10.0)):
        import jax

        self.config = config
        self.params = jax.device_put(params)
        self.lambdas = lambdas
        self.states = {}
        self.i = 0

    def __call__(self, batch, shared, method, semantics) -> float:
        import jax
        import numpy as np

        from rbjax.train.batching import dropout_key
        from rbjax.debias.objective import DebiasObjective
        from rbjax.train.step import StepSpec, init_state, train_step_jit

        objective = DebiasObjective(method, semantics)
        spec = StepSpec(config=self.config, objective=objective, dropout=True)
        key = (method, semantics)
        if key not in self.states:  # one state per method (each donates its own buffers)
            hp = dict(zip(("lambda_lm", "lambda_d"), self.lambdas)) if objective.hparam_names else {}
            self.states[key] = init_state(jax.tree.map(lambda x: x.copy(), self.params), spec, hparams=hp, lr=5e-5,
                                          t_total=1000)
        full = {k: np.asarray(v)[None] for k, v in batch.items()}
        full["rng"] = dropout_key(0, 0, self.i)[None]
        full.update(shared)
        t0 = time.perf_counter()
        self.states[key], m = train_step_jit(self.states[key], full, spec=spec)
        np.asarray(m["total"])
        jax.block_until_ready(self.states[key].params)
        self.i += 1
        return time.perf_counter() - t0


def rbjax_eval_losses(config, params, batch, shared, method, semantics, lambdas=(0.01, 10.0)):
    import numpy as np

    from rbjax.debias.objective import DebiasObjective
    from rbjax.train.step import StepSpec, micro_batch_losses

    objective = DebiasObjective(method, semantics)
    spec = StepSpec(config=config, objective=objective, dropout=False)
    hp = np.asarray(lambdas if objective.hparam_names else (), np.float32)
    tot, aux = micro_batch_losses(params, {**batch, **shared}, hp, spec)
    return [float(aux["lm_loss"]), float(aux["debias_loss"]), float(tot)]


def torch_losses(model, batch, shared, method, semantics, lambdas, torch):
    """LM loss + the paper's debiasing losses in torch ops (the same formulas as rbjax.debias.losses)."""
    F = torch.nn.functional
    ids = batch["input_ids"]
    mask = batch["attention_mask"]
    out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    logits, h = out.logits, out.hidden_states[-1]  # last hidden state is after ln_f
    tm = (mask[:, 1:] * mask[:, :-1]).float()
    nll = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                          reduction="none").view(tm.shape)
    lm = (nll * tm).sum() / tm.sum().clamp(min=1)
    if method == "lm":
        return lm, lm.new_zeros(()), lm
    wte = model.transformer.wte.weight
    pm = shared["pair_mask"].float()
    rows = wte[shared["pair_ids"]]  # (P, 2, W, d)
    e = (rows * pm[..., None]).sum(-2) / pm.sum(-1, keepdim=True).clamp(min=1)
    if semantics == "reference":
        e = e.detach()
    if method == "lmd":
        m = batch["lmd_mask"]
        gap = torch.einsum("bld,pd->blp", h, e[:, 0] - e[:, 1]).abs()
        cnt = m.sum(-1)
        hit = cnt > 0
        per = (m * gap).sum(-1) / cnt.clamp(min=1)
        deb = per[hit].sum() / hit.sum().clamp(min=1)
    else:
        ha = torch.einsum("bnl,bld->bnd", batch["occ_weights"], h)
        valid = batch["occ_mask"]
        if method == "add":
            def cos(x, y):
                xx, yy = (x * x).sum(-1), (y * y).sum(-1)
                ok = (xx > 0) & (yy > 0)
                c = (x * y).sum(-1) / (xx.clamp(min=1e-30).sqrt() * yy.clamp(min=1e-30).sqrt())
                return torch.where(ok, c, torch.zeros_like(c))

            c = cos(ha[:, :, None, None, :], e[None, None])
            deb = (valid * (c[..., 1] - c[..., 0]).abs().sum(-1)).sum()
        else:
            ed = e.detach()
            cmat = (ed[:, 0] - ed[:, 1]) / 2 if semantics == "paper" else (ed[:, 1] - ed[:, 0]) / 2
            _, s, vh = torch.linalg.svd(cmat, full_matrices=False)
            s2 = s * s
            before = (torch.cumsum(s2, 0) - s2) / s2.sum()
            keep = (before < 0.5) if semantics == "paper" else (before <= 0.5)
            basis = vh.T * keep.float()
            coef = torch.einsum("bnd,dm->bnm", ha, basis)
            if semantics == "paper":
                deb = (valid * coef.abs().sum(-1)).sum()
            else:
                proj = torch.einsum("bnm,dm->bnd", coef, basis) * valid[..., None]
                run = torch.cumsum(proj.reshape(-1, proj.shape[-1]), 0)
                deb = (valid.reshape(-1) * run.abs().sum(-1)).sum()
    lam_lm, lam_d = lambdas
    if semantics == "reference":
        total = lam_lm * lm + lam_d * deb if float(deb) != 0 else lm
    else:
        total = lam_lm * lm + lam_d * deb
    return lm, deb, total


class TorchStep:
    """A PyTorch update with the same weights: forward, LM + debias loss, backward, clip 1.0, AdamW(wd 0)."""

    def __init__(self, config, params, lambdas=(0.01, 10.0)):
        import torch

        torch.manual_seed(0)
        self.torch = torch
        self.model = torch_gpt2(config, params)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=5e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
        self.lambdas = lambdas

    def convert(self, batch_np, shared_np):
        import numpy as np

        torch = self.torch
        conv = {k: torch.tensor(np.asarray(v)) for k, v in batch_np.items()}
        conv["input_ids"] = conv["input_ids"].long()
        conv["attention_mask"] = conv["attention_mask"].long()
        for k in ("lmd_mask", "occ_weights", "occ_mask", "norm"):
            if k in conv:
                conv[k] = conv[k].float()
        sh = {"pair_ids": torch.tensor(np.asarray(shared_np["pair_ids"])).long(),
              "pair_mask": torch.tensor(np.asarray(shared_np["pair_mask"]))} if shared_np else {}
        return conv, sh

    def eval_losses(self, conv, sh, method, semantics):
        self.model.eval()
        with self.torch.no_grad():
            out = [float(x) for x in torch_losses(self.model, conv, sh, method, semantics, self.lambdas, self.torch)]
        self.model.train()
        return out

    def __call__(self, conv, sh, method, semantics) -> float:
        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        _, _, total = torch_losses(self.model, conv, sh, method, semantics, self.lambdas, self.torch)
        total.backward()
        self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return time.perf_counter() - t0
