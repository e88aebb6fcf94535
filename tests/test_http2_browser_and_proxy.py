"""HTTP/2 from the clients that speak it in production (docs/HTTP2.md, "Browsers" and "Behind
HAProxy"): headless chromium over TLS, h2 by ALPN, uploading and downloading megabytes from a
page; and HAProxy sending its HTTP/1.1 clients' requests to maitred over HTTP/2 (`proto h2` with
prior knowledge on a plain listener, `alpn h2` on a TLS one).

Both check that HTTP/2 was really spoken (the browser's nextHopProtocol, the application's
SERVER_PROTOCOL, the access log's protocol atom) and that every byte arrived exact. Each skips,
saying why, without chromium or haproxy (Debian's packages; .ci/run installs them)."""

from __future__ import annotations

import hashlib
import json
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from browser import CHROMIUM, Browser
from client import read_reply
from conftest import HOST, Server, eventually, free_port
from tls_certs import Authority, Pair, spki_sha256

APPS = Path(__file__).resolve().parent / "apps"
TIMEOUT = 10.0
ACCESS_FORMAT = '%(H)s "%(r)s" %(s)s'
# The streamed answer: 64 chunks of 64 KiB, chunk n of the value n % 251 (apps/h2_world.py).
CHUNKS, CHUNK_SIZE = 64, 65536


def streamed() -> bytes:
    return b"".join(bytes([number % 251]) * CHUNK_SIZE for number in range(CHUNKS))


def access_lines(path: Path, count: int) -> list[str]:
    """The access log's lines once it holds `count` of them."""
    assert eventually(lambda: path.exists() and len(path.read_text().splitlines()) >= count, TIMEOUT)
    return path.read_text().splitlines()


# The page's work, as one promise: a 3 MiB upload (byte i is i % 251) and the streamed download,
# each by fetch(), with what the browser says of the protocol each used.
BROWSER_SCRIPT = """
(async () => {
    const hex = async (bytes) => Array.from(
        new Uint8Array(await crypto.subtle.digest("SHA-256", bytes)),
        (byte) => byte.toString(16).padStart(2, "0"),
    ).join("");
    const upload = new Uint8Array(UPLOAD_SIZE);
    for (let i = 0; i < upload.length; i++) upload[i] = i % 251;
    const posted = await fetch("/upload", { method: "POST", body: upload });
    const stored = await posted.json();
    const download = await fetch("/stream?chunks=CHUNKS&size=CHUNK_SIZE");
    const body = await download.arrayBuffer();
    return {
        page: performance.getEntriesByType("navigation")[0].nextHopProtocol,
        fetches: performance.getEntriesByType("resource").map((entry) => entry.nextHopProtocol),
        upload: { sent: await hex(upload), stored, protocol: posted.headers.get("seen-protocol") },
        download: { length: body.byteLength, sha256: await hex(body), protocol: download.headers.get("seen-protocol") },
    };
})()
"""
UPLOAD_SIZE = 3 * 1024 * 1024


@pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (Debian's chromium package; .ci/run installs it)"
)
def test_chromium_speaks_h2_by_alpn_and_uploads_and_streams_megabytes(
    maitred_server: Callable[..., Server], server_pair: Pair, tmp_path: Path
) -> None:
    """docs/HTTP2.md, "Browsers": chromium takes h2 from the TLS listener's ALPN for the page and
    for its fetches; a 3 MiB upload reaches the application whole, and an answer streamed in 64
    chunks reaches the page exact. Chromium trusts the server's certificate by its public key
    (--ignore-certificate-errors-spki-list), nothing else."""
    access = tmp_path / "access.log"
    server = maitred_server(
        "-w", "2", "--certfile", str(server_pair.cert), "--keyfile", str(server_pair.key),
        "--access-logfile", str(access), "--access-logformat", ACCESS_FORMAT, "h2_world:app", cwd=APPS,
    )  # fmt: skip
    browser = Browser(
        tmp_path / "chromium", flags=(f"--ignore-certificate-errors-spki-list={spki_sha256(server_pair)}",)
    )
    try:
        browser.call("Page.enable")
        browser.call("Page.navigate", url=f"https://{HOST}:{server.port}/")
        browser.wait_for("document.readyState === 'complete' && document.title.includes('HTTP/2')", TIMEOUT)
        script = BROWSER_SCRIPT.replace("UPLOAD_SIZE", str(UPLOAD_SIZE))
        seen = browser.evaluate(script.replace("CHUNK_SIZE", str(CHUNK_SIZE)).replace("CHUNKS", str(CHUNKS)))
    finally:
        browser.close()
    assert seen["page"] == "h2"
    assert seen["fetches"] and set(seen["fetches"]) == {"h2"}, seen["fetches"]
    uploaded = bytes(number % 251 for number in range(251)) * (UPLOAD_SIZE // 251 + 1)
    expected_upload = hashlib.sha256(uploaded[:UPLOAD_SIZE]).hexdigest()
    assert seen["upload"] == {
        "sent": expected_upload,
        "stored": {"length": UPLOAD_SIZE, "sha256": expected_upload},
        "protocol": "HTTP/2",
    }
    assert seen["download"] == {
        "length": CHUNKS * CHUNK_SIZE,
        "sha256": hashlib.sha256(streamed()).hexdigest(),
        "protocol": "HTTP/2",
    }
    lines = access_lines(access, 3)
    assert all(line.startswith("HTTP/2.0 ") and line.endswith(" 200") for line in lines), lines
    assert {line.split()[2] for line in lines} >= {"/", "/upload", f"/stream?chunks={CHUNKS}&size={CHUNK_SIZE}"}


def haproxy_config(plain_front: int, tls_front: int, plain_backend: int, tls_backend: int, authority: Authority) -> str:
    """HTTP mode, HTTP/1.1 clients in front; behind, maitred over HTTP/2: with prior knowledge on
    its plain listener (`proto h2`), by ALPN on its TLS one (`alpn h2`, the certificate checked
    against the test authority)."""
    return f"""
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s

frontend plain_h2
    bind {HOST}:{plain_front}
    default_backend maitred_h2c

backend maitred_h2c
    server s1 {HOST}:{plain_backend} proto h2

frontend tls_h2
    bind {HOST}:{tls_front}
    default_backend maitred_h2_tls

backend maitred_h2_tls
    server s1 {HOST}:{tls_backend} ssl verify required ca-file {authority.pem} sni str(localhost) alpn h2
"""


def test_haproxy_proto_h2_carries_http11_clients_to_maitred(
    maitred_server: Callable[..., Server],
    haproxy_started: Callable[[str, list[int]], None],
    server_pair: Pair,
    authority: Authority,
    tmp_path: Path,
) -> None:
    """docs/HTTP2.md, "Behind HAProxy": HTTP/1.1 clients of HAProxy, on keep-alive connections,
    reach maitred over HTTP/2, plain (`proto h2`) and over TLS (`alpn h2`): several GETs, a
    POST with a Content-Length body and one with a chunked body, and a 4 MiB answer streamed in
    chunks, each exact; the application and the access log say HTTP/2 for every request."""
    access = tmp_path / "access.log"
    tls_backend, plain_backend = free_port(), free_port()
    maitred_server(
        "-w", "2", "-b", f"{HOST}:{tls_backend}", "-b", f"http://{HOST}:{plain_backend}",
        "--certfile", str(server_pair.cert), "--keyfile", str(server_pair.key),
        "--access-logfile", str(access), "--access-logformat", ACCESS_FORMAT, "h2_world:app",
        cwd=APPS, bind=False, port=tls_backend,
    )  # fmt: skip
    fronts = {"plain": free_port(), "tls": free_port()}
    haproxy_started(
        haproxy_config(fronts["plain"], fronts["tls"], plain_backend, tls_backend, authority), list(fronts.values())
    )
    body = bytes(range(256)) * 4096  # 1 MiB
    digest = hashlib.sha256(body).hexdigest()
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:300_000], body[300_000:])) + b"0\r\n\r\n"
    for name, port in fronts.items():
        with socket.create_connection((HOST, port), timeout=TIMEOUT) as sock:
            for _ in range(3):
                sock.sendall(b"GET / HTTP/1.1\r\nHost: front.test\r\n\r\n")
                reply = read_reply(sock)
                assert (reply.status, reply.headers["Seen-Protocol"]) == (200, "HTTP/2"), name
                assert reply.body.startswith(b"<!doctype html>"), name
            sock.sendall(
                b"POST /upload HTTP/1.1\r\nHost: front.test\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            reply = read_reply(sock)
            assert reply.headers["Seen-Protocol"] == "HTTP/2", name
            assert json.loads(reply.body) == {"length": len(body), "sha256": digest}, name
            sock.sendall(b"POST /upload HTTP/1.1\r\nHost: front.test\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked)
            assert json.loads(read_reply(sock).body) == {"length": len(body), "sha256": digest}, name
            sock.sendall(f"GET /stream?chunks={CHUNKS}&size={CHUNK_SIZE} HTTP/1.1\r\nHost: front.test\r\n\r\n".encode())
            reply = read_reply(sock)
            assert reply.status == 200 and reply.headers["Seen-Protocol"] == "HTTP/2", name
            assert reply.body == streamed(), name
    # 6 requests on each of the 2 client connections.
    lines = access_lines(access, 12)
    assert len(lines) == 12, lines
    assert all(line.startswith("HTTP/2.0 ") and line.endswith(' HTTP/2.0" 200') for line in lines), lines
