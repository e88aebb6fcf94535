"""A worker: runs the WSGI application for one request at a time in each of its threads, as
the lobby sends them over each thread's channel (docs/PROTOCOL.md, sections 2 and 4).

The native `WorkerChannel` does all the per-request work that does not involve the
application: it decodes the request, builds the environ, checks what ``start_response`` is
given and frames the response. What is left here is PEP 3333's part that must run as Python:
calling the application, iterating what it returns, and always calling its ``close()``.
"""

from __future__ import annotations

import faulthandler
import functools
import gc
import io
import os
import signal
import stat
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from maitred import __version__, _native, asgi, hooks, reload
from maitred import log as error_log
from maitred._native import ChannelClosed, ChannelError, ClientDisconnected, WorkerChannel
from maitred.app import AppLoadError
from maitred.log import log
from maitred.wsgi import ErrorStream, FileWrapper

Application = Callable[..., Any]

# A worker's hooks and its `worker` argument, when the config file set hooks.
Hooked = tuple[hooks.WorkerHooks, hooks.Worker] | None

# The signals the lobby acts on (docs/SIGNALS.md). A Ctrl-C, a `systemctl stop` or a `kill` of
# the whole process group reaches every process of maitred; the zygote and the workers leave
# them to the lobby, which decides when a request may be abandoned and retires a worker by
# closing its channel. Ignored, not caught: SIGTTIN and SIGTTOU must let a process in the
# background read and write its terminal (EIO and a write) instead of stopping it, and no
# signal here may interrupt the application's system calls. Programs the application starts
# inherit these as ignored, as they did SIGINT and SIGTERM.
LOBBY_SIGNALS = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGQUIT,
    signal.SIGHUP,
    signal.SIGUSR2,
    signal.SIGTTIN,
    signal.SIGTTOU,
)


# Before it kills a worker at --timeout, the lobby asks for the worker's Python stack with this
# signal (docs/SIGNALS.md, "--timeout and worker health"). A real-time signal: no terminal, shell
# or service manager sends one, so a signal to the whole process group never dumps every
# worker's stack. The lobby owns the number (SIGRTMIN + 2, crates/lobby/src/worker/health.rs).
STACK_SIGNAL = _native.STACK_SIGNAL


def leave_signals_to_the_lobby() -> None:
    """Ignores LOBBY_SIGNALS; SIGUSR1 reopens this process's error log (the lobby forwards it
    through the zygote); STACK_SIGNAL writes every thread's Python stack to the error log.
    SIGWINCH keeps its default action, which is to ignore it."""
    for number in LOBBY_SIGNALS:
        signal.signal(number, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, _reopen_log)
    # faulthandler writes from the C signal handler, so the stack comes even when the
    # application is stuck in C code where a Python handler would never run. It writes to
    # descriptor 2 directly and blocking (log.py's queue-less, non-blocking path is for lines a
    # worker writes while it serves; this one is about to be killed): the error log, or under
    # --capture-output the pipe the zygote forwards, after whatever the worker wrote before.
    faulthandler.register(STACK_SIGNAL, file=2, all_threads=True, chain=False)


def _reopen_log(signum: int, frame: object) -> None:
    error_log.reopen()


class _Leaving(SystemExit):
    """After worker_int on SIGQUIT (code 0) or worker_abort on SIGABRT (code 1): the worker
    leaves at once, abandoning the request it holds, through worker_exit, as gunicorn's do."""


def _catch_hook_signals(worker_hooks: hooks.WorkerHooks, me: hooks.Worker) -> None:
    """When worker_int is set, SIGINT and SIGQUIT run it; when worker_abort is set, SIGABRT
    runs it. After SIGINT the worker goes on: it is maitred's graceful stop, and the lobby
    decides when requests may be abandoned (docs/HOOKS.md)."""
    worker_int = worker_hooks.get("worker_int")
    worker_abort = worker_hooks.get("worker_abort")

    def interrupted(signum: int, frame: object) -> None:
        if me.alive:
            me.alive = False
            hooks.call("worker_int", worker_int, me)
        if signum == signal.SIGQUIT:
            raise _Leaving(0)

    def aborted(signum: int, frame: object) -> None:
        me.alive = False
        hooks.call("worker_abort", worker_abort, me)
        raise _Leaving(1)

    if worker_int is not None:
        signal.signal(signal.SIGINT, interrupted)
        # Caught only to call the hook: the application's system calls go on.
        signal.siginterrupt(signal.SIGINT, False)
        signal.signal(signal.SIGQUIT, interrupted)
    if worker_abort is not None:
        signal.signal(signal.SIGABRT, aborted)


