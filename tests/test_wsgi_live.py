"""maitred's WSGI behaviour end to end: real HTTP over real sockets to a running server.

The application is tests/apps/wsgi_live_app.py. The requests are written and the responses
parsed byte by byte here, so that framing (Content-Length, chunked, close-delimited, no body
at all) is checked as the client sees it, not as a client library smooths it over.

The servers run one worker: a worker calls close() on a response before it takes the next
request, so once a later response has arrived, everything the earlier request logged is in
the log already.
"""

from __future__ import annotations

import json
import random
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import HOST, Server

APPS = Path(__file__).resolve().parent / "apps"
TIMEOUT = 10.0
SERVED_SIZE = 3_000_000


# ---------------------------------------------------------------------------------------------
# A raw HTTP/1.1 client.


@dataclass
class Response:
    version: str
    status: int
    reason: str
    headers: list[tuple[str, str]]
    """(lower-case name, value) in the order received."""
    body: bytes = b""
    framing: str = "none"
    """How the body was delimited: "length", "chunked", "close" or "none" (no body allowed)."""
    trailers: list[tuple[str, str]] = field(default_factory=list)

    def header(self, name: str) -> str | None:
        values = [value for key, value in self.headers if key == name.lower()]
        return ", ".join(values) if values else None


class Client:
    """One connection. Every read waits at most TIMEOUT seconds."""

    def __init__(self, port: int, timeout: float = TIMEOUT) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.reader = self.sock.makefile("rb")

    def __enter__(self) -> Client:  # noqa: PYI034 - typing.Self needs Python 3.11; 3.10 is supported
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self.reader.close()
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _line(self) -> bytes:
        line = self.reader.readline(65537)
        if not line.endswith(b"\r\n"):
            raise AssertionError(f"the connection ended inside a line: {line!r}")
        return line[:-2]

    def read_head(self) -> Response:
        status_line = self._line().decode("latin-1")
        version, code, reason = (status_line.split(" ", 2) + [""])[:3]
        headers = []
        while line := self._line():
            name, _, value = line.decode("latin-1").partition(":")
            headers.append((name.lower(), value.strip(" \t")))
        return Response(version, int(code), reason, headers)

    def read_chunk(self) -> bytes:
        """One chunk of a chunked body; b"" for the last (after which the trailers follow)."""
        size = int(self._line().split(b";")[0], 16)
        if size == 0:
            return b""
        data = self.reader.read(size)
        assert len(data) == size, f"the connection ended inside a chunk of {size} bytes"
        assert self._line() == b"", "a chunk does not end with CRLF"
        return data

    def read_body(self, response: Response, method: str = "GET") -> Response:
        """Reads the body that `response`'s head announces, as RFC 9112 section 6.3 says."""
        no_body = method == "HEAD" or response.status < 200 or response.status in (204, 304)
        if no_body:
            return response
        if response.header("transfer-encoding") is not None:
            assert response.header("transfer-encoding") == "chunked"
            assert response.header("content-length") is None, "chunked with a Content-Length"
            parts = []
            while chunk := self.read_chunk():
                parts.append(chunk)
            while line := self._line():
                name, _, value = line.decode("latin-1").partition(":")
                response.trailers.append((name.lower(), value.strip()))
            response.body, response.framing = b"".join(parts), "chunked"
        elif response.header("content-length") is not None:
            length = int(response.header("content-length"))
            response.body, response.framing = self.reader.read(length), "length"
            assert len(response.body) == length, "the connection ended inside the body"
        else:
            response.body, response.framing = self.reader.read(), "close"
        return response

    def read_response(self, method: str = "GET") -> Response:
        return self.read_body(self.read_head(), method)

    def exchange(
        self,
        method: str,
        target: str,
        headers: list[tuple[str, str]] | tuple = (),
        body: bytes = b"",
        version: str = "HTTP/1.1",
    ) -> Response:
        """Sends one request and reads its response."""
        self.send(request(method, target, headers, body, version))
        return self.read_response(method)

    def at_eof(self) -> bool:
        """Whether the server has closed the connection (waiting up to TIMEOUT for it)."""
        return self.reader.read(1) == b""


