"""TLS in the lobby (docs/TLS.md): HTTPS with rustls on the listeners given a certificate,
plain HTTP beside it on those written http://ADDRESS; the handshake bounded like a head; plain
HTTP sent to a TLS port refused; the certificate renewed by SIGHUP; client certificates.

Every certificate is made by the test (tls_certs.py); every client is Python's ssl module or
requests."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import ssl
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
from client import Reply, read_reply, status_of
from conftest import HOST, Server, eventually, free_port
from tls_certs import Authority, Pair, client_context, peer_serial, serial_of

TIMEOUT = 10.0
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

ENVIRON_APP = """
import json
import os

def app(environ, start_response):
    seen = {key: environ.get(key) for key in ("wsgi.url_scheme", "HTTPS", "SERVER_PORT", "SSL_CLIENT_S_DN")}
    seen["body"] = environ["wsgi.input"].read().decode()
    body = json.dumps(seen).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]
"""


@pytest.fixture
def environ_app(app_dir: Path) -> Path:
    (app_dir / "seen.py").write_text(ENVIRON_APP)
    return app_dir


StartTls = Callable[..., Server]


@pytest.fixture
def tls_server(maitred_server: Callable[..., Server], environ_app: Path, server_pair: Pair) -> StartTls:
    """Starts maitred serving seen:app over TLS on its port, with more arguments."""

    def start(*args: str) -> Server:
        return maitred_server(
            "--certfile", str(server_pair.cert), "--keyfile", str(server_pair.key), *args, "seen:app", cwd=environ_app
        )

    return start


def tls_connect(port: int, context: ssl.SSLContext, session: ssl.SSLSession | None = None) -> ssl.SSLSocket:
    raw = socket.create_connection((HOST, port), timeout=TIMEOUT)
    return context.wrap_socket(raw, server_hostname="localhost", session=session)


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closes `sock` (a reset too: it may close before reading all)."""
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True


