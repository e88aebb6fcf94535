"""The Setting class: one row of the settings table (table.py), everything maitred knows of
one setting: its name, flags, parser, default, help, and who receives it.

May import: nothing of maitred (a leaf).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Setting:
    section: str
    """The heading it is listed under in --help."""
    name: str
    """The config-file name and the key in the resolved settings."""
    flags: tuple[str, ...]
    metavar: str | None
    """None for an on/off flag, which takes no value."""
    parse: Callable[[Any], object] | None
    """Text -> value; for a hook, the config file's function -> the function to call."""
    default: object
    help: str
    default_text: str | None = None
    """How the default reads in --help and the README, when str(default) would not say it."""
    repeatable: bool = False
    """Each use of the flag adds a value; the setting is a list."""
    for_lobby: bool = True
    """The lobby (maitred._native.serve) receives this setting."""
    file_settable: bool = True
    show: Callable[[object], str] = repr
    """How --print-config writes its value."""
    from_python: Callable[[object], object] | None = None
    """Checks a config file's value when it may be other than text (a dict, a list, a bool)."""
    const: str | None = None
    """The value of the flag given without one: its value is optional (``--proxy-protocol``)."""
    environ: str | None = None
    """The environment variable that, when set, gives the default, as under gunicorn."""
    hook: bool = False
    """A server hook (docs/HOOKS.md): a function, set only in a config file."""

    @property
    def is_flag(self) -> bool:
        return self.metavar is None

    @property
    def shown_default(self) -> str:
        if self.default_text is not None:
            return self.default_text
        if isinstance(self.default, tuple):
            return " ".join(self.default)
        if isinstance(self.default, float):
            return f"{self.default:g}"
        return str(self.default)
