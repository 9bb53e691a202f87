"""Settings of a debiasing sweep besides the training settings and the grid's axes (paper §5.1's selection on the
valid split; how the grid is run).

:class:`SweepConfig` holds each default, help text and check once: ``rbjax sweep``'s options are generated from it
(:func:`rbjax.commands.options.add_config_arguments`), :func:`rbjax.debias.sweep.run_sweeps` takes it, and the study
file's ``[sweep]`` section is validated by it. The training settings shared by every point are
:class:`rbjax.debias.config.DebiasRun`; the axes are :data:`rbjax.debias.sweep.PAPER_GRID` or a grid file
(:mod:`rbjax.debias.grid_config`).
"""
from __future__ import annotations

import dataclasses

from rbjax.core.config import check_types, field, replace_settings
from rbjax.core.errors import SettingError
from rbjax.core.parallel import EXECUTORS, Executor

__all__ = ["SweepConfig", "FINALS", "EXECUTORS"]

#: which selection(s) to retrain with export and full evaluation into ``OUT/selected_<rule>``
FINALS = ("none", "default", "reference", "both")


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    """How a sweep evaluates, selects and runs its grid points (frozen). Each field's ``metadata["help"]`` is its
    documentation.

    Raises:
        rbjax.core.errors.SettingError: a value of the wrong type or out of range (names the field; the CLI shows its
            flag, a study file its section and key).
    """

    lmp_tolerance: float = field(0.10, "rbjax's selection rule: allowed relative LMP increase over the starting "
                                       "model")
    n_bootstrap: int = field(1000, "bootstrap resamples of each point's dev LMB statistics")
    dev_max_pairs: int | None = field(None, "score only the first N valid pairs (smoke runs)", metavar="N")
    max_points: int | None = field(None, "run only the first N grid points (smoke runs)", metavar="N")
    grid_chunk: int | None = field(None, "grid points trained together in one vmapped program (when not given: as "
                                         "many of a batch plan's points as fit the free device memory)", metavar="N")
    final: str = field("none", "retrain the selected run(s) with export and full evaluation into "
                               "OUT/selected_<rule>", choices=FINALS)
    # how the chunks are run: the settings of rbjax.core.parallel.Executor, with its help (one text per option)
    executor: str = field("local", Executor.help("executor"), choices=EXECUTORS)
    ray_address: str | None = field(None, Executor.help("ray_address"), metavar="ADDRESS")
    jobs: int | None = field(None, Executor.help("jobs"), metavar="N")
    keep_point_checkpoints: bool = field(False, "keep every chunk's checkpoints after its points are recorded")

    def __post_init__(self):
        check_types(self)
        if not self.lmp_tolerance >= 0:
            raise SettingError("lmp_tolerance", f"must be a number >= 0 (0.10 = 10 %), got {self.lmp_tolerance!r}")
        if self.n_bootstrap < 0:
            raise SettingError("n_bootstrap", f"must be an integer >= 0, got {self.n_bootstrap!r}")
        for name in ("dev_max_pairs", "max_points", "grid_chunk", "jobs"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise SettingError(name, f"must be an integer >= 1, got {v!r}")
        for name, allowed in (("final", FINALS), ("executor", EXECUTORS)):
            if getattr(self, name) not in allowed:
                raise SettingError(name, f"must be {', '.join(allowed[:-1])} or {allowed[-1]}, "
                                         f"got {getattr(self, name)!r}")

    def replace(self, **changes) -> SweepConfig:
        """A copy with ``changes`` (checked again).

        Raises:
            TypeError: a name that is not a sweep setting.
        """
        return replace_settings(self, "sweep", **changes)