def exchange(sock: socket.socket, body: str = "") -> Reply:
    sock.sendall(f"POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode())
    return read_reply(sock)


def test_https_is_served_with_tls_13_alpn_and_the_https_scheme(tls_server: StartTls, authority: Authority) -> None:
    """docs/TLS.md, "HTTPS on a listener": TLS 1.3 by default, ALPN http/1.1 to a client that
    offers it (h2 is tests/test_http2.py's), and the application sees wsgi.url_scheme https;
    keep-alive requests share one connection."""
    server = tls_server()
    context = client_context(authority)
    context.set_alpn_protocols(["http/1.1"])
    with tls_connect(server.port, context) as sock:
        assert sock.version() == "TLSv1.3"
        assert sock.selected_alpn_protocol() == "http/1.1"
        for n in range(3):
            reply = exchange(sock, f"request {n}")
            assert reply.status == 200, reply
            seen = json.loads(reply.body)
            assert seen["wsgi.url_scheme"] == "https"
            assert seen["body"] == f"request {n}"
            assert seen["SERVER_PORT"] == str(server.port)
    # A client of the ordinary kind: requests, verifying the chain against the test's CA.
    answer = requests.post(f"https://localhost:{server.port}/", data="x" * 300_000, verify=str(authority.pem))
    assert answer.status_code == 200 and answer.json()["body"] == "x" * 300_000


def test_a_large_answer_and_pipelined_requests_cross_tls(
    maitred_server: Callable[..., Server], app_dir: Path, server_pair: Pair, authority: Authority
) -> None:
    """docs/TLS.md, "HTTPS on a listener": answers of every size, and requests pipelined in
    one TLS record, are served as over plain HTTP."""
    (app_dir / "big.py").write_text(
        "def app(environ, start_response):\n"
        "    size = int(environ['QUERY_STRING'] or 0)\n"
        "    start_response('200 OK', [('Content-Length', str(size))])\n"
        "    return [b'z' * size]\n"
    )
    server = maitred_server(
        "--certfile", str(server_pair.cert), "--keyfile", str(server_pair.key), "big:app", cwd=app_dir
    )
    with tls_connect(server.port, client_context(authority)) as sock:
        # Past 256 KiB the answer waits in a file, which goes out through rustls, not sendfile(2).
        for size in (0, 10, 70_000, 3_000_000):
            sock.sendall(f"GET /?{size} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            reply = read_reply(sock)
            assert reply.status == 200 and reply.body == b"z" * size
        sock.sendall(b"".join(f"GET /?{n} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for n in range(5)))
        for n in range(5):
            assert read_reply(sock).body == b"z" * n


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion:DeprecationWarning")
def test_tls_12_is_served_and_older_versions_are_refused(tls_server: StartTls, authority: Authority) -> None:
    """docs/TLS.md, "HTTPS on a listener": TLS 1.2 and 1.3 only."""
    server = tls_server()
    twelve = client_context(authority)
    twelve.maximum_version = ssl.TLSVersion.TLSv1_2
    with tls_connect(server.port, twelve) as sock:
        assert sock.version() == "TLSv1.2"
        assert exchange(sock).status == 200
    old = client_context(authority)
    old.set_ciphers("DEFAULT:@SECLEVEL=0")
    old.minimum_version = ssl.TLSVersion.TLSv1
    old.maximum_version = ssl.TLSVersion.TLSv1_1
    with pytest.raises(ssl.SSLError):
        tls_connect(server.port, old).close()
    server.wait_for_log("TLS handshake with 127.0.0.1", TIMEOUT)


def test_session_tickets_resume_the_session(tls_server: StartTls, authority: Authority) -> None:
    """docs/TLS.md, "Session resumption": a returning client skips the full handshake."""
    server = tls_server()
    context = client_context(authority)
    with tls_connect(server.port, context) as sock:
        assert exchange(sock).status == 200  # TLS 1.3 tickets arrive after the handshake
        session = sock.session
    assert session is not None and session.has_ticket
    with tls_connect(server.port, context, session=session) as again:
        assert again.session_reused
        assert exchange(again).status == 200


def test_plain_http_to_a_tls_port_gets_400_and_one_log_line(
    tls_server: StartTls, authority: Authority, server_pair: Pair
) -> None:
    """docs/TLS.md, "Plain HTTP sent to a TLS port"; and a listener written http://ADDRESS
    speaks plain HTTP beside the TLS one."""
    plain_port = free_port()
    server = tls_server("--bind", f"http://{HOST}:{plain_port}")
    with socket.create_connection((HOST, server.port), timeout=TIMEOUT) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = read_reply(sock)
    assert reply.status == 400
    assert b"this port speaks HTTPS" in reply.body
    log = server.wait_for_log("plain HTTP was sent to a TLS listener", TIMEOUT)
    assert log.count("plain HTTP was sent to a TLS listener") == 1
    assert f"listening at https://{HOST}:{server.port}" in log
    with socket.create_connection((HOST, plain_port), timeout=TIMEOUT) as sock:
        reply = exchange(sock)
    assert reply.status == 200 and json.loads(reply.body)["wsgi.url_scheme"] == "http"


def test_a_handshake_must_finish_within_the_header_timeout(tls_server: StartTls) -> None:
    """docs/TLS.md, "The handshake is bounded like a head": a client that begins a handshake
    and stalls is closed at --header-timeout, with a log line."""
    server = tls_server("--header-timeout", "1")
    with socket.create_connection((HOST, server.port), timeout=TIMEOUT) as sock:
        sock.sendall(b"\x16\x03\x01\x00")  # the start of a record header, then nothing
        assert closed_by_server(sock)  # well before TIMEOUT
    server.wait_for_log("TLS handshake did not finish within --header-timeout", TIMEOUT)


def test_handshakes_count_against_max_head_memory(tls_server: StartTls, authority: Authority) -> None:
    """docs/TLS.md, "The handshake is bounded like a head": stalled handshakes past
    --max-head-memory are closed, the oldest first, and a new client is still served."""
    server = tls_server("--max-head-memory", str(64 * 1024))
    stalled = [socket.create_connection((HOST, server.port), timeout=TIMEOUT) for _ in range(4)]
    try:
        for sock in stalled:
            sock.sendall(b"\x16")
        assert closed_by_server(stalled[0])
        server.wait_for_log("during its TLS handshake: the memory for incomplete request heads", TIMEOUT)
        with tls_connect(server.port, client_context(authority)) as sock:
            assert exchange(sock).status == 200
    finally:
        for sock in stalled:
            sock.close()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("--certfile", "CERT"), "--certfile is given without --keyfile"),
        (("--keyfile", "KEY"), "--keyfile is given without --certfile"),
        (("--certfile", "CERT", "--keyfile", "KEY", "--ciphers", "HIGH:!aNULL"), "does not support the cipher suite"),
        (
            ("--certfile", "CERT", "--keyfile", "KEY", "--cert-reqs", "required"),
            "--cert-reqs required needs --ca-certs",
        ),
        (("--certfile", "CERT", "--keyfile", "KEY", "--proxy-protocol", "v1"), "--proxy-protocol with TLS"),
        (("--certfile", "CERT", "--keyfile", "OTHER"), "does not go with the certificate"),
        (("--certfile", "KEY", "--keyfile", "KEY"), "holds no PEM certificate"),
    ],
)
def test_tls_settings_that_cannot_work_are_one_clear_line(
    run_maitred: Callable, authority: Authority, server_pair: Pair, arguments: tuple[str, ...], message: str
) -> None:
    """docs/TLS.md, "Settings": a missing half, an unknown suite or a key that does not match
    the certificate stops maitred with one line naming it."""
    other = authority.server("other")
    files = {"CERT": str(server_pair.cert), "KEY": str(server_pair.key), "OTHER": str(other.key)}
    finished = run_maitred(
        "--bind", f"{HOST}:{free_port()}", "--chdir", str(EXAMPLES), *(files.get(a, a) for a in arguments), "hello:app"
    )
    assert finished.returncode != 0
    assert message in finished.stderr, finished.stderr


GUNICORN_TLS_CONF = """
import ssl

wsgi_app = "seen:app"
bind = ["127.0.0.1:{port}"]
certfile = "{cert}"
keyfile = "{key}"
ca_certs = "{ca}"
cert_reqs = ssl.CERT_OPTIONAL
ssl_version = ssl.PROTOCOL_TLS_SERVER
do_handshake_on_connect = False
suppress_ragged_eofs = True
ciphers = "TLS_AES_128_GCM_SHA256:ECDHE-ECDSA-AES128-GCM-SHA256"
"""


def test_a_gunicorn_config_with_certfile_and_keyfile_serves_https(
    maitred_server: Callable[..., Server], environ_app: Path, server_pair: Pair, authority: Authority
) -> None:
    """docs/TLS.md, "Settings"; docs/GUNICORN.md: gunicorn's certificate settings in a config
    file renamed maitred.conf.py serve HTTPS, with no warning for the TLS settings whose values
    ask for what maitred does anyway, and the cipher suites it names."""
    port = free_port()
    conf = GUNICORN_TLS_CONF.format(port=port, cert=server_pair.cert, key=server_pair.key, ca=authority.pem)
    (environ_app / "maitred.conf.py").write_text(conf)
    server = maitred_server(cwd=environ_app, bind=False, port=port)
    answer = requests.get(f"https://localhost:{port}/", verify=str(authority.pem), timeout=TIMEOUT)
    assert answer.status_code == 200 and answer.json()["wsgi.url_scheme"] == "https"
    assert " is ignored: " not in server.stderr(), server.stderr()
    with tls_connect(port, client_context(authority)) as sock:
        assert sock.cipher()[0] == "TLS_AES_128_GCM_SHA256"
    twelve = client_context(authority)
    twelve.maximum_version = ssl.TLSVersion.TLSv1_2
    with tls_connect(port, twelve) as sock:
        assert sock.cipher()[0] == "ECDHE-ECDSA-AES128-GCM-SHA256"


def _replace(pair: Pair, cert: bytes, key: bytes) -> None:
    """Writes a renewed pair over `pair` the way certbot and the like do: each file whole,
    renamed into place."""
    for path, content in ((pair.cert, cert), (pair.key, key)):
        fresh = path.with_suffix(".new")
        fresh.write_bytes(content)
        fresh.replace(path)


def test_sighup_renews_the_certificate_under_load_with_no_error(
    tls_server: StartTls, authority: Authority, server_pair: Pair
) -> None:
    """docs/TLS.md, "Renewal without a restart": while clients connect without pause, a SIGHUP
    with renewed files makes new handshakes present the new certificate, a connection opened
    before it carries on, and a broken pair keeps the certificate in use, with one line saying
    why. No request fails."""
    server = tls_server("-w", "2")
    context = client_context(authority)
    first_serial = serial_of(server_pair.cert.read_bytes())
    held = tls_connect(server.port, context)
    assert exchange(held).status == 200 and peer_serial(held) == first_serial

    done = threading.Event()
    served: list[int] = []
    failures: list[str] = []

    def clients() -> None:
        # Bounded: at most 5000 new connections, stopping once the test has seen both reloads.
        for n in range(5000):
            if done.is_set():
                return
            try:
                with tls_connect(server.port, context) as sock:
                    reply = exchange(sock, str(n))
                    if reply.status != 200:
                        failures.append(f"request {n}: {reply.status}")
                    served.append(peer_serial(sock))
            except OSError as error:
                failures.append(f"request {n}: {error!r}")

    loader = threading.Thread(target=clients)
    loader.start()
    try:
        assert eventually(lambda: len(served) >= 20, TIMEOUT)
        renewed = authority.server("renewed")
        renewed_serial = serial_of(renewed.cert.read_bytes())
        _replace(server_pair, renewed.cert.read_bytes(), renewed.key.read_bytes())
        server.send_signal(signal.SIGHUP)
        server.wait_for_log(f"SIGHUP: read the certificate in {server_pair.cert} again", TIMEOUT)
        assert eventually(lambda: renewed_serial in served[-5:], TIMEOUT)
        # A key that does not go with the certificate: the renewed one stays in use.
        _replace(server_pair, renewed.cert.read_bytes(), authority.server("stranger").key.read_bytes())
        server.send_signal(signal.SIGHUP)
        log = server.wait_for_log("the certificate in use stays", TIMEOUT)
        assert log.count("the certificate in use stays") == 1
        assert "does not go with the certificate" in log
        count = len(served)
        assert eventually(lambda: len(served) >= count + 20, TIMEOUT)
    finally:
        done.set()
        loader.join(TIMEOUT * 3)
    assert not failures, failures[:5]
    assert served[-1] == renewed_serial
    # The connection opened before both reloads carries on, with the certificate it began with.
    assert exchange(held).status == 200 and peer_serial(held) == first_serial
    held.close()


def test_client_certificates_required_optional_and_the_subject_in_the_environ(
    tls_server: StartTls, authority: Authority, tmp_path: Path
) -> None:
    """docs/TLS.md, "Client certificates": --cert-reqs required refuses a client without a
    certificate from --ca-certs' authorities at the handshake; optional serves it; a verified
    certificate's subject is the environ's SSL_CLIENT_S_DN."""
    alice = authority.client("alice")
    stranger_directory = tmp_path / "stranger"
    stranger_directory.mkdir()
    mallory = Authority(stranger_directory, "another CA").client("mallory")
    required = tls_server("--ca-certs", str(authority.pem), "--cert-reqs", "required")
    with tls_connect(required.port, client_context(authority, alice)) as sock:
        seen = json.loads(exchange(sock).body)
    assert seen["SSL_CLIENT_S_DN"] == "CN=alice,O=maitred tests"
    assert seen["wsgi.url_scheme"] == "https"
    for refused in (None, mallory):
        # TLS 1.3: the client learns of the refusal when it reads.
        with (
            pytest.raises((ssl.SSLError, ConnectionError)),
            tls_connect(required.port, client_context(authority, refused)) as sock,
        ):
            exchange(sock)
    required.wait_for_log("TLS handshake with 127.0.0.1", TIMEOUT)
    optional = tls_server("--ca-certs", str(authority.pem), "--cert-reqs", "optional")
    with tls_connect(optional.port, client_context(authority)) as sock:
        assert json.loads(exchange(sock).body)["SSL_CLIENT_S_DN"] is None
    with tls_connect(optional.port, client_context(authority, alice)) as sock:
        assert json.loads(exchange(sock).body)["SSL_CLIENT_S_DN"] == "CN=alice,O=maitred tests"


def test_the_access_log_shows_the_tls_version_and_cipher(tls_server: StartTls, authority: Authority) -> None:
    """docs/TLS.md, "What the application and the logs see": the access log's tls_version and
    tls_cipher atoms."""
    server = tls_server("--access-logfile", "-", "--access-logformat", "%(tls_version)s %(tls_cipher)s %(s)s")
    with tls_connect(server.port, client_context(authority)) as sock:
        cipher = sock.cipher()[0]
        assert exchange(sock).status == 200
    assert eventually(lambda: server.stdout().strip() != "", TIMEOUT)
    version, suite, status = server.stdout().split()
    assert (version, status) == ("TLSv1.3", "200")
    assert suite == "TLS13_" + cipher.removeprefix("TLS_")


def lobby_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_idle_tls_connections_hibernate_and_cost_little(tls_server: StartTls, authority: Authority) -> None:
    """docs/TLS.md, "Idle TLS connections stay cheap": an idle keep-alive TLS connection
    hibernates like a plain one, keeping only its rustls session, and is served when it speaks
    again (pipelined requests too); 300 of them grow the lobby by well under 32 KB each."""
    stats = free_port()
    server = tls_server("--keep-alive", "60", "--stats", f"{HOST}:{stats}")
    context = client_context(authority)
    with tls_connect(server.port, context) as sock:
        assert exchange(sock).status == 200
        for _ in range(2):
            assert eventually(lambda: status_of(stats)["connections"]["hibernating"] == 1, TIMEOUT)
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 2)
            assert (read_reply(sock).status, read_reply(sock).status) == (200, 200)
    assert eventually(lambda: status_of(stats)["connections"]["hibernating"] == 0, TIMEOUT)
    before = lobby_rss_kb(server.pid)
    held = []
    try:
        for _ in range(300):
            sock = tls_connect(server.port, context)
            assert exchange(sock).status == 200
            held.append(sock)
        assert eventually(lambda: status_of(stats)["connections"]["hibernating"] == 300, TIMEOUT)
        grown = lobby_rss_kb(server.pid) - before
        assert grown / 300 <= 32, f"{grown / 300:.1f} KB per idle TLS connection"
        # Every one of them is still served.
        for sock in held[::30]:
            assert exchange(sock).status == 200
    finally:
        for sock in held:
            sock.close()