def request(
    method: str,
    target: str,
    headers: list[tuple[str, str]] | tuple = (),
    body: bytes = b"",
    version: str = "HTTP/1.1",
) -> bytes:
    """A request's bytes; Host (on HTTP/1.1) and Content-Length (for a body) are added
    unless `headers` has them or frames the body with Transfer-Encoding."""
    names = {name.lower() for name, _ in headers}
    lines = [f"{method} {target} {version}"]
    if version == "HTTP/1.1" and "host" not in names:
        lines.append(f"Host: {HOST}")
    lines.extend(f"{name}: {value}" for name, value in headers)
    if body and not names & {"content-length", "transfer-encoding"}:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def chunked(body: bytes, trailers: str = "") -> bytes:
    """`body` in chunks of varied sizes (one carrying an extension), then `trailers`."""
    sizes = [1, 7, 4096, 65536, 300_000, 13]
    out, position, index = [], 0, 0
    while position < len(body):
        size = sizes[index % len(sizes)]
        piece = body[position : position + size]
        extension = ";name=value" if index == 1 else ""
        out.append(b"%x%s\r\n%s\r\n" % (len(piece), extension.encode(), piece))
        position += size
        index += 1
    out.append(b"0\r\n" + trailers.encode("latin-1") + b"\r\n")
    return b"".join(out)


def assert_same_bytes(got: bytes, expected: bytes) -> None:
    """Like ``assert got == expected``, with a short message for megabytes of difference."""
    if got == expected:
        return
    first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    raise AssertionError(
        f"got {len(got)} bytes, expected {len(expected)}; first difference at byte {first}: "
        f"{got[first : first + 40]!r} vs {expected[first : first + 40]!r}"
    )


def wait_for_text(path: Path, wanted: str, timeout: float = TIMEOUT) -> str:
    """The text of `path` once it contains `wanted`, or whatever it holds at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        text = path.read_text() if path.exists() else ""
        if wanted in text or time.monotonic() >= deadline:
            return text
        time.sleep(0.02)


# ---------------------------------------------------------------------------------------------
# Servers and files, shared by the module.


@pytest.fixture(scope="module")
def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("wsgi-live")
    (directory / "served.bin").write_bytes(random.Random(3).randbytes(SERVED_SIZE))
    return directory


@pytest.fixture(scope="module")
def served(shared_dir: Path) -> bytes:
    return (shared_dir / "served.bin").read_bytes()


@pytest.fixture(scope="module")
def server(maitred_module_server: Callable[..., Server], shared_dir: Path) -> Server:
    return maitred_module_server(
        "wsgi_live_app:application",
        "--workers",
        "1",
        cwd=APPS,
        env={"WSGI_LIVE_DIR": str(shared_dir)},
    )


@pytest.fixture(scope="module")
def mounted_server(maitred_module_server: Callable[..., Server], shared_dir: Path) -> Server:
    return maitred_module_server(
        "wsgi_live_app:application",
        "--workers",
        "1",
        "-e",
        "SCRIPT_NAME=/app",
        cwd=APPS,
        env={"WSGI_LIVE_DIR": str(shared_dir)},
    )


class Log:
    """What a server writes to its log from now on."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.start = len(server.stderr())

    def text(self) -> str:
        return self.server.stderr()[self.start :]

    def assert_clean(self) -> None:
        text = self.text()
        for sign in ("Traceback", "Error", "WSGIWarning", "[ERROR]", "[WARNING]", "[CRITICAL]"):
            assert sign not in text, f"the server logged {sign!r}:\n{text}"


@pytest.fixture
def log(server: Server) -> Log:
    return Log(server)


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    with Client(server.port) as connection:
        yield connection


def environ_of(response: Response) -> dict[str, object]:
    assert response.status == 200, response
    return {key: item["value"] for key, item in json.loads(response.body)["environ"].items()}


# ---------------------------------------------------------------------------------------------
# Through wsgiref.validate: any breach of PEP 3333 by server or application is a 500 and a
# traceback in the log.

POSTED = b"".join(b"line %d of the posted body\n" % n for n in range(1000))

