"""Idle keep-alive clients that ask once more after a binary upgrade, for scenario U1.

    python3 bench/keepalive_clients.py --port P --count 200 --seconds 60

Opens --count connections to 127.0.0.1:P, one after the other, and sends one GET on each, reading
its whole answer; then prints "KEEPALIVE-JSON {...}" with "event": "holding" and leaves every connection idle. On SIGUSR1
(the harness sends it once the upgrade is over) each connection still open sends one more GET, on
the same connection, one connection after the other; then the program prints the outcome of those
requests ("event": "again") and exits. Without SIGUSR1 it exits after --seconds, printing "again"
with nothing asked. Every read and write has a --timeout.

The answers are bench/generation.py's, "generation G pid P": the pids say which process answered,
which the harness matches to the old or the new server. The counts:

    count     connections asked for
    opened    connects that completed (holding)
    held      holding: connections kept for the second request: answered without "Connection:
              close" (one answered with it is closed, as an HTTP/1.1 client does)
    answered  complete answers with a 2xx status (holding: to the first request; again: to the second)
    non2xx    complete answers with another status
    closed    again: the server had closed the connection (end of file before an answer)
    reset     again: the connection was reset (ECONNRESET or EPIPE on the write or the read)
    timeout   again: no answer within --timeout
    error     again: any other socket error
    pids      again: {pid: answers}, the processes that answered
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import time

REQUEST = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
MAX_HEAD = 16384


class Closed(Exception):
    """The server closed the connection before a whole answer."""


def read_answer(sock: socket.socket) -> tuple[int, str, bool]:
    """One whole HTTP/1.1 answer framed by Content-Length: (status, body, whether it says
    "Connection: close")."""
    received = b""
    while (end := received.find(b"\r\n\r\n")) < 0:
        if len(received) > MAX_HEAD:
            raise Closed("answer head too long")
        chunk = sock.recv(65536)
        if not chunk:
            raise Closed("end of file")
        received += chunk
    head = received[:end].decode("latin-1").split("\r\n")
    length = 0
    close = False
    for line in head[1:]:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name == "content-length":
            length = int(value.strip())
        elif name == "connection":
            close = "close" in value.lower()
    body = received[end + 4 :]
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise Closed("end of file in the body")
        body += chunk
    return int(head[0].split(" ", 2)[1]), body[:length].decode("latin-1"), close


def ask(sock: socket.socket) -> tuple[int, str, bool]:
    sock.sendall(REQUEST)
    return read_answer(sock)


def report(event: str, figures: dict) -> None:
    print("KEEPALIVE-JSON " + json.dumps(dict(event=event, **figures)), flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/keepalive_clients.py", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds for each connect, write and read")
    parser.add_argument("--seconds", type=float, default=60.0, help="exit after this long in any case")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.seconds

    asked_again: list[bool] = []
    signal.signal(signal.SIGUSR1, lambda *_: asked_again.append(True))
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: sys.exit(1))

    held = []
    first = {"count": args.count, "opened": 0, "answered": 0, "non2xx": 0, "failed": 0}
    for _ in range(args.count):
        try:
            sock = socket.create_connection(("127.0.0.1", args.port), timeout=args.timeout)
        except OSError:
            first["failed"] += 1
            continue
        first["opened"] += 1
        try:
            status, _body, close = ask(sock)
        except (OSError, Closed):
            first["failed"] += 1
            sock.close()
            continue
        first["answered" if 200 <= status < 300 else "non2xx"] += 1
        if close:  # as any HTTP/1.1 client does: the server will not read another request
            sock.close()
        else:
            held.append(sock)
    first["held"] = len(held)
    report("holding", first)

    while not asked_again and time.monotonic() < deadline:
        time.sleep(0.05)
    again = {"asked": 0, "answered": 0, "non2xx": 0, "closed": 0, "reset": 0, "timeout": 0, "error": 0, "pids": {}}
    if asked_again:
        for sock in held:
            again["asked"] += 1
            try:
                status, body, _close = ask(sock)
            except (ConnectionResetError, BrokenPipeError):
                again["reset"] += 1
                continue
            except TimeoutError:
                again["timeout"] += 1
                continue
            except Closed:
                again["closed"] += 1
                continue
            except OSError:
                again["error"] += 1
                continue
            again["answered" if 200 <= status < 300 else "non2xx"] += 1
            pid = body.split()[-1] if body.startswith("generation ") else "?"
            again["pids"][pid] = again["pids"].get(pid, 0) + 1
    for sock in held:
        sock.close()
    report("again", again)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