def test_at_sigusr2_tls_connections_finish_and_close_and_no_client_sees_an_error(
    tls_server: StartTls, authority: Authority, tmp_path: Path
) -> None:
    """docs/TLS.md, "Binary upgrade": TLS connections cannot be handed to the new maitred;
    each finishes its current request, answered with Connection: close, and closes. Clients in
    a keep-alive loop (which reconnect when told to close) and clients opening a connection per
    request, across the upgrade: none sees an error, and the new maitred serves them after."""
    pid_file = tmp_path / "maitred.pid"
    server = tls_server("-w", "2", "--pid", str(pid_file))
    context = client_context(authority)
    stop = threading.Event()
    failures: list[str] = []
    closes: list[int] = []
    served = [0] * 6

    def keep_alive_client(n: int) -> None:
        try:
            while not stop.is_set():
                with tls_connect(server.port, context) as sock:
                    while not stop.is_set():
                        reply = exchange(sock)
                        assert reply.status == 200, reply
                        served[n] += 1
                        if reply.headers.get("Connection", "").lower() == "close":
                            closes.append(n)
                            break
        except Exception as error:  # noqa: BLE001 - any failure is the test's finding
            failures.append(f"keep-alive client: {error!r}")

    def connection_per_request_client(n: int) -> None:
        try:
            while not stop.is_set():
                with tls_connect(server.port, context) as sock:
                    assert exchange(sock).status == 200
                    served[n] += 1
        except Exception as error:  # noqa: BLE001 - any failure is the test's finding
            failures.append(f"connection-per-request client: {error!r}")

    threads = [threading.Thread(target=keep_alive_client, args=(n,)) for n in range(4)]
    threads += [threading.Thread(target=connection_per_request_client, args=(n,)) for n in range(4, 6)]
    for thread in threads:
        thread.start()
    try:
        assert eventually(lambda: all(served) or bool(failures), TIMEOUT), served
        server.send_signal(signal.SIGUSR2)
        assert server.wait(timeout=30) == 0, server.stderr()
        after = list(served)
        assert eventually(lambda: all(now > then for now, then in zip(served, after)) or bool(failures), TIMEOUT)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    assert not failures, failures
    # Every keep-alive client was told to close by the old maitred, and went on with the new.
    assert sorted(set(closes)) == [0, 1, 2, 3], closes
    new_lobby = int(pid_file.read_text())
    assert new_lobby != server.pid
    os.kill(new_lobby, signal.SIGTERM)
    assert eventually(lambda: not pid_file.exists(), 30)


