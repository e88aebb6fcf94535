"""--reload, a development setting: new workers take over when a source file changes.

Two halves, because the files to watch are known only where the application was imported:

- each worker, once it has loaded the application, sends the files of every module it has
  imported to the lobby's process (`report_modules`), over a Unix datagram socket whose
  abstract name the CLI puts in REPORT_VARIABLE before it forks the zygote;
- in the lobby's process, `Watcher`, a thread, receives those lists, watches the directories
  of those files and of --reload-extra-file with watchfiles (inotify), and sends the lobby
  SIGHUP when one of the files changes. The reload is SIGHUP's (docs/SIGNALS.md): new workers
  import the code on disk and take over once all of them are ready; a file that does not import
  leaves the old workers serving.

watchfiles is an optional dependency (``pip install 'maitred[reload]'``); only the lobby's
process imports it, and only with --reload.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import struct
import sys
import threading
import traceback
from collections.abc import Iterable, MutableMapping

from maitred import log

# The abstract socket name (without its leading NUL) that workers report their modules to.
REPORT_VARIABLE = "MAITRED_RELOAD_SOCKET"

# Paths per datagram: well under the socket's send buffer (about 200 KiB by default), so that a
# datagram is never too large to send, and few datagrams even for an application that imports
# thousands of modules.
_REPORT_BYTES = 32 * 1024
# How long a worker waits for room in the watcher's queue before it gives up reporting.
_REPORT_TIMEOUT = 5.0
# How often the watching loop looks for new reports while no file changes (milliseconds).
_REPORT_POLL_MS = 100
# An editor's save is several events (write, truncate, rename, a backup file): watchfiles
# yields once no event has come for _QUIET_MS, or after _BURST_MS at most.
_QUIET_MS = 100
_BURST_MS = 1000

# SCM_CREDENTIALS' payload: struct ucred, pid, uid and gid.
_UCRED = struct.Struct("iII")

# Blocked in the watcher's thread, and so in the threads watchfiles starts from it (they inherit
# its mask): the lobby's threads take these signals, and a write to the terminal from the
# background is not a SIGTTOU here, as in the lobby's other helper threads.
_LEFT_TO_THE_LOBBY = {
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGQUIT,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGTTIN,
    signal.SIGTTOU,
    signal.SIGWINCH,
    signal.SIGCHLD,
}


class WatcherMissing(Exception):
    """--reload was asked for, but watchfiles is not installed; str(error) is one line."""


def check_available() -> None:
    """Raises WatcherMissing when watchfiles cannot be imported."""
    try:
        import watchfiles  # noqa: F401 - imported only to see that it can be
    except ImportError as error:
        raise WatcherMissing(
            f"--reload needs the watchfiles package ({error}): install it with pip install 'maitred[reload]'"
        ) from None


def new_report_address() -> str:
    """A fresh abstract socket name for one maitred's watcher."""
    return f"maitred-reload-{os.getpid()}-{secrets.token_hex(8)}"


def take_report_address(environ: MutableMapping[str, str]) -> str | None:
    """Removes REPORT_VARIABLE from `environ` (the application need not see it) and returns it."""
    return environ.pop(REPORT_VARIABLE, None)


# ---------------------------------------------------------------------------------------------
# The worker's half.


def module_files() -> set[str]:
    """The absolute paths of the files the modules imported so far were loaded from."""
    files = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and os.path.isfile(path):
            files.add(os.path.abspath(path))
    return files


def files_of_failure(error: BaseException) -> set[str]:
    """The files an import that failed with `error` was running, and the file a SyntaxError is
    in: a module that fails in its first import is in no module list, and the next save of it
    must reload too."""
    files = {frame.f_code.co_filename for frame, _ in traceback.walk_tb(error.__traceback__)}
    if isinstance(error, SyntaxError) and error.filename:
        files.add(error.filename)
    return {os.path.abspath(path) for path in files if os.path.isfile(path)}


def report_modules(address: str, failure: BaseException | None = None) -> None:
    """Sends `module_files()` to the watcher at `address`, and the files of `failure`, the error
    that stopped the application from loading. A watcher that cannot be reached is said in one
    line; the worker goes on all the same."""
    files = module_files()
    if failure is not None:
        files |= files_of_failure(failure)
    batches = _batches(sorted(files))
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sender:
        sender.settimeout(_REPORT_TIMEOUT)
        try:
            for batch in batches:
                sender.sendto(batch, b"\0" + address.encode())
        except OSError as error:
            log.log(
                "warning",
                f"--reload: worker {os.getpid()} could not tell the watcher which files it imported "
                f"({error}); a change to them will not reload",
            )


