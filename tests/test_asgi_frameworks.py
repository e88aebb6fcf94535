"""Real ASGI frameworks under maitred, each checked as it is under uvicorn (issue 29): Django's
own ASGI handler, Django with Channels, FastAPI, Starlette, Quart, Litestar and BlackSheep, each
serving tests/apps/conformance.py's routes written with its own means (conformance_*.py).

Every check runs against maitred (`-w 2`) and against uvicorn with its websockets backend, the
peer whose behaviour these frameworks are written and tested for: a check that fails under
uvicorn is a wrong check, one that fails under maitred alone is maitred's defect. The checks:
plain HTTP, a 1 MiB request body whole and chunked, a streamed answer, Server-Sent Events (whose
`Connection: keep-alive` the server drops), a WebSocket echo of text and bytes with the offered
subprotocol chosen and the application's close code and reason passed on, and the lifespan's
startup and shutdown (Django and Channels have none: they are served all the same).
"""

from __future__ import annotations

import hashlib
import importlib.util
import random
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import requests
from conftest import HOST, Server, free_port
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

APPS = Path(__file__).resolve().parent / "apps"
TIMEOUT = 10.0

# The framework, its application, and whether it speaks WebSocket and lifespan.
FRAMEWORKS = {
    "django": ("conformance_django:application", False, False),
    "channels": ("conformance_channels:application", True, False),
    "fastapi": ("conformance_fastapi:app", True, True),
    "starlette": ("conformance_starlette:app", True, True),
    "quart": ("conformance_quart:app", True, True),
    "litestar": ("conformance_litestar:app", True, True),
    "blacksheep": ("conformance_blacksheep:app", True, True),
}
SERVERS = ["maitred", "uvicorn"]


