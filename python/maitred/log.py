"""The error log's line format, shared by every Python process of maitred.

The lobby (Rust) writes the same format, so one log reads as one story:
``[2026-11-22 05:30:00 +0000] [1234] [INFO] message``. Everything goes to standard
error, which the CLI has already pointed at ``--error-logfile``.

A worker must not stop serving because nobody reads the log (docs/LIMITS.md, "Logs"), so
lines are written without waiting: a line the destination cannot take at once is dropped
and counted, and the count is written before the next line that gets through ("N log lines
dropped while the log was not being read"). Standard error's own descriptor is left as it
is, blocking: the other processes share it, and the application's own writes to it are its
business. Instead, where standard error is a pipe or a terminal this writes through a
second, non-blocking opening of it, and where it is a socket (the journal) it sends with
MSG_DONTWAIT. A regular file is written directly: it never waits for a reader.

The application's own lines (`wsgi.errors`, and its standard output and error under
--capture-output, which the zygote forwards) take the same path, marked ``[app]`` after the
level, and at most `AppLines.PER_SECOND` of them a second per worker: a runaway loop costs
bounded memory and CPU (docs/LIMITS.md, "The application's output").
"""

import os
import re
import socket
import stat
import threading
import time
from collections.abc import Callable

LEVELS = ("debug", "info", "warning", "error", "critical")

_threshold = LEVELS.index("info")

# Bytes a non-blocking pipe write takes whole or not at all (PIPE_BUF): lines are written in
# pieces of at most this size, cut after a newline where possible.
_PIECE = 4096

_send: Callable[[bytes], int] | None = None
"""Writes bytes to standard error without waiting: returns how many were taken, raises
BlockingIOError if none could be. Opened with the first line, and inherited by the workers
the zygote forks."""

_dropped = 0
"""Lines dropped since one was last written."""

_cut = False
"""The last write stopped inside a line: the next one starts a new line first."""

_file: str | None = None
"""The error log's path when standard error is a file the CLI opened (--error-logfile), for
`reopen`."""

_destination = 2
"""The descriptor of the error log: standard error, or, in a worker whose standard error the
zygote captures (--capture-output), the copy of it kept before."""

_lock = threading.RLock()
"""One line at a time, whatever the thread (a signal handler that logs runs in the thread it
interrupted, hence re-entrant)."""


def configure(level: str) -> None:
    """Sets the lowest level that is written; `level` is one of LEVELS."""
    global _threshold
    _threshold = LEVELS.index(level)


def set_destination(fd: int) -> None:
    """Writes the log to descriptor `fd` (a copy of standard error kept before it was captured)
    instead of 2."""
    global _destination, _send
    _destination = fd
    _send = None


def set_file(path: str) -> None:
    """Records that standard error is the file at `path` (absolute), for `reopen`."""
    global _file
    _file = path


