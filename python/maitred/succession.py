"""The binary upgrade (SIGUSR2; docs/SIGNALS.md), as the CLI sees it.

The running lobby starts the command it was started with (`command`, in `directory`), passing
its listen sockets and one end of a channel through the environment
(the lobby owns their names: `_native.UPGRADE_CHANNEL_VARIABLE` and
`_native.UPGRADE_LISTENERS_VARIABLE`). The new maitred's CLI takes those here:
a listen socket already bound to an address in --bind is used as it is (``fd://N``), so that no
connection waiting in its queue is lost (the lobby takes it for that address, which stays the
one logged and, for a Unix socket, the file removed at exit); one that --bind no longer names is
closed.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass

from maitred import _native, config, log

CHANNEL_VARIABLE = _native.UPGRADE_CHANNEL_VARIABLE
LISTENERS_VARIABLE = _native.UPGRADE_LISTENERS_VARIABLE


@dataclass
class Inheritance:
    """What the lobby being replaced passed: its end of the channel, and its listen sockets."""

    channel: int
    listeners: list[int]


def take_inheritance(environ: MutableMapping[str, str]) -> Inheritance | None:
    """Removes the upgrade's variables from `environ` (the application must not see them) and
    returns what they name; None when this maitred is not an upgrade. Raises ValueError when
    they are malformed."""
    channel_text = environ.pop(CHANNEL_VARIABLE, None)
    listeners_text = environ.pop(LISTENERS_VARIABLE, None)
    if channel_text is None:
        return None
    try:
        channel = int(channel_text)
        listeners = [int(fd) for fd in listeners_text.split(",")] if listeners_text else []
    except ValueError:
        raise ValueError(
            f"{CHANNEL_VARIABLE}={channel_text!r} {LISTENERS_VARIABLE}={listeners_text!r}: expected descriptor numbers"
        ) from None
    for fd in [channel, *listeners]:
        try:
            os.fstat(fd)
        except OSError as error:
            raise ValueError(f"descriptor {fd}, passed by the maitred being replaced: {error.strerror}") from None
    return Inheritance(channel, listeners)


def command() -> list[str]:
    """The command line that started this maitred, for the next upgrade to run again."""
    return [sys.executable, *sys.orig_argv[1:]]


def reuse_listeners(binds: Sequence[str], inherited: Sequence[int]) -> dict[str, int]:
    """The inherited sockets to use, by the bind that names the address each listens on (an
    ``fd://N`` bind names its own descriptor, and needs no entry). The inherited sockets that no
    bind names are closed, and the log says so."""
    addresses = {fd: _local_address(fd) for fd in inherited}
    used: set[int] = set()
    reused = {}
    for bind in binds:
        match = next((fd for fd in inherited if fd not in used and _names(bind, fd, addresses[fd])), None)
        if match is not None:
            used.add(match)
            if not bind.startswith("fd://"):
                reused[bind] = match
    for fd in inherited:
        if fd not in used:
            log.log("info", f"no longer listening at {_describe(addresses[fd])}: --bind does not name it")
            os.close(fd)
    return reused


def _local_address(fd: int) -> object:
    sock = socket.socket(fileno=fd)
    try:
        return sock.getsockname()
    finally:
        sock.detach()


def _describe(address: object) -> str:
    if isinstance(address, tuple):
        host, port = address[0], address[1]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"unix:{address}"


def _names(bind: str, fd: int, address: object) -> bool:
    """Whether `bind` is the address `address`, the inherited socket `fd` listens on."""
    parts = config.bind_parts(bind)
    if parts[0] == "fd":
        return parts[1] == fd
    if parts[0] == "unix":
        return isinstance(address, str) and os.path.abspath(parts[1]) == os.path.abspath(address)
    if not isinstance(address, tuple):
        return False
    _, host, port = parts
    try:
        candidates = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError):
        return False
    # The lobby binds the first address a name resolves to (crates/lobby/src/listen/bind.rs).
    return bool(candidates) and candidates[0][4][:2] == address[:2]
