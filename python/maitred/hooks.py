"""Server hooks: gunicorn's hook settings (``on_starting``, ``post_fork``, ``pre_request`` …),
called in the maitred process and at the moment docs/HOOKS.md gives for each.

A hook is a function set in a config file (``-c``). It is checked when the file is read: it
must take the number of arguments gunicorn passes it. Hooks get objects shaped like
gunicorn's, with the attributes hook code uses: a ``server`` (the arbiter: here the lobby),
a ``worker``, a ``req``, a ``resp``.

Where each runs: the lobby's (on_starting, when_ready, on_reload, nworkers_changed, child_exit,
pre_exec, on_exit) in the interpreter of the `maitred` command, which became the lobby, on a
thread of their own so that none can hold up the event loop; pre_fork in the zygote before its
fork; the others in the worker. A hook that raises has its traceback logged in one block, and
maitred carries on, except where gunicorn lets it stop the start: on_starting, when_ready and the
first nworkers_changed stop the server from starting, and post_fork or post_worker_init make the
worker fail to boot.
"""

from __future__ import annotations

import inspect
import os
import traceback
import types
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from maitred import log

# Each hook's arguments, by name, as gunicorn documents them.
ARGUMENTS: Mapping[str, tuple[str, ...]] = {
    "on_starting": ("server",),
    "on_reload": ("server",),
    "when_ready": ("server",),
    "pre_fork": ("server", "worker"),
    "post_fork": ("server", "worker"),
    "post_worker_init": ("worker",),
    "worker_int": ("worker",),
    "worker_abort": ("worker",),
    "pre_exec": ("server",),
    "pre_request": ("worker", "req"),
    "post_request": ("worker", "req", "environ", "resp"),
    "child_exit": ("server", "worker"),
    "worker_exit": ("server", "worker"),
    "nworkers_changed": ("server", "new_value", "old_value"),
    "on_exit": ("server",),
}

# post_request may leave out its last arguments, as under gunicorn: (worker, req) or
# (worker, req, environ) is called with those only.
_FEWEST_ARGUMENTS = {"post_request": 2}

Hook = Callable[..., object]


def checker(name: str) -> Callable[[object], Hook]:
    """The parser of hook setting `name`: takes the config file's value and returns the
    function to call with all of ARGUMENTS[name], or raises ValueError saying what is wrong."""
    arguments = ARGUMENTS[name]
    fewest = _FEWEST_ARGUMENTS.get(name, len(arguments))

    def check(value: object) -> Hook:
        if not callable(value):
            # ValueError, as for every other bad value: the caller makes each into one usage line.
            raise ValueError(f"expected a function of ({', '.join(arguments)}), got {value!r}")  # noqa: TRY004
        try:
            signature = inspect.signature(value)
        except (TypeError, ValueError):
            return value  # a builtin that does not say: it is called as it is
        for count in range(len(arguments), fewest - 1, -1):
            try:
                signature.bind(*arguments[:count])
            except TypeError:
                continue
            if count == len(arguments):
                return value
            return lambda *given: value(*given[:count])
        taking = " or ".join(f"({', '.join(arguments[:count])})" for count in range(fewest, len(arguments) + 1))
        raise ValueError(f"the function must take {taking}, but its signature is {signature}")

    return check


class Log:
    """The `log` of a server or worker: gunicorn's logger methods, writing to maitred's error
    log. Messages are formatted with %-style arguments, as the logging module does."""

    def debug(self, message: object, *args: object, **options: object) -> None:
        self._log("debug", message, args, options)

    def info(self, message: object, *args: object, **options: object) -> None:
        self._log("info", message, args, options)

    def warning(self, message: object, *args: object, **options: object) -> None:
        self._log("warning", message, args, options)

    def error(self, message: object, *args: object, **options: object) -> None:
        self._log("error", message, args, options)

    def critical(self, message: object, *args: object, **options: object) -> None:
        self._log("critical", message, args, options)

    def exception(self, message: object, *args: object, **options: object) -> None:
        self._log("error", message, args, {"exc_info": True, **options})

    def log(self, level: int, message: object, *args: object, **options: object) -> None:
        """`level` is a logging module level (logging.INFO …)."""
        names = ((50, "critical"), (40, "error"), (30, "warning"), (20, "info"))
        name = next((name for floor, name in names if level >= floor), "debug")
        self._log(name, message, args, options)

    @staticmethod
    def _log(level: str, message: object, args: tuple[object, ...], options: Mapping[str, object]) -> None:
        text = str(message) % args if args else str(message)
        if options.get("exc_info"):
            trace = traceback.format_exc().rstrip()
            if trace != "NoneType: None":
                text += "\n" + trace
        log.log(level, text)


def settings_view(settings: Mapping[str, object]) -> types.SimpleNamespace:
    """The `cfg` of a server or worker: every setting as an attribute (cfg.workers, cfg.bind …)."""
    return types.SimpleNamespace(**settings)


class Server:
    """The `server` argument: gunicorn's arbiter, which in maitred is the lobby. `pid` is the
    lobby's in every process; `num_workers` the number of workers the lobby keeps serving."""

    def __init__(self, pid: int, num_workers: int, cfg: types.SimpleNamespace) -> None:
        self.pid = pid
        self.num_workers = num_workers
        self.cfg = cfg
        self.log = Log()


class Worker:
    """The `worker` argument. `age` counts the workers started, from 1, as gunicorn's does;
    `ppid` is the zygote's pid, the process that forked it; `pid` is None until it is forked."""

    def __init__(self, age: int, ppid: int, cfg: types.SimpleNamespace, pid: int | None = None) -> None:
        self.age = age
        self.pid = pid
        self.ppid = ppid
        self.cfg = cfg
        self.alive = True
        self.log = Log()

    def __str__(self) -> str:
        return f"<Worker {self.pid}>"


