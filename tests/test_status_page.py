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
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import websocket
from client import get
from conftest import HOST, free_port, kill_group, wait_for_empty_group

APPS = Path(__file__).resolve().parent / "apps"
CHROMIUM = shutil.which("chromium")
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


class Browser:
    """Headless chromium in a process group of its own, with a fresh profile, and a DevTools
    connection to its one page. Every wait is bounded; `close` leaves no process behind."""

    def __init__(self, home: Path) -> None:
        self.events: list[dict] = []
        self.last_id = 0
        # Chromium's crash handler writes under $HOME and starts in a session of its own, out of
        # the browser's process group: a home of the test's own keeps ~ clean, and names the
        # handler's processes (their --database is in it), to see them gone in close().
        self.home = home
        profile = home / "profile"
        profile.mkdir(parents=True)
        self.log = open(home / "chromium.log", "wb")  # noqa: SIM115 - closed in close(), after the process
        command = [
            CHROMIUM,
            "--headless=new",
            f"--user-data-dir={profile}",
            # Port 0: chromium picks a free one and writes it to DevToolsActivePort.
            "--remote-debugging-port=0",
            "--window-size=1400,1000",
            "--no-first-run",
            "about:blank",
        ]
        if os.geteuid() == 0:
            command.insert(2, "--no-sandbox")  # chromium refuses to start as root with its sandbox
        environment = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}
        environment.pop("XDG_CACHE_HOME", None)
        self.process = subprocess.Popen(
            command,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=self.log,
            start_new_session=True,
        )
        try:
            self.socket = websocket.create_connection(self._page_address(profile), timeout=10, suppress_origin=True)
        except BaseException:
            self.close()
            raise

    def _page_address(self, profile: Path) -> str:
        active_port = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while True:
            assert self.process.poll() is None, f"chromium exited with {self.process.returncode}: {self._log()}"
            assert time.monotonic() < deadline, f"chromium did not open its DevTools port in 30 s: {self._log()}"
            lines = active_port.read_text().splitlines() if active_port.exists() else []
            if lines:
                break
            time.sleep(0.1)
        with urllib.request.urlopen(f"http://{HOST}:{lines[0]}/json/list", timeout=10) as answer:
            targets = json.load(answer)
        (page,) = [target for target in targets if target["type"] == "page"]
        return page["webSocketDebuggerUrl"]

    def _log(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-4000:]

    def call(self, method: str, **params) -> dict:
        """One DevTools command's result; the events that come before it are kept in `events`."""
        self.last_id += 1
        self.socket.send(json.dumps({"id": self.last_id, "method": method, "params": params}))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = json.loads(self.socket.recv())  # each recv bounded by the socket's timeout
            if message.get("id") == self.last_id:
                assert "error" not in message, (method, message["error"])
                return message["result"]
            self.events.append(message)
        raise AssertionError(f"chromium did not answer {method} within 30 s")

    def evaluate(self, expression: str):
        answer = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in answer, answer["exceptionDetails"]
        return answer["result"].get("value")

    def wait_for(self, expression: str, timeout: float):
        """The value of `expression` once it is truthy, evaluated every 0.2 s for `timeout` s."""
        deadline = time.monotonic() + timeout
        while not (value := self.evaluate(expression)):
            assert time.monotonic() < deadline, f"not true within {timeout} s: {expression}; {self.problems()}"
            time.sleep(0.2)
        return value

    def problems(self) -> list[str]:
        """What the page's console and the browser's log reported as errors or warnings."""
        found = []
        for event in self.events:
            params = event.get("params", {})
            if event.get("method") == "Runtime.exceptionThrown":
                found.append(json.dumps(params["exceptionDetails"]))
            elif event.get("method") == "Runtime.consoleAPICalled" and params["type"] in ("error", "warning"):
                found.append(json.dumps(params["args"]))
            elif event.get("method") == "Log.entryAdded" and params["entry"]["level"] in ("error", "warning"):
                found.append(json.dumps(params["entry"]))
        return found

    def requested(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    def close(self) -> None:
        if getattr(self, "socket", None) is not None:
            self.socket.close()
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            kill_group(self.process.pid)
            self.process.wait(timeout=10)
        left = wait_for_empty_group(self.process.pid, 10)
        kill_group(self.process.pid)
        deadline = time.monotonic() + 10
        while (handlers := processes_naming(self.home)) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in handlers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.log.close()
        assert not left and not handlers, f"chromium's processes {left + handlers} outlived it"


def processes_naming(path: Path) -> list[int]:
    """Live processes with `path` in their command line."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(path).encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue  # exited while we looked
    return found


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
