"""maitred's settings: one table, read from the command line and from a config file.

This file is the package's public interface: the rest of maitred, its tests and the lobby (which
imports maitred.config and asks `bind_parts` for each address's parts) use the names below, as
``config.NAME``, and nothing else of the package. Its modules, each importing only modules
listed before it:

- usage.py: UsageError, and the application's notation in usage lines.
- values.py: the value parsers (text -> value), the --bind grammar among them.
- setting.py: the Setting class, one row of the table.
- table_listening.py, table_lobby.py, table_websockets.py, table_tls.py, table_process.py: the
  table's rows, those the lobby receives (listening's, WebSockets' and TLS's apart) and the
  others.
- table.py: the whole table, SETTINGS and BY_NAME, and the README's flag table made from it.
- command_line.py: the argument parser made from the table.
- config_file.py: reading a config file or config module.
- service_manager.py: socket activation's sockets, and the service manager's variables.
- resolved.py: the resolved settings' keys, the lobby's settings dict and --print-config's text.
- precedence.py: the layers (defaults, environment, config file, MAITRED_CMD_ARGS, command line),
  and `resolve`.
- rereading.py: the config file read again for a reload.

A name with a leading underscore in these modules is the package's own, shared among them.

May import: every module of the package, to re-export what the rest of maitred uses.
"""

from __future__ import annotations

from maitred.config.command_line import ArgumentParser, argument_type
from maitred.config.precedence import CMD_ARGS_VARIABLE, resolve
from maitred.config.rereading import Reread, rereader
from maitred.config.resolved import NOTES, SOURCES, WARNINGS, lobby_settings, printed
from maitred.config.service_manager import without_service_manager
from maitred.config.table import BY_NAME, SETTINGS, markdown_table
from maitred.config.usage import UsageError
from maitred.config.values import bind_parts, seconds

__all__ = [
    "BY_NAME",
    "CMD_ARGS_VARIABLE",
    "NOTES",
    "SETTINGS",
    "SOURCES",
    "WARNINGS",
    "ArgumentParser",
    "Reread",
    "UsageError",
    "argument_type",
    "bind_parts",
    "lobby_settings",
    "markdown_table",
    "printed",
    "rereader",
    "resolve",
    "seconds",
    "without_service_manager",
]
