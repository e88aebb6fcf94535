"""The live page at / on the stats listener (docs/METRICS.md, "The live page"), in a real browser.

A real maitred on 127.0.0.1 with --stats, a bounded load on its application, and Debian's
chromium, headless, started by the test and driven over the DevTools protocol (websocket-client):
the page's charts (read from Chart.js itself) move under the load, the scoreboard shows the
workers' pids, the diagnoses shown are those of status.json, the page asks nothing of any address
but the stats listener's, and the browser reports no error. Skips, saying why, without chromium.

MAITRED_STATUS_PAGE_SCREENSHOT=PATH makes the test load the application for a minute rather than a
few seconds and save a screenshot of the page under that load to PATH (docs/images/status-page.png
is one).
"""

from __future__ import annotations

import base64
import os
import threading
import time
from pathlib import Path

import pytest
from browser import CHROMIUM, Browser
from client import get
from conftest import HOST, free_port

APPS = Path(__file__).resolve().parent / "apps"
SCREENSHOT = os.environ.get("MAITRED_STATUS_PAGE_SCREENSHOT")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (Debian's chromium package; .ci/run installs it)"
)

WORKERS = 2
CLIENTS = 6
# Each request takes the application this long: with more clients than workers, requests queue.
REQUEST_SECONDS = 0.2
LOAD_SECONDS = 60.0 if SCREENSHOT else 4.0
MAX_REQUESTS = int(CLIENTS * LOAD_SECONDS / REQUEST_SECONDS)

# Each chart's lines as the page draws them: Chart.js's own datasets, read back from the charts.
CHART_LINES = """
Object.fromEntries([...document.querySelectorAll("canvas")].map((canvas) => [
  canvas.id,
  Object.fromEntries(Chart.getChart(canvas).data.datasets.map((set) => [set.label, set.data.map((p) => p.y)])),
]))
"""

SCOREBOARD = """
[...document.querySelectorAll("#scoreboard tr")].map((row) => ({
  state: row.className,
  cells: [...row.cells].map((cell) => cell.textContent),
}))
"""

DIAGNOSES = """
({
  shown: [...document.querySelectorAll("#diagnoses li:not(.none) strong")].map((name) => name.textContent),
  answered: window.maitredStatus.last.diagnoses.map((diagnosis) => diagnosis.name),
})
"""


@pytest.fixture
def browser(tmp_path: Path):
    opened = Browser(tmp_path / "chromium")
    try:
        yield opened
    finally:
        opened.close()


def load(port: int, stop: threading.Event) -> tuple[set[int], list[int | str]]:
    """CLIENTS clients, each sending one request after another to the application on
    127.0.0.1, until `stop`, LOAD_SECONDS or MAX_REQUESTS in all: the serving workers' pids,
    and the statuses of the answers (or the error of a request that got none)."""
    pids: set[int] = set()
    statuses: list[int | str] = []
    deadline = time.monotonic() + LOAD_SECONDS
    lock = threading.Lock()

    def client() -> None:
        while not stop.is_set() and time.monotonic() < deadline:
            with lock:
                if len(statuses) >= MAX_REQUESTS:
                    return
            try:
                reply = get(port, f"/?sleep={REQUEST_SECONDS}", timeout=10)
            except OSError as error:
                with lock:
                    statuses.append(repr(error))
                return
            with lock:
                statuses.append(reply.status)
                if reply.status == 200:
                    pids.add(reply.pid)

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=LOAD_SECONDS + 20)
    assert not any(thread.is_alive() for thread in threads), "a client was still waiting 20 s after the load"
    return pids, statuses


def peak(values: list) -> float:
    numbers = [value for value in values if value is not None]
    return max(numbers) if numbers else 0


