"""``rbjax sweep``: the paper's 54-point grid for one or more methods and bias types, trained as vmapped programs and
selected on the validation split."""
from __future__ import annotations

import argparse
import dataclasses

from rbjax.commands.debias import add_plan_arguments, add_training_arguments, config_from_args
from rbjax.commands.options import add_config_arguments, config_values, given_options
from rbjax.core.config import field
from rbjax.core.distributed import initialize, requested
from rbjax.core.interrupt import Interrupted
from rbjax.core.io import replacing
from rbjax.core.mesh import mesh_product
from rbjax.data.redditbias import expand_bias_types
from rbjax.debias import grid_config as gcfg
from rbjax.debias.config import METHODS
from rbjax.debias.sweep_config import SweepConfig
from rbjax.debias.sweep import (PAPER_GRID, SELECTED_FOLDERS, SWEEP_FILES, clear_sweep, format_selection,
                                grid_memory_plan, grid_points, run_sweeps)
from rbjax.model.handle import ModelHandle
from rbjax.specs import is_spec_path


def _floats(s: str) -> tuple[float, ...]:
    try:
        v = tuple(float(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of numbers, got {s!r}") from None
    if not v:
        raise argparse.ArgumentTypeError("empty list")
    return v


def _ints(s: str) -> tuple[int, ...]:
    v = _floats(s)
    if any(x != int(x) or x < 1 for x in v):
        raise argparse.ArgumentTypeError(f"expected a comma list of positive integers, got {s!r}")
    return tuple(int(x) for x in v)


#: the grid's axes and the options that give them
AXIS_OPTIONS = {"batch_size": "batch_sizes", "grad_accum": "grad_accums", "lambda_lm": "lambda_lms",
                "lambda_d": "lambda_ds"}


@dataclasses.dataclass(frozen=True)
class SweepCommand:
    """The options of ``rbjax sweep`` besides the training settings (:class:`rbjax.debias.config.DebiasRun`), the
    sweep's (:class:`SweepConfig`) and the memory plan's (:class:`rbjax.commands.settings.PlanSettings`): the grid
    files, the grid's axes (:data:`AXIS_OPTIONS`) and whether several hosts run as one program."""

    grid_config: tuple[str, ...] | None = field(
        None, "TOML grid file(s): axes under [grid], shared settings under [settings], optional `methods` it is for; "
              "repeat it, or give a folder of them (the paper's: experiments/grids/). Options given here win over "
              "the file (see docs/scale.md)", repeat=True, metavar="FILE")
    batch_sizes: tuple[int, ...] = field(PAPER_GRID["batch_size"], "grid axis: batch sizes", parse=_ints,
                                         metavar="N,N,..")
    grad_accums: tuple[int, ...] = field(PAPER_GRID["grad_accum"], "grid axis: gradient accumulation steps",
                                         parse=_ints, metavar="N,N,..")
    lambda_lms: tuple[float, ...] = field(PAPER_GRID["lambda_lm"], "grid axis: λ_LM", parse=_floats,
                                          metavar="X,X,..")
    lambda_ds: tuple[float, ...] = field(PAPER_GRID["lambda_d"], "grid axis: λ_D", parse=_floats, metavar="X,X,..")
    distributed: bool = field(False, "several hosts as one program: call jax.distributed.initialize() first (also "
                                     "RBJAX_DISTRIBUTED=1); run the same command on every host, --out on a shared "
                                     "path; outside Cloud TPU/Slurm/Open MPI set JAX_COORDINATOR_ADDRESS, "
                                     "JAX_NUM_PROCESSES, JAX_PROCESS_ID (docs/scale.md)")


def register(sub) -> None:

    p = sub.add_parser(
        "sweep", help="run the paper's hyper-parameter grid (methods × bias types) and select on the valid split",
        description="Batch {4,8,16} x accumulation {1,5,8} x λ_LM {0.001,0.01} x λ_D {10,50,100} (54 runs; 9 for cda), "
                    "each trained from the same model and seed; the 6 λ combinations of a (batch, accumulation) "
                    "setting train together as one vmapped program (chunked to fit the device memory, spread over "
                    "all devices), then LMB on the valid split and the Reddit-6K perplexity of every point. Records "
                    "OUT/sweep.jsonl (a killed sweep resumes; finished points are never redone), OUT/sweep.csv and "
                    "OUT/selection.json with two selections: the reference rule (highest dev ttest_rel p-value) and "
                    "rbjax's default (smallest |dev t| among runs whose LMP is within --lmp-tolerance of the "
                    "starting model's). Several methods and bias types (e.g. --method lmd,add,hd,cda --bias all) "
                    "run as one study into OUT/<bias type>/<method>/. See docs/debiasing.md and docs/scale.md.")
    add_training_arguments(p, grid=True)
    g = p.add_argument_group("grid and execution")

    add_config_arguments(g, SweepCommand, ("grid_config", *AXIS_OPTIONS.values()))
    add_config_arguments(g, SweepConfig)
    add_config_arguments(g, SweepCommand, ("distributed",))
    add_plan_arguments(p)
    p.set_defaults(func=run)


def _combinations(args) -> list[tuple[str, str]]:

    methods = [m.strip() for m in args.method.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise ValueError(f"--method: unknown method(s) {bad}; expected a comma list of {', '.join(METHODS)}")
    return [(b, m) for b in expand_bias_types(args.bias_type) for m in methods]


def _run_sweeps(bases, overwrite: bool, *args, **kw) -> list[dict]:
    """:func:`run_sweeps`; with ``overwrite`` the sweeps in the folders are replaced as a whole or not at all: their
    files (:data:`SWEEP_FILES`, :data:`SELECTED_FOLDERS`) are set aside (:func:`rbjax.core.io.replacing`) and
    deleted once every sweep has finished, and put back when the new sweeps fail or are interrupted before. A
    distributed sweep (several processes writing one shared folder) clears them at the start instead."""
    import contextlib

    import jax

    if not overwrite:
        return run_sweeps(bases, *args, **kw)
    if jax.process_count() > 1:
        for _, folder in bases:
            clear_sweep(folder)
        return run_sweeps(bases, *args, **kw)
    earlier = []
    try:
        with contextlib.ExitStack() as stack:
            for _, folder in bases:
                earlier += stack.enter_context(replacing(folder, SWEEP_FILES + SELECTED_FOLDERS))
            return run_sweeps(bases, *args, **kw)
    except KeyboardInterrupt:
        if not earlier:
            raise
        raise Interrupted(
            "rbjax sweep --overwrite: interrupted before the new sweep finished. Its files are discarded and the "
            f"earlier sweep in {', '.join(str(f) for _, f in bases)} is kept as it was. Run the same command again "
            "to start over, or give another --out to keep both.") from None


def run(args) -> int:
    from pathlib import Path

    if args.executor == "ray" and requested(args.distributed):
        raise ValueError("--distributed (one program over several hosts) and --executor ray (chunks as tasks on a "
                         "Ray cluster) are two ways to use several machines: choose one")
    if requested(args.distributed):
        d = initialize()
        print(f"rbjax sweep: process {d['process_index']} of {d['process_count']} of a distributed job: "
              f"{d['devices']} devices in all, {d['local_devices']} here", flush=True)
    combos = _combinations(args)
    out = Path(args.out_dir)
    many = len(combos) > 1
    files = gcfg.load_grid_configs(args.grid_config)
    cli_grid = {axis: getattr(args, dest) for axis, dest in AXIS_OPTIONS.items()}
    axis_of = {dest: axis for axis, dest in AXIS_OPTIONS.items()}
    given = {axis_of.get(d, d) for d in given_options(args)}  # an axis by its name, a setting by its field
    grids, settings = {}, {}
    for m in {m for _, m in combos}:
        grids[m], settings[m] = gcfg.merge(gcfg.config_for_method(files, m), cli_grid, given)
    bases = []
    for b, m in combos:
        folder = out / (Path(b).stem if is_spec_path(b) else b) / m if many else out
        g = grids[m]
        bases.append((config_from_args(args, **{**settings[m], "method": m, "bias_type": b, "out_dir": str(folder),
                                                "batch_size": g["batch_size"][0], "grad_accum": g["grad_accum"][0],
                                                "lambda_lm": g["lambda_lm"][0], "lambda_d": g["lambda_d"][0]}),
                      folder))
    scfg = SweepConfig(**config_values(args, SweepConfig))
    # the memory plan before any weight is read, one per method's grid (the bias types share the model): --dry-run
    # prints its largest chunk; a run is refused when a chunk of --grid-chunk points (else of one point: the
    # automatic chunk size fits as many as the free memory takes) cannot fit
    planned = set()
    model = ModelHandle.open(bases[0][0].model, bases[0][0].tokenizer)  # every sweep's start model: one handle
    for (b, m), (base, _) in zip(combos, bases):
        if m in planned:
            continue
        planned.add(m)
        pts = grid_points(m, grids[m])[:scfg.max_points]
        n_dev = mesh_product(base.mesh) if args.dry_run and base.mesh else None
        if args.dry_run:
            plan = grid_memory_plan(base, pts, grid_chunk=scfg.grid_chunk, device_memory_gb=args.device_memory_gb,
                                    n_devices=n_dev, model=model)
            print(f"{m}: the largest chunk of its grid\n{plan.format()}")
        else:
            grid_memory_plan(base, pts, grid_chunk=scfg.grid_chunk or 1,
                             device_memory_gb=args.device_memory_gb, model=model).check()
    if args.dry_run:
        return 0
    sels = _run_sweeps(bases, args.overwrite, scfg, grid=cli_grid, method_grids=grids, progress=args.progress,
                       replace_other_inputs=args.overwrite, model=model)  # a selected_<rule> run of another point, too
    for (b, m), (_, folder), sel in zip(combos, bases, sels):
        print(f"{m} on {b}: " + format_selection(sel).replace("\n", "\n  "))
        print(f"  wrote {folder / 'selection.json'}, {folder / 'sweep.csv'}, {folder / 'sweep.jsonl'}")
    return 0
