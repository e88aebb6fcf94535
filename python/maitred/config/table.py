"""The settings table: every setting, one row each (`SETTINGS`), by name (`BY_NAME`), and the
README's table of flags made from it (`markdown_table`).

Each row gives the name (used in config files and as the key of the resolved settings), the
command-line flags, the parser that turns text into a value (values.py), the default and the
help. The argument parser (command_line.py), the config-file reader (config_file.py), --help
and the README's flag table are all made from these rows, so they cannot disagree.

May import: setting.py and the rows, table_listening.py, table_lobby.py, table_websockets.py,
table_tls.py and table_process.py.
"""

from __future__ import annotations

from collections.abc import Mapping

from maitred.config import table_listening, table_lobby, table_process, table_tls, table_websockets
from maitred.config.setting import Setting

SETTINGS: tuple[Setting, ...] = (
    *table_listening.ROWS,
    *table_lobby.ROWS,
    *table_websockets.ROWS,
    *table_tls.ROWS,
    *table_process.ROWS,
)

BY_NAME: Mapping[str, Setting] = {setting.name: setting for setting in SETTINGS}


def markdown_table() -> str:
    """The README's table of flags, made from SETTINGS."""
    rows = [
        "| Flag | Setting | Default | Meaning |",
        "|---|---|---|---|",
    ]
    for setting in SETTINGS:
        value = f"[{setting.metavar}]" if setting.const is not None else setting.metavar
        flags = ", ".join(f"`{flag}`" if setting.is_flag else f"`{flag} {value}`" for flag in setting.flags)
        if setting.hook:
            flags = "(config file only)"
        name = f"`{setting.name}`" if setting.file_settable else ""
        default = setting.default_text if setting.default_text is not None else f"`{setting.shown_default}`"
        help_text = setting.help.replace("|", "\\|")
        rows.append(f"| {flags} | {name} | {default} | {help_text} |")
    return "\n".join(rows)
