"""A generated ASGI answer to a client that reads slowly (docs/LIMITS.md, "A slow reader of an
ASGI answer"): the lobby keeps at most its 256 KiB share of it in memory, and the frames the
worker wrote before it read HOLD, and spills none of it to a file; the coroutine's sends wait
meanwhile, so the application makes the answer at its client's pace, and every byte arrives
once the client reads. Before, the lobby spilled up to --max-spill (1 GiB) of it to a file and
the application made it all at once.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

from client import get
from conftest import HOST
from test_lifecycle import APPS

SIZE = 64 << 20
# What may be on its way while the client reads nothing: the lobby's share (256 KiB) and what
# the worker wrote before it read HOLD (the ring's 1 MiB and one more piece), the kernel's
# buffers of the two sockets (the client's receive buffer is cut to 64 KiB; the lobby's send
# buffer grows to tcp_wmem's most, 4 MiB by default), and the piece on its way when looked at.
MOST_AHEAD = 8 << 20


def spill_files(pid: int) -> list[str]:
    """The deleted files the lobby holds open: its spool's temporary files."""
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.endswith(" (deleted)") and not target.startswith(("/memfd:", "/dev/shm")):
            found.append(target)
    return found


@contextmanager
def held_reader(server) -> Iterator[socket.socket]:
    """A client that asks for the generated answer and reads none of it (its receive buffer cut
    to 64 KiB), once the lobby holds that answer."""
    with socket.socket() as slow:
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        slow.connect((HOST, server.port))
        slow.sendall(b"GET /generate HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        server.wait_for_log("is held: its client reads slowly", timeout=20)
        yield slow


def test_a_slow_reader_holds_the_coroutine_not_the_lobbys_memory_or_disk(maitred_server):
    server = maitred_server("-w", "1", "--log-level", "debug", "generated:app", cwd=APPS)
    with held_reader(server) as slow:
        ahead = int(get(server.port, "/progress").body)
        assert ahead <= MOST_AHEAD, f"the application made {ahead:,} bytes for a client that read none"
        assert spill_files(server.pid) == []
        received = 0
        while data := slow.recv(1 << 20):
            received += len(data)
    assert get(server.port, "/progress").body == str(SIZE).encode()  # the other requests were served meanwhile
    assert received > SIZE


def test_a_held_answer_whose_client_leaves_ends_the_applications_sends(maitred_server):
    """Held, then the client goes: nothing is left to hold for, so the application's send raises
    (as under uvicorn) and the worker goes on. Before, the relay sent HOLD and GO in a loop for
    the answer that stayed over its share, the lobby and the worker each at 100% of a core, and
    the application never heard that its client had gone."""
    server = maitred_server("-w", "1", "--log-level", "debug", "generated:app", cwd=APPS)
    with held_reader(server):
        pass  # held, the client closes its socket
    deadline = time.monotonic() + 10
    while not (progress := get(server.port, "/progress").body).endswith(b" gone"):
        assert time.monotonic() < deadline, f"the application's sends went on after its client left: {progress!r}"
        time.sleep(0.05)
    assert int(progress.split()[0]) < SIZE
