"""maitred behind proxies (docs/PROXIES.md): forwarded headers from trusted peers
(--forwarded-allow-ips, secure_scheme_headers), the PROXY protocol from a real HAProxy
(--proxy-protocol, --proxy-allow-from), and a chunked body as a framework sees it.

A "different peer" is a client socket bound to another loopback address (127.0.0.2, 127.0.0.3):
Linux routes all of 127.0.0.0/8 to the loopback interface."""

from __future__ import annotations

import hashlib
import json
import random
import socket
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from client import Reply, read_reply
from conftest import HOST, Server, eventually, free_port

APPS = Path(__file__).resolve().parent / "apps"
TIMEOUT = 10.0

ORIGIN_APP = """
import json

def app(environ, start_response):
    seen = {key: environ.get(key) for key in ("REMOTE_ADDR", "REMOTE_PORT", "wsgi.url_scheme")}
    body = json.dumps(seen).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]
"""


@pytest.fixture
def origin_app(app_dir: Path) -> Path:
    (app_dir / "origin.py").write_text(ORIGIN_APP)
    return app_dir


def connect(port: int, source: str = HOST) -> socket.socket:
    """A connection to 127.0.0.1:`port` from the loopback address `source`."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(TIMEOUT)
    sock.bind((source, 0))
    sock.connect((HOST, port))
    return sock


def request(port: int, headers: tuple[tuple[str, str], ...] = (), source: str = HOST, prefix: bytes = b"") -> Reply:
    """One GET on a connection of its own from `source`, after `prefix` (a PROXY header)."""
    with connect(port, source) as sock:
        lines = "".join(f"{name}: {value}\r\n" for name, value in headers)
        sock.sendall(prefix + f"GET / HTTP/1.1\r\nHost: test\r\n{lines}\r\n".encode())
        return read_reply(sock)


def seen(reply: Reply) -> dict[str, str | None]:
    assert reply.status == 200, reply
    return json.loads(reply.body)


def log_lines(server: Server, text: str) -> list[str]:
    return [line for line in server.stderr().splitlines() if text in line]


# ---------------------------------------------------------------------------------------------
# Forwarded headers.


def test_a_trusted_peer_sets_the_client_address_and_scheme(
    maitred_server: Callable[..., Server], origin_app: Path, tmp_path: Path
) -> None:
    access_log = tmp_path / "access.log"
    server = maitred_server("origin:app", "--access-logfile", str(access_log), cwd=origin_app)
    # The right-most address that is not itself trusted: the client's proxy appended it.
    forwarded = seen(
        request(
            server.port, (("X-Forwarded-For", "198.51.100.1, 203.0.113.7, 127.0.0.1"), ("X-Forwarded-Proto", "https"))
        )
    )
    assert forwarded == {"REMOTE_ADDR": "203.0.113.7", "REMOTE_PORT": None, "wsgi.url_scheme": "https"}
    rfc7239 = seen(request(server.port, (("Forwarded", 'for="[2001:db8::7]:4711";proto=https'),)))
    assert rfc7239 == {"REMOTE_ADDR": "2001:db8::7", "REMOTE_PORT": "4711", "wsgi.url_scheme": "https"}
    plain = seen(request(server.port))
    assert plain["REMOTE_ADDR"] == HOST and plain["wsgi.url_scheme"] == "http"
    assert plain["REMOTE_PORT"] is not None and int(plain["REMOTE_PORT"]) > 0
    # The access log's h is the address the application saw.
    assert eventually(lambda: access_log.exists() and len(access_log.read_text().splitlines()) == 3, TIMEOUT)
    assert [line.split()[0] for line in access_log.read_text().splitlines()] == ["203.0.113.7", "2001:db8::7", HOST]


def test_an_untrusted_peer_is_the_client_whatever_its_headers_say(
    maitred_server: Callable[..., Server], origin_app: Path
) -> None:
    server = maitred_server("origin:app", cwd=origin_app)
    said = (("X-Forwarded-For", "203.0.113.7"), ("X-Forwarded-Proto", "https"), ("Forwarded", "for=198.51.100.1"))
    with connect(server.port, "127.0.0.2") as sock:
        port = sock.getsockname()[1]
        sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n" + b"".join(f"{n}: {v}\r\n".encode() for n, v in said) + b"\r\n")
        untrusted = seen(read_reply(sock))
    assert untrusted == {"REMOTE_ADDR": "127.0.0.2", "REMOTE_PORT": str(port), "wsgi.url_scheme": "http"}


def test_contradictory_scheme_headers_get_400(maitred_server: Callable[..., Server], origin_app: Path) -> None:
    server = maitred_server("origin:app", cwd=origin_app)
    refused = request(server.port, (("X-Forwarded-Proto", "http"), ("X-Forwarded-Ssl", "on")))
    assert refused.status == 400
    reason = "contradictory scheme headers: X-Forwarded-Ssl says https, X-Forwarded-Proto says http"
    assert reason in refused.body.decode()
    assert eventually(lambda: len(log_lines(server, reason)) == 1, TIMEOUT), server.stderr()
    # From an untrusted peer the same headers are not read, and so do not contradict.
    assert request(server.port, (("X-Forwarded-Proto", "http"), ("X-Forwarded-Ssl", "on")), "127.0.0.2").status == 200
    assert request(server.port).status == 200


def test_gunicorn_settings_from_a_config_file_and_the_environment(
    maitred_server: Callable[..., Server], origin_app: Path
) -> None:
    (origin_app / "gunicorn.conf.py").write_text(
        "forwarded_allow_ips = '127.0.0.2, 10.0.0.0/8'\nsecure_scheme_headers = {'X-Scheme': 'secure'}\n"
    )
    server = maitred_server("origin:app", "-c", "gunicorn.conf.py", cwd=origin_app)
    headers = (
        ("X-Forwarded-For", "10.1.1.1, 203.0.113.9, 10.2.2.2"),
        ("X-Scheme", "secure"),
        ("X-Forwarded-Proto", "http"),
    )
    # 127.0.0.1 is no longer trusted; 127.0.0.2 is, and so is 10.0.0.0/8 in the chain. The
    # default X-Forwarded-Proto no longer counts, so it does not contradict X-Scheme.
    assert seen(request(server.port, headers))["REMOTE_ADDR"] == HOST
    assert seen(request(server.port, headers, "127.0.0.2")) == {
        "REMOTE_ADDR": "203.0.113.9",
        "REMOTE_PORT": None,
        "wsgi.url_scheme": "https",
    }
    from_environment = maitred_server("origin:app", cwd=origin_app, env={"FORWARDED_ALLOW_IPS": "127.0.0.3"})
    client = (("X-Forwarded-For", "203.0.113.9"),)
    assert seen(request(from_environment.port, client, "127.0.0.3"))["REMOTE_ADDR"] == "203.0.113.9"
    assert seen(request(from_environment.port, client))["REMOTE_ADDR"] == HOST


def test_bad_proxy_settings_are_one_line_with_exit_code_2(run_maitred: Callable[..., object], origin_app: Path) -> None:
    for args, env, message in [
        (
            ["--forwarded-allow-ips", "127.0.0.1,10.0.0.1/8"],
            None,
            (
                "argument --forwarded-allow-ips: '10.0.0.1/8' is neither an IP address, a network such as "
                "10.0.0.0/8, nor * (10.0.0.1/8 has host bits set)"
            ),
        ),
        (["--proxy-allow-from", "localhost"], None, "'localhost' is neither an IP address"),
        (["--proxy-protocol", "v3"], None, "argument --proxy-protocol: expected one of off, v1, v2, auto, got 'v3'"),
        (["--secure-scheme-headers", "X-Proto"], None, "expected NAME=VALUE, got 'X-Proto'"),
        (
            [],
            {"FORWARDED_ALLOW_IPS": "nowhere"},
            "FORWARDED_ALLOW_IPS (the default of --forwarded-allow-ips): 'nowhere'",
        ),
    ]:
        finished = run_maitred("origin:app", *args, cwd=origin_app, env=env)
        assert finished.returncode == 2, finished
        lines = finished.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("maitred: error: ") and message in lines[0], lines


# ---------------------------------------------------------------------------------------------
# The PROXY protocol, from a real HAProxy.


@pytest.fixture
def haproxy(haproxy_started: Callable[[str, list[int]], None]) -> Callable[[int], dict[str, int]]:
    """Starts HAProxy in TCP mode in front of maitred's port: one frontend port that sends
    maitred a PROXY v1 header (`send-proxy`), one that sends v2 (`send-proxy-v2`). Returns the
    frontends' ports by version; HAProxy is stopped at the end."""

    def start(backend: int) -> dict[str, int]:
        ports = {"v1": free_port(), "v2": free_port()}
        sections = ["defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n"]
        for version, port in ports.items():
            send = "send-proxy" if version == "v1" else "send-proxy-v2"
            sections.append(
                f"listen front_{version}\n    bind {HOST}:{port}\n    server maitred {HOST}:{backend} {send}\n"
            )
        haproxy_started("\n".join(sections), list(ports.values()))
        return ports

    return start