VALIDATED = {
    "GET": ("GET", "/v/hello", b"", 200, b"hello, world\n"),
    "several chunks": ("GET", "/v/several", b"", 200, b"one two three\n"),
    "POST with a body": ("POST", "/v/echo", POSTED, 200, POSTED),
    "POST with an empty body": ("POST", "/v/echo", b"", 200, b""),
    "HEAD": ("HEAD", "/v/hello", b"", 200, b""),
    "streaming": ("GET", "/v/stream?n=20", b"", 200, b"".join(b"chunk %d\n" % n for n in range(20))),
    "write()": ("GET", "/v/write", b"", 200, b"written 1\nwritten 2\nreturned 1\nreturned 2\n"),
    "204": ("GET", "/v/status?status=204+No+Content", b"", 204, b""),
    "304": ("GET", "/v/status?status=304+Not+Modified", b"", 304, b""),
}


@pytest.mark.parametrize("method, target, body, status, expected", VALIDATED.values(), ids=VALIDATED.keys())
def test_validated_application(
    client: Client, log: Log, method: str, target: str, body: bytes, status: int, expected: bytes
) -> None:
    response = client.exchange(method, target, body=body)
    # The next answer on the connection comes from the same (only) worker, after the
    # validator's close() checks of this one have run.
    follow_up = client.exchange("GET", "/hello")
    assert (response.status, response.body) == (status, expected), log.text()
    assert follow_up.body == b"hello, world\n"
    log.assert_clean()


def test_validated_file_wrapper(client: Client, log: Log, served: bytes) -> None:
    response = client.exchange("GET", "/v/file")
    client.exchange("GET", "/hello")
    assert response.status == 200, log.text()
    assert_same_bytes(response.body, served)
    log.assert_clean()


def test_validator_failures_would_be_seen(client: Client, log: Log) -> None:
    """The check above is not vacuous: a validator assertion does come out as a 500 and a
    traceback. Here the application sends a Content-Type with a 204, which it forbids."""
    response = client.exchange("GET", "/v/status?status=204+No+Content&content_type=1")
    client.exchange("GET", "/hello")
    assert response.status == 500
    assert "AssertionError" in log.text() and "Traceback" in log.text()


# ---------------------------------------------------------------------------------------------
# The environ.

REQUIRED_STR_KEYS = [
    "REQUEST_METHOD",
    "SCRIPT_NAME",
    "PATH_INFO",
    "QUERY_STRING",
    "SERVER_NAME",
    "SERVER_PORT",
    "SERVER_PROTOCOL",
]


def test_environ_has_every_required_key_with_its_type(client: Client, server: Server) -> None:
    described = json.loads(client.exchange("GET", "/some/path?x=1").body)
    environ = described["environ"]
    for key in REQUIRED_STR_KEYS:
        assert environ[key]["type"] == "str", key
    values = {key: item["value"] for key, item in environ.items()}
    assert values["REQUEST_METHOD"] == "GET"
    assert values["SCRIPT_NAME"] == ""
    assert values["PATH_INFO"] == "/some/path"
    assert values["QUERY_STRING"] == "x=1"
    assert values["SERVER_PROTOCOL"] == "HTTP/1.1"
    assert environ["wsgi.version"] == {"type": "tuple", "value": [1, 0]}
    assert environ["wsgi.url_scheme"] == {"type": "str", "value": "http"}
    for key in ("wsgi.multithread", "wsgi.multiprocess", "wsgi.run_once"):
        assert environ[key]["type"] == "bool", key
    assert values["wsgi.multithread"] is False and values["wsgi.run_once"] is False
    assert values["wsgi.multiprocess"] is True  # a worker is a process, and there may be several
    assert {"read", "readline", "readlines", "__iter__"} <= set(described["input_methods"])
    assert {"write", "writelines", "flush"} <= set(described["errors_methods"])
    assert "wsgi.file_wrapper" in environ
    # PEP 3333: keys are native strings, and so are the values of all CGI keys.
    assert described["key_types"] == ["str"]
    for key, item in environ.items():
        if not key.startswith("wsgi."):
            assert item["type"] == "str", key


PATHS = {
    "UTF-8 bytes become latin-1 characters": ("/caf%C3%A9", "/caf\u00c3\u00a9"),
    "a byte above 0x7f": ("/%FF%e9", "/\u00ff\u00e9"),
    "space and tilde": ("/a%20b/%7Euser", "/a b/~user"),
    "percent sign": ("/100%25", "/100%"),
    "encoded slash": ("/a%2Fb", "/a/b"),
    "a % that escapes nothing stays": ("/50%zz", "/50%zz"),
    "nothing to decode": ("/plain.txt", "/plain.txt"),
}


