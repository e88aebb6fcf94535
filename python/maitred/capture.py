"""--capture-output: a worker's standard output and error become one pipe, and the zygote
forwards what comes through it to the error log as the application's lines (docs/LIMITS.md,
"The application's output").

`print()`, `logging.StreamHandler()` and C extensions writing to descriptor 2 then never wait
for the log, and a print()ed line reaches it as soon as it ends (standard output is made line
buffered): the zygote takes their bytes as they come and writes each line through the
non-blocking path (`log.AppLines`), which drops and counts lines when the log is not read. The
lines of one worker keep their order, and are never cut in the middle by another's.

The zygote reads, not a thread of the worker: a worker stuck in C code with the interpreter's
lock (the case `--timeout`'s stack dump is for) could not forward its own output, and a worker
that crashes would take the lines still in the pipe with it. From the zygote they survive the
worker, and the stack the worker writes at `--timeout` comes after whatever it wrote before.
"""

from __future__ import annotations

import io
import os
import re
import sys
import time

from maitred import log

CHOICES = ("auto", "yes", "no")

# A line longer than this is written in pieces of it: a partial line is held in memory only up
# to this size.
LONGEST_LINE = 16 * 1024

# A partial line (no newline yet) is written as it is once it has waited this long.
PARTIAL_AFTER = 1.0

# Bytes read from a worker's pipe at once.
_READ = 64 * 1024

# A Python stack written by faulthandler (the worker's at --timeout, or at a fatal error): its
# first line, and the lines of its blocks. It is maitred's, not the application's: forwarded as
# it is, unmarked and unlimited, in its place among the worker's lines.
_STACK_START = re.compile(r"(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$|Fatal Python error: ")
_STACK_LINE = re.compile(r"  File |  <no Python frame>|(?:Current thread|Thread) 0x[0-9a-f]+ \(|$")


def wanted(setting: object) -> bool:
    """Whether to capture: yes, no, or auto, which captures unless the error log is a
    terminal (where a write never waits for long, and the application's own colors and
    progress bars are better left alone)."""
    if setting == "auto":
        return not os.isatty(2)
    return setting == "yes"


def redirect(pipe: int) -> None:
    """In a new worker: keeps a copy of standard error for maitred's own lines and makes
    descriptors 1 and 2 the pipe's writing end."""
    sys.stdout.flush()
    sys.stderr.flush()
    log.set_destination(os.dup(2))  # not inheritable: the application's programs get the pipe
    os.dup2(pipe, 1)
    os.dup2(pipe, 2)
    os.close(pipe)
    line_buffered_stdout()


def line_buffered_stdout() -> None:
    """In a new worker, captured or not. Python block-buffers standard output that is not a
    terminal, as the capture's pipe is not, nor a container's standard output, nor a file: a
    print()ed line would wait in the worker for 8 KiB more, or for its exit. Line buffering
    writes each line when it ends, one system call a line (what standard error already does),
    without PYTHONUNBUFFERED's one a write."""
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)


class Output:
    """One worker's pipe, read by the zygote: bytes in, lines out."""

    def __init__(self, fd: int, pid: int) -> None:
        self.fd = fd
        self.pid = pid
        self._lines = log.AppLines("info", pid)
        self._partial = b""
        self._partial_since = 0.0
        self._in_stack = False

    def read(self) -> bool:
        """Takes what the pipe holds (the caller knows it is readable); False at its end, when
        every process that could write to it has gone."""
        data = os.read(self.fd, _READ)
        if not data:
            self.finish()
            return False
        if not self._lines.allows():
            # Over the rate: count the lines left out without making strings of them.
            self._lines.over(data.count(b"\n"))
            return True
        if not self._partial:
            self._partial_since = time.monotonic()
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            self._write(line)
        while len(self._partial) >= LONGEST_LINE:
            self._write(self._partial[:LONGEST_LINE])
            self._partial = self._partial[LONGEST_LINE:]
        return True

    def partial_due(self, now: float) -> float | None:
        """When the partial line held, if any, is to be written as it is."""
        return self._partial_since + PARTIAL_AFTER if self._partial else None

    def flush_partial(self) -> None:
        if self._partial:
            self._write(self._partial)
            self._partial = b""

    def finish(self) -> None:
        self.flush_partial()
        self._lines.finish()

    def _write(self, line: bytes) -> None:
        text = line.decode(errors="replace").rstrip("\r")
        self._in_stack = bool(_STACK_START.match(text) or (self._in_stack and _STACK_LINE.match(text)))
        if self._in_stack:
            log.raw(text)
        else:
            self._lines.write(text)
