"""Real Flask and Django applications served by a live maitred (tests/apps/flask_app.py and
tests/apps/django_app.py): form posts, a JSON API, a file download through
wsgi.file_wrapper and a streamed response, each checked to the byte."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests
from conftest import Server

APPS = Path(__file__).resolve().parent / "apps"
TIMEOUT = 10.0
DOWNLOAD_SIZE = 2_500_000

APPLICATIONS = {"flask": "flask_app:app", "django": "django_app:application"}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("framework-data")
    (directory / "download.bin").write_bytes(random.Random(7).randbytes(DOWNLOAD_SIZE))
    return directory


@pytest.fixture(scope="module")
def servers(maitred_module_server: Callable[..., Server], data_dir: Path) -> dict[str, Server]:
    return {
        name: maitred_module_server(
            spec,
            "--workers",
            "2",
            cwd=APPS,
            env={"FRAMEWORK_DATA_DIR": str(data_dir)},
        )
        for name, spec in APPLICATIONS.items()
    }


@pytest.fixture(params=list(APPLICATIONS))
def server(request: pytest.FixtureRequest, servers: dict[str, Server]) -> Server:
    return servers[request.param]


@pytest.fixture
def session() -> Iterator[requests.Session]:
    with requests.Session() as session:
        yield session


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_urlencoded_form(server: Server, session: requests.Session) -> None:
    fields = [("name", "Ada Lovelace"), ("city", "naïve café ✓"), ("tag", "a"), ("tag", "b&c=d"), ("empty", "")]
    response = session.post(f"{server.url}/form", data=fields, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    assert response.json() == {
        "fields": {"name": ["Ada Lovelace"], "city": ["naïve café ✓"], "tag": ["a", "b&c=d"], "empty": [""]},
        "files": {},
    }


def test_multipart_form_with_file_uploads(server: Server, session: requests.Session) -> None:
    small = bytes(range(256)) * 4 + b"\r\n--not-a-boundary\r\n"
    large = random.Random(11).randbytes(3_000_000)  # past the lobby's and Django's memory limits
    files = {
        "small": ("bytes.bin", small, "application/octet-stream"),
        "large": ("large photo.jpg", large, "image/jpeg"),
    }
    response = session.post(
        f"{server.url}/form",
        data={"title": "Résumé", "count": "2"},
        files=files,
        timeout=TIMEOUT,
    )
    assert response.status_code == 200, response.text
    assert response.json() == {
        "fields": {"title": ["Résumé"], "count": ["2"]},
        "files": {
            "small": {
                "filename": "bytes.bin",
                "content_type": "application/octet-stream",
                "size": len(small),
                "sha256": sha256(small),
            },
            "large": {
                "filename": "large photo.jpg",
                "content_type": "image/jpeg",
                "size": len(large),
                "sha256": sha256(large),
            },
        },
    }


def test_json_api(server: Server, session: requests.Session) -> None:
    order = {
        "items": [
            {"name": "crème brûlée", "price_cents": 650, "quantity": 2},
            {"name": "espresso ☕", "price_cents": 250, "quantity": 3},
        ],
        "note": "table 7, près de la fenêtre",
    }
    response = session.post(f"{server.url}/api/orders", json=order, timeout=TIMEOUT)
    assert response.status_code == 201, response.text
    assert response.headers["Content-Type"] == "application/json"
    assert response.json() == {
        "count": 5,
        "total_cents": 2050,
        "note": "TABLE 7, PRÈS DE LA FENÊTRE",
        "echo": order,
    }


def test_file_download_through_file_wrapper(server: Server, session: requests.Session, data_dir: Path) -> None:
    expected = (data_dir / "download.bin").read_bytes()
    for _ in range(2):  # twice on one connection: the connection goes on after a file
        response = session.get(f"{server.url}/download", timeout=TIMEOUT)
        assert response.status_code == 200, response.text
        assert response.content == expected
        assert response.headers["Content-Length"] == str(DOWNLOAD_SIZE)
        assert response.headers["Content-Type"] == "application/octet-stream"
        assert "report.bin" in response.headers["Content-Disposition"]
        assert "attachment" in response.headers["Content-Disposition"]
    server.wait_for_log("/download returned FileWrapper", TIMEOUT)


def test_streamed_response(server: Server, session: requests.Session) -> None:
    with session.get(
        f"{server.url}/stream", params={"n": "200", "word": "tick"}, stream=True, timeout=TIMEOUT
    ) as response:
        assert response.status_code == 200
        assert response.headers["Transfer-Encoding"] == "chunked"
        assert "Content-Length" not in response.headers
        body = b"".join(response.iter_content(chunk_size=None))
    assert body == "".join(f"tick {n}\n" for n in range(200)).encode()


def test_flask_range_request(servers: dict[str, Server], session: requests.Session, data_dir: Path) -> None:
    """Werkzeug answers a Range request from the file the server's wrapper holds."""
    expected = (data_dir / "download.bin").read_bytes()
    response = session.get(f"{servers['flask'].url}/download", headers={"Range": "bytes=1000-1999"}, timeout=TIMEOUT)
    assert response.status_code == 206
    assert response.headers["Content-Range"] == f"bytes 1000-1999/{DOWNLOAD_SIZE}"
    assert response.content == expected[1000:2000]


def test_no_errors_logged(servers: dict[str, Server]) -> None:
    """Runs last: nothing above made either server log an error."""
    for name, server in servers.items():
        log = server.stderr()
        for sign in ("Traceback", "[ERROR]", "[WARNING]", "[CRITICAL]"):
            assert sign not in log, f"{name} logged {sign}:\n{log}"
