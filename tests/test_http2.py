"""HTTP/2 in the lobby (docs/HTTP2.md): by ALPN on TLS listeners, with prior knowledge on plain
ones beside HTTP/1.1; each stream a request in the one queue, under the same limits; bodies both
ways within flow control; resets that drop a queued request; GOAWAY at a shutdown; the floods
the h2 crate refuses; h2spec's conformance suite.

The clients are real: curl (--http2, --http2-prior-knowledge), httpx with http2=True, h2spec, and
raw frames from the `h2` package (hyper-h2) where a test must send what no polite client sends.
Each test that needs a tool skips, saying why, without it."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
from collections.abc import Callable
from pathlib import Path

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import httpx
import hyperframe.frame
import pytest
from client import eventually, get, status_of, wait_for_queue
from conftest import HOST, Server, free_port
from hpack import Decoder, Encoder
from prometheus_client.parser import text_string_to_metric_families
from tls_certs import Authority, Pair

ROOT = Path(__file__).resolve().parent.parent
APPS = Path(__file__).resolve().parent / "apps"
TIMEOUT = 10.0

BIG_APP = """
def app(environ, start_response):
    size = int(environ['QUERY_STRING'] or 0)
    body = environ['wsgi.input'].read()
    start_response('200 OK', [('Content-Length', str(size + len(body))), ('Connection', 'keep-alive')])
    return [b'z' * size, body]
"""


def curl() -> str:
    path = shutil.which("curl")
    if path is None:
        pytest.skip("curl is not installed")
    features = subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout
    if "HTTP2" not in features:
        pytest.skip("this curl is built without HTTP/2 (nghttp2)")
    return path


def h2spec() -> str:
    """h2spec from .ci/run's build (.cache/bin) or the PATH. In CI (CI=true), where .ci/run
    builds it, a missing h2spec fails the test: the conformance suite must run there."""
    built = ROOT / ".cache" / "bin" / "h2spec"
    path = str(built) if built.exists() else shutil.which("h2spec")
    if path is None:
        why = "h2spec is not installed (.ci/run builds it into .cache/bin with go)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why}: in CI it must be, so that h2spec's suite runs (see .ci/run's log for the build)")
        pytest.skip(why)
    return path


class RawH2:
    """An HTTP/2 client connection on a socket, frame by frame, with hyper-h2's state machine:
    for what httpx and curl will not send (resets, many cookie fields, floods)."""

    def __init__(self, port: int, sock: socket.socket | None = None) -> None:
        self.sock = sock or socket.create_connection((HOST, port), timeout=TIMEOUT)
        # It checks nothing it sends: a test sends what a polite client would not.
        config = h2.config.H2Configuration(
            client_side=True, header_encoding=None, validate_outbound_headers=False, normalize_outbound_headers=False
        )
        self.conn = h2.connection.H2Connection(config)
        self.conn.initiate_connection()
        self.flush()
        self.ended: dict[int, tuple[int, dict[bytes, bytes], bytes]] = {}
        self.partial: dict[int, list] = {}
        self.resets: dict[int, int] = {}
        self.goaway: h2.events.ConnectionTerminated | None = None
        self.closed = False

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def request(self, path: str, method: str = "GET", headers: list[tuple[str, str]] = (), body: bytes = b"") -> int:
        stream = self.conn.get_next_available_stream_id()
        fields = [(":method", method), (":scheme", "http"), (":authority", "example.test"), (":path", path)]
        self.conn.send_headers(stream, [*fields, *headers], end_stream=not body)
        size = self.conn.max_outbound_frame_size
        for at in range(0, len(body), size):
            self.conn.send_data(stream, body[at : at + size], end_stream=at + size >= len(body))
        self.flush()
        return stream

    def pump(self) -> None:
        """Reads once and takes what came: the answers, resets and GOAWAY."""
        try:
            data = self.sock.recv(1 << 16)
        except ConnectionResetError:
            data = b""
        if not data:
            self.closed = True
            return
        for event in self.conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                self.partial[event.stream_id] = [dict(event.headers), b""]
            elif isinstance(event, h2.events.DataReceived):
                self.partial[event.stream_id][1] += event.data
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                headers, body = self.partial.pop(event.stream_id)
                self.ended[event.stream_id] = (int(headers[b":status"]), headers, body)
            elif isinstance(event, h2.events.StreamReset):
                self.resets[event.stream_id] = event.error_code
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.goaway = event
        self.flush()

    def until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            assert not self.closed, "the server closed the connection"
            self.pump()

    def response(self, stream: int) -> tuple[int, dict[bytes, bytes], bytes]:
        self.until(lambda: stream in self.ended or stream in self.resets)
        assert stream in self.ended, f"stream {stream} reset: {self.resets[stream]}"
        return self.ended[stream]


def frames_until_close(sock: socket.socket) -> list:
    """Every frame the server sends until it closes the connection, read with hyperframe alone:
    hyper-h2's state machine stops at the first GOAWAY, and a graceful one is followed by a PING
    (answered here, as every client answers it), the streams' answers and a last GOAWAY."""
    frames, data = [], b""
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            return frames
        data += chunk
        while len(data) >= 9:
            frame, length = hyperframe.frame.Frame.parse_frame_header(memoryview(data[:9]))
            if len(data) < 9 + length:
                break
            frame.parse_body(memoryview(data[9 : 9 + length]))
            frames.append(frame)
            if isinstance(frame, hyperframe.frame.PingFrame) and "ACK" not in frame.flags:
                ack = hyperframe.frame.PingFrame(0, frame.opaque_data, flags=["ACK"])
                with contextlib.suppress(OSError):
                    sock.sendall(ack.serialize())
            data = data[9 + length :]


def tls_args(pair: Pair) -> tuple[str, ...]:
    return ("--certfile", str(pair.cert), "--keyfile", str(pair.key))