@pytest.mark.parametrize("target, path_info", PATHS.values(), ids=PATHS.keys())
def test_path_info_is_percent_decoded_as_latin1(client: Client, target: str, path_info: str) -> None:
    environ = environ_of(client.exchange("GET", target + "?q=%C3%A9"))
    assert environ["PATH_INFO"] == path_info
    assert environ["QUERY_STRING"] == "q=%C3%A9"
    assert environ["RAW_URI"] == target + "?q=%C3%A9"


@pytest.mark.parametrize(
    "target, query_string",
    [
        ("/q?a=%C3%A9&b=c+d&e=%2F&&f", "a=%C3%A9&b=c+d&e=%2F&&f"),
        ("/q?", ""),
        ("/q", ""),
        ("/q?x=?&y=%zz", "x=?&y=%zz"),
    ],
)
def test_query_string_is_raw(client: Client, target: str, query_string: str) -> None:
    assert environ_of(client.exchange("GET", target))["QUERY_STRING"] == query_string


def test_repeated_headers_are_joined(client: Client) -> None:
    headers = [("X-Multi", "a"), ("Accept", "text/html"), ("X-Multi", "b, c"), ("x-multi", "d")]
    environ = environ_of(client.exchange("GET", "/headers", headers=headers))
    assert environ["HTTP_X_MULTI"] == "a, b, c, d"
    assert environ["HTTP_ACCEPT"] == "text/html"


def test_header_names_with_underscores_are_dropped(client: Client) -> None:
    headers = [("X_Forwarded_For", "10.6.6.6"), ("X-Forwarded-For", "10.0.0.1"), ("Under_Score", "1")]
    environ = environ_of(client.exchange("GET", "/headers", headers=headers))
    assert environ["HTTP_X_FORWARDED_FOR"] == "10.0.0.1"
    assert not [key for key in environ if "UNDER" in key]


def test_header_values_are_latin1(client: Client) -> None:
    raw = request("GET", "/headers").replace(b"\r\n\r\n", b"\r\nX-Name: caf\xe9\r\n\r\n")
    client.send(raw)
    assert environ_of(client.read_response())["HTTP_X_NAME"] == "caf\u00e9"


def test_content_type_and_length(client: Client) -> None:
    body = b"a=1&b=%C3%A9"
    headers = [("Content-Type", "application/x-www-form-urlencoded")]
    response = client.exchange("POST", "/form", headers=headers, body=body)
    described = json.loads(response.body)
    environ = environ_of(response)
    assert environ["CONTENT_TYPE"] == "application/x-www-form-urlencoded"
    assert environ["CONTENT_LENGTH"] == str(len(body))
    assert "HTTP_CONTENT_TYPE" not in environ and "HTTP_CONTENT_LENGTH" not in environ
    assert described["body"] == body.decode()


def test_no_body_no_content_length(client: Client) -> None:
    environ = environ_of(client.exchange("GET", "/nothing"))
    assert environ.get("CONTENT_LENGTH", "") in ("", "0")
    assert environ.get("CONTENT_TYPE", "") == ""


def test_remote_and_server_addresses(client: Client, server: Server) -> None:
    environ = environ_of(client.exchange("GET", "/addresses", headers=[("Host", "example.test:81")]))
    local_host, local_port = client.sock.getsockname()
    assert environ["REMOTE_ADDR"] == local_host == "127.0.0.1"
    assert environ["REMOTE_PORT"] == str(local_port)
    assert environ["SERVER_NAME"] == "127.0.0.1"
    assert environ["SERVER_PORT"] == str(server.port)
    assert environ["HTTP_HOST"] == "example.test:81"


def test_http_10_environ(client: Client) -> None:
    environ = environ_of(client.exchange("GET", "/old", version="HTTP/1.0"))
    assert environ["SERVER_PROTOCOL"] == "HTTP/1.0"
    assert "HTTP_HOST" not in environ


MOUNTED = {
    "below the mount point": ("/app/x/y", "/x/y"),
    "the mount point itself": ("/app", ""),
    "the mount point with a slash": ("/app/", "/"),
    "percent-encoded below": ("/app/caf%C3%A9", "/caf\u00c3\u00a9"),
    "a longer segment is not below": ("/application/x", "/application/x"),
    "elsewhere": ("/other", "/other"),
}


