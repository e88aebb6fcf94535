"""ASGI's Path Send (`http.response.pathsend`, docs/ASGI.md): an HTTP scope offers it, and the
file it names goes to the lobby as a descriptor that the lobby sends with sendfile(2), as
wsgi.file_wrapper's: none of its bytes cross the worker. Starlette's FileResponse uses it. A
path that cannot be sent is a 500 with one log line, and the worker serves on; a Range request
is answered as through file_wrapper. The apps are tests/apps/pathsend.py."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import pytest
from conftest import HOST, Server
from test_wsgi_live import Client

pytest.importorskip("starlette", reason="Starlette is in the test requirements")

APPS = Path(__file__).resolve().parent / "apps"
TIMEOUT = 30.0
LARGE = 64 * 1024 * 1024


@pytest.fixture(scope="module")
def large_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A 64 MiB file of varied bytes, and its sha256."""
    path = tmp_path_factory.mktemp("pathsend") / "large.bin"
    digest = hashlib.sha256()
    with path.open("wb") as file:
        for index in range(LARGE // (1024 * 1024)):
            block = hashlib.sha256(b"%d" % index).digest() * (1024 * 1024 // 32)
            digest.update(block)
            file.write(block)
    return path, digest.hexdigest()


def serve(launch: Callable[..., Server], application: str, *args: str) -> Server:
    return launch(f"pathsend:{application}", "-w", "1", *args, cwd=APPS)


def download(
    server: Server, target: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], str, int]:
    """GET `target`: its status, headers (names lowercased), the body's sha256 and length,
    read in pieces."""
    connection = http.client.HTTPConnection(HOST, server.port, timeout=TIMEOUT)
    try:
        connection.request("GET", target, headers=headers or {})
        response = connection.getresponse()
        digest, length = hashlib.sha256(), 0
        while piece := response.read(1024 * 1024):
            digest.update(piece)
            length += len(piece)
        return (
            response.status,
            {name.lower(): value for name, value in response.getheaders()},
            digest.hexdigest(),
            length,
        )
    finally:
        connection.close()


def file_target(path: Path | str, route: str = "/file") -> str:
    return f"{route}?path={quote(str(path))}"


def worker_pid(server: Server) -> int:
    with Client(server.port) as client:
        response = client.exchange("GET", "/pid")
    assert response.status == 200, server.stderr()
    return int(response.body)


def bytes_read_by(pid: int) -> int:
    """What process `pid` has read with read(2) and the like, its files included (`rchar`)."""
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["rchar"])


def test_an_http_scope_offers_pathsend(maitred_server: Callable[..., Server]) -> None:
    server = serve(maitred_server, "app")
    with Client(server.port) as client:
        response = client.exchange("GET", "/extensions")
    assert response.status == 200, server.stderr()
    assert json.loads(response.body) == {"http.response.pathsend": {}}


def test_a_large_file_sent_with_pathsend_arrives_whole_and_never_crosses_the_worker(
    maitred_server: Callable[..., Server], large_file: tuple[Path, str]
) -> None:
    path, sha256 = large_file
    server = serve(maitred_server, "app")
    pid = worker_pid(server)
    before = bytes_read_by(pid)
    status, headers, digest, length = download(server, file_target(path))
    assert (status, length, digest) == (200, LARGE, sha256), server.stderr()
    # The application gave no Content-Length: it is the file's, as for wsgi.file_wrapper.
    assert headers["content-length"] == str(LARGE)
    assert "transfer-encoding" not in headers
    assert headers["content-type"] == "application/x-test"
    # The worker read a request, not the file: the lobby sent it from the descriptor.
    assert bytes_read_by(pid) - before < LARGE // 64
    assert worker_pid(server) == pid


def test_starlettes_file_response_uses_pathsend(
    maitred_server: Callable[..., Server], large_file: tuple[Path, str]
) -> None:
    path, sha256 = large_file
    read = {}
    for application in ("starlette_app", "starlette_unoffered"):
        server = serve(maitred_server, application)
        pid = worker_pid(server)
        before = bytes_read_by(pid)
        status, headers, digest, length = download(server, file_target(path))
        assert (status, length, digest) == (200, LARGE, sha256), server.stderr()
        assert headers["content-length"] == str(LARGE)
        read[application] = bytes_read_by(pid) - before
        server.kill()
    # Offered the extension, FileResponse leaves the file to the lobby; without it, it reads
    # every byte in the worker, which is what the measure tells apart.
    assert read["starlette_app"] < LARGE // 64, read
    assert read["starlette_unoffered"] >= LARGE, read


def test_a_head_request_has_the_files_length_and_no_body(
    maitred_server: Callable[..., Server], large_file: tuple[Path, str]
) -> None:
    path, _ = large_file
    server = serve(maitred_server, "app")
    with Client(server.port) as client:
        for _ in range(2):  # and the connection goes on after it
            response = client.exchange("HEAD", file_target(path))
            assert response.status == 200, server.stderr()
            assert response.header("content-length") == str(LARGE)
            assert response.body == b""