def test_curl_speaks_http2_with_prior_knowledge_beside_http11_on_a_plain_port(
    maitred_server: Callable[..., Server],
) -> None:
    """docs/HTTP2.md, "Where it is spoken": a plain listener takes HTTP/2 from a client that
    opens with the preface, and HTTP/1.1 from the others; the environ says HTTP/2, and Host
    comes from :authority."""
    server = maitred_server("environ_echo:app", cwd=APPS)
    out = subprocess.run(
        [curl(), "-sS", "--http2-prior-knowledge", "-w", "\n%{http_version}", "-d", "hello", f"{server.url}/a?b=1"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=True,
    ).stdout
    body, version = out.rsplit("\n", 1)
    assert version == "2"
    seen = json.loads(body)
    assert seen["SERVER_PROTOCOL"] == "HTTP/2"
    assert seen["HTTP_HOST"] == f"{HOST}:{server.port}"
    assert (seen["PATH_INFO"], seen["QUERY_STRING"]) == ("/a", "b=1")
    assert base64.b64decode(seen["body"]) == b"hello"
    reply = get(server.port, "/plain")
    assert reply.status == 200 and json.loads(reply.body)["SERVER_PROTOCOL"] == "HTTP/1.1"


def test_tls_offers_h2_by_alpn_and_curl_takes_it(
    maitred_server: Callable[..., Server], server_pair: Pair, authority: Authority
) -> None:
    """docs/HTTP2.md, "Where it is spoken": TLS offers h2 first, then http/1.1."""
    server = maitred_server(*tls_args(server_pair), "environ_echo:app", cwd=APPS)
    url = f"https://localhost:{server.port}/"
    for flag, version, protocol in (("--http2", "2", "HTTP/2"), ("--http1.1", "1.1", "HTTP/1.1")):
        out = subprocess.run(
            [curl(), "-sS", flag, "--cacert", str(authority.pem), "-w", "\n%{http_version}", url],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=True,
        ).stdout
        body, seen_version = out.rsplit("\n", 1)
        assert seen_version == version
        assert json.loads(body)["SERVER_PROTOCOL"] == protocol


def test_httpx_sends_and_receives_large_bodies_within_flow_control(
    maitred_server: Callable[..., Server], app_dir: Path, server_pair: Pair, authority: Authority
) -> None:
    """docs/HTTP2.md, "Bodies and flow control": a body past the stream's window (and past
    256 KiB, so in a file) reaches the application whole, and an answer of megabytes (spilled
    to the answer's file) reaches a client whose window is 64 KiB; several streams at once on
    one connection."""
    (app_dir / "big.py").write_text(BIG_APP)
    server = maitred_server("-w", "2", *tls_args(server_pair), "big:app", cwd=app_dir)
    upload = os.urandom(1_500_000)
    verify = ssl.create_default_context(cafile=str(authority.pem))
    with httpx.Client(http2=True, verify=verify, timeout=TIMEOUT) as client:
        answer = client.post(f"https://localhost:{server.port}/?3000000", content=upload)
        assert answer.http_version == "HTTP/2"
        assert answer.status_code == 200
        assert answer.content[:3_000_000] == b"z" * 3_000_000
        assert answer.content[3_000_000:] == upload
        # The application's Connection field is dropped: HTTP/2 forbids it.
        assert "connection" not in answer.headers
        assert answer.headers["server"] == "maitred"
        for size in (0, 1, 70_000):
            answer = client.get(f"https://localhost:{server.port}/?{size}")
            assert answer.status_code == 200 and answer.content == b"z" * size


def test_an_answer_that_breaks_after_its_head_resets_only_its_stream(
    maitred_server: Callable[..., Server], app_dir: Path
) -> None:
    """docs/HTTP2.md, "Answers": an answer that breaks once its head is sent (here its body ends
    short of its Content-Length, which the worker refuses) resets its stream, where HTTP/1.1
    cuts the connection, so that no client takes a truncated answer for a whole one; the
    connection's other streams go on."""
    (app_dir / "short.py").write_text(
        "def app(environ, start_response):\n"
        "    start_response('200 OK', [('Content-Length', '5')])\n"
        "    yield b'1'\n"
        "    if environ['PATH_INFO'] == '/short':\n"
        "        yield b'23'\n"
        "    else:\n"
        "        yield b'2345'\n"
    )
    server = maitred_server("short:app", cwd=app_dir)
    client = RawH2(server.port)
    short = client.request("/short")
    client.until(lambda: short in client.resets)
    assert client.resets[short] == h2.errors.ErrorCodes.INTERNAL_ERROR
    server.wait_for_log("GET /short HTTP/2.0; its HTTP/2 stream reset (INTERNAL_ERROR)", TIMEOUT)
    assert "connection cut" not in server.stderr()
    assert client.response(client.request("/whole"))[2] == b"12345"


def test_the_asgi_scope_says_http_version_2(maitred_server: Callable[..., Server]) -> None:
    """docs/HTTP2.md, "What the application sees": ASGI's http_version is "2"; httpx with
    http1=False speaks HTTP/2 with prior knowledge."""
    server = maitred_server("asgi_conformance:app", "-w", "1", cwd=APPS)
    with httpx.Client(http1=False, http2=True, timeout=TIMEOUT) as client:
        answer = client.get(f"{server.url}/scope")
    assert answer.http_version == "HTTP/2"
    scope = answer.json()
    assert scope["http_version"] == ["str", "2"]
    assert scope["scheme"] == ["str", "http"]


def test_cookie_fields_are_joined_and_authority_is_the_host(maitred_server: Callable[..., Server]) -> None:
    """docs/HTTP2.md, "What the application sees": several cookie fields arrive as one, joined
    with "; "; Host is :authority's, beside a host field that names the same (one that names
    another is refused: tests/test_request_rules.py)."""
    server = maitred_server("environ_echo:app", cwd=APPS)
    client = RawH2(server.port)
    stream = client.request("/", headers=[("cookie", "a=1"), ("host", "Example.test"), ("cookie", "b=2")])
    status, _, body = client.response(stream)
    assert status == 200
    seen = json.loads(body)
    assert seen["HTTP_COOKIE"] == "a=1; b=2"
    assert seen["HTTP_HOST"] == "example.test"


def test_limits_refuse_one_stream_and_the_connection_goes_on(maitred_server: Callable[..., Server]) -> None:
    """docs/HTTP2.md, "The same limits": 431, 414 and 413 as for HTTP/1.1, with the reason in the
    body and a log line; the connection's other streams are served."""
    server = maitred_server(
        "--limit-request-fields", "5", "--limit-request-line", "100", "--max-body", "1000",
        "environ_echo:app", cwd=APPS,
    )  # fmt: skip
    client = RawH2(server.port)
    many = client.request("/", headers=[(f"x-{n}", "v") for n in range(6)])
    long_path = client.request("/" + "p" * 200)
    large = client.request("/", method="POST", body=b"b" * 2000)
    fine = client.request("/fine")
    assert client.response(many)[0] == 431
    assert b"--limit-request-fields" in client.response(many)[2]
    assert client.response(long_path)[0] == 414
    assert client.response(large)[0] == 413
    assert client.response(fine)[0] == 200
    server.wait_for_log("431 to 127.0.0.1", TIMEOUT)


def test_a_stream_reset_while_queued_is_dropped_without_running(
    maitred_server: Callable[..., Server], tmp_path: Path
) -> None:
    """docs/HTTP2.md, "Clients that leave": a queued stream its client resets never reaches a
    worker, and counts as abandoned, and as a stream reset while queued."""
    tally = tmp_path / "tally"
    stats = free_port()
    server = maitred_server("-w", "1", "--stats", f"{HOST}:{stats}", "tally:app", cwd=APPS, env={"TALLY": str(tally)})
    client = RawH2(server.port)
    busy = client.request("/busy?sleep=1")
    wait_for_queue(stats, busy=1, waiting=0)
    doomed = client.request("/doomed")
    wait_for_queue(stats, busy=1, waiting=1)
    client.conn.reset_stream(doomed, h2.errors.ErrorCodes.CANCEL)
    client.flush()
    assert eventually(lambda: status_of(stats)["overload"]["shed"]["abandoned"] == 1, TIMEOUT)
    resets = counts(stats, "maitred_http2_streams_reset")
    assert resets == {"reading": 0, "queued": 1, "in_service": 0, "writing": 0}, resets
    assert client.response(busy)[0] == 200
    after = client.request("/after")
    assert client.response(after)[0] == 200
    assert [line.split()[1] for line in tally.read_text().splitlines()] == ["/busy", "/after"]


def test_a_stream_reset_in_service_is_a_disconnect_for_the_application(
    maitred_server: Callable[..., Server], tmp_path: Path
) -> None:
    """docs/HTTP2.md, "Clients that leave": a stream reset while its answer streams tells the
    worker, whose ASGI application hears http.disconnect at once, as when an HTTP/1.1 client
    closes; the connection's other streams go on. It counts as a stream reset while its answer
    was written."""
    events = tmp_path / "events"
    stats = free_port()
    server = maitred_server(
        "asgi_conformance:app", "-w", "1", "--stats", f"{HOST}:{stats}", cwd=APPS, env={"ASGI_EVENTS": str(events)}
    )
    client = RawH2(server.port)
    stream = client.request("/first-then-wait")
    client.until(lambda: stream in client.partial and client.partial[stream][1] == b"first\n")
    client.conn.reset_stream(stream, h2.errors.ErrorCodes.CANCEL)
    client.flush()
    assert eventually(lambda: events.exists() and "http.disconnect" in events.read_text(), TIMEOUT), (
        events.read_text() if events.exists() else "no events"
    )
    assert client.response(client.request("/pid"))[0] == 200
    resets = counts(stats, "maitred_http2_streams_reset")
    assert resets == {"reading": 0, "queued": 0, "in_service": 0, "writing": 1}, resets


def test_sigterm_sends_goaway_and_finishes_the_open_streams(
    maitred_server: Callable[..., Server], tmp_path: Path
) -> None:
    """docs/HTTP2.md, "A connection's life": at a shutdown the connection gets GOAWAY at once,
    counted as maitred_http2_goaways_total{reason="shutdown"}, the stream it holds is answered,
    then it closes and the lobby exits cleanly."""
    tally = tmp_path / "tally"
    stats = free_port()
    server = maitred_server("-w", "1", "--stats", f"{HOST}:{stats}", "tally:app", cwd=APPS, env={"TALLY": str(tally)})
    client = RawH2(server.port)
    held = client.request("/held?sleep=2")
    wait_for_queue(stats, busy=1, waiting=0)
    server.send_signal(signal.SIGTERM)
    # The stats listener serves while the held stream is answered.
    assert eventually(lambda: counts(stats, "maitred_http2_goaways")["shutdown"] == 1, TIMEOUT)
    frames = frames_until_close(client.sock)
    kinds = [type(frame).__name__ for frame in frames]
    assert "GoAwayFrame" in kinds, kinds
    first_goaway = kinds.index("GoAwayFrame")
    answer = [frame for frame in frames if frame.stream_id == held]
    assert kinds.index("HeadersFrame") > first_goaway, kinds
    status = dict(Decoder().decode(answer[0].data, raw=True))[b":status"]
    assert status == b"200"
    assert b"".join(frame.data for frame in answer if isinstance(frame, hyperframe.frame.DataFrame)) == b"done\n"
    assert "END_STREAM" in answer[-1].flags
    assert server.wait(TIMEOUT) == 0


def test_sigusr2_sends_goaway_and_the_new_lobby_takes_the_next_connection(
    maitred_server: Callable[..., Server], tmp_path: Path
) -> None:
    """docs/HTTP2.md, "A connection's life": at a binary upgrade the old lobby sends GOAWAY,
    answers the stream it holds and exits; the connection is never handed over, and the
    client's next connection is the new lobby's."""
    tally = tmp_path / "tally"
    stats = free_port()
    pid_file = tmp_path / "maitred.pid"
    server = maitred_server(
        "-w", "1", "--pid", str(pid_file), "--stats", f"{HOST}:{stats}", "tally:app",
        cwd=APPS, env={"TALLY": str(tally)},
    )  # fmt: skip
    client = RawH2(server.port)
    held = client.request("/held?sleep=1")
    wait_for_queue(stats, busy=1, waiting=0)
    server.send_signal(signal.SIGUSR2)
    frames = frames_until_close(client.sock)
    kinds = [type(frame).__name__ for frame in frames]
    assert "GoAwayFrame" in kinds, kinds
    answer = [frame for frame in frames if frame.stream_id == held]
    assert dict(Decoder().decode(answer[0].data, raw=True))[b":status"] == b"200"
    assert "END_STREAM" in answer[-1].flags
    assert server.wait(30) == 0, server.stderr()
    new_lobby = int(pid_file.read_text())
    assert new_lobby != server.pid
    again = RawH2(server.port)
    assert again.response(again.request("/next"))[0] == 200
    os.kill(new_lobby, signal.SIGTERM)
    assert eventually(lambda: not pid_file.exists(), 30), server.stderr()
    assert [line.split()[1] for line in tally.read_text().splitlines()] == ["/held", "/next"]


def test_an_idle_connection_gets_goaway_after_keep_alive(maitred_server: Callable[..., Server]) -> None:
    """docs/HTTP2.md, "A connection's life": a connection without a stream for --keep-alive
    gets GOAWAY (NO_ERROR), counted as maitred_http2_goaways_total{reason="idle"}, then is
    closed."""
    stats = free_port()
    server = maitred_server("--keep-alive", "1", "--stats", f"{HOST}:{stats}", "environ_echo:app", cwd=APPS)
    client = RawH2(server.port)
    assert client.response(client.request("/"))[0] == 200
    goaways = [frame for frame in frames_until_close(client.sock) if isinstance(frame, hyperframe.frame.GoAwayFrame)]
    assert goaways and goaways[-1].error_code == h2.errors.ErrorCodes.NO_ERROR
    assert counts(stats, "maitred_http2_goaways") == {"shutdown": 0, "idle": 1, "protocol_error": 0, "flood": 0}


def hibernating(stats: int) -> int:
    return status_of(stats)["connections"]["hibernating"]


def opened_like_curl(client: RawH2) -> RawH2:
    """Opens the connection's window for answers as curl (32 MiB), h2load and browsers do."""
    client.conn.increment_flow_control_window(32 * 1024 * 1024 - 65535)
    client.flush()
    return client


def sleep_until_hibernating(client: RawH2, stats: int) -> None:
    """Idle, the connection's first time: the lobby asks the client to keep no HPACK table
    (SETTINGS, HEADER_TABLE_SIZE 0), which the client reads and acknowledges; then it sleeps."""
    client.until(lambda: client.conn.remote_settings.header_table_size == 0)
    assert eventually(lambda: hibernating(stats) == 1, TIMEOUT), status_of(stats)


@pytest.mark.parametrize("listener", ["plain", "tls"])
def test_an_idle_connection_hibernates_and_its_client_goes_on_as_before(
    maitred_server: Callable[..., Server], app_dir: Path, server_pair: Pair, authority: Authority, listener: str
) -> None:
    """docs/HTTP2.md, "Idle connections": a connection without a stream hibernates as an
    HTTP/1.1 one does; woken by its client, it goes on where it stopped: bodies and answers past
    the initial windows both ways, headers (now without an HPACK table), frames the client sends
    late for the streams it had (WINDOW_UPDATE, RST_STREAM) passed by, and again after a second
    sleep; no GOAWAY, no reset, the same connection throughout."""
    (app_dir / "big.py").write_text(BIG_APP)
    stats = free_port()
    tls = tls_args(server_pair) if listener == "tls" else ()
    server = maitred_server("--stats", f"{HOST}:{stats}", *tls, "big:app", cwd=app_dir)
    sock = socket.create_connection((HOST, server.port), timeout=TIMEOUT)
    if listener == "tls":
        context = ssl.create_default_context(cafile=str(authority.pem))
        context.set_alpn_protocols(["h2"])
        sock = context.wrap_socket(sock, server_hostname="localhost")
    client = opened_like_curl(RawH2(server.port, sock))
    first = client.request("/?10", headers=[("x-first", "a" * 100)])
    assert client.response(first)[2] == b"z" * 10
    sleep_until_hibernating(client, stats)
    # Late frames for stream 1, as a client that read its answer slowly might send them.
    sock.sendall(
        hyperframe.frame.WindowUpdateFrame(first, window_increment=10).serialize()
        + hyperframe.frame.RstStreamFrame(first, error_code=0).serialize()
    )
    # Past the initial windows both ways, within the lobby's 256 KiB stream window.
    upload = os.urandom(200_000)
    woken = client.request("/?400000", method="POST", headers=[("x-first", "a" * 100)], body=upload)
    status, _, body = client.response(woken)
    assert status == 200 and body == b"z" * 400_000 + upload
    assert eventually(lambda: hibernating(stats) == 1, TIMEOUT), status_of(stats)
    again = client.request("/?5")
    assert client.response(again)[2] == b"z" * 5
    assert client.goaway is None and not client.resets
    access = [line for line in server.stderr().splitlines() if "HTTP/2 connection" in line and "closed" in line]
    assert not access, access


def test_a_hibernating_connection_gets_goaway_at_keep_alive_and_at_a_shutdown(
    maitred_server: Callable[..., Server],
) -> None:
    """docs/HTTP2.md, "Idle connections": a hibernating connection is woken to say GOAWAY
    (NO_ERROR) when its --keep-alive runs out, or at once at a shutdown, and counted so, as an
    awake one is."""
    stats = free_port()
    server = maitred_server("--keep-alive", "3", "--stats", f"{HOST}:{stats}", "environ_echo:app", cwd=APPS)
    idle = opened_like_curl(RawH2(server.port))
    assert idle.response(idle.request("/"))[0] == 200
    sleep_until_hibernating(idle, stats)
    goaways = [frame for frame in frames_until_close(idle.sock) if isinstance(frame, hyperframe.frame.GoAwayFrame)]
    assert [frame.error_code for frame in goaways] == [h2.errors.ErrorCodes.NO_ERROR]
    assert counts(stats, "maitred_http2_goaways")["idle"] == 1
    stopping = opened_like_curl(RawH2(server.port))
    assert stopping.response(stopping.request("/"))[0] == 200
    sleep_until_hibernating(stopping, stats)
    server.send_signal(signal.SIGTERM)
    goaways = [frame for frame in frames_until_close(stopping.sock) if isinstance(frame, hyperframe.frame.GoAwayFrame)]
    assert [frame.error_code for frame in goaways] == [h2.errors.ErrorCodes.NO_ERROR]
    assert server.wait(TIMEOUT) == 0


def test_http_protocols_turns_either_off(
    maitred_server: Callable[..., Server], server_pair: Pair, authority: Authority
) -> None:
    """docs/HTTP2.md, `--http-protocols`: h1 leaves HTTP/2 out of ALPN and refuses the preface;
    h2 answers an HTTP/1.1 request 505 with the reason."""
    only_h1 = maitred_server(*tls_args(server_pair), "--http-protocols", "h1", "environ_echo:app", cwd=APPS)
    context = ssl.create_default_context(cafile=str(authority.pem))
    context.set_alpn_protocols(["h2", "http/1.1"])
    with context.wrap_socket(socket.create_connection((HOST, only_h1.port)), server_hostname="localhost") as sock:
        assert sock.selected_alpn_protocol() == "http/1.1"
    # A client that offers only h2 is refused at the handshake (no_application_protocol).
    context.set_alpn_protocols(["h2"])
    with pytest.raises(ssl.SSLError, match="no application protocol"):
        context.wrap_socket(socket.create_connection((HOST, only_h1.port)), server_hostname="localhost")
    only_h2 = maitred_server("--http-protocols", "h2", "environ_echo:app", cwd=APPS)
    reply = get(only_h2.port, "/")
    assert reply.status == 505 and b"--http-protocols h2" in reply.body
    client = RawH2(only_h2.port)
    assert client.response(client.request("/"))[0] == 200


def test_the_stream_cap_is_announced_and_held(maitred_server: Callable[..., Server]) -> None:
    """docs/HTTP2.md, "The same queue": --http2-max-concurrent-streams is the client's
    SETTINGS_MAX_CONCURRENT_STREAMS, and a stream past it is refused (REFUSED_STREAM) while the
    others are answered."""
    server = maitred_server(
        "-w", "1", "--http2-max-concurrent-streams", "2", "tally:app", cwd=APPS, env={"TALLY": "/dev/null"}
    )
    client = RawH2(server.port)
    client.until(lambda: client.conn.remote_settings.max_concurrent_streams == 2)
    # hyper-h2 keeps to the cap itself: the third stream goes out with the state machine's
    # cap lifted, as a client that ignores it would send it.
    first, second = client.request("/a?sleep=0.5"), client.request("/b?sleep=0.5")
    client.conn.remote_settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] = 3
    client.conn.remote_settings.acknowledge()
    third = client.request("/c")
    client.until(lambda: third in client.resets)
    assert client.resets[third] == h2.errors.ErrorCodes.REFUSED_STREAM
    assert client.response(first)[0] == client.response(second)[0] == 200