def test_haproxy_send_proxy_v1_and_v2_give_the_client_address_and_port(
    maitred_server: Callable[..., Server],
    origin_app: Path,
    haproxy: Callable[[int], dict[str, int]],
    tmp_path: Path,
) -> None:
    access_log = tmp_path / "proxied.log"
    server = maitred_server("origin:app", "--access-logfile", str(access_log), "--proxy-protocol", cwd=origin_app)
    fronts = haproxy(server.port)
    clients = []
    for version, source in (("v1", "127.0.0.3"), ("v2", "127.0.0.4")):
        with connect(fronts[version], source) as sock:
            client_port = sock.getsockname()[1]
            # Two requests on the connection: the header came once, and holds for both.
            for _ in range(2):
                sock.sendall(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
                assert seen(read_reply(sock)) == {
                    "REMOTE_ADDR": source,
                    "REMOTE_PORT": str(client_port),
                    "wsgi.url_scheme": "http",
                }, version
        clients.append(source)
    assert eventually(lambda: access_log.exists() and len(access_log.read_text().splitlines()) == 4, TIMEOUT)
    assert [line.split()[0] for line in access_log.read_text().splitlines()] == [c for c in clients for _ in (1, 2)]


def test_a_peer_outside_proxy_allow_from_is_refused(maitred_server: Callable[..., Server], origin_app: Path) -> None:
    server = maitred_server("origin:app", "--proxy-protocol", "auto", cwd=origin_app)
    # A header claiming another client, straight from a peer the list does not name.
    forged = request(server.port, source="127.0.0.2", prefix=b"PROXY TCP4 203.0.113.7 127.0.0.1 5555 80\r\n")
    assert forged.status == 400
    assert b"127.0.0.2 is not in --proxy-allow-from" in forged.body
    assert eventually(lambda: len(log_lines(server, "400 to 127.0.0.2:")) == 1, TIMEOUT), server.stderr()
    # A peer it names is served: v2's LOCAL command keeps the connection's own address.
    local = struct.pack("!12sBBH", b"\r\n\r\n\x00\r\nQUIT\n", 0x20, 0x00, 0)
    assert seen(request(server.port, prefix=local))["REMOTE_ADDR"] == HOST
    v1 = seen(request(server.port, prefix=b"PROXY TCP6 2001:db8::9 ::1 6000 80\r\n"))
    assert v1 == {"REMOTE_ADDR": "2001:db8::9", "REMOTE_PORT": "6000", "wsgi.url_scheme": "http"}


def test_a_missing_or_malformed_proxy_header_gets_400(maitred_server: Callable[..., Server], origin_app: Path) -> None:
    server = maitred_server("origin:app", "--proxy-protocol", "v1", cwd=origin_app)
    for prefix, reason in [
        (b"", "the connection does not begin with a PROXY protocol version 1 header"),
        (b"PROXY TCP4 1.2.3.4 ::1 1 2\r\n", "PROXY protocol line with an address not of its protocol's family"),
        (
            struct.pack("!12sBBH", b"\r\n\r\n\x00\r\nQUIT\n", 0x20, 0x00, 0),
            "does not begin with a PROXY protocol version 1",
        ),
    ]:
        with connect(server.port) as sock:
            sock.sendall(prefix + b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
            reply = read_reply(sock)
            assert reply.status == 400 and reason in reply.body.decode(), reply
            assert sock.recv(1) == b"", "the connection must close after the refusal"
    assert eventually(lambda: len(log_lines(server, "400 to 127.0.0.1:")) == 3, TIMEOUT), server.stderr()


# ---------------------------------------------------------------------------------------------
# A chunked body, as a framework sees it.


def send_chunked(port: int, target: bytes, data: bytes, content_type: bytes) -> Reply:
    """POSTs `data` in 7,000-byte chunks, all at once: a body past 256 KiB comes fast enough
    to stream (docs/LIMITS.md, "A fast upload streams")."""
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(part), part) for part in (data[i : i + 7000] for i in range(0, len(data), 7000))
    )
    with connect(port) as sock:
        sock.sendall(
            b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Type: %s\r\n\r\n" % (target, content_type) + chunks + b"0\r\n\r\n"
        )
        return read_reply(sock)


