"""Open streams and admitted requests of ASGI workers, observed (issue 47, item 7;
docs/METRICS.md): per worker on /metrics, status.json and `maitred top`; and the S4/S5
diagnosis, which counts an ASGI worker's admitted requests (answers not started), so that a
worker full of idle streams is not "saturated" while one whose admissions are all taken is.
Real processes and sockets; every wait is on an event."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from client import get, status_of
from conftest import HOST, Server, eventually, free_port, workers_of
from test_asgi_stream_lifecycle import PID_APP, open_streams, pid_of_answer

# A request whose answer starts only after `wait` seconds: admitted work, not a stream.
SLOW_APP = (
    PID_APP
    + """
_with_pid = app


async def app(scope, receive, send):
    if scope["type"] == "http" and scope["path"] == "/slow":
        await asyncio.sleep(float(scope["query_string"].decode().split("=")[1]))
    await _with_pid(scope, receive, send)
"""
)


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "streams.py").write_text(SLOW_APP)
    return tmp_path


def metric(text: str, name: str) -> float:
    """The value of the one sample named `name` (with its labels) in an exposition."""
    values = [line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith(name + " ")]
    assert len(values) == 1, f"{name}: {values} in\n{text}"
    (value,) = values
    return float(value)


def test_streams_and_admitted_are_shown_per_worker_and_idle_streams_do_not_saturate(
    maitred_server: Callable[..., Server], app_dir: Path
) -> None:
    stats = free_port()
    server = maitred_server(
        "streams:app", "-w", "1", "--worker-connections", "4", "--stats", f"{HOST}:{stats}", cwd=app_dir
    )
    (worker,) = workers_of(server.pid, 1)
    streams_open = 100

    async def with_streams() -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
        return await open_streams(server.port, streams_open, every=1)

    loop = asyncio.new_event_loop()
    try:
        streams = loop.run_until_complete(with_streams())
        counted = eventually(lambda: status_of(stats)["scoreboard"][0]["streams"] == streams_open, 10)
        assert counted, status_of(stats)["scoreboard"]
        status = status_of(stats)
        (card,) = status["scoreboard"]
        assert (card["pid"], card["asgi"], card["admitted"]) == (worker, True, 0), card
        # 100 streams on a worker of 4 admissions: its seats are all free, and short requests
        # are answered at once, one after another, with no S4/S5 diagnosis.
        assert status["seats"] == {"busy": 0, "free": 4}, status["seats"]
        for _ in range(20):
            assert loop.run_until_complete(asyncio.wait_for(pid_of_answer(server.port), 5)) == worker
        exposition = get(stats, "/metrics").body.decode()
        assert metric(exposition, f'maitred_worker_streams{{pid="{worker}"}}') == streams_open
        assert metric(exposition, f'maitred_worker_admitted{{pid="{worker}"}}') == 0
        # Its loop keeps up: it beats, under the 50 ms past which admission would wait.
        beating = eventually(lambda: status_of(stats)["scoreboard"][0]["loop_lag_seconds"] is not None, 10)
        assert beating, status_of(stats)["scoreboard"]
        exposition = get(stats, "/metrics").body.decode()
        assert 0 <= metric(exposition, f'maitred_worker_loop_lag_seconds{{pid="{worker}"}}') < 0.05
        assert metric(exposition, 'maitred_seats{state="free"}') == 4

        # Six requests whose answers start only after 4 s: four are admitted, two wait, and
        # past a second of that the worker is saturated, its admissions named.
        async def slow() -> int:
            reader, writer = await asyncio.open_connection(HOST, server.port)
            writer.write(b"GET /slow?wait=4 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = await reader.read()
            writer.close()
            return int(answer.split(b" ", 2)[1])

        slow_requests = [loop.create_task(slow()) for _ in range(6)]
        loop.run_until_complete(asyncio.sleep(0))

        def saturated() -> bool:
            loop.run_until_complete(asyncio.sleep(0.05))
            return any(d["name"] == "workers_saturated" for d in status_of(stats)["diagnoses"])

        assert eventually(saturated, 10), status_of(stats)
        status = status_of(stats)
        assert (status["scoreboard"][0]["admitted"], status["seats"]) == (4, {"busy": 4, "free": 0}), status
        exposition = get(stats, "/metrics").body.decode()
        assert metric(exposition, f'maitred_worker_admitted{{pid="{worker}"}}') == 4
        assert loop.run_until_complete(asyncio.wait_for(asyncio.gather(*slow_requests), 30)) == [200] * 6
        for _, writer in streams:
            writer.close()
    finally:
        loop.close()
    log = server.stderr()
    assert log.count("diagnosis S4/S5 (workers_saturated)") >= 1, log[-3000:]