@pytest.mark.parametrize("target, path_info", MOUNTED.values(), ids=MOUNTED.keys())
def test_script_name_from_the_environment(mounted_server: Server, target: str, path_info: str) -> None:
    with Client(mounted_server.port) as client:
        environ = environ_of(client.exchange("GET", target + "?k=v"))
    assert environ["SCRIPT_NAME"] == "/app"
    assert environ["PATH_INFO"] == path_info
    assert environ["QUERY_STRING"] == "k=v"


# ---------------------------------------------------------------------------------------------
# wsgi.input

BODIES = {
    "empty": b"",
    "lines": b"first line\nsecond\n\n\r\nno newline at the end",
    # Past the lobby's in-memory limit, so it arrives as a file; the first line is longer
    # than the worker's read-ahead.
    "5 MB": b"x" * 200_000 + b"\n" + random.Random(5).randbytes(5_000_000),
}
INPUT_MODES = ["read-n", "read-all", "readline", "readline-n", "readlines", "iter", "mixed"]


@pytest.mark.parametrize("mode", INPUT_MODES)
@pytest.mark.parametrize("body_name", BODIES)
@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_wsgi_input(client: Client, framing: str, body_name: str, mode: str) -> None:
    body = BODIES[body_name]
    size = 100 if mode == "readline-n" else 65_537
    target = f"/input?mode={mode}&size={size}"
    if framing == "chunked":
        headers = [("Transfer-Encoding", "chunked"), ("Trailer", "X-Sum")]
        client.send(request("POST", target, headers=headers, body=chunked(body, "X-Sum: 42\r\n")))
    else:
        client.send(request("POST", target, headers=[("Content-Length", str(len(body)))], body=body))
    response = client.read_response()
    assert response.status == 200, response.body[:2000]
    assert response.header("x-eof") == "yes"
    assert_same_bytes(response.body, body)


def test_chunked_body_has_a_content_length(client: Client) -> None:
    body = b"0123456789" * 1000
    client.send(request("POST", "/chunked", headers=[("Transfer-Encoding", "chunked")], body=chunked(body)))
    response = client.read_response()
    assert environ_of(response)["CONTENT_LENGTH"] == str(len(body))
    assert json.loads(response.body)["body"] == body.decode()


# ---------------------------------------------------------------------------------------------
# Connections: Expect, pipelining, keep-alive.


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_expect_100_continue(client: Client, framing: str) -> None:
    body = b"sent only after 100 Continue\n" * 10
    if framing == "chunked":
        headers = [("Transfer-Encoding", "chunked"), ("Expect", "100-continue")]
        payload = chunked(body)
    else:
        headers = [("Content-Length", str(len(body))), ("Expect", "100-continue")]
        payload = body
    client.send(request("POST", "/input?mode=read-all", headers=headers))
    interim = client.read_head()
    assert (interim.status, interim.reason) == (100, "Continue")
    assert interim.headers == []
    client.send(payload)
    response = client.read_response()
    assert response.status == 200
    assert response.body == body


def test_no_100_continue_for_http_10(client: Client) -> None:
    body = b"an HTTP/1.0 client cannot expect\n"
    client.send(
        request("POST", "/input?mode=read-all", headers=[("Expect", "100-continue")], body=body, version="HTTP/1.0")
    )
    response = client.read_response()
    assert response.status == 200
    assert response.body == body


def test_pipelined_requests_are_answered_in_order(client: Client, served: bytes) -> None:
    client.send(
        request("GET", "/first")
        + request("POST", "/second", body=b"payload of the second")
        + request("HEAD", "/hello")
        + request("GET", "/stream?n=3")
        + request(
            "POST",
            "/input?mode=readlines",
            headers=[("Transfer-Encoding", "chunked")],
            body=chunked(b"chunked\nfifth\n"),
        )
        + request("GET", "/file?offset=10&length=20")
        + request("GET", "/seventh", headers=[("Connection", "close")])
    )
    first = environ_of(client.read_response())
    second = client.read_response()
    head = client.read_response("HEAD")
    streamed = client.read_response()
    fifth = client.read_response()
    sixth = client.read_response()
    seventh = environ_of(client.read_response())
    assert first["PATH_INFO"] == "/first"
    assert environ_of(second)["PATH_INFO"] == "/second"
    assert json.loads(second.body)["body"] == "payload of the second"
    assert (head.status, head.body) == (200, b"")
    assert streamed.body == b"chunk 0\nchunk 1\nchunk 2\n"
    assert fifth.body == b"chunked\nfifth\n"
    assert sixth.body == served[10:30]
    assert seventh["PATH_INFO"] == "/seventh"
    assert client.at_eof()