def test_small_files_one_after_the_other_on_one_connection(
    maitred_server: Callable[..., Server], tmp_path: Path
) -> None:
    server = serve(maitred_server, "app")
    with Client(server.port) as client:
        for size in (0, 1, 100_000, 3):
            path = tmp_path / f"file-{size}"
            path.write_bytes(bytes(range(256)) * (size // 256) + b"x" * (size % 256))
            response = client.exchange("GET", file_target(path))
            assert (response.status, response.body) == (200, path.read_bytes()), server.stderr()
            assert response.header("content-length") == str(size)


def test_pathsend_over_http2(maitred_server: Callable[..., Server], large_file: tuple[Path, str]) -> None:
    # The lobby's HTTP/2 streams send a file answer too, within their flow control.
    httpx = pytest.importorskip("httpx")
    path, sha256 = large_file
    server = serve(maitred_server, "app")
    with httpx.Client(http1=False, http2=True, timeout=TIMEOUT) as client:
        for _ in range(2):  # two streams of one connection
            with client.stream("GET", f"{server.url}{file_target(path)}") as answer:
                assert (answer.http_version, answer.status_code) == ("HTTP/2", 200), server.stderr()
                assert answer.headers["content-length"] == str(LARGE)
                digest = hashlib.sha256()
                for piece in answer.iter_bytes():
                    digest.update(piece)
            assert digest.hexdigest() == sha256


def unsendable_paths(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    return {
        "missing": (tmp_path / "missing", "cannot be opened: No such file or directory"),
        "a directory": (tmp_path, "is a directory, not a regular file"),
        # Opened without waiting for a writer: the event loop is never held by it.
        "a FIFO": (fifo, "is a FIFO, not a regular file"),
        # Its line stays one line.
        "a name with a line break": (tmp_path / "two\nlines", "cannot be opened: No such file or directory"),
    }


@pytest.mark.parametrize("case", ["missing", "a directory", "a FIFO", "a name with a line break"])
def test_a_path_that_cannot_be_sent_is_a_500_with_one_line_and_the_worker_serves_on(
    maitred_server: Callable[..., Server], tmp_path: Path, case: str
) -> None:
    path, why = unsendable_paths(tmp_path)[case]
    server = serve(maitred_server, "app")
    pid = worker_pid(server)
    target = file_target(path)
    with Client(server.port) as client:
        response = client.exchange("GET", target)
        assert response.status == 500, server.stderr()
        shown = str(path).replace("\n", " ")
        line = f"http.response.pathsend for GET /file: {shown}: {why}"
        log = server.wait_for_log(line, TIMEOUT)
        naming = [text for text in log.splitlines() if shown.split(" ")[0] in text]
        assert len(naming) == 1 and line in naming[0], log
        assert "Traceback" not in log
        # The same worker, on the same connection, serves the next request.
        good = tmp_path / "good"
        good.write_bytes(b"served on\n")
        response = client.exchange("GET", file_target(good))
        assert (response.status, response.body) == (200, b"served on\n")
    assert worker_pid(server) == pid


def test_pathsend_before_http_response_start_is_the_applications_error(
    maitred_server: Callable[..., Server], tmp_path: Path
) -> None:
    path = tmp_path / "file"
    path.write_bytes(b"never sent\n")
    server = serve(maitred_server, "app")
    pid = worker_pid(server)
    with Client(server.port) as client:
        response = client.exchange("GET", file_target(path, "/before-start"))
        assert response.status == 500
    server.wait_for_log("RuntimeError: http.response.pathsend was sent before http.response.start", TIMEOUT)
    assert worker_pid(server) == pid


def test_a_range_request_is_answered_as_through_file_wrapper(
    maitred_server: Callable[..., Server], large_file: tuple[Path, str]
) -> None:
    path, _ = large_file
    wsgi = serve(maitred_server, "wsgi_app", "--interface", "wsgi")
    pathsend = serve(maitred_server, "app")
    starlette = serve(maitred_server, "starlette_app")
    wanted = {"Range": "bytes=1000-70999"}

    def answer(server: Server, target: str) -> tuple[int, str | None, str, str, int]:
        status, headers, digest, length = download(server, target, wanted)
        return status, headers.get("content-range"), headers["content-length"], digest, length

    # The lobby leaves Range to the application, for a descriptor as for any answer: an
    # application that ignores it sends the whole file, through file_wrapper or pathsend.
    whole = answer(wsgi, file_target(path))
    assert whole[:3] == (200, None, str(LARGE))
    assert answer(pathsend, file_target(path)) == whole
    # Starlette answers it itself (206, from its own reads: a range is not a whole file, which
    # is all pathsend names), as a WSGI application answers it through file_wrapper, from an
    # offset with a Content-Length.
    part = answer(wsgi, file_target(path) + "&ranges=1")
    assert part[:3] == (206, f"bytes 1000-70999/{LARGE}", "70000")
    assert part[3] == hashlib.sha256(path.read_bytes()[1000:71000]).hexdigest()
    assert answer(starlette, file_target(path)) == part


def test_pathsends_while_other_answers_fill_the_ring(
    maitred_server: Callable[..., Server], large_file: tuple[Path, str]
) -> None:
    # Other requests' large bodies fill the worker's answer ring, so that a file's frames
    # wait behind theirs; they must still reach the lobby in order, and the worker survive.
    path, sha256 = large_file
    server = serve(maitred_server, "app")
    pid = worker_pid(server)

    def one(index: int) -> tuple[int, str, int]:
        target = f"/big?size={8 * 1024 * 1024}" if index % 2 else file_target(path)
        status, _, digest, length = download(server, target)
        return status, digest, length

    big = hashlib.sha256(bytes(8 * 1024 * 1024)).hexdigest()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(16)))
    for index, result in enumerate(results):
        expected = (200, big, 8 * 1024 * 1024) if index % 2 else (200, sha256, LARGE)
        assert result == expected, (index, server.stderr())
    assert worker_pid(server) == pid
