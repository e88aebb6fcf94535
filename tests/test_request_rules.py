"""One set of request rules for HTTP/1.1 and HTTP/2 (docs/HTTP2.md, "The same rules"): each
case goes to one server over HTTP/1.1 (bytes on a socket) and over HTTP/2 (hyper-h2 with its own
checks off, prior knowledge on the plain port), and gets the same verdict from both, or the
difference this table gives a reason for. The rules are crates/protocol's `rules.rs`, which
HTTP/1.1's decoder and HTTP/2's reading of a head (client/h2/head.rs) both apply.

A refusal is a 4xx or 5xx of the lobby's own (with its reason in the body), or, over HTTP/2, a
stream the h2 crate resets as malformed before the lobby sees it; after each, a good request on
the same HTTP/2 connection is served. Before, six of these reached the application over HTTP/2.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

import h2.errors
import pytest
from client import read_reply
from conftest import HOST
from test_http2 import RawH2

APP = """
def app(environ, start_response):
    seen = f"{environ['REQUEST_METHOD']} {environ['PATH_INFO']} host={environ.get('HTTP_HOST')}"
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [seen.encode()]
"""

SERVED = "served"
REFUSED = "refused"


@dataclass
class Case:
    name: str
    http1: bytes
    http2: list[tuple[str, str]]
    http1_verdict: str
    # HTTP/2's verdict where it differs from HTTP/1.1's, with the reason it may.
    http2_verdict: str | None = None
    why_they_differ: str = ""
    trailers: list[tuple[str, str]] = field(default_factory=list)

    @property
    def expected_over_http2(self) -> str:
        return self.http2_verdict or self.http1_verdict


def h2_fields(path: str = "/", authority: str | None = "example.test", method: str = "GET", *extra):
    fields = [(":method", method), (":scheme", "http")]
    if authority is not None:
        fields.append((":authority", authority))
    if path is not None:
        fields.append((":path", path))
    return [*fields, *extra]


def h1(line: str, *fields: str) -> bytes:
    return (line + "\r\n" + "".join(f"{f}\r\n" for f in fields) + "\r\n").encode("latin-1")


CASES = [
    Case("a path", h1("GET /a?b=1 HTTP/1.1", "Host: example.test"), h2_fields("/a?b=1"), SERVED),
    Case("* with OPTIONS", h1("OPTIONS * HTTP/1.1", "Host: example.test"), h2_fields("*", method="OPTIONS"), SERVED),
    Case("* with GET", h1("GET * HTTP/1.1", "Host: example.test"), h2_fields("*"), REFUSED),
    Case("a target that is no path", h1("GET a/b HTTP/1.1", "Host: example.test"), h2_fields("a/b"), REFUSED),
    Case(
        "a whole URI as the target",
        h1("GET http://example.test/a HTTP/1.1", "Host: example.test"),
        h2_fields("http://example.test/a"),
        SERVED,
        REFUSED,
        "HTTP/1.1's absolute form is for proxies (RFC 9112 3.2.2), which servers must accept; an HTTP/2 :path is "
        "a path or *, never a URI (RFC 9113 8.3.1), :scheme and :authority carrying the rest",
    ),
    Case(
        "CONNECT",
        h1("CONNECT example.test:443 HTTP/1.1", "Host: example.test:443"),
        h2_fields(None, "example.test:443", "CONNECT"),
        REFUSED,
    ),
    Case(
        "a userinfo in the authority",
        h1("GET / HTTP/1.1", "Host: evil.example@127.0.0.1"),
        h2_fields("/", "evil.example@127.0.0.1"),
        REFUSED,
    ),
    Case(
        "a port that is no number",
        h1("GET / HTTP/1.1", "Host: example.test:http"),
        h2_fields("/", "example.test:http"),
        REFUSED,
    ),
    Case("an empty host", h1("GET / HTTP/1.1", "Host: :80"), h2_fields("/", None, "GET", ("host", ":80")), REFUSED),
    Case(
        "a host field without :authority",
        h1("GET / HTTP/1.1", "Host: other.test"),
        h2_fields("/", None, "GET", ("host", "other.test")),
        SERVED,
    ),
    Case(
        "no authority at all",
        h1("GET / HTTP/1.1"),
        h2_fields("/", None),
        REFUSED,
        SERVED,
        "an HTTP/1.1 request must carry Host, and one without it is refused (RFC 9112 3.2); an HTTP/2 request "
        "with no authority to convey leaves out :authority (RFC 9113 8.3.1), and the application is given the "
        "listener's name, as for an HTTP/1.0 request",
    ),
    Case(
        "a host field with a userinfo, without :authority",
        h1("GET / HTTP/1.1", "Host: a@other.test"),
        h2_fields("/", None, "GET", ("host", "a@other.test")),
        REFUSED,
    ),
    Case(
        "two hosts that disagree",
        h1("GET / HTTP/1.1", "Host: example.test", "Host: other.test"),
        h2_fields("/", "example.test", "GET", ("host", "other.test")),
        REFUSED,
    ),
    Case(
        "two hosts that agree",
        h1("GET / HTTP/1.1", "Host: example.test", "Host: example.test"),
        h2_fields("/", "example.test", "GET", ("host", "example.test")),
        REFUSED,
        SERVED,
        "HTTP/1.1 allows one Host line (RFC 9112 3.2); HTTP/2 allows a host field beside :authority that names "
        "the same (RFC 9113 8.3.1), which is not a second authority",
    ),
    Case(
        "whitespace around a field value",
        h1("GET / HTTP/1.1", "Host: example.test", "X-Padded: \t value \t"),
        h2_fields("/", "example.test", "GET", ("x-padded", " value ")),
        SERVED,
        REFUSED,
        "around an HTTP/1.1 value it is the syntax's optional whitespace, which is trimmed (RFC 9112 5.1); an "
        "HTTP/2 value has none, so one that starts or ends with whitespace is malformed (RFC 9113 8.2.1)",
    ),
    Case(
        "a control character in a value",
        h1("GET / HTTP/1.1", "Host: example.test", "X-Bad: a\x01b"),
        h2_fields("/", "example.test", "GET", ("x-bad", "a\x01b")),
        REFUSED,
    ),
    Case(
        "a NUL in a value",
        h1("GET / HTTP/1.1", "Host: example.test", "X-Bad: a\x00b"),
        h2_fields("/", "example.test", "GET", ("x-bad", "a\x00b")),
        REFUSED,
    ),
    Case(
        "a field name with a space",
        h1("GET / HTTP/1.1", "Host: example.test", "X Bad: a"),
        h2_fields("/", "example.test", "GET", ("x bad", "a")),
        REFUSED,
    ),
    Case(
        "an upper-case field name",
        h1("GET / HTTP/1.1", "Host: example.test", "X-Name: a"),
        h2_fields("/", "example.test", "GET", ("X-Name", "a")),
        SERVED,
        REFUSED,
        "HTTP/1.1's field names are case-insensitive; HTTP/2 sends them in lower case, and one in upper case is malformed (RFC 9113 8.2.1)",
    ),
    Case(
        "a pseudo-header in the trailers",
        h1("POST / HTTP/1.1", "Host: example.test", "Transfer-Encoding: chunked")
        + b"1\r\na\r\n0\r\n:path: /other\r\n\r\n",
        h2_fields("/", "example.test", "POST"),
        REFUSED,
        SERVED,
        "the h2 crate drops a trailer section's pseudo-headers unseen (h2 0.4.20, recv_trailers), so the lobby "
        "cannot refuse it (RFC 9113 8.1 makes the request malformed); no application sees trailers, over either "
        "protocol, so the dropped field reaches nothing",
        trailers=[(":path", "/other")],
    ),
]


@pytest.fixture(scope="module")
def server(maitred_module_server, tmp_path_factory):
    directory = tmp_path_factory.mktemp("rules")
    (directory / "rules_app.py").write_text(APP)
    return maitred_module_server("-w", "1", "rules_app:app", cwd=directory)


def over_http1(port: int, request: bytes) -> tuple[str, int, bytes]:
    with socket.create_connection((HOST, port), timeout=10) as sock:
        sock.sendall(request)
        reply = read_reply(sock)
    return verdict(reply.status, reply.body), reply.status, reply.body


def over_http2(port: int, case: Case) -> tuple[str, int, bytes]:
    raw = RawH2(port)
    try:
        stream = raw.conn.get_next_available_stream_id()
        raw.conn.send_headers(stream, case.http2, end_stream=not case.trailers)
        if case.trailers:
            raw.conn.send_data(stream, b"a")
            raw.conn.send_headers(stream, case.trailers, end_stream=True)
        raw.flush()
        raw.until(lambda: stream in raw.ended or stream in raw.resets or raw.goaway is not None)
        if raw.goaway is not None:
            # The h2 crate reads a field it cannot decode (a control byte in a value) as a
            # connection error: refused, with the connection.
            assert raw.goaway.error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR, raw.goaway
            return REFUSED, 0, b"GOAWAY PROTOCOL_ERROR"
        if stream in raw.resets:
            outcome = (REFUSED, 0, f"stream reset, error code {raw.resets[stream]}".encode())
        else:
            status, _headers, body = raw.ended[stream]
            outcome = (verdict(status, body), status, body)
        # The connection goes on: a good request after the refused one is served.
        assert raw.response(raw.request("/after"))[0] == 200
        return outcome
    finally:
        raw.sock.close()


def verdict(status: int, body: bytes) -> str:
    if status == 200 and body.startswith((b"GET ", b"POST ", b"OPTIONS ")):
        return SERVED
    assert status >= 400, (status, body)
    return REFUSED


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_each_rule_gives_the_same_verdict_over_http1_and_http2(server, case):
    assert (case.http2_verdict is None) == (not case.why_they_differ), "a difference needs its reason, and only one"
    assert case.http2_verdict != case.http1_verdict
    got1 = over_http1(server.port, case.http1)
    got2 = over_http2(server.port, case)
    assert got1[0] == case.http1_verdict, f"HTTP/1.1: {got1}"
    assert got2[0] == case.expected_over_http2, f"HTTP/2: {got2}"
