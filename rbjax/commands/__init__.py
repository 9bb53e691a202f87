"""The subcommands of the ``rbjax`` command, one module each (``register(subparsers)``), and what they share."""
from __future__ import annotations

import argparse


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows ``(default: X)`` only where there is a real default not already spelled out in the help."""

    def _get_help_string(self, action):
        h = action.help or ""
        if not h or "default" in h.lower() or action.default is None or action.default is False \
                or action.default == argparse.SUPPRESS:
            return h
        return super()._get_help_string(action)


class CLIError(Exception):
    """An error the user can fix; printed without a traceback."""
