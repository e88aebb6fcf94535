"""The zygote: the process that forks the workers when the lobby asks for them.

The CLI forks it before the lobby starts any thread, so every worker is forked from a
single-threaded process. It speaks the control channel of docs/PROTOCOL.md section 1: one
datagram per message over a SOCK_SEQPACKET socketpair. It runs nothing but this loop (and,
with --preload, the application's import), so that it stays small and hard to break.

It leaves the lobby's signals to the lobby (docs/SIGNALS.md); SIGUSR1, or the lobby's `reopen`,
reopens its error log and is passed on to every worker. Under --capture-output it also forwards
each worker's standard output and error to the error log (capture.py).
"""

from __future__ import annotations

import os
import select
import selectors
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable, Mapping

from maitred import asgi, capture, hooks, log, reload, worker
from maitred._native import report_exited, report_failed, report_spawned, zygote_order
from maitred.app import AppLoadError

LoadApp = Callable[[], Callable[..., object]]

# Messages from the lobby are a few dozen bytes; anything longer is malformed anyway.
_MAX_MESSAGE = 512


class _LobbyGone(Exception):
    """The control channel is closed: the lobby has exited or is shutting down."""


class _SpawnFailed(Exception):
    """The zygote could not make a worker; str(error) says why."""


def run(control: socket.socket, settings: Mapping[str, object], load_app: LoadApp) -> int:
    """Serves the control channel until the lobby closes it; returns the exit code.

    `load_app` loads the application (raising AppLoadError); with settings["preload"] it is
    called once here, otherwise once in each worker.
    """
    # Ctrl-C and `systemctl stop` signal the whole process group; only the lobby decides.
    worker.leave_signals_to_the_lobby()
    report_address = reload.take_report_address(os.environ)
    worker_load_app = load_app
    interface = settings["interface"]
    assert isinstance(interface, str)
    if settings["preload"]:
        try:
            application = load_app()
        except AppLoadError as error:
            _log_cause(error)
            if report_address is not None:
                reload.report_modules(report_address, failure=error.__cause__)
            fail(control, str(error))
            return 1
        worker_load_app = lambda: application
        if interface == "auto":
            interface = "asgi" if asgi.is_asgi(application) else "wsgi"
    if settings["gc_freeze"]:
        worker_load_app = worker.freezing_the_import(worker_load_app)
    young_threshold = settings["gc_threshold"]
    assert isinstance(young_threshold, int)
    worker_load_app = worker.sizing_the_young_generation(worker_load_app, young_threshold)
    grace = settings["graceful_timeout"]
    timeout = settings["timeout"]
    assert isinstance(grace, float) and isinstance(timeout, float)
    worker_hooks = hooks.WorkerHooks(settings) if hooks.configured(settings) else None
    captures = capture.wanted(settings["capture_output"])
    options = asgi.Options(loop=str(settings["loop"]), timeout=timeout, graceful_timeout=grace)
    zygote = _Zygote(control, worker_load_app, grace, worker_hooks, report_address, captures, options)
    zygote.interface = None if interface == "auto" else interface
    zygote.interface_forced = settings["interface"] != "auto"
    return zygote.serve()


# What `ps` and `top` call the interface probe, so that it is not taken for a worker.
PROBE_NAME = "maitred-probe"


def _name_this_process(name: str) -> None:
    """Sets the kernel's name of this process (`ps -o comm`, at most 15 bytes)."""
    try:
        with open("/proc/self/comm", "w") as comm:
            comm.write(name)
    except OSError:
        pass  # no /proc: the name is only a courtesy


def _name_of_this_process() -> str | None:
    try:
        with open("/proc/self/comm") as comm:
            return comm.read().rstrip("\n")
    except OSError:
        return None


def probe_interface(load_app: LoadApp) -> str | None:
    """Whether the application is ASGI or WSGI, asked of a child that imports it and exits, so
    that the zygote stays without the application (no --preload). None when the import fails:
    the worker that imports it next says why, and the next spawn asks again."""
    reader, writer = os.pipe2(os.O_CLOEXEC)
    sys.stdout.flush()
    sys.stderr.flush()
    # The probe is born with its name, the zygote's for the moment of the fork: named after it,
    # it would show for that moment as one more child of the zygote, like a worker.
    own_name = _name_of_this_process()
    _name_this_process(PROBE_NAME)
    pid = os.fork()
    if pid == 0:
        answer = b"?"
        try:
            os.close(reader)
            answer = b"asgi" if asgi.is_asgi(load_app()) else b"wsgi"
        except BaseException:  # noqa: BLE001, S110 - the worker that imports it next says why
            pass
        finally:
            os.write(writer, answer)
            os._exit(0)
    if own_name is not None:
        _name_this_process(own_name)
    os.close(writer)
    with os.fdopen(reader, "rb") as answer:
        said = answer.read()
    os.waitpid(pid, 0)
    return said.decode() if said in (b"asgi", b"wsgi") else None