def serve(
    channel_fds: list[int],
    load_app: Callable[[], Application],
    hooked: Hooked = None,
    report_address: str | None = None,
    asgi_options: asgi.Options | None = None,
    interface_forced: bool = False,
) -> int:
    """Loads the application with `load_app`, then serves the requests that arrive on
    `channel_fds` (the worker's ends of its channels, one per thread, which this takes over)
    until the lobby closes them. Returns the exit code: 0 when the lobby closed the channels,
    1 if the application did not load, a hook failed its boot, a channel broke (an I/O error,
    a frame against the protocol) or SIGABRT came (--timeout). With --reload, `report_address`
    is the watcher's, told which files the application was imported from (or was being
    imported from, when that failed) before the worker says it is ready (or failed). With
    `asgi_options` the application is ASGI, served on an event loop (asgi.py); unless
    `interface_forced` (--interface), an application of the other interface fails to boot."""
    leave_signals_to_the_lobby()
    if hooked is not None:
        hooked[1].pid = os.getpid()
        _catch_hook_signals(*hooked)
    environ = base_environ(threads=len(channel_fds))
    evented = asgi_options is not None
    channels = [WorkerChannel(fd, environ, evented) for fd in channel_fds]
    try:
        return _boot_and_serve(channels, load_app, hooked, report_address, asgi_options, interface_forced)
    except _Leaving as leaving:
        assert isinstance(leaving.code, int)
        return leaving.code
    finally:
        if hooked is not None:
            worker_hooks, me = hooked
            me.alive = False
            hooks.call("worker_exit", worker_hooks.get("worker_exit"), worker_hooks.server, me)


def freezing_the_import(load_app: Callable[[], Application]) -> Callable[[], Application]:
    """`load_app`, then gc.freeze(): the objects the application's import made (modules,
    classes, functions, its settings; some 60,000 for FastAPI with asyncpg) live as long as the
    worker, yet every full collection of the cyclic garbage collector visited them all, 25 ms
    each, and wrote into their headers, which copies every page of a --preload zygote's heap
    that holds one. Frozen, only what requests make is collected. What the import made and later
    drops in a cycle stays, as it would in the zygote; docs/TUNING.md, "Garbage collection"."""

    def load() -> Application:
        application = load_app()
        gc.freeze()
        return application

    return load


# The collector's first threshold before any application was imported: Python's own (700 in the
# versions maitred is tested on), against which a threshold the application's import set is told
# apart.
_PYTHONS_YOUNG_THRESHOLD = gc.get_threshold()[0]


def sizing_the_young_generation(load_app: Callable[[], Application], threshold: int) -> Callable[[], Application]:
    """`load_app`, then the collector's first threshold set to --gc-threshold, unless the
    application's import set its own. The collector counts the objects made since its last
    collection, less those freed; the lobby seats requests in batches (a worker's loop took 4.7
    in a row on average, uvicorn's 2.9, under DB-FASTAPI's /db at 64 connections), and a batch's
    new objects, some 150 a request in FastAPI, passed 700 before the batch before it had freed
    theirs: one collection of the youngest every 20 requests, finding nothing, against one every
    100-150 in uvicorn (docs/TUNING.md, "Garbage collection")."""

    def load() -> Application:
        application = load_app()
        first, second, third = gc.get_threshold()
        if first == _PYTHONS_YOUNG_THRESHOLD:
            gc.set_threshold(threshold, second, third)
        return application

    return load


def _boot_failed(channel: WorkerChannel, message: str) -> int:
    try:
        channel.boot_failed(message)
    except ChannelClosed:
        pass  # the lobby is already gone (another worker's failure may have stopped it)
    return 1


