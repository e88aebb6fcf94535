"""Past capacity (docs/TUNING.md, "Overload"): no work for clients who have left, the time a
request already spent upstream counted, and 503s for what can no longer be answered in time,
once clients show how long they wait; patient clients are never shed.

The apps tally the requests they run (tests/apps/tally.py), so "the app ran once" is counted
where it happens, in the worker.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from client import get, read_reply, status_of
from conftest import HOST, eventually, free_port

APPS = Path(__file__).parent / "apps"


def tally_server(maitred_server, tmp_path, *args):
    """A server of tally:app with a stats listener; returns it, the stats port and the tally."""
    tally = tmp_path / "tally"
    tally.write_text("")
    stats = free_port()
    server = maitred_server("--stats", f"{HOST}:{stats}", *args, "tally:app", cwd=APPS, env={"TALLY": str(tally)})
    return server, stats, tally


def ran(tally: Path) -> list[str]:
    """The paths of the requests the app ran, in order."""
    return [line.split()[1] for line in tally.read_text().splitlines()]


def shed(stats: int) -> dict:
    return status_of(stats)["overload"]["shed"]


def send(port: int, path: str, headers: str = "") -> socket.socket:
    sock = socket.create_connection((HOST, port), timeout=30)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\n{headers}\r\n".encode())
    return sock


def occupy(port: int, tally: Path, seconds: float) -> threading.Thread:
    """Holds the one worker with a request of `seconds`, once it has begun."""
    busy = threading.Thread(target=get, args=(port, f"/busy?sleep={seconds}"))
    busy.start()
    assert eventually(lambda: "/busy" in ran(tally), timeout=10)
    return busy


def clients_give_up_one_by_one(server, stats, tally) -> None:
    """Overload, as a proxy with a 0.3 s timeout makes it: behind a 3 s request on the only
    worker, a client arrives every 50 ms for 1.2 s, and each gives up 0.3 s after it sent. The
    queue grows and never drains, so from 1 s on their departures teach the queue their
    patience. Returns once it has learned it, with the 3 s request still running."""
    busy = occupy(server.port, tally, 3)
    leaving: list[tuple[float, socket.socket]] = []
    started = time.monotonic()
    for n in range(24):
        # Paced arrivals, and each client's own patience: the clients' behaviour, not a wait
        # for the server.
        time.sleep(max(0.0, started + n * 0.05 - time.monotonic()))
        leaving.append((time.monotonic() + 0.3, send(server.port, f"/left{n}")))
        while leaving and leaving[0][0] <= time.monotonic():
            leaving.pop(0)[1].close()
    for due, sock in leaving:
        time.sleep(max(0.0, due - time.monotonic()))
        sock.close()
    assert eventually(lambda: shed(stats)["abandoned"] == 24, timeout=10)
    assert status_of(stats)["overload"]["learned"] is not None, status_of(stats)["overload"]
    return busy


def six_at_once(port: int) -> list:
    """The replies to six requests of a 0.1 s app sent at once."""
    replies: list = []
    queued = [threading.Thread(target=lambda n=n: replies.append(get(port, f"/q{n}?sleep=0.1"))) for n in range(6)]
    for thread in queued:
        thread.start()
    for thread in queued:
        thread.join(timeout=20)
    return replies


def test_requests_of_clients_who_left_are_never_run(maitred_server, tmp_path):
    """The issue's case: ten requests to one worker of a 0.5 s app, every client closing after
    0.2 s. The first is in service and runs; the nine waiting behind it are dropped."""
    server, stats, tally = tally_server(maitred_server, tmp_path, "-w", "1")
    clients = [send(server.port, f"/r{n}?sleep=0.5") for n in range(10)]
    assert eventually(lambda: ran(tally) == ["/r0"], timeout=10)
    time.sleep(0.2)  # the clients' own patience, not a wait for the server
    for sock in clients:
        sock.close()
    assert eventually(lambda: shed(stats)["abandoned"] == 9, timeout=10), shed(stats)
    assert eventually(lambda: status_of(stats)["workers"]["idle"] == 1, timeout=10)
    assert get(server.port, "/after").status == 200
    assert ran(tally) == ["/r0", "/after"]
    assert status_of(stats)["queue"]["waiting"] == 0


def test_a_half_close_is_a_client_leaving_unless_half_close_serve(maitred_server, tmp_path):
    server, stats, tally = tally_server(maitred_server, tmp_path, "-w", "1")
    busy = occupy(server.port, tally, 0.5)
    half = send(server.port, "/half")
    half.shutdown(socket.SHUT_WR)
    assert eventually(lambda: shed(stats)["abandoned"] == 1, timeout=10)
    assert half.recv(1024) == b""  # closed, unanswered
    half.close()
    busy.join(timeout=10)
    assert ran(tally) == ["/busy"]

    server, stats, tally = tally_server(maitred_server, tmp_path, "-w", "1", "--half-close", "serve")
    busy = occupy(server.port, tally, 0.5)
    half = send(server.port, "/half")
    half.shutdown(socket.SHUT_WR)
    assert read_reply(half).status == 200
    half.close()
    busy.join(timeout=10)
    assert ran(tally) == ["/busy", "/half"]
    assert shed(stats)["abandoned"] == 0


def test_time_spent_upstream_counts_against_the_request_deadline(maitred_server, tmp_path):
    access = tmp_path / "access.log"
    server, stats, tally = tally_server(
        maitred_server,
        tmp_path,
        "--request-deadline",
        "2",
        "--access-logfile",
        str(access),
        "--access-logformat",
        "%(U)s %(s)s %(queue_ms)s",
    )
    now = time.time()
    # nginx's $msec (seconds), Heroku's milliseconds, Apache's microseconds.
    spent = send(server.port, "/spent", f"X-Request-Start: t={now - 5:.3f}\r\n")
    reply = read_reply(spent)
    assert reply.status == 503 and reply.headers["Retry-After"] == "1", reply
    assert b"--request-deadline" in reply.body
    fresh = send(server.port, "/fresh", f"X-Request-Start: {int((now - 0.3) * 1000)}\r\n")
    assert read_reply(fresh).status == 200
    micros = send(server.port, "/micros", f"X-Request-Start: t={int((time.time() - 0.01) * 1e6)}\r\n")
    assert read_reply(micros).status == 200
    assert ran(tally) == ["/fresh", "/micros"]
    assert shed(stats)["deadline"] == 1
    # queue_ms counts the wait upstream: at least the 0.3 s the proxy said.
    assert eventually(lambda: len(access.read_text().splitlines()) == 3, timeout=10)
    logged = {
        path: (status, float(queue_ms)) for path, status, queue_ms in map(str.split, access.read_text().splitlines())
    }
    # The header said 5 s ago to the millisecond, rounded either way.
    assert logged["/spent"][0] == "503" and logged["/spent"][1] >= 4999
    assert logged["/fresh"][0] == "200" and 300 <= logged["/fresh"][1] < 2000


def test_x_request_start_from_an_untrusted_peer_is_ignored(maitred_server, tmp_path):
    server, stats, tally = tally_server(
        maitred_server, tmp_path, "--request-deadline", "2", "--forwarded-allow-ips", "10.0.0.1"
    )
    sock = send(server.port, "/spent", f"X-Request-Start: t={time.time() - 60:.3f}\r\n")
    assert read_reply(sock).status == 200
    assert ran(tally) == ["/spent"]
    assert shed(stats)["deadline"] == 0


def test_once_clients_give_up_what_waits_past_half_their_patience_gets_503(maitred_server, tmp_path):
    """Clients that give up after 0.3 s, one by one while the queue grows, teach the queue their
    patience; then requests that wait over half of it are answered 503 with Retry-After instead
    of late, the log names the overload with its fix, and once the overload has ended (the
    queue drained and stayed short for 1 s) the patience lapses and requests are served again."""
    server, stats, tally = tally_server(maitred_server, tmp_path, "-w", "1")
    busy = clients_give_up_one_by_one(server, stats, tally)
    learned = status_of(stats)["overload"]["learned"]
    # Measured from when the lobby had read each request, a little after its client sent it.
    assert 0.25 <= learned["patience_seconds"] < 1, learned
    assert learned["departures"] >= 5, learned
    late = [send(server.port, f"/late{n}") for n in range(6)]
    replies = [read_reply(sock) for sock in late]
    busy.join(timeout=10)
    assert [reply.status for reply in replies] == [503] * 6
    for reply in replies:
        assert int(reply.headers["Retry-After"]) >= 1
        assert b"could no longer be answered in time" in reply.body
        assert b"separate departures" in reply.body
    assert shed(stats)["overload"] == 6
    assert not any(path.startswith(("/left", "/late")) for path in ran(tally))
    server.wait_for_log("diagnosis O1 (overload): requests arrive faster than the workers answer them", 10)
    assert eventually(lambda: status_of(stats)["overload"]["learned"] is None, timeout=10)
    assert [reply.status for reply in six_at_once(server.port)] == [200] * 6


def test_clients_leaving_at_one_instant_teach_nothing(maitred_server, tmp_path):
    """A load generator's exit (issue 30): connections whose requests wait behind a 4 s request,
    arriving one after another until the server is past its capacity (its queue growing for a
    second), close at one instant, as wrk's do at the end of a run. Their requests are dropped,
    never run, but their waits are not a patience: the next requests are all served."""
    server, stats, tally = tally_server(maitred_server, tmp_path, "-w", "1")
    busy = occupy(server.port, tally, 4)
    clients = []
    started = time.monotonic()
    while not status_of(stats)["overload"]["overloaded"]:
        # Overload is a queue growing for a second (SUSTAINED), whatever the count: the clients
        # arrive at a pace of their own, one every 20 ms, not as fast as this loop can (which
        # once made 500 in under a second), and give the server 3 s of the 4 s request to say it.
        assert time.monotonic() - started < 3, "the queue grew for 3 s and the server never said it was overloaded"
        time.sleep(max(0.0, started + len(clients) * 0.02 - time.monotonic()))
        clients.append(send(server.port, f"/gone{len(clients)}"))
        queued = len(clients)
        assert eventually(lambda n=queued: status_of(stats)["queue"]["waiting"] == n, timeout=10)
    for sock in clients:
        sock.close()
    assert eventually(lambda: shed(stats)["abandoned"] == len(clients), timeout=10)
    assert status_of(stats)["overload"]["learned"] is None
    busy.join(timeout=10)
    assert [reply.status for reply in six_at_once(server.port)] == [200] * 6
    assert not any(path.startswith("/gone") for path in ran(tally))
    assert shed(stats)["overload"] == 0


def test_a_standing_queue_of_patient_clients_is_served_whole_in_order(maitred_server, tmp_path):
    """S1's case: far more clients than workers, none giving up. Nothing is shed, however long
    the queue waits, and the requests run in the order they came."""
    server, stats, tally = tally_server(maitred_server, tmp_path, "-w", "1")
    busy = occupy(server.port, tally, 3)
    clients = []
    for n in range(30):
        clients.append(send(server.port, f"/p{n:02}?sleep=0.02"))
        assert eventually(lambda n=n: status_of(stats)["queue"]["waiting"] == n + 1, timeout=10)
    assert [read_reply(sock).status for sock in clients] == [200] * 30
    for sock in clients:
        sock.close()
    busy.join(timeout=10)
    assert ran(tally) == ["/busy"] + [f"/p{n:02}" for n in range(30)]
    assert shed(stats) == {"abandoned": 0, "overload": 0, "deadline": 0, "queue_timeout": 0}
    assert status_of(stats)["overload"]["patience_seconds"] is None


def test_fifo_serves_every_request_however_long_it_waited(maitred_server, tmp_path):
    server, stats, tally = tally_server(maitred_server, tmp_path, "-w", "1", "--queue-policy", "fifo")
    busy = clients_give_up_one_by_one(server, stats, tally)
    late = [send(server.port, f"/late{n}") for n in range(6)]
    assert [read_reply(sock).status for sock in late] == [200] * 6
    busy.join(timeout=10)
    assert shed(stats)["overload"] == 0
    assert status_of(stats)["overload"]["policy"] == "fifo"


def test_shed_requests_are_counted_from_the_first_scrape(maitred_server, tmp_path):
    stats = free_port()
    maitred_server("--stats", f"{HOST}:{stats}", "echo:app", cwd=APPS)
    metrics = get(stats, "/metrics").body.decode()
    for reason in ("abandoned", "overload", "deadline", "queue_timeout"):
        assert f'maitred_shed_total{{reason="{reason}"}} 0' in metrics, metrics


WRK = shutil.which("wrk")


@pytest.mark.skipif(WRK is None, reason="wrk is not installed (Debian: apt-get install wrk; .ci/run installs it)")
@pytest.mark.parametrize(
    ("interface", "milliseconds", "options", "connections"),
    [
        # The reproduction: 8 threads, 32 connections, 24 requests queued at each exit.
        ("wsgi", 20, ("-w", "2", "--threads", "4"), 32),
        ("wsgi", 1, ("-w", "2"), 1000),
        ("wsgi", 100, ("-w", "2", "--threads", "4"), 1),
        ("wsgi", 100, ("-w", "2"), 256),
        ("asgi", 1, ("-w", "2"), 1000),
        ("asgi", 20, ("-w", "2", "--worker-connections", "8"), 64),
        ("asgi", 100, ("-w", "2", "--worker-connections", "8"), 256),
    ],
)
def test_back_to_back_load_runs_are_all_answered(maitred_server, interface, milliseconds, options, connections):
    """Issue 30: a load generator's exit, closing every connection while requests wait, is not
    impatience. Three `wrk` runs one after the other, as benchmarks run them: every answer of
    every run is a 200, and nothing is shed."""
    stats = free_port()
    app = "paced:app" if interface == "wsgi" else "paced:asgi_app"
    server = maitred_server(*options, "--stats", f"{HOST}:{stats}", app, cwd=APPS)
    url = f"http://{HOST}:{server.port}/?ms={milliseconds}"
    for run in range(3):
        done = subprocess.run(
            [WRK, f"-t{min(2, connections)}", f"-c{connections}", "-d2s", "--timeout", "30s", url],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        answered = re.search(r"(\d+) requests in", done.stdout)
        assert answered is not None and int(answered[1]) > 0, done.stdout
        assert "Non-2xx" not in done.stdout, f"run {run + 1}: {done.stdout}"
        assert "Socket errors" not in done.stdout, f"run {run + 1}: {done.stdout}"
    assert shed(stats)["overload"] == 0
    assert status_of(stats)["overload"]["learned"] is None