def test_rapid_reset_ends_in_goaway_and_runs_few_requests(
    maitred_server: Callable[..., Server], tmp_path: Path
) -> None:
    """docs/HTTP2.md, "Floods": HEADERS then RST_STREAM, up to 10,000 times, ends in GOAWAY
    ENHANCE_YOUR_CALM with one log line; the worker runs only a few of the requests, and
    another client is served afterwards."""
    tally = tmp_path / "tally"
    stats = free_port()
    server = maitred_server("-w", "1", "--stats", f"{HOST}:{stats}", "tally:app", cwd=APPS, env={"TALLY": str(tally)})
    before = rss_mib(server.pid)
    client = RawH2(server.port)
    sent = 0
    try:
        for sent in range(1, 10_001):
            stream = client.request("/flood")
            client.conn.reset_stream(stream, h2.errors.ErrorCodes.CANCEL)
            client.flush()
    except (BrokenPipeError, ConnectionResetError):
        pass  # The server closed the connection: the GOAWAY is in what it sent before.
    goaways = [frame for frame in frames_until_close(client.sock) if isinstance(frame, hyperframe.frame.GoAwayFrame)]
    assert sent < 10_000 or goaways
    assert [frame.error_code for frame in goaways][-1:] == [h2.errors.ErrorCodes.ENHANCE_YOUR_CALM]
    assert_refused_once(
        server, stats, "rapid_reset", "it reset more than 20 streams before the lobby took them (rapid reset"
    )
    assert rss_mib(server.pid) - before < 50
    assert get(server.port, "/other").status == 200
    ran = tally.read_text().splitlines()
    assert ran[-1].split()[1] == "/other"
    assert len(ran) < 100, len(ran)