def framework_server(maitred_server: Callable[..., Server], app: str, how: str, data_dir: Path) -> Server:
    """tests/apps' framework `app` under `--wsgi-chunked-body how`, at debug level, for the
    lobby's line when a body streams."""
    return maitred_server(
        "--wsgi-chunked-body", how, "--log-level", "debug", app, cwd=APPS, env={"FRAMEWORK_DATA_DIR": str(data_dir)}
    )


@pytest.mark.parametrize("how", ["stream", "whole"])
def test_flask_sees_a_chunked_body_without_its_coding_and_with_its_length_once_whole(
    maitred_server: Callable[..., Server], tmp_path: Path, how: str
) -> None:
    """A chunked body reaches Flask de-chunked, with no Transfer-Encoding. Its CONTENT_LENGTH is
    there when the body is whole as its worker takes it: a small one (1,000 bytes, and an empty
    one), and, under `--wsgi-chunked-body whole`, a large one too, through a temporary file. Under
    `stream` (the default) a large one that comes fast streams without it, and Flask, told by
    `wsgi.input_terminated`, reads it to its end, as under gunicorn."""
    server = framework_server(maitred_server, "flask_app:app", how, tmp_path)
    body = random.Random(3).randbytes(1 << 20)
    for data in (body, body[:1000], b""):
        reply = send_chunked(server.port, b"/upload-length", data, b"application/octet-stream")
        assert reply.status == 200, reply
        streamed = how == "stream" and len(data) == len(body)
        assert json.loads(reply.body) == {
            "content_length": None if streamed else len(data),
            "transfer_encoding": None,
            "received": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    assert server.stderr().count("its body streams to its worker") == (how == "stream")


def test_django_gets_a_fast_chunked_upload_whole_under_wsgi_chunked_body_whole(
    maitred_server: Callable[..., Server], tmp_path: Path
) -> None:
    """Django 5.2 takes a body without CONTENT_LENGTH as empty, so `--wsgi-chunked-body whole`
    reads a chunked body whole first, as nginx does, however fast it comes: a 1 MiB file in a
    chunked multipart form reaches `request.FILES` whole, with the form's field beside it."""
    server = framework_server(maitred_server, "django_app:application", "whole", tmp_path)
    data = random.Random(4).randbytes(1 << 20)
    boundary = b"maitred-boundary"
    form = (
        b'--%s\r\nContent-Disposition: form-data; name="title"\r\n\r\nreport\r\n'
        b'--%s\r\nContent-Disposition: form-data; name="upload"; filename="report.bin"\r\n'
        b"Content-Type: application/octet-stream\r\n\r\n" % (boundary, boundary) + data + b"\r\n--%s--\r\n" % boundary
    )
    reply = send_chunked(server.port, b"/form", form, b"multipart/form-data; boundary=" + boundary)
    assert reply.status == 200, reply
    assert json.loads(reply.body) == {
        "fields": {"title": ["report"]},
        "files": {
            "upload": {
                "filename": "report.bin",
                "content_type": "application/octet-stream",
                "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        },
    }
    assert "its body streams to its worker" not in server.stderr()


def test_proxy_protocol_modes_as_gunicorn_takes_them(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from maitred import config

    monkeypatch.chdir(tmp_path)
    assert config.resolve(["app:app", "--proxy-protocol"])["proxy_protocol"] == "auto"
    assert config.resolve(["--proxy-protocol", "v2", "app:app"])["proxy_protocol"] == "v2"
    assert config.resolve(["app:app"])["proxy_protocol"] == "off"
    (tmp_path / "conf.py").write_text("proxy_protocol = True\nproxy_allow_ips = ['10.0.0.0/8', '192.0.2.1']\n")
    from_file = config.resolve(["-c", "conf.py", "app:app"])
    assert (from_file["proxy_protocol"], from_file["proxy_allow_ips"]) == ("auto", ["10.0.0.0/8", "192.0.2.1"])
