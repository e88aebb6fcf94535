"""The TLS scenarios of docs/TLS.md, run side by side in one invocation, results in bench/results/tls/:

- T1-TLS: T1's load (wrk -t2 -c100 -d10s, keep-alive, hello world) over TLS: maitred; granian with
  its TLS (--ssl-certificate, --ssl-keyfile); gunicorn's gthread worker with its TLS (--certfile,
  --keyfile), 4 threads per worker as in T1. Two workers each. Reports req/s.
- M1-TLS: idle TLS keep-alive connections held against maitred: the RSS of its process group
  (the sum of VmRSS, as M1 reads it) before and once they have all been idle for 3 s; reports KB
  per connection.
- T2-TLS: a new TLS connection per request against maitred, with `openssl s_time -new` (a full
  handshake each) and `-reuse` (each resumes the first one's session); reports connections per
  second. s_time is one client process: its own half of each handshake bounds the figure.

    flock /work/bench.lock .venv/bin/python bench/tls.py [--idle 5000] [--seconds 10]

Peers come from bench/.peers (granian==2.8.7, gunicorn==27.0.1, as bench/servers.py pins them);
the certificate is an ECDSA P-256 one made with openssl for the run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from procs import free_port

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
MAITRED = REPO / ".venv" / "bin" / "maitred"
PEERS = BENCH / ".peers" / "bin"
RESULTS = BENCH / "results" / "tls"
HOST = "127.0.0.1"


def make_certificate(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
        + ["-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=localhost"]
        + ["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    return cert, key


def commands(name: str, port: int, cert: Path, key: Path) -> list[str]:
    if name == "maitred":
        return [str(MAITRED), "-w", "2", "-b", f"{HOST}:{port}", "--certfile", str(cert), "--keyfile", str(key)] + [
            "apps:hello"
        ]
    if name == "granian":
        return [str(PEERS / "granian"), "--interface", "wsgi", "--host", HOST, "--port", str(port)] + [
            "--workers",
            "2",
            "--ssl-certificate",
            str(cert),
            "--ssl-keyfile",
            str(key),
            "apps:hello",
        ]
    if name == "gunicorn-gthread":
        return [str(PEERS / "gunicorn"), "-k", "gthread", "-w", "2", "--threads", "4", "-b", f"{HOST}:{port}"] + [
            "--certfile",
            str(cert),
            "--keyfile",
            str(key),
            "apps:hello",
        ]
    raise ValueError(name)


class Server:
    def __init__(self, name: str, cert: Path, key: Path, log: Path) -> None:
        self.name = name
        self.port = free_port()
        self.argv = commands(name, self.port, cert, key)
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                self.argv, cwd=BENCH, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        context = ssl.create_default_context(cafile=str(cert))
        deadline = time.monotonic() + 30
        while True:
            try:
                with context.wrap_socket(socket.create_connection((HOST, self.port), 1), server_hostname="localhost"):
                    return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not serve TLS; see {log}") from None
                time.sleep(0.1)

    def rss_kb(self) -> int:
        """The sum of VmRSS over the server's process group, as M1 reads it."""
        total = 0
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                if int(stat[stat.rindex(")") + 2 :].split()[2]) != self.process.pid:
                    continue
                for line in (entry / "status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            except (OSError, ValueError):
                continue
        return total

    def stop(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


def t1_tls(server: Server, seconds: int, workdir: Path) -> dict:
    argv = ["wrk", "-t2", "-c100", f"-d{seconds}s", f"https://{HOST}:{server.port}/"]
    output = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    (workdir / f"T1-TLS-{server.name}.wrk").write_text(output)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", output)[1])
    errors = re.search(r"Socket errors: (.*)", output)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    return {
        "command": " ".join(argv).replace(str(server.port), "PORT"),
        "rps": rps,
        "socket_errors": errors[1] if errors else "none",
        "non2xx": int(non2xx[1]) if non2xx else 0,
    }


def complete(answer: bytes) -> bool:
    """Whether `answer` holds a whole response: its head and Content-Length bytes of body."""
    head, found, body = answer.partition(b"\r\n\r\n")
    if not found:
        return False
    length = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
    return len(body) >= (int(length[1]) if length else 0)


def m1_tls(server: Server, count: int, cert: Path) -> dict:
    context = ssl.create_default_context(cafile=str(cert))
    time.sleep(1)
    before = server.rss_kb()
    held = []
    request = b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"
    try:
        for _ in range(count):
            sock = context.wrap_socket(socket.create_connection((HOST, server.port), 10), server_hostname="localhost")
            sock.sendall(request)
            answer = b""
            while not complete(answer):
                chunk = sock.recv(4096)
                if not chunk:
                    break
                answer += chunk
            held.append(sock)
        time.sleep(3)  # idle past the lobby's 0.5 s, so that they hibernate
        after = server.rss_kb()
    finally:
        for sock in held:
            sock.close()
    return {
        "held": len(held),
        "rss_before_mb": before / 1024,
        "rss_growth_mb": (after - before) / 1024,
        "kb_per_connection": (after - before) / max(len(held), 1),
    }


def t2_tls(server: Server, seconds: int, mode: str) -> dict:
    argv = ["openssl", "s_time", "-connect", f"{HOST}:{server.port}", mode, "-time", str(seconds), "-www", "/"]
    output = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
    found = re.findall(r"(\d+) connections in ([\d.]+) real seconds", output)
    connections, real = found[-1]
    return {
        "command": " ".join(argv).replace(str(server.port), "PORT"),
        "connections": int(connections),
        "per_second": int(connections) / float(real),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", type=int, default=5000, help="M1-TLS: idle connections held")
    parser.add_argument("--seconds", type=int, default=10, help="T1-TLS and T2-TLS: seconds per run")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict = {"T1-TLS": {}, "machine": os.uname().release, "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory() as scratch:
        cert, key = make_certificate(Path(scratch))
        for name in ("maitred", "granian", "gunicorn-gthread"):
            server = Server(name, cert, key, args.out / f"{name}.log")
            try:
                results["T1-TLS"][name] = t1_tls(server, args.seconds, args.out) | {"argv": server.argv[1:]}
                if name == "maitred":
                    results["T2-TLS"] = {
                        "full handshake (-new)": t2_tls(server, args.seconds, "-new"),
                        "resumed (-reuse)": t2_tls(server, args.seconds, "-reuse"),
                    }
            finally:
                server.stop()
        server = Server("maitred", cert, key, args.out / "maitred-m1.log")
        try:
            results["M1-TLS"] = m1_tls(server, args.idle, cert)
        finally:
            server.stop()
    # The machine may be shared: what else ran is part of the figures.
    results["load_average_at_end"] = os.getloadavg()
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = ["# TLS scenarios (bench/tls.py)", "", "| T1-TLS | req/s | socket errors | non-2xx |", "|---|---|---|---|"]
    for name, run in results["T1-TLS"].items():
        lines.append(f"| {name} | {run['rps']:,.0f} | {run['socket_errors']} | {run['non2xx']} |")
    lines += ["", "| T2-TLS (maitred) | connections/s |", "|---|---|"]
    for mode, run in results["T2-TLS"].items():
        lines.append(f"| {mode} | {run['per_second']:,.0f} |")
    m1 = results["M1-TLS"]
    lines += [
        "",
        "| M1-TLS (maitred) | held | RSS before | RSS growth | KB per idle connection |",
        "|---|---|---|---|---|",
        (
            f"| maitred | {m1['held']} | {m1['rss_before_mb']:.1f} MB | {m1['rss_growth_mb']:.1f} MB | "
            f"{m1['kb_per_connection']:.2f} |"
        ),
    ]
    lines += ["", f"Load average at the end: {results['load_average_at_end'][0]:.2f} on {os.cpu_count()} CPUs."]
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