def _boot_and_serve(
    channels: list[WorkerChannel],
    load_app: Callable[[], Application],
    hooked: Hooked,
    report_address: str | None,
    asgi_options: asgi.Options | None,
    interface_forced: bool,
) -> int:
    # Boot failures go on the first channel; the others close with the process.
    channel = channels[0]
    if hooked is not None:
        worker_hooks, me = hooked
        # As under gunicorn, a worker whose post_fork raises has failed to boot.
        if not hooks.call("post_fork", worker_hooks.get("post_fork"), worker_hooks.server, me):
            return _boot_failed(channel, hooks.summary("post_fork"))
    try:
        application = load_app()
    except AppLoadError as error:
        if error.__cause__ is not None:
            log("debug", "".join(traceback.format_exception(error.__cause__)).rstrip())
        if report_address is not None:
            reload.report_modules(report_address, failure=error.__cause__)
        return _boot_failed(channel, str(error))
    if report_address is not None:
        reload.report_modules(report_address)
    if hooked is not None:
        worker_hooks, me = hooked
        if not hooks.call("post_worker_init", worker_hooks.get("post_worker_init"), me):
            return _boot_failed(channel, hooks.summary("post_worker_init"))
    if not interface_forced and asgi.is_asgi(application) != (asgi_options is not None):
        # The zygote chose the interface when maitred started (--interface, or the application
        # as it was then); a reload cannot change it.
        found, serving = ("ASGI", "WSGI") if asgi_options is None else ("WSGI", "ASGI")
        return _boot_failed(
            channel,
            f"the application is {found}, and this maitred serves {serving} (--interface, or the application "
            "when it started); restart it, or upgrade it with SIGUSR2",
        )
    if asgi_options is not None:
        return asgi.serve(channel, application, asgi_options, functools.partial(_boot_failed, channel))

    def answer_on(channel: WorkerChannel) -> Callable[[dict[str, Any], Any], None]:
        if hooked is not None and hooked[0].around_requests:
            # pre_request before each request, post_request after it, in the request's thread.
            return functools.partial(_answer_with_hooks, channel, application, *hooked)
        return functools.partial(_answer, channel, application)

    try:
        for each in channels:
            each.ready()
        others = [
            threading.Thread(target=_serve_thread, args=(each, answer_on(each)), name=f"maitred-{number}", daemon=True)
            for number, each in enumerate(channels[1:], start=1)
        ]
        for thread in others:
            thread.start()
        # The main thread serves the first channel, so that signals are handled as they are
        # without threads; once the lobby has closed it, the others finish what they hold.
        _serve_requests(channel, answer_on(channel))
        for thread in others:
            thread.join()
    except ChannelClosed as error:
        # The lobby let go in the middle of an exchange: it is shutting down or went away,
        # and it is the one to say so.
        log("debug", f"worker {os.getpid()}: {error}")
    except ChannelError as error:
        log("error", f"worker {os.getpid()}: {error}")
        return 1
    return 0


def base_environ(threads: int = 1) -> dict[str, Any]:
    """The environ keys that are the same for every request; the channel copies this dict
    for each request and adds the request's own keys."""
    return {
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.errors": ErrorStream(),
        "wsgi.multithread": threads > 1,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
        # The lobby de-chunks bodies: reading wsgi.input to its end is always safe.
        "wsgi.input_terminated": True,
        "wsgi.file_wrapper": FileWrapper,
        "SERVER_SOFTWARE": f"maitred/{__version__}",
        "SCRIPT_NAME": os.environ.get("SCRIPT_NAME", "").rstrip("/"),
    }


def _serve_requests(channel: WorkerChannel, answer: Callable[[dict[str, Any], Any], None]) -> None:
    """Answers each request the lobby sends with `answer(environ, start_response)`, until the
    lobby closes the channel."""
    receive = channel.receive
    while True:
        request = receive()
        if request is None:
            return
        answer(*request)


