"""Finding the WSGI application named on the command line.

A spec is ``MODULE`` or ``MODULE:CALLABLE``. MODULE is a dotted module name; CALLABLE is a
(possibly dotted) attribute of it, ``application`` when omitted, and may end in ``()`` to name
a factory that is called with no arguments to make the application (``myapp:create_app()``).

Every failure is an `AppLoadError` whose message is one line that says what went wrong and
where, never a traceback: it travels to the operator's terminal through the lobby.
"""

from __future__ import annotations

import difflib
import importlib
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType, TracebackType

DEFAULT_CALLABLE = "application"

_DOTTED_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


class AppLoadError(Exception):
    """The application could not be loaded; str(error) is one line for the operator."""


@dataclass(frozen=True)
class AppSpec:
    module: str
    attribute: str
    """Dotted attribute path within the module."""
    factory: bool
    """The attribute is called with no arguments, and its result is the application."""

    def __str__(self) -> str:
        return f"{self.module}:{self.attribute}{'()' if self.factory else ''}"


def parse_spec(spec: str) -> AppSpec:
    """Checks the syntax of `spec`; raises AppLoadError naming the problem."""
    module, colon, attribute = spec.partition(":")
    if not colon:
        attribute = DEFAULT_CALLABLE
    factory = attribute.endswith("()")
    if factory:
        attribute = attribute[: -len("()")]
    if "/" in module or (module.endswith(".py") and os.path.isfile(module)):
        directory = os.path.dirname(module) or "."
        name = os.path.basename(module).removesuffix(".py")
        raise AppLoadError(
            f"{spec!r} is a file path; name its module instead: --chdir {directory} {name}{spec[len(module) :]}"
        )
    if not _DOTTED_NAME.fullmatch(module):
        raise AppLoadError(f"{spec!r} is not MODULE[:CALLABLE]: {module!r} is not a dotted module name")
    if not _DOTTED_NAME.fullmatch(attribute):
        raise AppLoadError(f"{spec!r} is not MODULE[:CALLABLE]: {attribute!r} is not a Python name")
    return AppSpec(module, attribute, factory)


def load_app(spec: str) -> Callable[..., object]:
    """Imports the application named by `spec`, searching the current directory first (the
    CLI has already changed to --chdir). Raises AppLoadError."""
    parsed = parse_spec(spec)
    directory = os.getcwd()
    if directory not in sys.path:
        sys.path.insert(0, directory)
    module = _import(parsed.module, directory)
    target: object = module
    walked = parsed.module
    for name in parsed.attribute.split("."):
        try:
            target = getattr(target, name)
        except AttributeError as error:
            message = _missing_attribute_message(target, walked, name, module)
            raise AppLoadError(message) from error
        except Exception as error:  # a property or a module __getattr__ of the application
            raise AppLoadError(f"getting {walked}.{name} raised {_describe(error)}") from error
        walked = f"{walked}.{name}"
    if parsed.factory:
        if not callable(target):
            raise AppLoadError(f"{parsed} calls {walked}, which is a {type(target).__name__}")
        try:
            target = target()
        except Exception as error:
            raise AppLoadError(f"calling {walked}() raised {_describe(error)}") from error
        walked = f"{walked}()"
    if not callable(target):
        raise AppLoadError(f"{walked} is a {type(target).__name__}, not a WSGI application (which is callable)")
    return target


def _import(name: str, directory: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name is not None and _is_same_or_parent(error.name, name):
            raise AppLoadError(
                f"no module named {error.name!r} (looked in {directory} first, then sys.path)"
            ) from error
        raise AppLoadError(f"importing {name} raised {_describe(error)}") from error
    except SyntaxError as error:
        # Its own message names the file without its directory ("invalid syntax (app.py, line
        # 3)"); the broken file may be any module the application imports, so give its path.
        where = f" ({error.filename}, line {error.lineno})" if error.filename else ""
        raise AppLoadError(f"importing {name} raised {type(error).__name__}: {error.msg}{where}") from error
    except SystemExit as error:
        raise AppLoadError(f"importing {name} called sys.exit({error.code!r})") from error
    except Exception as error:
        raise AppLoadError(f"importing {name} raised {_describe(error)}") from error


def _is_same_or_parent(found: str, wanted: str) -> bool:
    return wanted == found or wanted.startswith(found + ".")


def _missing_attribute_message(target: object, walked: str, name: str, module: ModuleType) -> str:
    where = f"module {walked}" if target is module else walked
    location = getattr(module, "__file__", None)
    message = f"{where} has no attribute {name!r}"
    if location:
        message += f" ({location})"
    candidates = [n for n in dir(target) if not n.startswith("_")]
    close = difflib.get_close_matches(name, candidates, n=1)
    if name == DEFAULT_CALLABLE and "app" in candidates:
        close = ["app"]
    if close:
        message += f"; did you mean {close[0]!r}?"
    return message


def _describe(error: BaseException) -> str:
    """'Type: message (file, line N)' on one line; the place is the innermost frame."""
    text = type(error).__name__
    message = " ".join(str(error).split())
    if message:
        text += f": {message}"
    place = _innermost_frame(error.__traceback__)
    if place is not None:
        text += f" ({place[0]}, line {place[1]})"
    return text


def _innermost_frame(traceback: TracebackType | None) -> tuple[str, int] | None:
    """The file and line where the exception was raised, skipping the import machinery."""
    place = None
    while traceback is not None:
        filename = traceback.tb_frame.f_code.co_filename
        if not filename.startswith("<frozen "):
            place = (filename, traceback.tb_lineno)
        traceback = traceback.tb_next
    return place
