"""Holds many TCP connections open against a server on 127.0.0.1, for scenarios C1 and M1.

    python3 bench/connections.py slow --port P --count 2000    # C1: request heads that never end
    python3 bench/connections.py idle --port P --count 10000   # M1: one request, then idle keep-alive
    python3 bench/connections.py idle-h2 --port P --count 10000   # M1-H2: the same over HTTP/2

slow: each connection sends a request line and a Host header at once, then one more byte of a
header every --interval seconds (5 s): the head never ends, so a server either holds the
connection or closes it (a header timeout), and nothing else.
idle: each connection sends one GET, reads the whole response, then stays open without a word,
as a browser or a proxy's pool does between requests.
idle-h2: idle's over HTTP/2 with prior knowledge: each connection sends the preface, an empty
SETTINGS, a WINDOW_UPDATE opening the connection's window (as curl, h2load and browsers do) and
one GET on stream 1, reads until that stream ends, then stays open, acknowledging the server's
SETTINGS and PINGs as every client must (and nothing else).

At most --in-flight connections are being opened (or, for idle, awaiting their response) at once,
so that the server's accept queue sets the pace rather than overflowing. Once every connection is
open (or has failed), or --open-seconds have passed, the program prints its counts as a line
"CONNECTIONS-JSON {...}" with "event": "holding", and goes on holding them until SIGTERM, SIGINT or
--seconds after its start; then it prints the counts again ("event": "end") and exits. The counts:

    count      connections asked for
    started    connections whose connect() was issued
    opened     connects that completed
    refused    connects that failed (refused, reset, timed out)
    pending    connects still in progress, plus (idle) requests still awaiting their response
    answered   idle: complete responses read; slow: connections on which the server sent anything
    non2xx     idle: responses with a status outside 200-299 (idle-h2: a :status other than the
               200, 204 or 206 that HPACK's static table indexes, which is how servers send them)
    closed     connections the server closed (end of file or reset) after they opened
    open       connections open now (opened and not closed)
    held       idle: answered and still open (what M1 counts as held); slow: the same as open
    seconds    since the start
"""

from __future__ import annotations

import argparse
import errno
import json
import resource
import selectors
import signal
import socket
import sys
import time
from collections import deque

REQUEST = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
SLOW_START = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n"
# What a slow connection trickles, one byte per interval: header lines that never end the head.
SLOW_TRICKLE = b"X-Slow: 1\r\n"
# The longest response head an idle connection accepts before calling the response broken.
MAX_HEAD = 16384

# idle-h2's opening, all at once: the preface, an empty SETTINGS frame, a WINDOW_UPDATE that
# opens the connection's window to 32 MiB as curl's does (h2load opens it to 1 GiB, browsers to
# 12-15 MiB), and HEADERS on stream 1 (END_STREAM, END_HEADERS) whose block is HPACK's static
# entries for GET, http and / and the :authority name with a literal value.
H2_AUTHORITY = b"127.0.0.1"
H2_BLOCK = bytes([0x82, 0x86, 0x84, 0x41, len(H2_AUTHORITY)]) + H2_AUTHORITY
H2_CONNECTION_WINDOW = 32 * 1024 * 1024
H2_OPENING = (
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    + bytes([0, 0, 0, 0x4, 0, 0, 0, 0, 0])
    + bytes([0, 0, 4, 0x8, 0, 0, 0, 0, 0])
    + (H2_CONNECTION_WINDOW - 65535).to_bytes(4, "big")
    + len(H2_BLOCK).to_bytes(3, "big")
    + bytes([0x1, 0x5, 0, 0, 0, 1])
    + H2_BLOCK
)
H2_DATA, H2_HEADERS, H2_SETTINGS, H2_PING = 0x0, 0x1, 0x4, 0x6
H2_END_STREAM, H2_ACK, H2_PADDED, H2_PRIORITY = 0x1, 0x1, 0x8, 0x20
# HPACK's static table: indexes 8, 9 and 10 are :status 200, 204 and 206.
H2_SUCCESS = (0x88, 0x89, 0x8A)

CONNECTING, AWAITING, HOLDING, GONE = "connecting", "awaiting", "holding", "gone"