def test_http_10_without_keep_alive_closes(client: Client) -> None:
    response = client.exchange("GET", "/hello", version="HTTP/1.0")
    assert (response.status, response.body) == (200, b"hello, world\n")
    assert client.at_eof()


def test_http_10_keep_alive(client: Client) -> None:
    keep_alive = [("Connection", "keep-alive")]
    first = client.exchange("GET", "/hello", version="HTTP/1.0", headers=keep_alive)
    assert first.framing == "length"
    assert (first.header("connection") or "").lower() == "keep-alive"
    second = client.exchange("GET", "/several", version="HTTP/1.0", headers=keep_alive)
    assert second.body == b"one two three\n"
    third = client.exchange("GET", "/hello", version="HTTP/1.0")
    assert third.body == b"hello, world\n"
    assert client.at_eof()


def test_http_10_keep_alive_ends_after_a_body_of_unknown_length(client: Client) -> None:
    response = client.exchange("GET", "/stream?n=2", version="HTTP/1.0", headers=[("Connection", "keep-alive")])
    assert response.framing == "close"
    assert response.body == b"chunk 0\nchunk 1\n"


def test_connection_close_is_honoured(client: Client) -> None:
    response = client.exchange("GET", "/hello", headers=[("Connection", "close")])
    assert response.body == b"hello, world\n"
    assert (response.header("connection") or "").lower() == "close"
    assert client.at_eof()


def test_hop_by_hop_headers_from_the_application_are_dropped_as_gunicorn_does(server: Server, log: Log) -> None:
    with Client(server.port) as client:
        for _ in range(2):
            response = client.exchange("GET", "/hop-by-hop")
            assert (response.status, response.body, response.framing) == (200, b"hop by hop\n", "chunked")
            assert [name for name, _ in response.headers].count("transfer-encoding") == 1
            assert response.header("connection") is None and response.header("keep-alive") is None
        # The application's Connection: close still closes, after the answer.
        response = client.exchange("GET", "/hop-by-hop?close=1")
        assert (response.status, response.body) == (200, b"hop by hop\n")
        assert response.header("connection") == "close"
        assert client.at_eof()
    # Said once per worker, at the first.
    lines = [line for line in server.stderr().splitlines() if "hop-by-hop" in line]
    assert len(lines) == 1 and '"connection"' in lines[0], lines


# linux/tcp_states.h: the state of a socket that has received its peer's FIN.
TCP_CLOSE_WAIT = 8


@pytest.mark.parametrize(
    "version, headers",
    [
        ("HTTP/1.1", [("Connection", "close")]),
        ("HTTP/1.0", []),
    ],
    ids=["connection close", "HTTP/1.0"],
)
def test_a_closing_answer_carries_the_fin(server: Server, version: str, headers: list) -> None:
    """The last bytes before a close and the FIN travel in one segment: one packet and one
    wake-up fewer per connection. So once the client can read the answer, its socket has
    seen the FIN too; sent apart, the FIN would often come a moment later."""
    for _ in range(20):
        with socket.create_connection((HOST, server.port), timeout=TIMEOUT) as sock:
            sock.sendall(request("GET", "/hello", headers=headers, version=version))
            answer = sock.recv(65536)
            state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
            assert answer.endswith(b"\r\n\r\nhello, world\n")
            assert state == TCP_CLOSE_WAIT


def test_keep_alive_by_default(client: Client) -> None:
    for _ in range(3):
        assert client.exchange("GET", "/hello").body == b"hello, world\n"


# ---------------------------------------------------------------------------------------------
# Responses.


def test_content_length_added_for_a_one_item_list(client: Client) -> None:
    response = client.exchange("GET", "/hello")
    assert response.framing == "length"
    assert response.header("content-length") == "13"
    assert response.header("transfer-encoding") is None


def test_content_length_added_for_a_list_of_several(client: Client) -> None:
    response = client.exchange("GET", "/several")
    assert (response.framing, response.body) == ("length", b"one two three\n")