def _serve_thread(channel: WorkerChannel, answer: Callable[[dict[str, Any], Any], None]) -> None:
    """A thread other than the main one serves its channel. What would end a worker without
    threads ends this one too: its channel broke, or the application raised SystemExit."""
    try:
        _serve_requests(channel, answer)
    except ChannelClosed as error:
        log("debug", f"worker {os.getpid()}: {error}")
    except BaseException as error:  # noqa: BLE001 - the worker exits, whatever it was
        if isinstance(error, ChannelError):
            log("error", f"worker {os.getpid()}: {error}")
        elif not isinstance(error, SystemExit):
            log("critical", f"worker {os.getpid()} crashed:\n{traceback.format_exc().rstrip()}")
        sys.stdout.flush()
        sys.stderr.flush()
        # The lobby sees every channel close: each request the worker held is answered 502.
        os._exit(error.code if isinstance(error, SystemExit) and isinstance(error.code, int) else 1)


def _answer_with_hooks(
    channel: WorkerChannel,
    application: Application,
    worker_hooks: hooks.WorkerHooks,
    me: hooks.Worker,
    environ: dict[str, Any],
    start_response: Any,
) -> None:
    pre_request = worker_hooks.get("pre_request")
    req = hooks.Request(environ)
    resp = hooks.Response()

    def recording(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        write = start_response(status, headers, exc_info)
        resp.started(status, headers)
        return write

    def hooked_application(environ: dict[str, Any], start_response: Any) -> Any:
        # A pre_request that raises costs its request a 500, as under gunicorn.
        if pre_request is not None:
            pre_request(me, req)
        return application(environ, recording)

    try:
        _answer(channel, hooked_application, environ, start_response)
    finally:
        resp.answered(*channel.status)
        hooks.call("post_request", worker_hooks.get("post_request"), me, req, environ, resp)


def _answer(channel: WorkerChannel, application: Application, environ: dict[str, Any], start_response: Any) -> None:
    """Runs the application for one request and sends its answer."""
    try:
        result = application(environ, start_response)
        try:
            _send(channel, result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
    except (ChannelError, _Leaving):
        raise
    except ClientDisconnected:
        # The lobby cancelled the response (docs/PROTOCOL.md, section 2): nothing is wrong
        # with the application, and nobody is left to receive the rest.
        log("info", f"client went away during {channel.request_line}; response abandoned")
        channel.fail("the client went away")
    except BaseException as error:
        _fail(channel, error)
        if not isinstance(error, Exception):
            raise  # SystemExit and the like end the worker once the client has its answer


# The iterators of a list and a tuple: their chunks are all made already.
_MADE_ITERATORS = (type(iter([])), type(iter(())))


def _send(channel: WorkerChannel, result: Any) -> None:
    result_type = type(result)
    if result_type is list or result_type is tuple:
        # The whole body is here: the response goes out as one frame.
        channel.respond(result)
        return
    if result_type is FileWrapper:
        file_range = _regular_file_range(result.filelike)
        if file_range is not None:
            channel.send_file(*file_range)
            return
    chunks = iter(result)
    if type(chunks) in _MADE_ITERATORS:
        # An object that iterates a list it holds (Django's HttpResponse): its body is whole
        # too, and goes out as one frame, as a list's does. Sent chunk by chunk and then ended,
        # it was two frames, each of which could wake the lobby: under DB-DJANGO's /fortunes
        # load the worker rang the lobby's bell twice per request and looked for a CANCEL
        # between (bench/results/db).
        channel.respond(list(chunks))
        return
    send_body = channel.send_body
    for chunk in chunks:
        send_body(chunk)
    channel.finish()


def _regular_file_range(filelike: Any) -> tuple[int, int, int] | None:
    """(descriptor, position, bytes after it) when `filelike` is a binary regular file the
    lobby can read itself; None when it must be read through Python."""
    if isinstance(filelike, io.TextIOBase):
        return None  # its tell() is not a byte offset
    try:
        fd = filelike.fileno()
        position = filelike.tell()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both of these
        return None
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode):
        return None
    return fd, position, max(status.st_size - position, 0)


def _fail(channel: WorkerChannel, error: BaseException) -> None:
    """Logs the application's error, then answers 500 if the head has not gone out yet, or
    cuts the response off if it has."""
    trace = "".join(traceback.format_exception(error)).rstrip()
    log("error", f"Error handling request {channel.request_line}\n{trace}")
    channel.fail(f"{type(error).__name__}: {error}")
