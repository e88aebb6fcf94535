"""Many keep-alive clients against few workers (SCENARIOS.md, S4 and S5): every request is
served, no connection is closed because the workers are busy, and none waits behind clients that
keep asking.

The clients are asyncio streams, so that 200 of them cost the test little. Each speaks raw
HTTP/1.1 over one connection; the application answers the client's port, which shows that
all ten answers came over the connection the client opened.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

from conftest import HOST

APPS = Path(__file__).resolve().parent / "apps"
CLIENTS = 200
REQUESTS_PER_CLIENT = 10
DEADLINE = 45.0


@dataclass
class ClientRun:
    """What one client saw."""

    port: int
    statuses: list[int] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    connection_headers: list[str] = field(default_factory=list)
    closed_by_server: bool = False


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("closed before a response")
    status = int(status_line.split(b" ", 2)[1])
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers["content-length"]))
    return status, headers, body


async def keep_alive_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> ClientRun:
    run = ClientRun(port=writer.get_extra_info("sockname")[1])
    try:
        for number in range(REQUESTS_PER_CLIENT):
            writer.write(f"GET /{number} HTTP/1.1\r\nHost: load\r\n\r\n".encode())
            await writer.drain()
            try:
                status, headers, body = await read_response(reader)
            except (ConnectionError, asyncio.IncompleteReadError):
                run.closed_by_server = True
                return run
            run.statuses.append(status)
            run.bodies.append(body)
            run.connection_headers.append(headers.get("connection", ""))
        # Still open after the last answer: the stream has not reached its end.
        run.closed_by_server = reader.at_eof()
        return run
    finally:
        writer.close()


async def crowd(port: int) -> list[ClientRun]:
    """Connects every client first, so that all 200 connections are open at once, then lets
    them all send their requests."""
    streams = await asyncio.gather(*(asyncio.open_connection(HOST, port) for _ in range(CLIENTS)))
    return await asyncio.gather(*(keep_alive_client(reader, writer) for reader, writer in streams))


def test_200_keep_alive_clients_on_2_workers_are_all_served_on_their_own_connections(
    maitred_server,
):
    server = maitred_server("-w", "2", "nap:app", cwd=APPS)
    started = time.monotonic()
    runs = asyncio.run(asyncio.wait_for(crowd(server.port), DEADLINE))
    elapsed = time.monotonic() - started

    closed = [run.port for run in runs if run.closed_by_server]
    assert closed == [], f"{len(closed)} connections closed by the server"
    statuses = [status for run in runs for status in run.statuses]
    assert statuses == [200] * (CLIENTS * REQUESTS_PER_CLIENT)
    wrong_connection = [run.port for run in runs if set(run.bodies) != {f"{run.port}\n".encode()}]
    assert wrong_connection == []
    assert {value for run in runs for value in run.connection_headers} <= {"", "keep-alive"}
    # 2000 requests of 5 ms on 2 workers is 5 s of sleeping; the rest is overhead.
    assert elapsed < DEADLINE
    assert server.process.poll() is None


# Keep-alive clients that ask again the moment each answer comes: more of them than the server
# has threads, so that a request is always waiting.
EAGER_CLIENTS = 16


async def newcomer_among_eager_clients(port: int) -> tuple[int, int, list[int]]:
    """EAGER_CLIENTS clients ask again as soon as each answer comes; once every one of them has
    had an answer, a newcomer connects and asks once. Returns the newcomer's status, how many
    answers the eager clients got between its request and its answer, and their statuses."""
    statuses: list[int] = []
    answered: set[int] = set()
    all_answered = asyncio.Event()
    stop = asyncio.Event()

    async def eager(index: int) -> None:
        reader, writer = await asyncio.open_connection(HOST, port)
        try:
            while not stop.is_set():
                writer.write(b"GET /eager HTTP/1.1\r\nHost: load\r\n\r\n")
                await writer.drain()
                status, _headers, _body = await read_response(reader)
                statuses.append(status)
                answered.add(index)
                if len(answered) == EAGER_CLIENTS:
                    all_answered.set()
        finally:
            writer.close()

    clients = [asyncio.create_task(eager(index)) for index in range(EAGER_CLIENTS)]
    await all_answered.wait()
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        before = len(statuses)
        writer.write(b"GET /newcomer HTTP/1.1\r\nHost: load\r\n\r\n")
        await writer.drain()
        status, _headers, _body = await read_response(reader)
        between = len(statuses) - before
    finally:
        writer.close()
        stop.set()
    await asyncio.gather(*clients)
    return status, between, statuses


def test_clients_that_ask_again_at_once_cannot_keep_a_newcomer_waiting(maitred_server):
    """S4 as granian --backpressure shows it (SCENARIOS.md): a server that serves a few
    keep-alive connections at a time leaves the others waiting for as long as those few keep
    asking. In maitred's one FIFO a request waits behind those queued before it and no more:
    with 16 clients asking again at once on 2 threads, each of them gets about one answer (the
    request ahead of the newcomer's, or the answer already on its way) before the newcomer's
    comes; the bound of two each leaves room for the test's own event loop, not for rounds."""
    server = maitred_server("-w", "1", "--threads", "2", "nap:app", cwd=APPS)
    status, between, statuses = asyncio.run(asyncio.wait_for(newcomer_among_eager_clients(server.port), DEADLINE))
    assert status == 200
    assert set(statuses) == {200}
    assert between <= 2 * EAGER_CLIENTS, f"{between} answers to the others before the newcomer's"
    assert server.process.poll() is None
