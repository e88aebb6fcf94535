"""The reverse proxy in front of the server under test: in scenario S5 nginx from Debian, keeping
persistent HTTP/1.1 connections to the backend, as a production deployment behind nginx would; in
O1-HAPROXY HAProxy from Debian, which gives up on the server after 1 s.

The proxy is part of the scenario, not a server under test: each run writes its configuration
into the run's work directory, starts it (in its own process group) once the backend is ready,
sends the load to its port, and stops it before the backend.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

NGINX = "/usr/sbin/nginx"
HAPROXY = "/usr/sbin/haproxy"

_CONFIG = """\
# The proxy in front of the server under test (bench/front.py). PORT and BACKEND are chosen per run.
daemon off;
worker_processes {workers};
pid {workdir}/front-nginx.pid;
error_log {workdir}/front-nginx-error.log warn;
events {{
    worker_connections 4096;
}}
http {{
    access_log off;
    client_body_temp_path {workdir}/front-temp/body;
    proxy_temp_path {workdir}/front-temp/proxy;
    fastcgi_temp_path {workdir}/front-temp/fastcgi;
    uwsgi_temp_path {workdir}/front-temp/uwsgi;
    scgi_temp_path {workdir}/front-temp/scgi;
    upstream backend {{
        server 127.0.0.1:{backend};
        keepalive {keepalive};
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""


@dataclass(frozen=True)
class NginxFront:
    """nginx as a keep-alive reverse proxy: `keepalive` idle connections to the backend kept per
    nginx worker process (the `upstream { keepalive N; }` directive), HTTP/1.1 to the backend with
    its Connection header cleared, so that connections are reused."""

    keepalive: int = 32
    workers: str = "auto"  # nginx's advice: one worker process per core

    name = "nginx (front)"
    debian = "nginx"
    command = "nginx -p WORKDIR -c front-nginx.conf"

    def available(self) -> bool:
        return shutil.which(NGINX) is not None

    def version(self) -> str:
        return _first_line([NGINX, "-v"])

    def prepare(self, *, port: int, backend: int, workdir: Path) -> list[str]:
        """Writes the configuration into workdir; returns the command that runs nginx with it in
        the foreground."""
        (workdir / "front-temp").mkdir(exist_ok=True)
        config = workdir / "front-nginx.conf"
        config.write_text(
            _CONFIG.format(workers=self.workers, workdir=workdir, backend=backend, keepalive=self.keepalive, port=port)
        )
        return [NGINX, "-p", str(workdir), "-e", str(workdir / "front-nginx-error.log"), "-c", str(config)]

    def describe(self) -> str:
        """The configuration as the results show it, with placeholders for the per-run parts."""
        return _CONFIG.format(
            workers=self.workers, workdir="WORKDIR", backend="BACKEND_PORT", keepalive=self.keepalive, port="PORT"
        )


_HAPROXY_CONFIG = """\
# The proxy in front of the server under test (bench/front.py). PORT and BACKEND are chosen per run.
global
    # Past what O1's arrivals hold open at once (1.5 x a capacity of some hundreds a second, each
    # for up to 2 s), and within the open-files limit: HAProxy wants 2 descriptors a connection.
    maxconn 5000
    # One line per request on standard error (the run's front.log), read after the load.
    log stderr format raw local0 info
defaults
    mode http
    log global
    log-format "{marker} %ST %tsc"
    maxconn 5000
    timeout connect 1s
    timeout client 10s
    timeout server {timeout_server}s
frontend clients
    bind 127.0.0.1:{port}
    default_backend server
backend server
    server under-test 127.0.0.1:{backend}
"""


@dataclass(frozen=True)
class HAProxyFront:
    """HAProxy as the reverse proxy, with `timeout server`: how long it waits for the server's
    answer before it gives up, answers its client 504 and closes its connection to the server
    (the proxy's own patience, O1-HAPROXY). No maxconn on the server line, so HAProxy queues
    nothing itself: every request goes to the server at once, which queues them. Its default
    connection reuse (http-reuse safe) sends each client connection's first request on a
    connection of its own, so a new connection per request (O1's clients) is one per request at
    the server too."""

    timeout_server: float = 1.0

    name = "HAProxy (front)"
    debian = "haproxy"
    command = "haproxy -db -f front-haproxy.cfg"
    # Starts each request's line in its log (the log-format above): status, termination state.
    marker = "HAPROXY-REQUEST"

    def available(self) -> bool:
        return shutil.which(HAPROXY) is not None

    def version(self) -> str:
        return _first_line([HAPROXY, "-v"])

    def prepare(self, *, port: int, backend: int, workdir: Path) -> list[str]:
        """Writes the configuration into workdir; returns the command that runs HAProxy with it in
        the foreground (-db)."""
        config = workdir / "front-haproxy.cfg"
        config.write_text(self._config(port, backend))
        return [HAPROXY, "-db", "-f", str(config)]

    def describe(self) -> str:
        return self._config("PORT", "BACKEND_PORT")

    def _config(self, port: int | str, backend: int | str) -> str:
        return _HAPROXY_CONFIG.format(
            marker=self.marker, timeout_server=f"{self.timeout_server:g}", port=port, backend=backend
        )

    def outcomes(self, log: str) -> dict[str, int]:
        """From the lines the log holds, what became of the requests: how many HAProxy handled,
        how many the server answered with 200 in time, how many HAProxy gave up on at `timeout
        server` (termination state sH or sD: a server-side timeout while waiting for the answer's
        head or body; it answered 504), and how many it could not connect for (second letter C:
        it answered 503)."""
        states: Counter[tuple[str, str]] = Counter()
        for line in log.splitlines():
            if line.startswith(self.marker + " "):
                _marker, status, termination = line.split()
                states[(status, termination[:2])] += 1
        return {
            "proxy_requests": sum(states.values()),
            "proxy_200": sum(count for (status, state), count in states.items() if status == "200" and state == "--"),
            "proxy_gave_up": sum(count for (_status, state), count in states.items() if state in ("sH", "sD")),
            "proxy_no_connection": sum(count for (_status, state), count in states.items() if state[1:] == "C"),
        }


def _first_line(argv: list[str]) -> str:
    """The first line a command prints (nginx -v writes its version on standard error)."""
    result = subprocess.run(argv, check=False, capture_output=True, text=True)
    return ((result.stdout + result.stderr).strip().splitlines() or ["unknown"])[0]
