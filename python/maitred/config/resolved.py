"""The resolved settings (what `precedence.resolve` returns) and what is made of them: their
keys besides the settings (SOURCES, WARNINGS), the settings dict the lobby takes
(`lobby_settings`) and --print-config's text (`printed`).

May import: table.py (and maitred.privileges).
"""

from __future__ import annotations

from collections.abc import Mapping

from maitred import privileges
from maitred.config import table_tls
from maitred.config.table import SETTINGS

# Keys of the resolved settings besides the settings themselves.
SOURCES = "sources"
"""Where each setting's value came from, by name, for --print-config."""
WARNINGS = "warnings"
"""The config file's warnings (ConfigFile.warnings) and the command line's, for the log."""
NOTES = "notes"
"""Lines for the log at info level: what --workers auto read."""


def lobby_settings(settings: Mapping[str, object]) -> dict[str, object]:
    """The dict that maitred._native.serve takes: the lobby's settings and the app spec."""
    chosen = {s.name: settings[s.name] for s in SETTINGS if s.for_lobby}
    chosen["app"] = settings["app"]
    chosen["plain_binds"] = table_tls.plain_binds(settings["bind"])  # type: ignore[arg-type]
    wanted = privileges.credentials(settings)
    chosen["drop_to"] = wanted.as_lobby_setting() if wanted is not None else None
    return chosen


def printed(settings: Mapping[str, object]) -> str:
    """--print-config's output: one line per setting, ``name = value  # where it came from``,
    a config file's syntax, the application first."""
    sources = settings[SOURCES]
    assert isinstance(sources, dict)
    width = max(len(setting.name) for setting in SETTINGS)
    lines = [f"{'app':<{width}} = {settings['app']!r}  # {sources['app']}"]
    for setting in SETTINGS:
        value = setting.show(settings[setting.name])
        lines.append(f"{setting.name:<{width}} = {value}  # {sources[setting.name]}")
    return "\n".join(lines) + "\n"
