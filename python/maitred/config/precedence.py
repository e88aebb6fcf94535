"""Precedence between the layers a setting may come from, as gunicorn's: built-in default (or
what WEB_CONCURRENCY and PORT say, or a setting's own environment variable) < config file
(-c, or ./maitred.conf.py) < MAITRED_CMD_ARGS < command line; `resolve` reads every layer and
returns the resolved settings.

May import: every other module of the package but rereading.py (and maitred.app and maitred.cpus).
"""

from __future__ import annotations

import argparse
import os
import pwd
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from maitred import cpus
from maitred.app import AppLoadError, parse_spec
from maitred.config import table_tls
from maitred.config.command_line import _parse_arguments, build_parser
from maitred.config.config_file import ConfigFile, read_config
from maitred.config.resolved import NOTES, SOURCES, WARNINGS
from maitred.config.service_manager import activated_sockets
from maitred.config.setting import Setting
from maitred.config.table import BY_NAME, SETTINGS
from maitred.config.usage import APP_METAVAR, UsageError
from maitred.config.values import WORKERS_AUTO, _bind_address, _config_location

# Read like gunicorn's GUNICORN_CMD_ARGS: command-line arguments, split as a shell would.
CMD_ARGS_VARIABLE = "MAITRED_CMD_ARGS"

# Read from the current directory when no config file is named, as gunicorn reads
# ./gunicorn.conf.py.
DEFAULT_CONFIG_FILE = "maitred.conf.py"


def resolve(argv: Sequence[str], upgrading: bool = False) -> dict[str, object]:
    """Every setting's value, by name, plus "app", SOURCES and WARNINGS: defaults (or
    WEB_CONCURRENCY and PORT), then the config file, then MAITRED_CMD_ARGS, then the command
    line. Raises UsageError; --help and --version print and exit. `upgrading`: this maitred
    was started by a binary upgrade (SIGUSR2), and inherits socket activation's sockets from
    the one it replaces."""
    parser = build_parser()
    command_line, flag_warnings = _parse_arguments(parser, list(argv), "")
    app = command_line.pop("app", None)
    layers = _layers_below_the_file(parser, os.environ, command_line)
    location = layers.config_location
    config_file = read_config(location) if location is not None else ConfigFile()
    file_origin = f"config file {location}"
    if location is not None and location.startswith("python:"):
        file_origin = f"config module {location[len('python:') :]}"
    app_origin = "command line"
    if app is None:
        app, app_origin = config_file.app, f"{file_origin} (wsgi_app)"
    if app is None:
        raise UsageError(f"no application given: maitred [OPTIONS] {APP_METAVAR}")
    try:
        parse_spec(app)
    except AppLoadError as error:
        raise UsageError(str(error)) from None
    settings, sources = _merge([*layers.below, (file_origin, config_file.values), *layers.above])
    sources["app"] = app_origin
    notes = _complete(settings, sources)
    try:
        activated = activated_sockets(os.environ, upgrading)
    except ValueError as error:
        raise UsageError(f"socket activation: {error}") from None
    if activated:
        settings["bind"] = activated
        sources["bind"] = "LISTEN_FDS (socket activation)"
    duplicates = sorted({b for b in settings["bind"] if settings["bind"].count(b) > 1})
    if duplicates:
        raise UsageError(f"address given twice: {', '.join(duplicates)}")
    if settings["stats"] is not None and settings["stats"] in settings["bind"]:
        raise UsageError(f"--stats {settings['stats']} is also an application address (--bind): give it one of its own")
    if settings["reload_extra_files"] and not settings["reload"]:
        raise UsageError("--reload-extra-file is given without --reload, which it needs")
    try:
        table_tls.check(settings)
    except ValueError as error:
        raise UsageError(str(error)) from None
    settings["app"] = app
    settings[SOURCES] = sources
    settings[NOTES] = notes
    settings[WARNINGS] = [*config_file.warnings, *layers.warnings, *flag_warnings, *_deprecated(settings, sources)]
    return settings


def _deprecated(settings: Mapping[str, object], sources: Mapping[str, str]) -> list[str]:
    """One line for each setting given that no longer does anything, naming where it was given."""
    if settings.get("websocket_seats") is None:
        return []
    origin = sources.get("websocket_seats", "the command line")
    line = (
        f"{origin}: --websocket-seats is deprecated and does nothing: an ASGI worker's open WebSockets hold no "
        "seat, and a handshake waits in the one queue as any request does (docs/TUNING.md, WebSockets)"
    )
    return [line]