def test_the_page_charts_the_load_and_shows_the_workers(maitred_server, browser):
    stats = free_port()
    server = maitred_server("-w", str(WORKERS), "--backlog", "64", "--stats", f"{HOST}:{stats}", "echo:app", cwd=APPS)
    page = f"http://{HOST}:{stats}/"
    for domain in ("Runtime", "Log", "Network", "Page"):
        browser.call(f"{domain}.enable")
    browser.call("Page.navigate", url=page)
    browser.wait_for("window.maitredStatus && window.maitredStatus.answers >= 3", timeout=30)

    idle = browser.evaluate(CHART_LINES)
    assert peak(idle["chart-requests"]["all"]) == 0, idle["chart-requests"]
    assert peak(idle["chart-workers"]["busy"]) == 0, idle["chart-workers"]
    assert peak(idle["chart-queue"]["waiting"]) == 0, idle["chart-queue"]

    stop = threading.Event()
    during: dict = {}

    def look_while_loaded() -> None:
        # Half-way through the load, both workers are at a request.
        if not stop.wait(LOAD_SECONDS / 2):
            during["scoreboard"] = browser.evaluate(SCOREBOARD)
            if SCREENSHOT:
                take_screenshot(browser, Path(SCREENSHOT))

    looker = threading.Thread(target=look_while_loaded)
    looker.start()
    try:
        pids, statuses = load(server.port, stop)
    finally:
        stop.set()
        looker.join(timeout=60)
    assert statuses and set(statuses) == {200}, statuses
    assert len(pids) == WORKERS, pids
    # Two answers after the load: the last difference of the counters covers its end.
    answers = browser.evaluate("window.maitredStatus.answers")
    browser.wait_for(f"window.maitredStatus.answers >= {answers + 2}", timeout=30)

    charts = browser.evaluate(CHART_LINES)
    assert peak(charts["chart-requests"]["all"]) > 0, charts["chart-requests"]
    assert peak(charts["chart-requests"]["5xx"]) == 0, charts["chart-requests"]
    assert peak(charts["chart-queue"]["waiting"]) >= 1, charts["chart-queue"]
    assert peak(charts["chart-workers"]["busy"]) == WORKERS, charts["chart-workers"]
    assert peak(charts["chart-workers"]["wanted (-w)"]) == WORKERS, charts["chart-workers"]
    assert peak(charts["chart-queue-wait"]["p99"]) > 0, charts["chart-queue-wait"]
    # Every request takes 0.2 s: the median of a second's durations says so, within its bucket.
    medians = [value for value in charts["chart-duration"]["p50"] if value]
    assert medians and all(0.1 <= value <= 0.5 for value in medians), charts["chart-duration"]
    assert peak(charts["chart-connections"]["in_service"]) >= 1, charts["chart-connections"]
    listener = f"http://{HOST}:{server.port}"
    assert peak(charts["chart-listen"][f"{listener} backlog"]) == 64, charts["chart-listen"]
    assert set(charts["chart-overflows"]) == {"ListenOverflows", "ListenDrops"}, charts["chart-overflows"]

    # The scoreboard: a row for each worker, by pid, and while loaded, the request each serves.
    assert "scoreboard" in during, "the page could not be read half-way through the load"
    assert {int(row["cells"][0]) for row in during["scoreboard"]} == pids, during["scoreboard"]
    busy = [row["cells"][3] for row in during["scoreboard"] if row["state"] == "busy"]
    assert busy and all(request.startswith("GET /") for request in busy), during["scoreboard"]
    after = browser.evaluate(SCOREBOARD)
    assert {int(row["cells"][0]) for row in after} == pids, after
    assert sum(int(row["cells"][5]) for row in after) > 0, after

    diagnoses = browser.evaluate(DIAGNOSES)
    assert diagnoses["shown"] == diagnoses["answered"], diagnoses

    assert browser.evaluate("window.maitredStatus.failures") == 0
    outside = [url for url in browser.requested() if not url.startswith(page)]
    assert not outside, f"the page asked for more than the stats listener: {outside}"
    assert not browser.problems(), browser.problems()


def take_screenshot(browser: Browser, path: Path) -> None:
    """The whole page, as tall as it is."""
    size = browser.call("Page.getLayoutMetrics")["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
    shot = browser.call("Page.captureScreenshot", format="png", clip=clip, captureBeyondViewport=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(base64.b64decode(shot["data"]))


def test_the_page_shows_what_each_thread_of_a_worker_is_busy_with(maitred_server, browser):
    stats = free_port()
    server = maitred_server("-w", "1", "--threads", "2", "--stats", f"{HOST}:{stats}", "echo:app", cwd=APPS)
    browser.call("Runtime.enable")
    browser.call("Page.navigate", url=f"http://{HOST}:{stats}/")
    held = threading.Thread(target=get, args=(server.port, "/held-in-a-thread?sleep=3"))
    held.start()
    try:
        browser.wait_for(
            "[...document.querySelectorAll('#scoreboard tr.thread')].some("
            "(row) => row.textContent.includes('/held-in-a-thread'))",
            timeout=20,
        )
        rows = browser.evaluate(SCOREBOARD)
    finally:
        held.join(timeout=30)
    threads = [row for row in rows if row["state"].startswith("thread")]
    assert [row["cells"][2] for row in threads] == ["thread 0", "thread 1"], rows
    assert sorted(row["state"] for row in threads) == ["thread busy", "thread idle"], rows
    assert sum(row["cells"][3] == "GET /held-in-a-thread" for row in threads) == 1, rows