def test_at_sigusr2_an_idle_tls_connection_is_not_closed_under_its_client(
    tls_server: StartTls, authority: Authority, tmp_path: Path
) -> None:
    """docs/TLS.md, "Binary upgrade": a TLS connection idle at SIGUSR2, asleep or just answered,
    stays open in the old maitred however long its client waits, and its next request is answered
    there with Connection: close; once they have closed, the old maitred exits. It used to close
    them once idle for 0.5 s: a client sending its next request at that moment lost it (the soak,
    bench/results/soak, lost one so)."""
    pid_file = tmp_path / "maitred.pid"
    stats = free_port()
    server = tls_server("-w", "1", "--pid", str(pid_file), "--stats", f"{HOST}:{stats}")
    context = client_context(authority)
    asleep = tls_connect(server.port, context)
    fresh: ssl.SSLSocket | None = None
    try:
        assert exchange(asleep).status == 200
        assert eventually(lambda: status_of(stats)["connections"]["hibernating"] == 1, TIMEOUT)
        fresh = tls_connect(server.port, context)
        assert exchange(fresh).status == 200
        server.send_signal(signal.SIGUSR2)
        server.wait_for_log("shutting down: no new connections", TIMEOUT)
        # Watching for a close that must not come: the old rule closed both within 0.5 s of the
        # signal (the sleeper at once), so a second without one shows the rule gone; a slow
        # machine can only make this pass later, never fail.
        readable, _, _ = select.select([asleep, fresh], [], [], 1.0)
        assert not readable, "an idle TLS connection was closed at the upgrade"
        for sock in (asleep, fresh):
            reply = exchange(sock)
            assert reply.status == 200, reply
            assert reply.headers["Connection"].lower() == "close", reply
            assert closed_by_server(sock)
    finally:
        asleep.close()
        if fresh is not None:
            fresh.close()
    assert server.wait(timeout=TIMEOUT) == 0, server.stderr()
    assert "--graceful-timeout passed" not in server.stderr()
    os.kill(int(pid_file.read_text()), signal.SIGTERM)
    assert eventually(lambda: not pid_file.exists(), 30)


