"""Errors that name the setting the caller got wrong.

:class:`SettingError` carries the *Python* name of a setting (a dataclass field or keyword argument, e.g.
``batch_size``) and what is wrong with its value. The Python API shows it as is ("batch_size must be >= 1, got 0");
the command line shows the flag the user wrote instead ("--batch-size must be >= 1, got 0", :func:`rbjax.cli.main`
maps every option's destination back to its flag), and a study file its file, section and key.
"""
from __future__ import annotations

__all__ = ["SettingError"]


class SettingError(ValueError):
    """A bad value of one setting.

    Attributes:
        field: the setting's Python name (``batch_size``, ``learning_rate``).
        problem: what is wrong, after the name ("must be >= 1, got 0"), or a whole sentence with ``{name}`` where
            the setting is named ("...; pass {name} to plot them anyway").
    """

    def __init__(self, field: str, problem: str):
        self.field = field
        self.problem = problem if "{name}" in problem else "{name} " + problem
        super().__init__(self.renamed(field))

    def renamed(self, name: str) -> str:
        """The message with ``name`` (a flag, a study file's key) where the setting is named."""
        return self.problem.replace("{name}", name)