class Request:
    """The `req` of pre_request and post_request, made from the request's environ: `headers`
    are (NAME, value) pairs with upper-case names, as gunicorn gives them."""

    def __init__(self, environ: Mapping[str, Any]) -> None:
        self.method = environ["REQUEST_METHOD"]
        self.uri = environ["RAW_URI"]
        # A target that starts with "//" is a path, not an authority (as gunicorn reads it).
        self.path = urlsplit("." + self.uri).path[1:] if self.uri.startswith("//") else urlsplit(self.uri).path
        self.query = environ["QUERY_STRING"]
        self.version = (1, 0) if environ["SERVER_PROTOCOL"] == "HTTP/1.0" else (1, 1)
        self.scheme = environ["wsgi.url_scheme"]
        address = environ["REMOTE_ADDR"]
        self.remote_addr = (address, int(environ["REMOTE_PORT"])) if "REMOTE_PORT" in environ else address
        self.headers = [
            (key[5:].replace("_", "-"), value) if key.startswith("HTTP_") else (key.replace("_", "-"), value)
            for key, value in environ.items()
            if key.startswith("HTTP_") or key in ("CONTENT_TYPE", "CONTENT_LENGTH")
        ]


class Response:
    """The `resp` of post_request: what was answered. `status` is the status line's text
    ("200 OK"), `status_code` its number, `headers` the application's (name, value) pairs (none
    when maitred answered 500 in the application's place)."""

    def __init__(self) -> None:
        self.status: str | None = None
        self.status_code: int | None = None
        self.headers: list[tuple[str, str]] = []

    def started(self, status: str, headers: list[tuple[str, str]]) -> None:
        """The application called start_response (which checked both)."""
        self.status = status
        self.headers = list(headers)

    def answered(self, code: int, reason: str) -> None:
        """The status that went out: the application's, or maitred's 500. Code 0: nothing
        went out (SIGABRT or SIGQUIT made the worker leave first)."""
        if code == 0:
            return
        status = f"{code} {reason}"
        if status != self.status:
            self.headers = []
        self.status = status
        self.status_code = code


def call(name: str, hook: Hook | None, *args: object) -> bool:
    """Calls `hook` if it is set; returns False when it raised, after logging its traceback in
    one block."""
    if hook is None:
        return True
    try:
        hook(*args)
    except Exception:  # noqa: BLE001 - the operator's code: logged, and maitred carries on
        log.log("error", f"the {name} hook raised:\n{traceback.format_exc().rstrip()}")
        return False
    return True


def summary(name: str) -> str:
    """One line for a start or a boot stopped by hook `name`."""
    return f"the {name} hook raised an exception (its traceback is in the error log)"


def configured(settings: Mapping[str, object]) -> bool:
    return any(settings.get(name) is not None for name in ARGUMENTS)


class LobbyHooks:
    """The hooks of the lobby's process: the CLI calls on_starting, the first nworkers_changed
    and on_exit; the lobby (Rust) calls the others on a thread of its own, through the methods
    below, each returning whether the hook succeeded. A reload's config file replaces them."""

    def __init__(self, settings: Mapping[str, object]) -> None:
        workers = settings["workers"]
        assert isinstance(workers, int)
        self.server = Server(os.getpid(), workers, settings_view(settings))
        self._settings = settings

    @property
    def names(self) -> frozenset[str]:
        """The hooks set."""
        return frozenset(name for name in ARGUMENTS if self._settings.get(name) is not None)

    def adopt(self, settings: Mapping[str, object]) -> None:
        """A reload read the config file again: its hooks and settings from now on."""
        self._settings = settings
        self.server.cfg = settings_view(settings)

    def _call(self, name: str, *args: object) -> bool:
        hook = self._settings.get(name)
        assert hook is None or callable(hook)
        return call(name, hook, self.server, *args)

    def on_starting(self) -> bool:
        return self._call("on_starting")

    def when_ready(self) -> bool:
        return self._call("when_ready")

    def on_reload(self) -> bool:
        return self._call("on_reload")

    def pre_exec(self) -> bool:
        return self._call("pre_exec")

    def on_exit(self) -> bool:
        return self._call("on_exit")

    def nworkers_changed(self, new: int, old: int | None) -> bool:
        self.server.num_workers = new
        return self._call("nworkers_changed", new, old)

    def child_exit(self, pid: int, age: int, ppid: int) -> bool:
        worker = Worker(age, ppid, self.server.cfg, pid)
        worker.alive = False
        return self._call("child_exit", worker)


class WorkerHooks:
    """The hooks of the zygote and its workers, as the config file was when the zygote read it.
    The zygote keeps `server` up to date with the number of workers the lobby wants."""

    def __init__(self, settings: Mapping[str, object]) -> None:
        workers = settings["workers"]
        assert isinstance(workers, int)
        self.cfg = settings_view(settings)
        # The zygote's parent is the lobby: the CLI forked it, or the lobby started it (a
        # reload with --preload).
        self.server = Server(os.getppid(), workers, self.cfg)
        self.hooks = {name: settings.get(name) for name in ARGUMENTS}

    def get(self, name: str) -> Hook | None:
        hook = self.hooks[name]
        assert hook is None or callable(hook)
        return hook

    @property
    def around_requests(self) -> bool:
        return self.hooks["pre_request"] is not None or self.hooks["post_request"] is not None
