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
# What the lobby may hold of it, beyond the kernel's buffers of the two sockets (docs/LIMITS.md):
# its 256 KiB share, what the worker wrote before it read HOLD (the ring's 1 MiB and one more
# piece) and 256 KiB on the request's route.
MOST_IN_LOBBY = 2 << 20


def kernel_queued(server_port: int, client_port: int) -> int:
    """What the kernel holds of the connection from `client_port` to the server: the bytes in
    the server's socket not yet acknowledged, and those the client's has received and not read
    (/proc/net/tcp's tx_queue and rx_queue)."""
    queued = 0
    with open("/proc/net/tcp") as table:
        next(table)
        for row in table:
            fields = row.split()
            local, remote = (int(address.split(":")[1], 16) for address in fields[1:3])
            tx_queue, rx_queue = (int(count, 16) for count in fields[4].split(":"))
            if (local, remote) == (server_port, client_port):
                queued += tx_queue
            elif (local, remote) == (client_port, server_port):
                queued += rx_queue
    return queued


def made_and_kept(server, slow: socket.socket) -> tuple[int, int]:
    """What the application has made of the answer and what the lobby keeps of it (made, less
    what the kernel holds), once the hold lasts: the application made nothing more while the
    kernel's queues were read."""
    made = int(get(server.port, "/progress").body)
    deadline = time.monotonic() + 20
    while True:
        queued = kernel_queued(server.port, slow.getsockname()[1])
        again = int(get(server.port, "/progress").body)
        if again == made:
            return made, made - queued
        assert time.monotonic() < deadline, f"the application went on making the answer: {again:,} bytes"
        made = again


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
def held_reader(server, target: str = "/generate") -> Iterator[socket.socket]:
    """A client that asks for the generated answer and reads none of it (its receive buffer cut
    to 64 KiB), once the lobby holds that answer."""
    with socket.socket() as slow:
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        slow.connect((HOST, server.port))
        slow.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        server.wait_for_log("is held: its client reads slowly", timeout=20)
        yield slow


def test_a_slow_reader_holds_the_coroutine_not_the_lobbys_memory_or_disk(maitred_server):
    server = maitred_server("-w", "1", "--log-level", "debug", "generated:app", cwd=APPS)
    with held_reader(server) as slow:
        made, kept = made_and_kept(server, slow)
        assert kept <= MOST_IN_LOBBY, f"the application made {made:,} bytes, of which the lobby keeps {kept:,}"
        assert spill_files(server.pid) == []
        received = 0
        while data := slow.recv(1 << 20):
            received += len(data)
    assert get(server.port, "/progress").body == str(SIZE).encode()  # the other requests were served meanwhile
    assert received > SIZE


def test_a_held_send_goes_on_while_another_task_awaits_receive(maitred_server):
    """Django's and Quart's handlers await receive() in a task of their own, for
    http.disconnect, while the response is sent. Both tasks wait on the one request's news; the
    GO must wake the held send, not only the receive. Before, each wait replaced the other's,
    and the send, held for a slow client, never went on: the client waited for ever."""
    server = maitred_server("-w", "1", "--log-level", "debug", "generated:app", cwd=APPS)
    with held_reader(server, "/generate?mib=8&listen=1") as slow:
        slow.settimeout(20)
        received = 0
        while data := slow.recv(1 << 20):
            received += len(data)
    assert received > 8 << 20
    assert get(server.port, "/progress").body == str(8 << 20).encode()


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
