"""How the operator is told that the settings are wrong: `UsageError`, and the application's
notation in usage lines (`APP_METAVAR`).

May import: nothing of maitred (a leaf, so that every module of the package may import it).
"""

from __future__ import annotations

APP_METAVAR = "MODULE[:CALLABLE]"


class UsageError(Exception):
    """A setting is missing or malformed; str(error) is one line for the operator."""
