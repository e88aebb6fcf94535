"""maitred-stub (bench/stub), the bench tool behind bench/ceiling.py: the real lobby seating
requests at native stub workers, which speak the worker protocol (docs/PROTOCOL.md) and answer
every request at once.

Builds nothing: it runs maitred-stub from cargo's target directory (target/, or where
CARGO_TARGET_DIR puts it), which `make test` builds first (`cargo build --release -p
maitred-stub`, as bench/ceiling.py does), and is skipped, saying so, when a bare pytest run finds
it missing.
"""

from __future__ import annotations

import http.client
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import HOST, accepts_connections, free_port, kill_group, maitred_stub, wait_for_empty_group

STUB = maitred_stub()

pytestmark = pytest.mark.skipif(
    not STUB.exists(), reason=f"{STUB} is not built (cargo build --release -p maitred-stub)"
)


def test_stub_workers_answer_over_keep_alive_and_the_server_stops_cleanly(tmp_path: Path) -> None:
    port = free_port()
    log_path = tmp_path / "stub.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(STUB), "--port", str(port), "--workers", "2"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 5
        while not accepts_connections(port):
            assert process.poll() is None, f"maitred-stub exited with {process.returncode}: {log_path.read_text()}"
            assert time.monotonic() < deadline, f"nothing listens on {port}: {log_path.read_text()}"
            time.sleep(0.01)

        connection = http.client.HTTPConnection(HOST, port, timeout=5)
        connection.connect()
        socket = connection.sock
        for i in range(100):
            connection.request("GET", f"/{i}")
            response = connection.getresponse()
            assert (response.status, response.read()) == (200, b"Hello, world!\n")
            assert response.getheader("Content-Length") == "14"
        # Every request went over the one connection.
        assert connection.sock is socket
        connection.close()

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=5) == 0, log_path.read_text()
        assert wait_for_empty_group(process.pid, timeout=2) == []
        assert "ERROR" not in log_path.read_text()
    finally:
        kill_group(process.pid)
        process.wait()
