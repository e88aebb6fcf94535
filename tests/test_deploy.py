"""The deployments of docs/DEPLOY.md, run from the example files as they are in examples/, with
only their addresses and paths changed for the test: the example maitred.conf.py serving a
Flask application behind the example nginx site, and a Django application behind the example
HAProxy (PROXY protocol); the container's command checked with --check-config and
--print-config. Real nginx and HAProxy from Debian (skipped, saying why, without them); clients
connect from 127.0.0.2, another loopback address, so that the address the application sees is
provably the client's and not the proxy's.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from client import read_reply
from conftest import MAITRED, accepts_connections, eventually, free_port, kill_group

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
CLIENT = "127.0.0.2"

FLASK_APP = """
from flask import Flask, jsonify, request

app = Flask(__name__)


@app.get("/who")
def who():
    return jsonify(addr=request.remote_addr, scheme=request.scheme)
"""

DJANGO_APP = """
from django.conf import settings

settings.configure(ROOT_URLCONF=__name__, ALLOWED_HOSTS=["*"], SECRET_KEY="test-only", MIDDLEWARE=[])

from django.core.wsgi import get_wsgi_application
from django.http import JsonResponse
from django.urls import path


def who(request):
    return JsonResponse({"addr": request.META["REMOTE_ADDR"], "scheme": request.scheme})