def _batches(paths: Iterable[str]) -> list[bytes]:
    batches: list[bytes] = []
    current = bytearray()
    for path in paths:
        encoded = os.fsencode(path) + b"\n"
        if current and len(current) + len(encoded) > _REPORT_BYTES:
            batches.append(bytes(current))
            current.clear()
        current += encoded
    if current:
        batches.append(bytes(current))
    return batches


# ---------------------------------------------------------------------------------------------
# The lobby's half.


class Watcher:
    """Watches the files workers report and the extra files; a change sends this process
    SIGHUP. Runs on a thread of its own from `start` until `stop`."""

    def __init__(self, address: str, extra_files: Iterable[str]) -> None:
        # Each file watched, and what it was when it was last acted on (or first known).
        self._files: dict[str, _Signature] = {}
        self._directories: set[str] = set()
        self._add(extra_files)
        self._reports = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._reports.bind(b"\0" + address.encode())
        # The kernel attaches each sender's credentials: reports from another user are refused,
        # since anyone may send to an abstract socket.
        self._reports.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self._reports.setblocking(False)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="maitred-reload", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        # watchfiles looks at the event between two waits of at most _REPORT_POLL_MS.
        self._thread.join(timeout=5)
        self._reports.close()

    def _run(self) -> None:
        import watchfiles

        signal.pthread_sigmask(signal.SIG_BLOCK, _LEFT_TO_THE_LOBBY)
        while not self._stopping.is_set():
            self._take_reports()
            directories = sorted(d for d in self._directories if os.path.isdir(d))
            if not directories:
                # Nothing to watch until the first worker reports.
                self._stopping.wait(_REPORT_POLL_MS / 1000)
                continue
            said = False
            try:
                # Directories, not files: an editor that saves by renaming a new file over the
                # old one replaces the file that a watch on it would follow.
                for changes in watchfiles.watch(
                    *directories,
                    watch_filter=None,
                    debounce=_BURST_MS,
                    step=_QUIET_MS,
                    stop_event=self._stopping,
                    rust_timeout=_REPORT_POLL_MS,
                    yield_on_timeout=True,
                    raise_interrupt=False,
                    recursive=False,
                    ignore_permission_denied=True,
                ):
                    # Reports first: a worker that failed to load reported the file that broke
                    # it before the lobby said so, and so before anyone could save it again.
                    new_directory = self._take_reports()
                    changed = {path for _, path in changes if path in self._files}
                    if not said:
                        # The first yield comes once the watches are in place. A file saved
                        # while none was (before, or between two sets of watches) is found by
                        # what it is now.
                        log.log(
                            "info", f"--reload: watching {len(self._files)} files in {len(directories)} directories"
                        )
                        said = True
                        changed |= {path for path, known in self._files.items() if _signature(path) != known}
                    if changed:
                        self._reload(sorted(changed))
                    if new_directory:
                        break  # watch the new set
            except OSError as error:
                # Out of inotify watches or instances (fs.inotify.max_user_*), most likely.
                log.log("error", f"--reload: cannot watch the application's files: {error}; changes will not reload")
                return

    def _reload(self, changed: list[str]) -> None:
        for path in changed:
            self._files[path] = _signature(path)
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        log.log("info", f"--reload: {changed[0]} changed{more}; reloading as SIGHUP does")
        os.kill(os.getpid(), signal.SIGHUP)

    def _take_reports(self) -> bool:
        """Adds the files in every report waiting on the socket; True when one of them is in a
        directory not watched yet."""
        new_directory = False
        while True:
            try:
                data, ancillary, _, _ = self._reports.recvmsg(2 * _REPORT_BYTES, socket.CMSG_SPACE(_UCRED.size))
            except BlockingIOError:
                return new_directory
            sender = _sender_uid(ancillary)
            if sender != os.getuid():
                log.log("warning", f"--reload: ignored a report from user {sender}, who is not this server's")
                continue
            if self._add(os.fsdecode(line) for line in data.splitlines() if line):
                new_directory = True

    def _add(self, files: Iterable[str]) -> bool:
        """Adds `files`; True when one of them is in a directory not watched yet."""
        new_directory = False
        for path in files:
            # Events name a file under the watched directory as given; resolving the directory
            # makes a file reached through a symbolic link match its events.
            directory, name = os.path.split(os.path.abspath(path))
            directory = os.path.realpath(directory)
            path = os.path.join(directory, name)
            if path not in self._files:
                self._files[path] = _signature(path)
            if directory not in self._directories:
                self._directories.add(directory)
                new_directory = True
        return new_directory


# A file's identity and contents as stat(2) tells them; None when it does not exist.
_Signature = tuple[int, int, int] | None


def _signature(path: str) -> _Signature:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return (status.st_ino, status.st_size, status.st_mtime_ns)


def _sender_uid(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(payload) >= _UCRED.size:
            _, uid, _ = _UCRED.unpack(payload[: _UCRED.size])
            return uid
    return None