def test_generator_is_chunked_under_http_11(client: Client) -> None:
    response = client.exchange("GET", "/stream?n=50")
    assert response.framing == "chunked"
    assert response.body == b"".join(b"chunk %d\n" % n for n in range(50))
    assert client.exchange("GET", "/hello").body == b"hello, world\n"


def test_generator_is_close_delimited_under_http_10(client: Client) -> None:
    response = client.exchange("GET", "/stream?n=50", version="HTTP/1.0")
    assert response.framing == "close"
    assert response.header("content-length") is None and response.header("transfer-encoding") is None
    assert response.body == b"".join(b"chunk %d\n" % n for n in range(50))


NO_BODY = {
    "HEAD of a list": ("HEAD", "/hello", 200),
    "HEAD of a generator": ("HEAD", "/stream", 200),
    "HEAD of a file": ("HEAD", "/file", 200),
    "HEAD of write()": ("HEAD", "/write", 200),
    "204 with a body from the application": ("GET", "/status?status=204+No+Content&body=dropped", 204),
    "304 with a body from the application": ("GET", "/status?status=304+Not+Modified&body=dropped", 304),
}


@pytest.mark.parametrize("method, target, status", NO_BODY.values(), ids=NO_BODY.keys())
def test_no_body(client: Client, method: str, target: str, status: int) -> None:
    client.send(request(method, target) + request("GET", "/hello"))
    response = client.read_response(method)
    assert response.status == status
    if status in (204, 304):
        assert response.header("transfer-encoding") is None
    if status == 204:
        assert response.header("content-length") is None
    # Had any body byte followed the head, this would read it as the next status line.
    after = client.read_response()
    assert (after.status, after.body) == (200, b"hello, world\n")


def test_head_has_the_length_get_would_have(client: Client) -> None:
    assert client.exchange("HEAD", "/hello").header("content-length") == "13"
    assert client.exchange("HEAD", "/file").header("content-length") == str(SERVED_SIZE)


FILES = {
    "whole file": ("/file", 0, SERVED_SIZE),
    "with the application's Content-Length": (f"/file?length={SERVED_SIZE}", 0, SERVED_SIZE),
    "from an offset": ("/file?offset=1000", 1000, SERVED_SIZE),
    "from an offset with a Content-Length": ("/file?offset=1000&length=5000", 1000, 6000),
    "empty remainder": (f"/file?offset={SERVED_SIZE}", SERVED_SIZE, SERVED_SIZE),
    "without a descriptor": ("/memory-file", 0, SERVED_SIZE),
}


@pytest.mark.parametrize("target, start, end", FILES.values(), ids=FILES.keys())
def test_file_wrapper(client: Client, served: bytes, log: Log, target: str, start: int, end: int) -> None:
    for _ in range(2):  # and the connection goes on after it
        response = client.exchange("GET", target)
        assert response.status == 200, log.text()
        assert_same_bytes(response.body, served[start:end])
        if response.framing == "length":
            assert response.header("content-length") == str(end - start)
    log.assert_clean()


def test_file_wrapper_under_http_10(client: Client, served: bytes) -> None:
    response = client.exchange("GET", "/file?offset=7", version="HTTP/1.0")
    assert_same_bytes(response.body, served[7:])
    assert client.at_eof()


def test_streamed_response_arrives_incrementally(client: Client, shared_dir: Path) -> None:
    """The application yields a chunk, then waits for the test to have it: a server that
    held the chunk back would leave both waiting until the application gave up."""
    gate = "gate-incremental"
    client.send(request("GET", f"/gated?gate={gate}"))
    client.sock.settimeout(5.0)  # less than the application's wait
    head = client.read_head()
    assert head.header("transfer-encoding") == "chunked"
    assert client.read_chunk() == b"first chunk\n"
    (shared_dir / gate).touch()
    assert client.read_chunk() == b"last chunk\n"
    assert client.read_chunk() == b""


def test_write_callable(client: Client) -> None:
    response = client.exchange("GET", "/write")
    assert response.framing == "chunked"
    assert response.body == b"written 1\nwritten 2\nreturned 1\nreturned 2\n"


def test_write_callable_with_content_length(client: Client) -> None:
    response = client.exchange("GET", "/write-only")
    assert (response.framing, response.body) == ("length", b"hello world\n")


