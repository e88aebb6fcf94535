"""A service manager's environment (docs/SYSTEMD.md): the sockets passed by socket activation
(LISTEN_FDS), which replace every --bind, and the service manager's variables, which the
zygote's environment must not keep.

May import: values.py (and maitred._native: the lobby owns LISTEN_FDS_START).
"""

from __future__ import annotations

import os
import re
from collections.abc import MutableMapping

from maitred import _native
from maitred.config.values import _bind_address

# The first descriptor socket activation passes (SD_LISTEN_FDS_START in sd_listen_fds(3)); the
# lobby, which names the sockets it serves by it too, owns the number.
LISTEN_FDS_START = _native.LISTEN_FDS_START

# What systemd tells the process it starts: the sockets passed by socket activation, the notify
# socket and the watchdog. They are the lobby's; the zygote, and so the workers and the
# application, must not see them (see without_service_manager).
SERVICE_MANAGER_VARIABLES = (
    "LISTEN_PID",
    "LISTEN_FDS",
    "LISTEN_FDNAMES",
    "NOTIFY_SOCKET",
    "WATCHDOG_PID",
    "WATCHDOG_USEC",
)


def activated_sockets(environ: MutableMapping[str, str], upgrading: bool = False) -> list[str]:
    """The sockets a service manager passed to this process by socket activation, as
    ``fd://N`` binds: LISTEN_FDS descriptors from fd 3 on, when LISTEN_PID is this process (as
    sd_listen_fds(3) reads them). Empty when there are none for this process. They replace
    every --bind, as gunicorn's do. Raises ValueError when the variables are malformed or a
    descriptor is not an open socket; the lobby checks that each listens for streams."""
    pid_text, count_text = environ.get("LISTEN_PID"), environ.get("LISTEN_FDS")
    if pid_text is None or count_text is None:
        return []
    if not re.fullmatch(r"[0-9]+", pid_text):
        raise ValueError(f"LISTEN_PID: expected a process id, got {pid_text!r}")
    # A binary upgrade's new maitred is started by the lobby that was given them.
    if int(pid_text) != os.getpid() and not (upgrading and int(pid_text) == os.getppid()):
        return []  # meant for another process (one that started maitred without exec)
    # They are this process's now, and so the next upgrade's.
    environ["LISTEN_PID"] = str(os.getpid())
    if not re.fullmatch(r"[0-9]+", count_text):
        raise ValueError(f"LISTEN_FDS: expected a number of descriptors, got {count_text!r}")
    count = int(count_text)
    names = environ.get("LISTEN_FDNAMES")
    if count and names is not None and len(names.split(":")) != count:
        raise ValueError(f"LISTEN_FDNAMES names {len(names.split(':'))} sockets, LISTEN_FDS passes {count}")
    binds = []
    for fd in range(LISTEN_FDS_START, LISTEN_FDS_START + count):
        try:
            binds.append(_bind_address(f"fd://{fd}"))
        except ValueError as error:
            raise ValueError(f"LISTEN_FDS={count}: {error}") from None
    return binds


def without_service_manager(environ: MutableMapping[str, str]) -> None:
    """Removes the service manager's variables from `environ`, as sd_listen_fds(3) and
    sd_notify(3) do when told to unset them. The CLI calls it in the zygote, right after the
    fork: the lobby keeps them (it notifies, and names the sockets it serves), while the
    application, in the zygote or a worker, neither sees sockets that are the lobby's nor
    speaks to the service manager in the lobby's name."""
    for name in SERVICE_MANAGER_VARIABLES:
        environ.pop(name, None)