@pytest.mark.parametrize("transport", ["tls", "prior_knowledge"])
def test_h2spec_conformance(
    maitred_server: Callable[..., Server], tmp_path: Path, server_pair: Pair, transport: str
) -> None:
    """docs/HTTP2.md, "Checked against": h2spec's whole suite, strict mode included (-S), over
    TLS (h2 by ALPN) and with prior knowledge on a plain listener that speaks HTTP/2 only
    (--http-protocols h2), where bytes that are not the preface get HTTP/2's connection error
    (h2spec 3.5/2)."""
    tool = h2spec()
    (tmp_path / "hello.py").write_text(
        "def app(environ, start_response):\n"
        "    environ['wsgi.input'].read()\n"
        "    start_response('200 OK', [('Content-Type', 'text/plain'), ('Content-Length', '3')])\n"
        "    return [b'ok\\n']\n"
    )
    if transport == "tls":
        server = maitred_server("-w", "2", *tls_args(server_pair), "hello:app", cwd=tmp_path)
        over = ["-t", "-k"]
    else:
        server = maitred_server("-w", "2", "--http-protocols", "h2", "hello:app", cwd=tmp_path)
        over = []
    report = subprocess.run(
        [tool, *over, "-S", "-h", HOST, "-p", str(server.port), "-o", "5", "-j", str(tmp_path / "h2spec.xml")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert report.returncode == 0, report.stdout[-6000:]
    assert " 0 failed" in report.stdout, report.stdout[-2000:]


def test_an_invalid_preface_where_only_http2_is_spoken_is_a_connection_error(
    maitred_server: Callable[..., Server],
) -> None:
    """docs/HTTP2.md, `--http-protocols`: on a plain listener that speaks HTTP/2 only, first bytes
    that are neither the preface nor an HTTP/1.x request get the server's SETTINGS and GOAWAY
    PROTOCOL_ERROR, then the close, with one log line, counted as invalid_preface; an HTTP/1.1
    request still gets 505 with the reason."""
    stats = free_port()
    server = maitred_server("--http-protocols", "h2", "--stats", f"{HOST}:{stats}", "environ_echo:app", cwd=APPS)
    with socket.create_connection((HOST, server.port), timeout=TIMEOUT) as sock:
        sock.sendall(b"INVALID CONNECTION PREFACE\r\n\r\n")
        frames = frames_until_close(sock)
    assert [type(frame).__name__ for frame in frames] == ["SettingsFrame", "GoAwayFrame"], frames
    assert frames[1].error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR
    assert_refused_once(
        server,
        stats,
        "invalid_preface",
        'it opened with "INVALID CONNECTION PREFACE\\r\\n\\r\\n", neither',
        "protocol_error",
    )
    reply = get(server.port, "/")
    assert reply.status == 505 and b"--http-protocols h2" in reply.body


class Flooder:
    """A raw HTTP/2 client connection: the preface and an empty SETTINGS, then whatever frames
    a test writes, with hyperframe and hpack alone; what the server answers is read as frames."""

    def __init__(self, port: int, settings: dict[int, int] | None = None) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=TIMEOUT)
        self.sock.sendall(
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + hyperframe.frame.SettingsFrame(0, settings or {}).serialize()
        )
        self.frames: list = []
        self.closed = False
        self.buffer = b""

    def send(self, frames: list) -> bool:
        """Sends the frames; False once the server has closed the connection (or stopped reading
        past TIMEOUT)."""
        try:
            self.sock.sendall(b"".join(frame.serialize() for frame in frames))
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            return False
        return True

    def read_until(self, condition: Callable[[list], bool]) -> list:
        """Reads frames until `condition(frames)` holds or the server closes; PINGs answered."""
        while not condition(self.frames) and not self.closed:
            try:
                chunk = self.sock.recv(1 << 16)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                self.closed = True
                break
            self.buffer += chunk
            while len(self.buffer) >= 9:
                frame, length = hyperframe.frame.Frame.parse_frame_header(memoryview(self.buffer[:9]))
                if len(self.buffer) < 9 + length:
                    break
                frame.parse_body(memoryview(self.buffer[9 : 9 + length]))
                self.frames.append(frame)
                self.buffer = self.buffer[9 + length :]
        return self.frames


def goaway(frames: list) -> hyperframe.frame.GoAwayFrame | None:
    return next((frame for frame in frames if isinstance(frame, hyperframe.frame.GoAwayFrame)), None)


def ended(frame: hyperframe.frame.Frame, stream: int) -> bool:
    """Whether `frame` ends the server's side of `stream`."""
    return frame.stream_id == stream and "END_STREAM" in frame.flags


def request_block(path: str = "/") -> bytes:
    return Encoder().encode([(":method", "GET"), (":scheme", "http"), (":authority", "t"), (":path", path)])


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def counts(stats: int, family: str) -> dict[str, float]:
    """A labelled counter's samples, by the value of its one label, from /metrics."""
    text = get(stats, "/metrics").body.decode()
    for metric in text_string_to_metric_families(text):
        if metric.name == family:
            return {next(iter(sample.labels.values())): sample.value for sample in metric.samples}
    raise AssertionError(f"no {family} in /metrics")


def refusal_lines(server: Server) -> list[str]:
    return [
        line
        for line in server.stderr().splitlines()
        if "HTTP/2 connection from 127.0.0.1:" in line and " refused: " in line
    ]


def assert_refused_once(server: Server, stats: int, reason: str, words: str, goaway: str = "flood") -> None:
    """One log line saying what the client did and what maitred did, and its counts: the
    refusal's label and the GOAWAY's, each 1, and no other refusal."""
    server.wait_for_log(words, TIMEOUT)
    lines = refusal_lines(server)
    assert len(lines) == 1 and words in lines[0], lines
    refused = counts(stats, "maitred_http2_refused")
    assert refused[reason] == 1 and sum(refused.values()) == 1, refused
    assert counts(stats, "maitred_http2_goaways")[goaway] == 1


def continuation_flood() -> list:
    """A header block that never ends: CONTINUATION frames of 1,000 fresh bytes each."""
    frames = [hyperframe.frame.HeadersFrame(1, request_block())]
    pad = Encoder().encode([("x-pad", "a" * 1000)])
    frames += [hyperframe.frame.ContinuationFrame(1, pad) for _ in range(10_000)]
    return frames


def empty_data_flood() -> list:
    """A POST whose body never comes: empty DATA frames, 100,000 of them."""
    return [hyperframe.frame.HeadersFrame(1, request_block(), flags=["END_HEADERS"])] + [
        hyperframe.frame.DataFrame(1, b"") for _ in range(100_000)
    ]


def zero_length_headers() -> list:
    """HEADERS frames with an empty block (no pseudo-header: malformed), 10,000 streams."""
    return [hyperframe.frame.HeadersFrame(2 * n + 1, b"", flags=["END_HEADERS", "END_STREAM"]) for n in range(10_000)]


def settings_flood() -> list:
    return [hyperframe.frame.SettingsFrame(0, {}) for _ in range(100_000)]


def ping_flood() -> list:
    return [hyperframe.frame.PingFrame(0, b"\0" * 8) for _ in range(100_000)]


def window_update_of_zero() -> list:
    return [hyperframe.frame.WindowUpdateFrame(0, 0)]


def window_past_the_limit() -> list:
    return [hyperframe.frame.WindowUpdateFrame(0, 2**31 - 1)]


# Each flood, the GOAWAY's error it gets, its label in maitred_http2_refused_total and its GOAWAY's
# in maitred_http2_goaways_total, and the words of its one log line.
FLOODS = [
    (continuation_flood, "ENHANCE_YOUR_CALM", "continuation_flood", "flood", "more CONTINUATION frames than a head of 64 KiB needs"),
    (empty_data_flood, "ENHANCE_YOUR_CALM", "empty_data_flood", "flood", "more than 100 empty DATA frames"),
    (zero_length_headers, "ENHANCE_YOUR_CALM", "malformed_streams", "flood", "more than 256 of its streams broke the protocol"),
    (settings_flood, "ENHANCE_YOUR_CALM", "settings_flood", "flood", "more than 256 SETTINGS frames within a second"),
    (ping_flood, "ENHANCE_YOUR_CALM", "ping_flood", "flood", "more than 256 PING frames within a second"),
    (window_update_of_zero, "PROTOCOL_ERROR", "protocol_error", "protocol_error", "it broke the HTTP/2 protocol"),
    (window_past_the_limit, "FLOW_CONTROL_ERROR", "flow_control", "protocol_error", "a window past 2^31-1"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("flood", "error", "reason", "goaway_reason", "words"), FLOODS, ids=[f[0].__name__ for f in FLOODS]
)
def test_a_flood_ends_in_goaway_and_others_are_served(
    maitred_server: Callable[..., Server],
    tmp_path: Path,
    flood: Callable[[], list],
    error: str,
    reason: str,
    goaway_reason: str,
    words: str,
) -> None:
    """docs/HTTP2.md, "Floods": each ends in GOAWAY with one log line saying what the client did
    and the GOAWAY, counted in maitred_http2_refused_total and maitred_http2_goaways_total; the
    lobby's memory grows by less than 50 MiB, no request reaches the worker, and another client is
    served."""
    tally = tmp_path / "tally"
    stats = free_port()
    server = maitred_server("-w", "1", "--stats", f"{HOST}:{stats}", "tally:app", cwd=APPS, env={"TALLY": str(tally)})
    before = rss_mib(server.pid)
    flooder = Flooder(server.port)
    flooder.send(flood())
    frames = flooder.read_until(lambda frames: goaway(frames) is not None)
    assert goaway(frames) is not None, [type(frame).__name__ for frame in frames][-20:]
    assert goaway(frames).error_code == h2.errors.ErrorCodes[error]
    assert_refused_once(server, stats, reason, words, goaway_reason)
    assert f"GOAWAY {error}, connection closed" in refusal_lines(server)[0]
    assert rss_mib(server.pid) - before < 50
    assert get(server.port, "/other").status == 200
    assert [line.split()[1] for line in tally.read_text().splitlines()] == ["/other"]


def test_an_hpack_bomb_past_the_header_limit_is_refused(maitred_server: Callable[..., Server]) -> None:
    """docs/HTTP2.md, "Floods": 4,000 bytes indexed once and referred to 100 times decode to
    400 KB, past four times the 64 KiB a head may have (and past --limit-request-fields and
    --limit-request-field-size): GOAWAY ENHANCE_YOUR_CALM with one log line naming the HPACK bomb,
    counted as header_list_too_large, without the application seeing it; others are served."""
    stats = free_port()
    server = maitred_server("--stats", f"{HOST}:{stats}", "environ_echo:app", cwd=APPS)
    fields = [(":method", "GET"), (":scheme", "http"), (":authority", "t"), (":path", "/")]
    block = Encoder().encode(fields + [("x-bomb", "b" * 4000)] * 100)
    assert len(block) < 5000
    flooder = Flooder(server.port)
    flooder.send([hyperframe.frame.HeadersFrame(1, block, flags=["END_HEADERS", "END_STREAM"])])
    frames = flooder.read_until(lambda frames: goaway(frames) is not None)
    assert goaway(frames).error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    assert_refused_once(
        server, stats, "header_list_too_large", "past 256 KiB, 4 times the 64 KiB a head may have (an HPACK bomb)"
    )
    assert get(server.port, "/").status == 200


def test_an_hpack_bomb_under_four_times_the_limit_is_answered_431_with_a_line_and_a_count(
    maitred_server: Callable[..., Server],
) -> None:
    """docs/HTTP2.md, "Floods": 4,000 bytes indexed once and referred to 25 times decode to
    100 KB, past the 64 KiB a head may have but short of the four times that end the
    connection. The h2 crate answers the stream 431 and resets it by itself; the lobby still
    writes one line and counts the refusal, the application never sees it, and the connection
    goes on: its next stream is served."""
    stats = free_port()
    server = maitred_server("--stats", f"{HOST}:{stats}", "environ_echo:app", cwd=APPS)
    fields = [(":method", "GET"), (":scheme", "http"), (":authority", "t"), (":path", "/bomb")]
    encoder = Encoder()
    block = encoder.encode(fields + [("x-bomb", "b" * 4000)] * 25)
    flooder = Flooder(server.port)
    flooder.send([hyperframe.frame.HeadersFrame(1, block, flags=["END_HEADERS", "END_STREAM"])])
    frames = flooder.read_until(lambda frames: any(ended(frame, 1) for frame in frames))
    heads = [frame for frame in frames if isinstance(frame, hyperframe.frame.HeadersFrame)]
    assert [dict(Decoder().decode(head.data)).get(":status") for head in heads] == ["431"]
    words = "stream 1's header list decodes past the 65536 bytes a head may have (an HPACK bomb"
    server.wait_for_log(words, TIMEOUT)
    assert len([line for line in server.stderr().splitlines() if words in line]) == 1
    assert counts(stats, "maitred_refusals")["431"] == 1
    assert sum(counts(stats, "maitred_http2_refused").values()) == 0
    # The same connection's next stream is served.
    next_block = encoder.encode(fields[:3] + [(":path", "/next")])
    flooder.send([hyperframe.frame.HeadersFrame(3, next_block, flags=["END_HEADERS", "END_STREAM"])])
    frames = flooder.read_until(lambda frames: any(ended(frame, 3) for frame in frames))
    assert goaway(frames) is None and not flooder.closed
    assert get(server.port, "/").status == 200


def test_a_zero_window_on_100_streams_is_cut_by_send_timeout(
    maitred_server: Callable[..., Server], app_dir: Path
) -> None:
    """docs/HTTP2.md, "Floods": a client that opens 100 streams and never gives a window to
    any is disconnected with GOAWAY after --send-timeout, with one log line."""
    (app_dir / "big.py").write_text(BIG_APP)
    stats = free_port()
    server = maitred_server("-w", "2", "--send-timeout", "1", "--stats", f"{HOST}:{stats}", "big:app", cwd=app_dir)
    flooder = Flooder(server.port, {hyperframe.frame.SettingsFrame.INITIAL_WINDOW_SIZE: 0})
    encoder = Encoder()
    flooder.send(
        [
            hyperframe.frame.HeadersFrame(
                2 * n + 1,
                encoder.encode([(":method", "GET"), (":scheme", "http"), (":authority", "t"), (":path", "/?100000")]),
                flags=["END_HEADERS", "END_STREAM"],
            )
            for n in range(100)
        ]
    )
    frames = flooder.read_until(lambda frames: goaway(frames) is not None)
    assert goaway(frames).error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    assert_refused_once(
        server, stats, "zero_window", "it gave no window for its answer (or read nothing) for 1 s (--send-timeout)"
    )
    assert get(server.port, "/?3").status == 200


def test_the_access_log_and_the_metrics_count_http2(maitred_server: Callable[..., Server], tmp_path: Path) -> None:
    """docs/HTTP2.md, "The access log" and docs/METRICS.md: the protocol atom says HTTP/2.0, and
    maitred_http2_requests_total counts HTTP/2's answers among maitred_requests_total's."""
    access = tmp_path / "access.log"
    stats = free_port()
    server = maitred_server(
        "--access-logfile", str(access), "--access-logformat", '%(H)s "%(r)s" %(s)s',
        "--stats", f"{HOST}:{stats}", "environ_echo:app", cwd=APPS,
    )  # fmt: skip
    client = RawH2(server.port)
    assert client.response(client.request("/two?x=1"))[0] == 200
    assert get(server.port, "/one").status == 200
    assert eventually(lambda: access.exists() and len(access.read_text().splitlines()) == 2, TIMEOUT)
    lines = access.read_text().splitlines()
    assert 'HTTP/2.0 "GET /two?x=1 HTTP/2.0" 200' in lines, lines
    assert 'HTTP/1.1 "GET /one HTTP/1.1" 200' in lines, lines
    metrics = get(stats, "/metrics").body.decode()
    assert "maitred_http2_requests_total 1" in metrics.splitlines()


def test_streams_count_as_requests_in_the_connection_states(maitred_server: Callable[..., Server]) -> None:
    """docs/HTTP2.md, "Streams are requests": in /status.json (and maitred_connections) each
    stream counts as the request it is, where an HTTP/1.1 connection with that request would: one
    connection with three streams against one busy worker shows one in service and two queued,
    as three HTTP/1.1 connections would, and the connection itself is not counted beside them;
    without a stream it is idle again."""
    stats = free_port()
    server = maitred_server("-w", "1", "--stats", f"{HOST}:{stats}", "tally:app", cwd=APPS, env={"TALLY": "/dev/null"})
    client = RawH2(server.port)
    streams = [client.request(f"/{n}?sleep=1") for n in range(3)]
    wait_for_queue(stats, busy=1, waiting=2)
    connections = status_of(stats)["connections"]
    assert (connections["queued"], connections["in_service"], connections["idle"]) == (2, 1, 0), connections
    assert [client.response(stream)[0] for stream in streams] == [200, 200, 200]
    assert eventually(lambda: status_of(stats)["connections"]["idle"] == 1, TIMEOUT)
    assert sum(status_of(stats)["connections"].values()) == 1


def test_streams_slow_to_send_their_bodies_are_named_slow_clients(maitred_server: Callable[..., Server]) -> None:
    """docs/METRICS.md, "Diagnoses": twelve streams of one connection that send half their body
    and stop are twelve clients sending their request, as twelve HTTP/1.1 connections would be:
    the slow_clients diagnosis names them within a second or so, and the worker serves on."""
    stats = free_port()
    server = maitred_server("-w", "1", "--stats", f"{HOST}:{stats}", "environ_echo:app", cwd=APPS)
    client = RawH2(server.port)
    for _ in range(12):
        stream = client.conn.get_next_available_stream_id()
        fields = [
            (":method", "POST"),
            (":scheme", "http"),
            (":authority", "t"),
            (":path", "/"),
            ("content-length", "10"),
        ]
        client.conn.send_headers(stream, fields)
        client.conn.send_data(stream, b"half")
    client.flush()
    marker = "(slow_clients): "
    line = next(line for line in server.wait_for_log(marker, TIMEOUT).splitlines() if marker in line)
    assert "12 connections have been sending their request" in line, line
    assert any(d["name"] == "slow_clients" for d in status_of(stats)["diagnoses"])
    assert get(server.port, "/").status == 200