def fail(control: socket.socket, message: str) -> None:
    """Sends `failed MESSAGE` before the zygote exits."""
    try:
        control.send(report_failed(message))
    except OSError:
        return  # the lobby is gone; there is nobody left to tell
    # Closing a Unix socket with unread messages (the lobby's `spawn`s) makes the lobby's next
    # read fail with ECONNRESET ahead of the `failed` still queued for it; read them first.
    control.setblocking(False)
    try:
        while control.recv(_MAX_MESSAGE):
            pass
    except OSError:
        pass  # BlockingIOError: nothing left unread


def _log_cause(error: AppLoadError) -> None:
    """The one-line message goes to the operator via the lobby; the traceback behind it is
    only for someone who asked for --log-level debug."""
    if error.__cause__ is not None:
        lines = traceback.format_exception(error.__cause__)
        log.log("debug", "".join(lines).rstrip())


class _Zygote:
    def __init__(
        self,
        control: socket.socket,
        load_app: LoadApp,
        grace: float,
        worker_hooks: hooks.WorkerHooks | None,
        report_address: str | None,
        captures: bool,
        asgi_options: asgi.Options,
    ) -> None:
        self._control = control
        self._asgi_options = asgi_options
        # asgi or wsgi: forced (--interface), told by the preloaded application, or once a
        # probe has imported it; None until then.
        self.interface: str | None = None
        self.interface_forced = False
        self._captures = captures
        # Each worker's captured output (--capture-output), by the descriptor it is read from:
        # kept until every process that could write to it has gone, which may be after the
        # worker itself (a program it started), so that no line is lost with it.
        self._outputs: dict[int, capture.Output] = {}
        self._load_app = load_app
        self._report_address = report_address
        self._grace = grace
        self._hooks = worker_hooks
        self._children: set[int] = set()
        self._pid = os.getpid()
        self._reopen_wanted = False
        # SIGCHLD wakes the selector through the wakeup fd; the Python-level handler has
        # nothing to do (reaping happens in the loop), but without one no byte is written.
        self._wakeup_read, self._wakeup_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self._wakeup_write, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.signal(signal.SIGUSR1, self._on_reopen_signal)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wakeup_read, selectors.EVENT_READ)
        self._selector.register(self._control, selectors.EVENT_READ)

    def serve(self) -> int:
        log.log("debug", "zygote ready")
        try:
            while True:
                for key, _ in self._selector.select(self._partial_wait()):
                    if key.fileobj is self._control:
                        self._receive()
                    elif key.fileobj == self._wakeup_read:
                        self._drain_wakeups()
                    else:
                        self._forward(key.data)
                self._flush_partials()
                if self._reopen_wanted:
                    self._reopen_logs()
                self._reap(report=True)
        except _LobbyGone:
            self._obey_last_kills()
            self._wait_for_children()
            return 0
        except _SpawnFailed as error:
            # The protocol has one way to say "I cannot make workers": `failed`, then exit.
            # Workers already running go on until the lobby closes their channels.
            fail(self._control, str(error))
            return 1

    def _receive(self) -> None:
        try:
            message = self._control.recv(_MAX_MESSAGE)
        except ConnectionError:
            raise _LobbyGone() from None
        if not message:
            raise _LobbyGone()
        try:
            order = zygote_order(message)
        except ValueError as error:
            log.log("error", f"zygote: ignoring {error}")
            return
        self._obey(order)

    def _obey(self, order: tuple[str, ...]) -> None:
        """Does what one of the lobby's orders says (crates/wire's zygote.rs spells them)."""
        match order:
            case ("spawn", slot, workers, threads):
                self._spawn(slot, workers, threads)
            case ("kill", pid, number):
                self._kill(pid, number)
            case ("reopen",):
                self._reopen_logs()
            case ("level", name) if name in log.LEVELS:
                log.configure(name)
            case _:
                log.log("error", f"zygote: ignoring the order {order!r}: no such log level")

    def _on_reopen_signal(self, signum: int, frame: object) -> None:
        """SIGUSR1 sent to the zygote itself (the lobby asks with `reopen`). The loop acts on
        it, between two messages: a worker forked meanwhile is either signalled or inherits the
        new file. In a worker forked a moment ago that has not set its own handler yet, this is
        its handler, and it reopens its own log."""
        if os.getpid() != self._pid:
            log.reopen()
        else:
            self._reopen_wanted = True

    def _reopen_logs(self) -> None:
        """Reopens the zygote's error log, then has every worker reopen its own."""
        self._reopen_wanted = False
        log.reopen()
        for pid in self._children:
            # A child is only forgotten once reaped, so `pid` is still ours.
            os.kill(pid, signal.SIGUSR1)

    def _obey_last_kills(self) -> None:
        """The lobby kills busy workers just before it leaves (SIGQUIT, --graceful-timeout);
        those orders may still be queued when the zygote notices it has gone."""
        while True:
            try:
                message = self._control.recv(_MAX_MESSAGE, socket.MSG_DONTWAIT)
            except OSError:
                return
            if not message:
                return
            try:
                order = zygote_order(message)
            except ValueError:
                continue
            if order[0] == "kill":
                self._obey(order)

    def _send(self, message: bytes, fds: list[int] | None = None) -> None:
        try:
            if fds:
                socket.send_fds(self._control, [message], fds)
            else:
                self._control.send(message)
        except OSError:
            raise _LobbyGone() from None

    def _spawn(self, slot: int, workers: int, threads: int) -> None:
        if self.interface is None:
            self.interface = probe_interface(self._load_app)
        # A channel per thread; an ASGI worker's one channel carries every request it runs at
        # once (docs/PROTOCOL.md, section 4). An application that did not import yet is served
        # as WSGI would be: its worker fails to boot and says why.
        interface = self.interface or "wsgi"
        channels = 1 if interface == "asgi" else threads
        pairs: list[tuple[socket.socket, socket.socket]] = []
        try:
            for _ in range(channels):
                pairs.append(socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM))
            output = os.pipe2(os.O_CLOEXEC) if self._captures else None
        except OSError as error:
            for pair in pairs:
                for end in pair:
                    end.close()
            raise _SpawnFailed(f"cannot create the channels for worker {slot}: {error}") from None
        lobby_ends = [lobby_end for lobby_end, _ in pairs]
        worker_ends = [worker_end for _, worker_end in pairs]
        hooked = None
        if self._hooks is not None:
            self._hooks.server.num_workers = workers
            # Slots count from 0; gunicorn's ages from 1.
            hooked = (self._hooks, hooks.Worker(slot + 1, self._pid, self._hooks.cfg))
            # Raising does not stop the fork: the worker is wanted all the same.
            hooks.call("pre_fork", self._hooks.get("pre_fork"), self._hooks.server, hooked[1])
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as error:
            for end in (*lobby_ends, *worker_ends):
                end.close()
            for end in output or ():
                os.close(end)
            raise _SpawnFailed(f"cannot fork worker {slot}: {error}") from None
        if pid == 0:
            self._become_worker(lobby_ends, worker_ends, hooked, output, interface)
        for worker_end in worker_ends:
            worker_end.close()
        if output is not None:
            os.close(output[1])
            self._outputs[output[0]] = capture.Output(output[0], pid)
            self._selector.register(output[0], selectors.EVENT_READ, output[0])
        # Recorded before `spawned` is sent and reaped only after it, so `exited` follows it.
        self._children.add(pid)
        try:
            self._send(report_spawned(slot, pid), [lobby_end.fileno() for lobby_end in lobby_ends])
        finally:
            # The zygote keeps no channel end: a worker must hold only its own, so that
            # end-of-file reaches it when the lobby lets go.
            for lobby_end in lobby_ends:
                lobby_end.close()
        log.log("debug", f"zygote: forked worker {pid} for slot {slot}")

    def _become_worker(
        self,
        lobby_ends: list[socket.socket],
        worker_ends: list[socket.socket],
        hooked: worker.Hooked,
        output: tuple[int, int] | None,
        interface: str,
    ) -> None:
        """In the forked child: drop the zygote's state and serve; never returns. `hooked`: the
        hooks and the worker's `worker` argument, when there are hooks; `output`: the pipe its
        standard output and error become (--capture-output)."""
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            self._selector.close()
            os.close(self._wakeup_read)
            os.close(self._wakeup_write)
            self._control.close()
            for lobby_end in lobby_ends:
                lobby_end.close()
            for fd in self._outputs:
                os.close(fd)
            if output is not None:
                os.close(output[0])
                capture.redirect(output[1])
            else:
                capture.line_buffered_stdout()
            channel_fds = [worker_end.detach() for worker_end in worker_ends]
            asgi_options = self._asgi_options if interface == "asgi" else None
            code = worker.serve(
                channel_fds, self._load_app, hooked, self._report_address, asgi_options, self.interface_forced
            )
        except BaseException:  # noqa: BLE001 - a worker logs why it died, whatever it was
            log.log("critical", f"worker {os.getpid()} crashed:\n{traceback.format_exc().rstrip()}")
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def _kill(self, pid: int, number: int) -> None:
        if pid not in self._children:
            log.log("debug", f"zygote: not signalling {pid}, which is not a live worker")
            return
        if number not in signal.valid_signals():
            log.log("error", f"zygote: ignoring kill {pid} with unknown signal {number}")
            return
        # A child is only forgotten once reaped, so `pid` cannot have been reused yet.
        os.kill(pid, number)

    def _forward(self, fd: int) -> None:
        """Forwards what a worker's output pipe holds; at its end, lets it go."""
        output = self._outputs[fd]
        try:
            more = output.read()
        except OSError as error:
            log.log("error", f"zygote: cannot read worker {output.pid}'s output: {error}")
            more = False
        if not more:
            output.finish()
            self._selector.unregister(fd)
            os.close(fd)
            del self._outputs[fd]

    def _partial_wait(self) -> float | None:
        """How long the loop may wait before a partial line is due to be written."""
        now = time.monotonic()
        due = [at for output in self._outputs.values() if (at := output.partial_due(now)) is not None]
        return max(0.0, min(due) - now) if due else None

    def _flush_partials(self) -> None:
        now = time.monotonic()
        for output in self._outputs.values():
            due = output.partial_due(now)
            if due is not None and due <= now:
                output.flush_partial()

    def _forward_what_is_left(self) -> None:
        """At the end: forwards what the pipes still hold, without waiting for more."""
        for fd in list(self._outputs):
            while fd in self._outputs and select.select([fd], [], [], 0)[0]:
                self._forward(fd)
            if fd in self._outputs:
                self._outputs.pop(fd).finish()
                self._selector.unregister(fd)
                os.close(fd)

    def _drain_wakeups(self) -> None:
        try:
            while os.read(self._wakeup_read, 4096):
                pass
        except BlockingIOError:
            pass

    def _reap(self, *, report: bool) -> None:
        while self._children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            self._children.discard(pid)
            if os.WIFSIGNALED(status):
                how = f"signal {os.WTERMSIG(status)}"
            else:
                how = f"code {os.WEXITSTATUS(status)}"
            log.log("debug", f"zygote: worker {pid} exited, {how}")
            if report:
                self._send(report_exited(pid, status))

    def _wait_for_children(self) -> None:
        """After the lobby has gone: workers exit on end-of-file of their channels. One still
        running after --graceful-timeout is stuck in the application and is killed, so that
        nothing outlives the server."""
        self._selector.unregister(self._control)
        self._reap(report=False)
        if self._children:
            # Debug: a stop or a failed start leaves workers exiting here every time, and a failed
            # start's error is to be the one line a user reads.
            pids = ", ".join(str(pid) for pid in sorted(self._children))
            log.log("debug", f"zygote: the lobby has gone; waiting for its workers to exit (pids {pids})")
        deadline = time.monotonic() + self._grace
        while self._children:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.log(
                    "warning",
                    f"zygote: killing {len(self._children)} worker(s) still running "
                    f"{self._grace:g} s after the lobby left",
                )
                for pid in self._children:
                    os.kill(pid, signal.SIGKILL)
                for pid in list(self._children):
                    os.waitpid(pid, 0)
                self._children.clear()
                break
            for key, _ in self._selector.select(remaining):
                if key.fileobj == self._wakeup_read:
                    self._drain_wakeups()
                else:
                    self._forward(key.data)
            self._reap(report=False)
        self._forward_what_is_left()
