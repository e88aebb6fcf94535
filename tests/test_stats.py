"""The stats listener (--stats, docs/METRICS.md): Prometheus metrics answered by the lobby.

A real maitred on 127.0.0.1, real requests; the exposition is read with the Prometheus
project's own Python parser (prometheus-client), checked with `promtool check metrics`, and
scraped by a real Prometheus server (Debian's prometheus package; those tests skip, saying why,
without it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from client import get, read_reply, wait_for_queue
from conftest import HOST, MAITRED, eventually, free_port
from prometheus_client.parser import text_string_to_metric_families

APPS = Path(__file__).resolve().parent / "apps"
DOCS = Path(__file__).resolve().parent.parent / "docs"


def scrape(port: int) -> dict[str, list]:
    """GET /metrics: every sample, by family name."""
    with socket.create_connection((HOST, port), timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: stats\r\n\r\n")
        reply = read_reply(sock)
    assert reply.status == 200, reply
    assert reply.headers["Content-Type"] == "text/plain; version=0.0.4"
    return {family.name: family.samples for family in text_string_to_metric_families(reply.body.decode())}


def exposition(port: int) -> str:
    with socket.create_connection((HOST, port), timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: stats\r\n\r\n")
        return read_reply(sock).body.decode()


def value(samples: list, name: str, **labels: str) -> float:
    found = [s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, samples)
    return found[0]


def kernel_listen_counters() -> dict[str, int]:
    """The kernel's ListenOverflows and ListenDrops now (/proc/net/netstat, TcpExt): the
    counters maitred_listen_overflows_total follows, for this network namespace."""
    lines = iter(Path("/proc/net/netstat").read_text().splitlines())
    for names, values in zip(lines, lines):
        if names.startswith("TcpExt:"):
            counters = dict(zip(names.split(), values.split()))
            return {name: int(counters[name]) for name in ("ListenOverflows", "ListenDrops")}
    raise AssertionError("no TcpExt counters in /proc/net/netstat")


def test_metrics_count_what_the_lobby_served_without_a_worker(maitred_server):
    stats = free_port()
    before = kernel_listen_counters()
    server = maitred_server("-w", "2", "--stats", f"{HOST}:{stats}", "echo:app", cwd=APPS)
    for _ in range(7):
        assert get(server.port, "/").status == 200
    with socket.create_connection((HOST, server.port), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\n\r\n")  # no Host: the lobby refuses it
        assert read_reply(sock).status == 400
    families = scrape(stats)
    assert value(families["maitred_requests"], "maitred_requests_total", **{"class": "2xx"}) == 7
    assert value(families["maitred_requests"], "maitred_requests_total", **{"class": "4xx"}) == 1
    assert value(families["maitred_refusals"], "maitred_refusals_total", status="400") == 1
    assert value(families["maitred_request_duration_seconds"], "maitred_request_duration_seconds_count") == 7
    assert value(families["maitred_queue_wait_seconds"], "maitred_queue_wait_seconds_count") == 7
    assert value(families["maitred_workers"], "maitred_workers", state="idle") == 2
    assert value(families["maitred_workers"], "maitred_workers", state="busy") == 0
    assert value(families["maitred_seats"], "maitred_seats", state="free") == 2
    assert value(families["maitred_seats"], "maitred_seats", state="busy") == 0
    assert value(families["maitred_queue_requests"], "maitred_queue_requests") == 0
    after = kernel_listen_counters()
    # The test's own requests lose no connect at the listen queue: what the counters show since
    # maitred started, the rest of the machine lost between the test's two reads of the kernel's
    # counters (on a quiet machine nothing, and the bound is 0). The kernel's own total since boot,
    # or a count that is not the lobby's since its start, is over that bound.
    overflows = families["maitred_listen_overflows"]
    for counter in ("ListenOverflows", "ListenDrops"):
        lost = value(overflows, "maitred_listen_overflows_total", counter=counter, scope="machine")
        assert lost <= after[counter] - before[counter], (counter, lost, before, after)
    server.wait_for_log("stats at http://", 10)


def test_every_family_is_there_from_the_first_scrape_with_its_known_labels_at_zero(maitred_server):
    """docs/METRICS.md: a family that appears only once something happened breaks a rate() over
    the time before, so every family, and each label value known in advance, is there at 0."""
    stats = free_port()
    maitred_server("--stats", f"{HOST}:{stats}", "echo:app", cwd=APPS)
    families = scrape(stats)
    documented = set(re.findall(r"^\| `(maitred_[a-z_]+)` \|", (DOCS / "METRICS.md").read_text(), re.MULTILINE))
    exposed = {sample.name for samples in families.values() for sample in samples}
    missing = {name for name in documented if not any(e == name or e.startswith(name + "_") for e in exposed)}
    assert not missing, f"documented in docs/METRICS.md but not on the first scrape: {sorted(missing)}"
    refusals = {s.labels["status"]: s.value for s in families["maitred_refusals"] if s.name == "maitred_refusals_total"}
    assert refusals == {
        status: 0 for status in ("400", "408", "413", "414", "417", "426", "431", "500", "501", "503", "505")
    }
    for family, label in (("maitred_shed", "reason"), ("maitred_worker_exits", "reason")):
        zeros = [s for s in families[family] if s.name == family + "_total"]
        assert zeros and all(s.value == 0 for s in zeros), (family, zeros)
        assert all(label in s.labels for s in zeros)


def test_busy_workers_and_waiting_requests_show_while_they_wait(maitred_server):
    stats = free_port()
    server = maitred_server("-w", "1", "--stats", f"{HOST}:{stats}", "echo:app", cwd=APPS)
    threads = [threading.Thread(target=get, args=(server.port, "/?sleep=1.5")) for _ in range(3)]
    for thread in threads:
        thread.start()
    wait_for_queue(stats, busy=1, waiting=2)
    families = scrape(stats)
    # Answered by the lobby while its only worker is busy.
    assert value(families["maitred_workers"], "maitred_workers", state="busy") == 1
    assert value(families["maitred_queue_requests"], "maitred_queue_requests") == 2
    # One connection with the worker, two whose complete request waits for it.
    assert value(families["maitred_connections"], "maitred_connections", state="in_service") == 1
    assert value(families["maitred_connections"], "maitred_connections", state="queued") == 2
    for thread in threads:
        thread.join(timeout=20)


def test_a_listeners_queue_and_backlog_show_while_the_lobby_is_at_max_connections(maitred_server):
    """At --max-connections the lobby stops accepting: connections wait in the kernel's queue,
    and the metric says how many, against the backlog granted."""
    stats = free_port()
    server = maitred_server(
        "--backlog", "16", "--max-connections", "1", "--stats", f"{HOST}:{stats}", "echo:app", cwd=APPS
    )
    listener = f"http://{HOST}:{server.port}"
    held = socket.create_connection((HOST, server.port), timeout=10)
    held.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    read_reply(held)
    waiting = [socket.create_connection((HOST, server.port), timeout=10) for _ in range(3)]

    def listen_queue() -> float:
        return value(scrape(stats)["maitred_listen_queue"], "maitred_listen_queue", listener=listener)

    assert eventually(lambda: listen_queue() == 3, 10), listen_queue()
    families = scrape(stats)
    assert value(families["maitred_listen_backlog"], "maitred_listen_backlog", listener=listener) == 16
    assert value(families["maitred_listen_queue"], "maitred_listen_queue", listener=listener) == 3
    held.close()
    for sock in waiting:
        sock.close()


def test_other_paths_and_methods_get_a_clear_answer(maitred_server):
    stats = free_port()
    maitred_server("--stats", f"{HOST}:{stats}", "echo:app", cwd=APPS)
    for request, status in ((b"GET /nope HTTP/1.1\r\n\r\n", 404), (b"POST /metrics HTTP/1.1\r\n\r\n", 405)):
        with socket.create_connection((HOST, stats), timeout=10) as sock:
            sock.sendall(request)
            assert read_reply(sock).status == status


@pytest.mark.parametrize("address", ["same", "fd://3"])
def test_a_stats_address_that_is_an_application_address_is_refused(address):
    port = free_port()
    stats = f"{HOST}:{port}" if address == "same" else address
    run = subprocess.run(
        [str(MAITRED), "--bind", f"{HOST}:{port}", "--stats", stats, "echo:app"],
        cwd=APPS,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert run.returncode == 2
    (line,) = run.stderr.splitlines()
    assert line.startswith("maitred: error:") and "--stats" in line, line


PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
needs_prometheus = pytest.mark.skipif(
    PROMTOOL is None or PROMETHEUS is None,
    reason="promtool and prometheus are not installed (Debian's prometheus package; .ci/run installs it)",
)


@needs_prometheus
def test_promtool_finds_nothing_wrong_with_the_exposition(maitred_server):
    stats = free_port()
    server = maitred_server("--stats", f"{HOST}:{stats}", "echo:app", cwd=APPS)
    get(server.port, "/")
    with socket.create_connection((HOST, server.port), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
        read_reply(sock)
    checked = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=exposition(stats), capture_output=True, text=True, timeout=30, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


@needs_prometheus
def test_a_prometheus_server_scrapes_it_and_counts_the_requests(maitred_server, tmp_path):
    stats = free_port()
    server = maitred_server("-w", "2", "--stats", f"{HOST}:{stats}", "echo:app", cwd=APPS)
    for _ in range(5):
        assert get(server.port, "/").status == 200
    web = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n"
        f"scrape_configs:\n  - job_name: maitred\n    static_configs:\n      - targets: ['{HOST}:{stats}']\n"
    )
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed after the process
    prometheus = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address={HOST}:{web}",
        ],
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    query = urllib.parse.urlencode({"query": 'maitred_requests_total{class="2xx"}'})
    try:
        deadline = time.monotonic() + 30
        found = None
        while found is None:
            assert time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()
            time.sleep(0.5)
            try:
                with urllib.request.urlopen(f"http://{HOST}:{web}/api/v1/query?{query}", timeout=5) as answer:
                    result = json.load(answer)["data"]["result"]
            except OSError:
                continue
            if result:
                found = float(result[0]["value"][1])
        assert found == 5
    finally:
        os.killpg(prometheus.pid, signal.SIGTERM)
        prometheus.wait(timeout=30)
        log.close()
