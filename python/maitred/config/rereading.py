"""The config file read again, for a reload (SIGHUP; docs/SIGNALS.md): the settings a reload
cannot change (KEPT_ON_RELOAD), and what the lobby calls to read the file again (`rereader`),
under the same layers as at start-up.

May import: every other module of the package (and maitred.log).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

from maitred import log
from maitred.config.command_line import _parse_arguments, build_parser
from maitred.config.config_file import read_config
from maitred.config.precedence import Layer, _complete, _layers_below_the_file, _merge
from maitred.config.resolved import lobby_settings
from maitred.config.service_manager import activated_sockets
from maitred.config.table import SETTINGS

# Settings a reload cannot change: they need new listeners, a new lobby or a new zygote (an
# upgrade). When the config file read again changes one, the log names it and it keeps its value.
KEPT_ON_RELOAD = (
    "bind",
    "backlog",
    "max_connections",
    "stats",
    "max_spill_total",
    "max_head_memory",
    "access_logfile",
    "error_logfile",
    "preload",
    "gc_freeze",
    "gc_threshold",
    "interface",
    "loop",
    "chdir",
    "env",
    "pid",
    "user",
    "group",
    "initgroups",
    "umask",
    "reload",
    "reload_extra_files",
    # A SIGHUP reads the TLS files again, from the paths given at start (docs/TLS.md).
    "certfile",
    "keyfile",
    "ca_certs",
    "cert_reqs",
    "ciphers",
)

Reread = Callable[[], tuple[dict[str, object], list[str]]]


def rereader(
    argv: Sequence[str], settings: Mapping[str, object], adopt: Callable[[Mapping[str, object]], None]
) -> Reread | None:
    """What the lobby calls to read the config file again for a reload: None when there is no
    config file. Call it where `resolve` was called, before --chdir is applied: it reads the
    command line and MAITRED_CMD_ARGS again, relative to the directory maitred was started in.
    `adopt` is given every setting of a file read without error (the lobby's server hooks among
    them)."""
    location = settings["config"]
    if location is None:
        return None
    assert isinstance(location, str)  # made absolute by _config_location, or python:MODULE
    parser = build_parser()
    command_line, _ = _parse_arguments(parser, list(argv), "")  # its warnings were logged at start
    command_line.pop("app", None)
    layers = _layers_below_the_file(parser, os.environ, command_line)
    started = dict(settings)
    return lambda: reread(location, layers.below, layers.above, started, adopt)


def reread(
    location: str,
    below: Sequence[Layer],
    above: Sequence[Layer],
    started: Mapping[str, object],
    adopt: Callable[[Mapping[str, object]], None],
) -> tuple[dict[str, object], list[str]]:
    """Reads the config file at `location` again and returns the lobby's new settings (as
    `lobby_settings` makes them) and the names of the settings in KEPT_ON_RELOAD that the file
    changes, which keep their values from `started`. MAITRED_CMD_ARGS and the command line
    (`above`) still override the file. Raises UsageError, with one line, when the file cannot
    be read or is wrong."""
    from_file = read_config(location)
    merged, sources = _merge([*below, ("config file", from_file.values), *above])
    # --workers auto counts again: a container's CPUs may have changed since the start (a
    # Kubernetes pod resized in place), and the log says what this reload read, as at start-up.
    for note in _complete(merged, sources):
        log.log("info", f"SIGHUP: {note}")
    settings = dict(started)
    settings.update({s.name: merged[s.name] for s in SETTINGS if s.file_settable})
    try:
        activated = activated_sockets(os.environ)
    except ValueError:
        activated = []
    if activated:
        # Socket activation replaces every bind, as `resolve` does: the file's do not count.
        settings["bind"] = activated
    kept = [name for name in KEPT_ON_RELOAD if settings[name] != started[name]]
    for name in kept:
        settings[name] = started[name]
    adopt(settings)
    return lobby_settings(settings), kept
