"""The settings table's rows the lobby does not receive (`for_lobby=False`): the workers'
garbage collector, what the maitred command does with its processes (process), the workers' own
output (logging), --reload (development) and the server hooks, which are functions given in a
config file. table.py puts them after table_lobby.py's.

May import: setting.py, values.py, maitred.capture and maitred.hooks.
"""

from __future__ import annotations

from maitred import capture, hooks
from maitred.config.setting import Setting
from maitred.config.values import (
    _boolean,
    _boolean_value,
    _config_location,
    _environment_pair,
    _existing_directory,
    _existing_file,
    _file_path,
    _group,
    _umask,
    _user,
    _whole_number,
    one_of,
)


def _capture_output_value(value: object) -> str:
    """A config file's capture_output: a choice, or True and False, as gunicorn takes it."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return one_of(*capture.CHOICES)(value)
    raise ValueError(f"expected one of {', '.join(capture.CHOICES)}, True or False, got {value!r}")


ROWS: tuple[Setting, ...] = (
    Setting(
        "workers",
        "gc_freeze",
        ("--gc-freeze",),
        "BOOL",
        _boolean,
        True,
        "Once a worker has imported the application, move every object the import made out of the garbage "
        "collector's sight (gc.freeze), so that its full collections skip them and, with --preload, do not "
        "copy the zygote's pages (docs/TUNING.md, Garbage collection). false: leave them to the collector.",
        default_text="true",
        from_python=_boolean_value,
        for_lobby=False,
    ),
    Setting(
        "workers",
        "gc_threshold",
        ("--gc-threshold",),
        "INT",
        _whole_number(1, 1_000_000),
        2000,
        "The garbage collector's first threshold in each worker (gc.set_threshold): how many more objects "
        "may be alive than at its last collection before it collects the youngest. A worker takes requests "
        "in batches, whose objects swing that count past Python's 700 with nothing to collect "
        "(docs/TUNING.md, Garbage collection). An application that sets its own at its import keeps it.",
        for_lobby=False,
    ),
    Setting(
        "process",
        "chdir",
        ("--chdir",),
        "DIR",
        _existing_directory,
        None,
        "Change to this directory before loading the application, and look for its module there first.",
        default_text="the current directory",
        for_lobby=False,
    ),
    Setting(
        "process",
        "env",
        ("-e", "--env"),
        "KEY=VALUE",
        _environment_pair,
        (),
        "Set an environment variable for the application. Repeatable.",
        default_text="none",
        repeatable=True,
        for_lobby=False,
    ),
    Setting(
        "process",
        "pid",
        ("-p", "--pid"),
        "FILE",
        _file_path,
        None,
        "Write the server's process id to this file, and remove it at exit.",
        default_text="none",
        for_lobby=False,
    ),
    Setting(
        "process",
        "user",
        ("-u", "--user"),
        "USER",
        _user,
        None,
        "Run as this user (name or number) once the listen sockets are bound: the lobby, the zygote and the "
        "workers. maitred must be started as root (docs/GUNICORN.md, Privileges).",
        default_text="the user maitred is started as",
        for_lobby=False,
    ),
    Setting(
        "process",
        "group",
        ("-g", "--group"),
        "GROUP",
        _group,
        None,
        "Run as this group (name or number) once the listen sockets are bound.",
        default_text="--user's primary group, or the group maitred is started as",
        for_lobby=False,
    ),
    Setting(
        "process",
        "initgroups",
        ("--initgroups",),
        None,
        None,
        False,
        "With --user, also keep the supplementary groups the group database gives that user (otherwise "
        "--group is the only group).",
        default_text="off",
        for_lobby=False,
    ),
    Setting(
        "process",
        "umask",
        ("-m", "--umask"),
        "MASK",
        _umask,
        None,
        "File-mode mask of every process of maitred and of the application (0022, 0o027; a leading 0 means "
        "octal, as in gunicorn).",
        default_text="the one maitred is started with",
        for_lobby=False,
        show=lambda mask: "None" if mask is None else f"0o{mask:03o}",
    ),
    Setting(
        "process",
        "config",
        ("-c", "--config"),
        "FILE",
        _config_location,
        None,
        "Python file of settings, or python:MODULE: its module-level names are setting names (the Setting "
        "column of the README's table), and gunicorn's (docs/GUNICORN.md). MAITRED_CMD_ARGS and the command "
        "line override it.",
        default_text="./maitred.conf.py if there is one",
        for_lobby=False,
        file_settable=False,
    ),
    Setting(
        "process",
        "check_config",
        ("--check-config",),
        None,
        None,
        False,
        "Read the settings and load the application, then exit: 0 if both are right, 1 with one line saying "
        "what is wrong.",
        default_text="off",
        for_lobby=False,
    ),
    Setting(
        "process",
        "print_config",
        ("--print-config",),
        None,
        None,
        False,
        "Print every setting's value and where it came from, then exit.",
        default_text="off",
        for_lobby=False,
    ),
    Setting(
        "logging",
        "capture_output",
        ("--capture-output",),
        "WHEN",
        one_of(*capture.CHOICES),
        "auto",
        "The workers' standard output and error (print(), logging to stderr, C extensions) go to the error log "
        "as the application's lines, which the zygote forwards so that the application never waits for the "
        "log: yes (the flag alone), no, or auto, which captures unless the error log is a terminal.",
        for_lobby=False,
        const="yes",
        from_python=_capture_output_value,
    ),
    Setting(
        "development",
        "reload",
        ("--reload",),
        None,
        None,
        False,
        "For development only: when a source file of the application changes, new workers import it and "
        "take over, as on SIGHUP (docs/SIGNALS.md, --reload). Needs watchfiles: pip install 'maitred[reload]'.",
        default_text="off",
        for_lobby=False,
    ),
    Setting(
        "development",
        "reload_extra_files",
        ("--reload-extra-file",),
        "FILE",
        _existing_file,
        (),
        "With --reload, also reload when this file changes (a template, a data file). Repeatable.",
        default_text="none",
        repeatable=True,
        for_lobby=False,
    ),
    *(
        Setting(
            "server hooks",
            name,
            (),
            "FUNCTION",
            hooks.checker(name),
            None,
            f"Server hook: a function of ({', '.join(hooks.ARGUMENTS[name])}), called {when} (docs/HOOKS.md).",
            default_text="none",
            for_lobby=False,
            hook=True,
        )
        for name, when in (
            ("on_starting", "in the maitred command before the server starts"),
            ("when_ready", "in the lobby once every worker is ready"),
            ("on_reload", "in the lobby on SIGHUP, before the new workers start"),
            ("pre_fork", "in the zygote before it forks a worker"),
            ("post_fork", "in a new worker before it loads the application"),
            ("post_worker_init", "in a worker once it has loaded the application"),
            ("worker_int", "in a worker on SIGINT or SIGQUIT"),
            ("worker_abort", "in a worker on SIGABRT, which --timeout sends"),
            ("pre_exec", "in the lobby as SIGUSR2 starts a new maitred"),
            ("pre_request", "in a worker before each request"),
            ("post_request", "in a worker after each answer (the last two arguments may be left out)"),
            ("child_exit", "in the lobby when a worker has exited"),
            ("worker_exit", "in a worker as it exits"),
            ("nworkers_changed", "in the lobby when the number of workers changes"),
            ("on_exit", "in the maitred command once the server has stopped"),
        )
    ),
)