def reopen() -> None:
    """SIGUSR1: opens the error log again at its path and makes it standard error, so that
    after a rotation that renamed the file, lines go to a new file at the old path. Does
    nothing when standard error is not a file maitred opened."""
    global _send
    if _file is None:
        return
    try:
        fd = os.open(_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as error:
        log("error", f"cannot reopen the error log {_file}: {error.strerror}; writing on to the old file")
        return
    os.dup2(fd, _destination)
    os.close(fd)
    _send = None


def log(level: str, message: str) -> None:
    """Writes one line (or a traceback's several) at `level` if it passes the threshold;
    never waits for the destination."""
    if LEVELS.index(level) < _threshold:
        return
    _write(_format(level, message))


def _format(level: str, message: str, pid: int | None = None) -> str:
    # UTC, written +0000, as the lobby writes its lines and the access log's times
    # (crates/lobby/src/log/text.rs): one log, one clock, whatever TZ the host has.
    stamp = time.strftime("%Y-%m-%d %H:%M:%S +0000", time.gmtime())
    return f"[{stamp}] [{pid or os.getpid()}] [{level.upper()}] {message}\n"


# A line that begins with a level name, as Python's logging writes them ("WARNING:root:..."),
# and most other loggers ("[ERROR] ...", "ERROR ...").
_LEADING_LEVEL = re.compile(r"\s*\[?(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\b")
_LEVEL_NAMES = {"WARN": "warning", "FATAL": "critical"}


class AppLines:
    """The application's lines of one worker, on their way to the log: each at the level it
    begins with, or `default`; at most PER_SECOND a second (BURST at once), the rest counted and
    said in one line once lines get through again, or at `finish`."""

    PER_SECOND = 1000
    BURST = 1000

    def __init__(self, default: str, pid: int | None = None) -> None:
        self.default = default
        self.pid = pid
        self._tokens = float(self.BURST)
        self._refilled = time.monotonic()
        self._over = 0

    def write(self, line: str) -> None:
        now = time.monotonic()
        self._tokens = min(self.BURST, self._tokens + (now - self._refilled) * self.PER_SECOND)
        self._refilled = now
        if self._tokens < 1:
            self._over += 1
            return
        self._tokens -= 1
        self.finish()
        found = _LEADING_LEVEL.match(line)
        level = _LEVEL_NAMES.get(found[1], found[1].lower()) if found else self.default
        if LEVELS.index(level) >= _threshold:
            _write(_format(level, f"[app] {line}", self.pid))

    def over(self, lines: int) -> None:
        """Counts `lines` left out unread (a runaway writer, over the rate)."""
        self._over += lines

    def finish(self) -> None:
        """Says how many lines were left out, if any."""
        if self._over:
            over, self._over = self._over, 0
            message = f"[app] {over:,} lines of the application's output left out: over {self.PER_SECOND:,} a second"
            _write(_format("warning", message, self.pid))

    def allows(self) -> bool:
        """Whether a line now would be written (without taking its place)."""
        now = time.monotonic()
        return min(self.BURST, self._tokens + (now - self._refilled) * self.PER_SECOND) >= 1


def raw(line: str) -> None:
    """Writes `line` as it is, without a stamp: a Python stack a worker wrote (faulthandler's
    format, as the lines around it expect), forwarded by the zygote."""
    _write(line + "\n")


def _write(line: str) -> None:
    with _lock:
        _write_locked(line)


def _write_locked(line: str) -> None:
    global _dropped, _cut, _send
    # Kept for the whole line: a signal handler may `reopen` in the middle of it.
    send = _send
    if send is None:
        send = _send = _open()
    data = line.encode(errors="replace")
    if _dropped:
        count = _format("warning", f"{_dropped:,} log lines dropped while the log was not being read")
        data = count.encode() + data
    if _cut:
        data = b"\n" + data
    written = 0
    try:
        for piece in _pieces(data):
            taken = send(piece)
            written += taken
            if taken < len(piece):
                # Only a socket or an odd destination takes part of a piece; the rest is lost.
                break
    except BlockingIOError:
        pass
    except OSError:
        # Standard error is closed or broken: nobody can be told anything.
        return
    if written == len(data):
        _dropped = 0
        _cut = False
    elif written == 0:
        _dropped += 1
    else:
        # Some lines went out (perhaps the count): the line is counted as dropped, as it is
        # not whole, and whoever writes next must not continue it.
        _dropped = 1
        _cut = not data[:written].endswith(b"\n")


def _pieces(data: bytes) -> list[bytes]:
    """`data` in pieces of at most _PIECE bytes, each ending with a newline where it can."""
    pieces = []
    while len(data) > _PIECE:
        end = data.rfind(b"\n", 0, _PIECE) + 1 or _PIECE
        pieces.append(data[:end])
        data = data[end:]
    if data:
        pieces.append(data)
    return pieces


def _open() -> Callable[[bytes], int]:
    """A way to write to standard error that does not wait; a blocking one as a last resort."""
    try:
        mode = os.fstat(_destination).st_mode
    except OSError:
        mode = 0
    if stat.S_ISSOCK(mode):
        try:
            stream = socket.socket(fileno=os.dup(_destination))
        except OSError:
            pass
        else:
            return lambda data: stream.send(data, socket.MSG_DONTWAIT)
    elif stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
        # A second opening of the same pipe or terminal, with flags of its own. (A regular file
        # is not reopened: another opening would have its own offset.)
        try:
            fd = os.open(f"/proc/self/fd/{_destination}", os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError:
            pass
        else:
            return lambda data: os.write(fd, data)
    destination = _destination
    return lambda data: os.write(destination, data)


def _forget_count() -> None:
    """In a forked child: the parent's count is the parent's to report."""
    global _dropped, _cut
    _dropped = 0
    _cut = False


os.register_at_fork(after_in_child=_forget_count)