def response_status(received: bytes) -> str | None:
    """The status code of the HTTP response at the start of received ("" if its status line has
    none) once all of it is in: its head and Content-Length bytes of body; None until then.
    Raises ValueError when the head runs past MAX_HEAD."""
    end = received.find(b"\r\n\r\n")
    if end < 0:
        if len(received) > MAX_HEAD:
            raise ValueError(f"a response head over {MAX_HEAD} bytes")
        return None
    head = received[:end].decode("latin-1").split("\r\n")
    length = 0
    for line in head[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    if len(received) - (end + 4) < length:
        return None
    status_line = head[0].split(" ", 2)
    return status_line[1] if len(status_line) > 1 else ""


class Connection:
    __slots__ = ("answered", "headed", "received", "sent", "sock", "state")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.state = CONNECTING
        self.received = b""
        self.sent = 0  # slow: bytes of SLOW_TRICKLE sent so far
        self.answered = False
        self.headed = False  # idle-h2: the answer's header block has come


# States in which a connection counts against --in-flight.
IN_FLIGHT = (CONNECTING, AWAITING)


class Crowd:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.selector = selectors.DefaultSelector()
        self.connections: list[Connection] = []
        self.started_at = time.monotonic()
        self.counts = dict.fromkeys(("started", "opened", "refused", "answered", "non2xx", "closed"), 0)
        self.in_flight = 0
        # slow: connections in the order their next byte is due; each goes to the back after
        # sending, and every interval is the same, so the front is always the next one due.
        self.trickle: deque[tuple[float, Connection]] = deque()

    def move(self, connection: Connection, state: str) -> None:
        self.in_flight += (state in IN_FLIGHT) - (connection.state in IN_FLIGHT)
        connection.state = state

    # -- opening -------------------------------------------------------------------------------

    def open_more(self) -> None:
        while self.in_flight < self.args.in_flight and self.counts["started"] < self.args.count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            connection = Connection(sock)
            self.connections.append(connection)
            self.counts["started"] += 1
            self.in_flight += 1
            code = sock.connect_ex(("127.0.0.1", self.args.port))
            if code not in (0, errno.EINPROGRESS):
                self.counts["refused"] += 1
                self.forget(connection)
                continue
            self.selector.register(sock, selectors.EVENT_WRITE, connection)

    def connected(self, connection: Connection) -> None:
        self.selector.unregister(connection.sock)
        if connection.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
            self.counts["refused"] += 1
            self.forget(connection)
            return
        self.counts["opened"] += 1
        first = {"idle": REQUEST, "idle-h2": H2_OPENING, "slow": SLOW_START}[self.args.mode]
        try:
            connection.sock.send(first)  # a few dozen bytes: they fit in an empty send buffer
        except OSError:
            self.counts["closed"] += 1
            self.forget(connection)
            return
        self.selector.register(connection.sock, selectors.EVENT_READ, connection)
        if self.args.mode != "slow":
            self.move(connection, AWAITING)
        else:
            self.move(connection, HOLDING)
            self.trickle.append((time.monotonic() + self.args.interval, connection))

    # -- reading -------------------------------------------------------------------------------

    def readable(self, connection: Connection) -> None:
        try:
            data = connection.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.server_closed(connection)
        elif self.args.mode == "idle-h2":
            connection.received += data
            self.read_frames(connection)
        elif connection.state == AWAITING:
            connection.received += data
            self.read_response(connection)
        elif not connection.answered:
            # slow: the server answered a head that never ended (408, 400...); an idle
            # connection that hears something unasked is counted the same way.
            connection.answered = True
            self.counts["answered"] += 1

    def read_response(self, connection: Connection) -> None:
        try:
            status = response_status(connection.received)
        except ValueError:  # a head longer than MAX_HEAD
            self.server_closed(connection)
            return
        if status is None:
            return
        connection.received = b""
        connection.answered = True
        self.move(connection, HOLDING)
        self.counts["answered"] += 1
        if not status.startswith("2"):
            self.counts["non2xx"] += 1

    def read_frames(self, connection: Connection) -> None:
        """idle-h2: takes the whole frames received: the answer on stream 1 (its status from the
        first byte of its header block), and the SETTINGS and PINGs to acknowledge."""
        received = connection.received
        while len(received) >= 9:
            length = int.from_bytes(received[:3], "big")
            if len(received) < 9 + length:
                break
            kind, flags, stream = received[3], received[4], int.from_bytes(received[5:9], "big") & 0x7FFFFFFF
            payload, received = received[9 : 9 + length], received[9 + length :]
            if kind == H2_SETTINGS and not flags & H2_ACK:
                self.acknowledge(connection, bytes([0, 0, 0, H2_SETTINGS, H2_ACK, 0, 0, 0, 0]))
            elif kind == H2_PING and not flags & H2_ACK:
                self.acknowledge(connection, bytes([0, 0, 8, H2_PING, H2_ACK, 0, 0, 0, 0]) + payload)
            elif stream == 1 and kind == H2_HEADERS and not connection.headed:
                connection.headed = True
                skip = (1 if flags & H2_PADDED else 0) + (5 if flags & H2_PRIORITY else 0)
                if payload[skip] not in H2_SUCCESS:
                    self.counts["non2xx"] += 1
            if stream == 1 and kind in (H2_HEADERS, H2_DATA) and flags & H2_END_STREAM and not connection.answered:
                connection.answered = True
                self.counts["answered"] += 1
                self.move(connection, HOLDING)
        connection.received = received

    def acknowledge(self, connection: Connection, frame: bytes) -> None:
        try:
            connection.sock.send(frame)  # a few bytes: they fit in the send buffer
        except OSError:
            pass  # the server closed: the next read says so

    def server_closed(self, connection: Connection) -> None:
        self.counts["closed"] += 1
        self.selector.unregister(connection.sock)
        self.forget(connection)

    def forget(self, connection: Connection) -> None:
        self.move(connection, GONE)
        connection.sock.close()

    # -- trickling (slow) ----------------------------------------------------------------------

    def send_due_bytes(self, now: float) -> None:
        while self.trickle and self.trickle[0][0] <= now:
            due, connection = self.trickle.popleft()
            if connection.state == GONE:
                continue
            byte = SLOW_TRICKLE[connection.sent % len(SLOW_TRICKLE) :][:1]
            try:
                connection.sock.send(byte)
            except BlockingIOError:
                pass  # the server stopped reading and the buffer is full: still held
            except OSError:
                self.server_closed(connection)
                continue
            connection.sent += 1
            self.trickle.append((due + self.args.interval, connection))

    # -- the loop ------------------------------------------------------------------------------

    def run(self, stop: list[bool]) -> None:
        reported = False
        deadline = self.started_at + self.args.seconds
        open_deadline = self.started_at + self.args.open_seconds
        while not stop and time.monotonic() < deadline:
            self.open_more()
            now = time.monotonic()
            settled = self.counts["started"] == self.args.count and self.in_flight == 0
            if not reported and (settled or now >= open_deadline):
                self.report("holding")
                reported = True
            wait = 0.1
            if self.trickle:
                wait = max(0.0, min(wait, self.trickle[0][0] - now))
            for key, _events in self.selector.select(wait):
                connection = key.data
                if connection.state == CONNECTING:
                    self.connected(connection)
                elif connection.state != GONE:
                    self.readable(connection)
            self.send_due_bytes(time.monotonic())
        if not reported:
            self.report("holding")
        self.report("end")

    def report(self, event: str) -> None:
        live = [c for c in self.connections if c.state != GONE]
        held = sum(c.state == HOLDING for c in live)
        figures = dict(
            event=event,
            mode=self.args.mode,
            count=self.args.count,
            **self.counts,
            pending=sum(c.state in IN_FLIGHT for c in live),
            open=sum(c.state != CONNECTING for c in live),
            held=held,
            seconds=round(time.monotonic() - self.started_at, 3),
        )
        print("CONNECTIONS-JSON " + json.dumps(figures), flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/connections.py", description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("slow", "idle", "idle-h2"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--interval", type=float, default=5.0, help="slow: seconds between bytes")
    parser.add_argument("--in-flight", type=int, default=500, help="connections opening at once")
    parser.add_argument(
        "--open-seconds",
        type=float,
        default=15.0,
        help="report 'holding' after this long even if some are still opening",
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="exit after this long in any case")
    args = parser.parse_args(argv)

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < args.count + 64:
        print(
            f"connections.py: the open-files limit ({hard}) is below the {args.count + 64} that "
            f"{args.count} connections need",
            file=sys.stderr,
        )
        return 2
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    stop: list[bool] = []
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: stop.append(True))
    Crowd(args).run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