def test_idle_connections_left_at_the_graceful_timeout_end_the_drain_cleanly(
    tls_server: StartTls, authority: Authority, tmp_path: Path
) -> None:
    """docs/SIGNALS.md: connections still open but idle when --graceful-timeout ends (here a TLS
    one the new maitred could not take) are no request unfinished: the old lobby closes them and
    stops its workers gracefully, with one line, and exits 0."""
    pid_file = tmp_path / "maitred.pid"
    server = tls_server("-w", "1", "--pid", str(pid_file), "--graceful-timeout", "1")
    with tls_connect(server.port, client_context(authority)) as sock:
        assert exchange(sock).status == 200
        server.send_signal(signal.SIGUSR2)
        assert server.wait(timeout=TIMEOUT) == 0, server.stderr()
        log = server.stderr()
        assert "--graceful-timeout passed; closing the 1 connections left, all idle" in log, log
        assert "stopping their workers" not in log, log
        assert closed_by_server(sock)
    os.kill(int(pid_file.read_text()), signal.SIGTERM)
    assert eventually(lambda: not pid_file.exists(), 30)


def test_a_pipelined_request_rustls_holds_while_the_first_waits_stalls_nothing(maitred_server, server_pair, authority):
    """Issue 46's class, found by reading: a TLS request waited on its answer while rustls held
    the plaintext of the next one (more than the lobby had read of it), and the watch for the
    client's leaving spun: rustls said there was input, the socket said there was none, and the
    loop asked again without ever yielding. The lobby answered nothing more. Here a request
    waiting a second has an 8 KiB pipelined request behind it: both are answered, and another
    client is answered while they wait."""
    apps = Path(__file__).resolve().parent / "apps"
    server = maitred_server(
        "-w", "2", "--certfile", str(server_pair.cert), "--keyfile", str(server_pair.key), "crashy:app", cwd=apps
    )
    context = client_context(authority)
    padding = "x" * 4096
    with tls_connect(server.port, context) as sock:
        sock.sendall(
            b"GET /sleep?seconds=1 HTTP/1.1\r\nHost: localhost\r\n\r\n"
            + f"GET /pid HTTP/1.1\r\nHost: localhost\r\nX-One: {padding}\r\nX-Two: {padding}\r\n\r\n".encode()
        )
        with tls_connect(server.port, context) as other:
            other.sendall(b"GET /pid HTTP/1.1\r\nHost: localhost\r\n\r\n")
            assert read_reply(other).status == 200
        assert read_reply(sock).status == 200
        assert read_reply(sock).status == 200