def _routes_contract() -> ModuleType:
    """tests/apps/conformance.py, whose constants the applications serve."""
    spec = importlib.util.spec_from_file_location("conformance", APPS / "conformance.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


conformance = _routes_contract()


def start(kind: str, launcher: Callable[..., Server], spec: str, lifespan_log: Path) -> Server:
    env = {"LIFESPAN_LOG": str(lifespan_log)}
    if kind == "maitred":
        return launcher("-w", "2", spec, cwd=APPS, env=env)
    port = free_port()
    return launcher("--host", HOST, "--port", str(port), spec, cwd=APPS, env=env, bind=False, port=port)


@pytest.fixture(scope="module")
def servers(
    maitred_module_server: Callable[..., Server],
    uvicorn_module_server: Callable[..., Server],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[tuple[str, str], Server]:
    """Every framework under both servers, started once for the module."""
    pytest.importorskip("uvicorn", reason="uvicorn is not installed (tests/requirements.txt)")
    logs = tmp_path_factory.mktemp("lifespan")
    launchers = {"maitred": maitred_module_server, "uvicorn": uvicorn_module_server}
    return {
        (framework, kind): start(kind, launchers[kind], spec, logs / f"{framework}-{kind}")
        for framework, (spec, _, _) in FRAMEWORKS.items()
        for kind in SERVERS
    }


@pytest.fixture(params=[(framework, kind) for framework in FRAMEWORKS for kind in SERVERS], ids="-".join)
def served(request: pytest.FixtureRequest, servers: dict[tuple[str, str], Server]) -> tuple[str, Server]:
    framework, kind = request.param
    return framework, servers[(framework, kind)]


@pytest.fixture
def session() -> Iterator[requests.Session]:
    with requests.Session() as session:
        yield session


def test_plain_http(served: tuple[str, Server], session: requests.Session) -> None:
    _, server = served
    reply = session.get(f"{server.url}/hello", timeout=TIMEOUT)
    assert (reply.status_code, reply.text) == (200, conformance.HELLO)
    assert reply.headers["Content-Type"].startswith("text/plain")


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_request_body_arrives_whole(served: tuple[str, Server], session: requests.Session, framing: str) -> None:
    _, server = served
    body = random.Random(29).randbytes(1 << 20)
    # requests sends a generator's pieces chunked, and a bytes body with its Content-Length.
    data = body if framing == "content-length" else iter(body[at : at + 65536] for at in range(0, len(body), 65536))
    reply = session.post(f"{server.url}/echo", data=data, timeout=TIMEOUT)
    assert reply.status_code == 200
    assert hashlib.sha256(reply.content).hexdigest() == hashlib.sha256(body).hexdigest()


def test_a_streamed_answer(served: tuple[str, Server], session: requests.Session) -> None:
    _, server = served
    with session.get(f"{server.url}/stream", timeout=TIMEOUT, stream=True) as reply:
        assert reply.status_code == 200
        assert reply.raw.read().decode() == "".join(conformance.CHUNKS)


def test_server_sent_events_with_their_connection_header(served: tuple[str, Server], session: requests.Session) -> None:
    """An SSE endpoint's `Connection: keep-alive` is the framework's habit, not an error: the
    events arrive, and the connection serves the next request."""
    _, server = served
    with session.get(f"{server.url}/sse", timeout=TIMEOUT, stream=True) as reply:
        assert reply.status_code == 200
        assert reply.headers["Content-Type"].startswith("text/event-stream")
        text = reply.raw.read().decode().replace("\r\n", "\n")
    events = [line.removeprefix("data: ") for line in text.split("\n") if line.startswith("data: ")]
    assert events == conformance.EVENTS
    assert session.get(f"{server.url}/hello", timeout=TIMEOUT).status_code == 200


def test_websocket_echo_subprotocol_and_close_code(served: tuple[str, Server]) -> None:
    framework, server = served
    url = f"ws://{HOST}:{server.port}/ws"
    if not FRAMEWORKS[framework][1]:
        # Django's handler refuses a WebSocket: the handshake fails, and nothing else does.
        with pytest.raises(InvalidStatus):
            connect(url, open_timeout=TIMEOUT).close()
        return
    with connect(url, subprotocols=[conformance.SUBPROTOCOL, "other"], open_timeout=TIMEOUT) as websocket:
        assert websocket.subprotocol == conformance.SUBPROTOCOL
        websocket.send("hello")
        assert websocket.recv(timeout=TIMEOUT) == "hello"
        websocket.send(b"\x00\xffbytes")
        assert websocket.recv(timeout=TIMEOUT) == b"\x00\xffbytes"
        websocket.send("close")
        with pytest.raises(ConnectionClosed):
            websocket.recv(timeout=TIMEOUT)
        assert websocket.close_code == conformance.CLOSE_CODE
        assert websocket.close_reason == conformance.CLOSE_REASON
    with connect(url, open_timeout=TIMEOUT) as websocket:
        assert websocket.subprotocol is None
        websocket.send("again")
        assert websocket.recv(timeout=TIMEOUT) == "again"


@pytest.mark.parametrize("framework", list(FRAMEWORKS))
@pytest.mark.parametrize("kind", SERVERS)
def test_lifespan_startup_and_shutdown(
    framework: str,
    kind: str,
    maitred_server: Callable[..., Server],
    uvicorn_module_server: Callable[..., Server],
    tmp_path: Path,
) -> None:
    """Each worker runs the lifespan's startup before its first request and its shutdown at a
    stop; a framework without lifespan is served all the same."""
    spec, _, has_lifespan = FRAMEWORKS[framework]
    log = tmp_path / "lifespan"
    server = start(kind, maitred_server if kind == "maitred" else uvicorn_module_server, spec, log)
    reply = requests.get(f"{server.url}/lifespan", timeout=TIMEOUT)
    assert (reply.status_code, reply.text) == (200, "started" if has_lifespan else "no lifespan")
    server.send_signal(signal.SIGTERM)
    # uvicorn raises the signal again once it has shut down, as its exit status.
    assert server.wait(TIMEOUT * 3) == (0 if kind == "maitred" else -signal.SIGTERM)
    events = log.read_text().split() if log.exists() else []
    workers = 2 if kind == "maitred" else 1
    assert events.count("startup") == (workers if has_lifespan else 0), events
    assert events.count("shutdown") == events.count("startup"), events


def test_no_application_errors_were_logged(servers: dict[tuple[str, str], Server]) -> None:
    """Nothing above made any framework, or the server, log a traceback (but Django's handler,
    which refuses a WebSocket by raising)."""
    for (framework, kind), server in servers.items():
        if framework == "django":
            continue
        assert "Traceback" not in server.stderr(), f"{framework} under {kind}:\n{server.stderr()}"
