"""The reverse proxy in front of the server under test in scenario S5: nginx from Debian, keeping
persistent HTTP/1.1 connections to the backend, as a production deployment behind nginx would.

The proxy is part of the scenario, not a server under test: each run writes its configuration
into the run's work directory, starts it (in its own process group) once the backend is ready,
sends the load to its port, and stops it before the backend.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

NGINX = "/usr/sbin/nginx"

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

    def available(self) -> bool:
        return shutil.which(NGINX) is not None

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