CLOSE_CASES = {
    "after the whole body": ("GET", "chunks=3", 200, "called\nexhausted\nclosed\n"),
    "after a HEAD": ("HEAD", "chunks=3", 200, None),
    "when iteration fails at once": ("GET", "chunks=3&fail=0", 500, "called\nclosed\n"),
}


@pytest.mark.parametrize("method, params, status, events", CLOSE_CASES.values(), ids=CLOSE_CASES.keys())
def test_close_is_called(
    client: Client, shared_dir: Path, method: str, params: str, status: int, events: str | None
) -> None:
    name = f"close-{method}-{params.replace('&', '-').replace('=', '')}"
    response = client.exchange(method, f"/closing?record={name}&{params}")
    assert response.status == status
    text = wait_for_text(shared_dir / name, "closed")
    assert text.endswith("closed\n")
    if events is not None:
        assert text == events


def test_close_is_called_when_iteration_fails_midway(client: Client, shared_dir: Path, log: Log) -> None:
    name = "close-midway"
    client.send(request("GET", f"/closing?record={name}&chunks=3&fail=2"))
    head = client.read_head()
    assert head.status == 200
    assert client.read_chunk() == b"chunk 0\n"
    assert client.read_chunk() == b"chunk 1\n"
    # The response is cut off: no last chunk, the connection closes.
    assert client.reader.read() == b""
    assert wait_for_text(shared_dir / name, "closed") == "called\nclosed\n"
    assert "failing at chunk 2, as asked" in log.text()


def test_close_is_called_when_the_client_goes_away(server: Server, shared_dir: Path) -> None:
    name = "close-disconnect"
    with Client(server.port) as client:
        client.send(request("GET", f"/closing?record={name}&chunks=40&pause=0.05"))
        client.read_head()
        assert client.read_chunk() == b"chunk 0\n"
    assert wait_for_text(shared_dir / name, "closed").endswith("closed\n")
    with Client(server.port) as client:
        assert client.exchange("GET", "/hello").body == b"hello, world\n"


def test_iteration_stops_when_the_client_goes_away(maitred_server: Callable[..., Server], shared_dir: Path) -> None:
    """A client that leaves a long stream (a download, server-sent events) must not hold the
    worker until the stream ends or --timeout kills it (which would skip close()): the
    iteration stops soon after, and close() is called. This test has a server of its own, so
    that a worker kept busy cannot hold up the module's other tests."""
    own_server = maitred_server(
        "wsgi_live_app:application",
        "--workers",
        "1",
        cwd=APPS,
        env={"WSGI_LIVE_DIR": str(shared_dir)},
    )
    name = "close-long-disconnect"
    with Client(own_server.port) as client:
        # 600 chunks 0.05 s apart: half a minute if nothing stops it.
        client.send(request("GET", f"/closing?record={name}&chunks=600&pause=0.05"))
        client.read_head()
        assert client.read_chunk() == b"chunk 0\n"
    assert wait_for_text(shared_dir / name, "closed", timeout=5.0) == "called\nclosed\n"
    with Client(own_server.port, timeout=2.0) as client:
        assert client.exchange("GET", "/hello").body == b"hello, world\n"


def test_exc_info_replaces_the_head_when_nothing_was_sent(client: Client, log: Log) -> None:
    response = client.exchange("GET", "/exc-info-before-head")
    assert (response.status, response.reason) == (503, "Service Unavailable")
    assert response.header("x-replaced") == "yes"
    assert response.header("x-first") is None
    assert (response.framing, response.body) == ("length", b"replaced\n")
    assert client.exchange("GET", "/hello").body == b"hello, world\n"
    log.assert_clean()


def test_exc_info_after_the_head_cuts_the_response_off(client: Client, server: Server, log: Log) -> None:
    client.send(request("GET", "/exc-info-after-head"))
    head = client.read_head()
    assert head.status == 200
    assert client.read_chunk() == b"partial\n"
    rest = client.reader.read()
    assert b"never sent" not in rest
    assert not rest.endswith(b"0\r\n\r\n"), "a cut-off response must not look complete"
    with Client(server.port) as other:
        assert other.exchange("GET", "/hello").body == b"hello, world\n"
    assert "too late to change the status" in log.text()
