"""The command line: maitred's argument parser, made from the settings table (`build_parser`)
and gunicorn's flags that maitred ignores (maitred.gunicorn's table), and words read with it
(`_parse_arguments`: the command line's, or MAITRED_CMD_ARGS's).
`ArgumentParser` and `argument_type` serve `maitred top` too.

May import: table.py and usage.py (and maitred.gunicorn, to name gunicorn's flags).
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Callable
from typing import NoReturn

from maitred import __version__, gunicorn
from maitred.config.table import SETTINGS
from maitred.config.usage import APP_METAVAR, UsageError


class ArgumentParser(argparse.ArgumentParser):
    """An argument parser whose errors are UsageError, so that the CLI prints one line."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def argument_type(parse: Callable[[str], object], name: str) -> Callable[[str], object]:
    """A value parser (text -> value, raising ValueError) as an argparse type: argparse prints
    a parser's own message only when it raises ArgumentTypeError."""

    def convert(text: str) -> object:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    convert.__name__ = name
    return convert


# The parsed arguments' key for the warnings about gunicorn's flags that maitred ignores.
_IGNORED_FLAGS = "ignored gunicorn flags"


class _IgnoredGunicornFlag(argparse.Action):
    """A gunicorn flag that maitred ignores, as a config file's setting of it is: taken (with its
    value, if it has one) and named in a warning, unless its value asks for nothing more."""

    def __init__(
        self, option_strings: list[str], dest: str, theirs: gunicorn.GunicornSetting, default: object = None
    ) -> None:
        nargs = 0 if theirs.flag_sets is not None else None
        super().__init__(option_strings, dest, nargs=nargs, default=default, help=argparse.SUPPRESS)
        self.theirs = theirs

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        value = self.theirs.flag_sets if self.nargs == 0 else values
        if gunicorn.asks_nothing_more(self.theirs, value):
            return
        line = f"{option_string} (gunicorn's {self.theirs.name}) is ignored: {self.theirs.why}"
        setattr(namespace, self.dest, [*getattr(namespace, self.dest, []), line])


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="maitred",
        usage=f"maitred [OPTIONS] {APP_METAVAR}",
        description="Serve a WSGI application. The application is the callable CALLABLE "
        "(default: application) of the Python module MODULE, e.g. myproject.wsgi:application.",
        epilog="Signals: SIGTERM or SIGINT stops gracefully (requests in progress finish, up to "
        "--graceful-timeout); SIGQUIT stops at once; SIGHUP reloads the application and the config file; "
        "SIGUSR1 reopens the log files; SIGTTIN and SIGTTOU add and remove a worker. gunicorn's flags that "
        "maitred cannot honour are taken with a warning saying why (docs/GUNICORN.md).",
        allow_abbrev=False,
        argument_default=argparse.SUPPRESS,
        formatter_class=lambda prog: argparse.HelpFormatter(prog, max_help_position=36),
    )
    parser.add_argument("app", nargs="?", metavar=APP_METAVAR, help=argparse.SUPPRESS)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for setting in SETTINGS:
        if setting.hook:
            continue  # a function, given in a config file only
        if setting.section not in groups:
            groups[setting.section] = parser.add_argument_group(setting.section)
        group = groups[setting.section]
        text = f"{setting.help} (default: {setting.shown_default})"
        if setting.is_flag:
            group.add_argument(*setting.flags, dest=setting.name, action="store_true", help=text)
        elif setting.const is not None:
            group.add_argument(
                *setting.flags,
                dest=setting.name,
                metavar=setting.metavar,
                type=argument_type(setting.parse, setting.name),
                nargs="?",
                const=setting.const,
                help=text,
            )
        else:
            group.add_argument(
                *setting.flags,
                dest=setting.name,
                metavar=setting.metavar,
                type=argument_type(setting.parse, setting.name),
                action="append" if setting.repeatable else "store",
                help=text,
            )
    for theirs in gunicorn.IGNORED_WITH_FLAGS:
        parser.add_argument(*theirs.flags, dest=_IGNORED_FLAGS, action=_IgnoredGunicornFlag, theirs=theirs)
    parser.add_argument(
        "--version",
        action="version",
        version=f"maitred {__version__}",
        help="Print the version and exit.",
    )
    return parser


def _parse_arguments(
    parser: argparse.ArgumentParser, words: list[str], where: str
) -> tuple[dict[str, object], list[str]]:
    """The settings the words give, by name, and the warnings for the gunicorn flags among them
    that maitred ignores. `where` prefixes every line: "" for the command line itself."""
    try:
        parsed, extra = parser.parse_known_args(words)
    except UsageError as error:
        raise UsageError(f"{where}{error}") from None
    if extra:
        raise UsageError(where + _unexpected_argument_message(parser, extra))
    values = vars(parsed)
    ignored = values.pop(_IGNORED_FLAGS, [])
    return values, [f"{where or 'command line: '}{line}" for line in ignored]


def _unexpected_argument_message(parser: argparse.ArgumentParser, extra: list[str]) -> str:
    """Names the first unknown option, or else the first surplus argument. (argparse lists
    them all, including the value that followed an unknown option.)"""
    for argument in extra:
        if argument.startswith("-") and argument != "-":
            option = argument.partition("=")[0]
            known = [flag for action in parser._actions for flag in action.option_strings]
            theirs = gunicorn.BY_FLAG.get(option)
            if theirs is not None and theirs.verdict is gunicorn.Verdict.REFUSED:
                return f"unknown option {option!r}: gunicorn's {theirs.name} is not supported: {theirs.why}"
            close = difflib.get_close_matches(option, known, n=1, cutoff=0.75)
            hint = f" (did you mean {close[0]}?)" if close else ""
            return f"unknown option {option!r}{hint}"
    return f"unexpected argument {extra[0]!r}: give one application, MODULE[:CALLABLE]"
