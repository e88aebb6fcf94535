"""Headless chromium, started by a test in a process group of its own and driven over the
DevTools protocol (websocket-client): tests/test_status_page.py's live page, tests/test_asgi.py's
WebSocket and tests/test_http2_browser_and_proxy.py's HTTP/2 in a real browser. CHROMIUM is None
when it is not installed (Debian's chromium package; .ci/run installs it): the tests that need it
skip, saying so."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import websocket
from conftest import HOST, kill_group, wait_for_empty_group

CHROMIUM = shutil.which("chromium")


class Browser:
    """Headless chromium in a process group of its own, with a fresh profile, and a DevTools
    connection to its one page. Every wait is bounded; `close` leaves no process behind."""

    def __init__(self, home: Path, flags: tuple[str, ...] = ()) -> None:
        """flags: more of chromium's command-line switches (tests/test_http2_browser_and_proxy.py's
        trust in its test authority's certificate)."""
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
            *flags,
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