urlpatterns = [path("who", who)]
application = get_wsgi_application()
"""


def tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if found is None:
        pytest.skip(f"{name} is not installed (Debian: apt-get install {name})")
    return found


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen]]:
    """Processes the test starts, each in its own group, killed and reaped at the end."""
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        if process.poll() is None:
            kill_group(process.pid)
        process.wait(timeout=10)


def start(processes: list, command: list[str], log: Path, **kwargs) -> subprocess.Popen:
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **kwargs)
    processes.append(process)
    return process


def ask_from_another_address(port: int) -> dict:
    with socket.socket() as sock:
        sock.settimeout(10)
        sock.bind((CLIENT, 0))
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET /who HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n")
        reply = read_reply(sock)
    assert reply.status == 200, reply
    return json.loads(reply.body)


def example_maitred(processes: list, tmp_path: Path, app: str, bind: str, *extra: str) -> subprocess.Popen:
    """maitred as docs/DEPLOY.md runs it: -c examples/deploy/maitred.conf.py, the addresses from
    the environment the example reads."""
    environment = dict(os.environ, APP=app, BIND=bind, STATS=f"127.0.0.1:{free_port()}", WEB_CONCURRENCY="2")
    command = [str(MAITRED), "-c", str(EXAMPLES / "deploy" / "maitred.conf.py"), *extra]
    server = start(processes, command, tmp_path / "maitred.log", cwd=tmp_path, env=environment)
    assert eventually(lambda: "serving " in (tmp_path / "maitred.log").read_text() or server.poll() is not None, 30)
    assert server.poll() is None, (tmp_path / "maitred.log").read_text()
    return server


def test_flask_behind_the_example_nginx_sees_the_clients_address(processes, tmp_path):
    nginx = tool("nginx")
    (tmp_path / "flask_who.py").write_text(FLASK_APP)
    socket_path = tmp_path / "maitred.sock"
    server = example_maitred(processes, tmp_path, "flask_who:app", f"unix:{socket_path}")
    port = free_port()
    site = (EXAMPLES / "nginx" / "maitred.conf").read_text()
    site = site.replace("unix:/run/maitred/maitred.sock", f"unix:{socket_path}").replace(
        "listen 80;", f"listen 127.0.0.1:{port};"
    )
    (tmp_path / "site.conf").write_text(site)
    temp = tmp_path / "nginx-temp"
    temp.mkdir()
    (tmp_path / "nginx.conf").write_text(
        # Its workers as root: the test's directory is root's alone (docs/DEPLOY.md says how to
        # give nginx's user the socket in production).
        f"daemon off;\nuser root;\nworker_processes 1;\npid {tmp_path}/nginx.pid;\nerror_log {tmp_path}/nginx-error.log;\n"
        "events { worker_connections 64; }\n"
        f"http {{\n access_log off;\n client_body_temp_path {temp}/body;\n proxy_temp_path {temp}/proxy;\n"
        f" fastcgi_temp_path {temp}/fastcgi;\n uwsgi_temp_path {temp}/uwsgi;\n scgi_temp_path {temp}/scgi;\n"
        f" include {tmp_path}/site.conf;\n}}\n"
    )
    start(processes, [nginx, "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")], tmp_path / "nginx.log")
    assert eventually(lambda: accepts_connections(port), 10), (tmp_path / "nginx-error.log").read_text()
    assert ask_from_another_address(port) == {"addr": CLIENT, "scheme": "http"}
    # The access log (standard error, as the example says) names the client, with the queue
    # and application times; the post_fork hook ran in each worker.
    assert eventually(lambda: f"{CLIENT} - - [" in (tmp_path / "maitred.log").read_text(), 5)
    log = (tmp_path / "maitred.log").read_text()
    assert '"GET /who HTTP/1.1" 200' in log, log
    assert log.count("ready to open its connections") >= 2, log
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=30) == 0


def test_django_behind_the_example_haproxy_sees_the_clients_address(processes, tmp_path):
    haproxy = tool("haproxy")
    (tmp_path / "django_who.py").write_text(DJANGO_APP)
    port, front = free_port(), free_port()
    example_maitred(
        processes,
        tmp_path,
        "django_who:application",
        f"127.0.0.1:{port}",
        "--proxy-protocol",
        "--proxy-allow-from",
        "127.0.0.1",
    )
    config = (EXAMPLES / "haproxy" / "haproxy.cfg").read_text()
    config = config.replace("bind :80", f"bind 127.0.0.1:{front}").replace("127.0.0.1:8000", f"127.0.0.1:{port}")
    config = config.replace("maxconn 20000", "maxconn 64")
    (tmp_path / "haproxy.cfg").write_text(config)
    check = subprocess.run(
        [haproxy, "-c", "-f", str(tmp_path / "haproxy.cfg")], check=False, capture_output=True, timeout=30
    )
    assert check.returncode == 0, check
    start(processes, [haproxy, "-db", "-f", str(tmp_path / "haproxy.cfg")], tmp_path / "haproxy.log")
    assert eventually(lambda: accepts_connections(front), 10), (tmp_path / "haproxy.log").read_text()
    assert ask_from_another_address(front) == {"addr": CLIENT, "scheme": "http"}
    # A client that goes around HAProxy, without a PROXY header, is refused.
    with socket.socket() as sock:
        sock.settimeout(10)
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET /who HTTP/1.1\r\nHost: example.com\r\n\r\n")
        assert read_reply(sock).status == 400


def test_the_example_containers_command_reads_port_and_web_concurrency(tmp_path):
    dockerfile = (EXAMPLES / "container" / "Dockerfile").read_text()
    command = json.loads(next(line for line in dockerfile.splitlines() if line.startswith("CMD "))[4:])
    environment_line = next(line for line in dockerfile.splitlines() if line.startswith("ENV "))
    container_env = dict(pair.split("=", 1) for pair in environment_line[4:].split())
    (tmp_path / "hello.py").write_text(
        "def app(environ, start_response):\n    start_response('200 OK', [])\n    return [b'hello']\n"
    )
    argv = [str(MAITRED), *command[1:-1], "hello:app"]
    environment = {**os.environ, **container_env}
    checked = subprocess.run(
        [*argv, "--check-config"], cwd=tmp_path, env=environment, check=False, capture_output=True, timeout=60
    )
    assert checked.returncode == 0, checked
    printed = subprocess.run(
        [*argv, "--print-config"],
        cwd=tmp_path,
        env=environment,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert printed.returncode == 0, printed
    settings = {line.split("=", 1)[0].strip(): line.split("=", 1)[1] for line in printed.stdout.splitlines()}
    assert "['0.0.0.0:8000']" in settings["bind"] and "PORT" in settings["bind"], settings["bind"]
    assert "# WEB_CONCURRENCY (auto: " in settings["workers"], settings["workers"]
    assert int(settings["workers"].split()[0]) <= len(os.sched_getaffinity(0)), settings["workers"]