Layer = tuple[str, Mapping[str, object]]
"""Where some settings came from, and their values by name."""


@dataclass
class _Layers:
    below: list[Layer]
    """Under the config file: what the environment says the defaults are."""
    above: list[Layer]
    """Over the config file: MAITRED_CMD_ARGS, then the command line."""
    config_location: str | None
    warnings: list[str]
    """MAITRED_CMD_ARGS's, for the gunicorn flags in it that maitred ignores."""


def _layers_below_the_file(
    parser: argparse.ArgumentParser, environ: Mapping[str, str], command_line: Mapping[str, object]
) -> _Layers:
    """Everything but the config file, and where the config file is: -c on the command line,
    else -c in MAITRED_CMD_ARGS, else ./maitred.conf.py if there is one (as gunicorn)."""
    below: list[Layer] = []
    concurrency = environ.get("WEB_CONCURRENCY")
    if concurrency is not None:
        try:
            below.append(("WEB_CONCURRENCY", {"workers": BY_NAME["workers"].parse(concurrency)}))
        except ValueError as error:
            raise UsageError(f"WEB_CONCURRENCY: {error}") from None
    port = environ.get("PORT")
    if port is not None:
        try:
            below.append(("PORT", {"bind": [_bind_address(f"0.0.0.0:{port}")]}))
        except ValueError as error:
            raise UsageError(f"PORT: {error}") from None
    from_variable: dict[str, object] = {}
    warnings: list[str] = []
    if CMD_ARGS_VARIABLE in environ:
        try:
            words = shlex.split(environ[CMD_ARGS_VARIABLE])
        except ValueError as error:
            raise UsageError(f"{CMD_ARGS_VARIABLE}: {error}") from None
        from_variable, warnings = _parse_arguments(parser, words, f"{CMD_ARGS_VARIABLE}: ")
        if "app" in from_variable:
            raise UsageError(
                f"{CMD_ARGS_VARIABLE}: unexpected argument {from_variable['app']!r}: give the application on the "
                "command line"
            )
    above: list[Layer] = [(CMD_ARGS_VARIABLE, from_variable), ("command line", command_line)]
    location = command_line.get("config", from_variable.get("config"))
    if location is None and os.path.isfile(DEFAULT_CONFIG_FILE):
        location = _config_location(DEFAULT_CONFIG_FILE)
        below.append((f"./{DEFAULT_CONFIG_FILE} in the working directory", {"config": location}))
    assert location is None or isinstance(location, str)
    return _Layers(below, above, location, warnings)


def _merge(layers: Sequence[Layer]) -> tuple[dict[str, object], dict[str, str]]:
    """Each setting's value from the last layer that has it, else its default."""
    settings: dict[str, object] = {}
    sources: dict[str, str] = {}
    for setting in SETTINGS:
        value = default(setting)
        source = setting.environ if setting.environ is not None and setting.environ in os.environ else "default"
        for where, values in layers:
            if setting.name in values:
                value, source = values[setting.name], where
        settings[setting.name] = list(value) if setting.repeatable else value
        sources[setting.name] = source
    return settings, sources


def _complete(settings: dict[str, object], sources: dict[str, str]) -> list[str]:
    """Fills in what a setting implies: --workers auto means one per CPU maitred may use, and
    --user without --group the user's primary group (not the group maitred was started as,
    which is root's). Returns the lines saying what --workers auto read, for the log."""
    notes = []
    if settings["workers"] == WORKERS_AUTO:
        try:
            available = cpus.available()
        except (OSError, ValueError) as error:
            raise UsageError(f"--workers auto cannot count the CPUs: {error}") from None
        settings["workers"] = available.count
        sources["workers"] += f" (auto: {available.reading})"
        notes.append(f"--workers auto: {available.count}, for {available.reading}")
    user, group = settings["user"], settings["group"]
    if user is None or group is not None:
        return notes
    assert isinstance(user, int)
    try:
        entry = pwd.getpwuid(user)
    except KeyError:
        raise UsageError(
            f"--user {user} is in no user database, so it has no primary group: give --group too"
        ) from None
    settings["group"] = entry.pw_gid
    sources["group"] = f"the primary group of user {entry.pw_name}"
    return notes


def default(setting: Setting) -> object:
    """A setting's default: its environment variable's value when it has one that is set."""
    text = os.environ.get(setting.environ) if setting.environ is not None else None
    if text is None:
        return setting.default
    assert setting.parse is not None
    try:
        return setting.parse(text)
    except ValueError as error:
        raise UsageError(f"{setting.environ} (the default of {setting.flags[-1]}): {error}") from None
