"""Reading a config file: a Python file run (-c PATH) or a config module imported
(-c python:MODULE), and the settings among its module-level names, checked with the table's
parsers. gunicorn's names are taken, ignored with a warning or refused, as gunicorn.py's table
says (docs/GUNICORN.md).

May import: setting.py, table.py and usage.py (and maitred.gunicorn).
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
import types
from collections.abc import Mapping
from dataclasses import dataclass, field

from maitred import gunicorn
from maitred.config.setting import Setting
from maitred.config.table import BY_NAME, SETTINGS
from maitred.config.usage import APP_METAVAR, UsageError

# The module name a config file runs as.
_CONFIG_MODULE = "__maitred_config__"


def _from_python(setting: Setting, value: object) -> object:
    """Checks a value given in a config file, with the same parser as the command line."""
    if setting.from_python is not None:
        return setting.from_python(value)
    if setting.is_flag:
        if not isinstance(value, bool):
            raise ValueError(f"expected True or False, got {value!r}")
        return value
    assert setting.parse is not None
    if setting.hook:
        return setting.parse(value)
    if value is None:
        if setting.default is None:
            return None
        raise ValueError("cannot be None")
    if setting.repeatable:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
            raise ValueError(f"expected a string or a list of strings, got {value!r}")
        return [setting.parse(item) for item in items]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        # ValueError, as for every other bad value: the caller makes each into one usage line.
        raise ValueError(f"expected {setting.metavar}, got a {type(value).__name__}: {value!r}")  # noqa: TRY004
    return setting.parse(str(value))


def _unknown_setting_message(origin: str, name: str) -> str:
    message = f"{origin}: unknown setting {name!r}"
    known = [s.name for s in SETTINGS if s.file_settable] + list(gunicorn.BY_NAME)
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    if close:
        return message + f" (did you mean {close[0]!r}?)"
    return message


@dataclass
class ConfigFile:
    """What a config file says: settings by maitred's names, checked and converted."""

    values: dict[str, object] = field(default_factory=dict)
    app: str | None = None
    """gunicorn's wsgi_app: the application, when the command line gives none."""
    warnings: list[str] = field(default_factory=list)
    """One line per gunicorn setting the file sets that maitred ignores, saying why."""


def read_config(location: str) -> ConfigFile:
    """Runs a config file (a path) or imports a config module (python:MODULE) and returns the
    settings it sets, checked and converted."""
    if location.startswith("python:"):
        module_name = location[len("python:") :]
        return _settings_from(f"config module {module_name}", vars(_import_config_module(module_name)), module_name)
    try:
        with open(location, "rb") as file:
            source = file.read()
    except OSError as error:
        raise UsageError(f"cannot read config file {location}: {error.strerror}") from None
    try:
        code = compile(source, location, "exec")
    except SyntaxError as error:
        raise UsageError(f"config file {location}, line {error.lineno}: {error.msg}") from None
    namespace: dict[str, object] = {"__file__": location, "__name__": _CONFIG_MODULE}
    try:
        exec(code, namespace)  # noqa: S102 - a config file is Python by design, as gunicorn's is
    except (Exception, SystemExit) as error:  # noqa: BLE001 - the operator's code: any failure is one line
        raise UsageError(f"config file {location} raised {_exception_summary(error)}") from None
    return _settings_from(f"config file {location}", namespace, _CONFIG_MODULE)


def _import_config_module(name: str) -> types.ModuleType:
    """Imports (or, for a reload, imports again) a config module, with the current directory
    searched first, as gunicorn's own directory is."""
    here = os.getcwd()
    added = here not in sys.path
    if added:
        sys.path.insert(0, here)
    try:
        loaded = sys.modules.get(name)
        return importlib.reload(loaded) if loaded is not None else importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name is not None and (name == error.name or name.startswith(error.name + ".")):
            raise UsageError(f"cannot import config module {name}: no module named {error.name!r}") from None
        raise UsageError(f"config module {name} raised {_exception_summary(error)}") from None
    except (Exception, SystemExit) as error:  # noqa: BLE001 - the operator's code: any failure is one line
        raise UsageError(f"config module {name} raised {_exception_summary(error)}") from None
    finally:
        if added:
            sys.path.remove(here)


def _settings_from(origin: str, namespace: Mapping[str, object], module_name: str) -> ConfigFile:
    """The settings among a config file's module-level names. maitred's names come first; a
    gunicorn name is taken, ignored with a warning or refused as docs/GUNICORN.md's table says."""
    found = ConfigFile()
    given_as: dict[str, str] = {}

    def take(name: str, value: object, written: str) -> None:
        if name in given_as:
            raise UsageError(f"{origin} sets both {given_as[name]!r} and {written!r}: keep one")
        given_as[name] = written
        try:
            found.values[name] = _from_python(BY_NAME[name], value)
        except ValueError as error:
            raise UsageError(f"{origin}: {written}: {error}") from None

    for name, value in namespace.items():
        setting = BY_NAME.get(name)
        # A hook may be imported from a module of the operator's (from myhooks import post_fork).
        if name.startswith("_") or (_is_imported(value, module_name) and not (setting is not None and setting.hook)):
            continue
        if setting is not None and setting.file_settable:
            take(name, value, name)
            continue
        theirs = gunicorn.BY_NAME.get(name)
        if theirs is None:
            raise UsageError(_unknown_setting_message(origin, name))
        if theirs.verdict is gunicorn.Verdict.MAPPED and theirs.target == "app":
            if not isinstance(value, str):
                raise UsageError(f"{origin}: {name}: expected {APP_METAVAR} as a string, got {value!r}")
            found.app = value
        elif theirs.verdict is gunicorn.Verdict.MAPPED:
            assert theirs.target is not None
            take(theirs.target, value, name)
        elif theirs.verdict is gunicorn.Verdict.SAME:
            # A name maitred knows but not from a config file: where the config file is.
            found.warnings.append(f"{origin}: {name} is ignored: it only has effect on the command line")
        elif theirs.verdict is gunicorn.Verdict.IGNORED and not gunicorn.asks_nothing_more(theirs, value):
            found.warnings.append(f"{origin}: {name} is ignored: {theirs.why}")
        elif theirs.verdict is gunicorn.Verdict.REFUSED and not gunicorn.asks_nothing_more(theirs, value):
            raise UsageError(f"{origin}: {name} cannot be honoured: {theirs.why}")
    return found


def _is_imported(value: object, module_name: str) -> bool:
    """A module, or a function or class imported by the config file (``from multiprocessing
    import cpu_count``), is not a setting. One defined in the file is checked like any other
    name, so that a misspelt server hook is reported instead of silently never called."""
    if isinstance(value, types.ModuleType):
        return True
    return callable(value) and getattr(value, "__module__", None) != module_name


def _exception_summary(error: BaseException) -> str:
    """'Type: message (line N)' on one line, N being the config file's line that raised."""
    summary = type(error).__name__
    message = " ".join(str(error).split())
    if message:
        summary += f": {message}"
    traceback = error.__traceback__
    line = None
    while traceback is not None:
        if traceback.tb_frame.f_code.co_name == "<module>":
            line = traceback.tb_lineno
        traceback = traceback.tb_next
    return summary + (f" (line {line})" if line is not None else "")
