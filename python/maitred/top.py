"""`maitred top --stats ADDRESS`: a live terminal view of a running maitred.

It reads the stats listener's /status.json (docs/METRICS.md) every interval and draws, with
curses, the server's counts, its current diagnoses and one row per worker. Rates and the
queue wait's percentiles come from the difference between two answers: the server keeps
cumulative counters and histograms, and the reader chooses the span.

The answers are fetched on a thread of their own, so that a stats address that does not
answer never keeps `q` from being read; only the main thread touches the terminal.
"""

from __future__ import annotations

import curses
import http.client
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from maitred import config

STATUS_PATH = "/status.json"

# How long one fetch may take before it counts as no answer. The lobby answers at once even
# when every worker is busy, so this only bounds a wedged or unreachable listener.
FETCH_TIMEOUT = 5.0

# How often the keyboard is looked at, in milliseconds: how soon `q` and a resize are seen.
KEY_POLL_MS = 100


class CannotShow(Exception):
    """`top` cannot run here (no terminal); str(error) is one line for the operator."""


class BadAnswer(Exception):
    """The stats listener could not be reached or did not answer with a status; str(error)
    is one line for the screen."""


@dataclass(frozen=True)
class Options:
    address: str
    """Canonical, as config checks --stats: HOST:PORT, [IPV6]:PORT or unix:/ABSOLUTE/PATH."""
    interval: float


def parse_arguments(argv: Sequence[str]) -> Options:
    """`maitred top`'s command line. Raises config.UsageError; --help prints and exits."""
    parser = config.ArgumentParser(
        prog="maitred top",
        description="Show a running maitred live: its counts, diagnoses and workers, read from "
        "the stats listener's /status.json (a maitred started with --stats ADDRESS). q quits.",
        allow_abbrev=False,
    )
    parser.add_argument(
        "--stats",
        required=True,
        metavar="ADDRESS",
        # The server's own --stats grammar, so that the address given to both reads the same.
        type=config.argument_type(config.BY_NAME["stats"].parse, "stats"),
        help="The stats listener's address, as given to the server's --stats: HOST:PORT or unix:PATH.",
    )
    parser.add_argument(
        "--interval",
        metavar="SECONDS",
        type=config.argument_type(config.seconds(allow_zero=False), "interval"),
        default=1.0,
        help="Seconds between two readings (default: 1).",
    )
    parsed = parser.parse_args(list(argv))
    return Options(address=parsed.stats, interval=parsed.interval)


# ---------------------------------------------------------------------------------------------
# Reading /status.json.


class _UnixConnection(http.client.HTTPConnection):
    """HTTP/1.1 over a unix stream socket: http.client with its connection made to a path."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.unix_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def fetch(address: str, timeout: float = FETCH_TIMEOUT) -> dict:
    """GET /status.json from the stats listener at `address`: the decoded object. Raises
    BadAnswer, with one line saying what went wrong."""
    if address.startswith("unix:"):
        connection: http.client.HTTPConnection = _UnixConnection(address[len("unix:") :], timeout)
    else:
        connection = http.client.HTTPConnection(address, timeout=timeout)
    try:
        connection.request("GET", STATUS_PATH)
        response = connection.getresponse()
        body = response.read()
    except TimeoutError:
        raise BadAnswer(f"{address} did not answer within {timeout:g} s") from None
    except OSError as error:
        raise BadAnswer(f"cannot reach {address}: {error.strerror or error}") from None
    except http.client.HTTPException as error:
        raise BadAnswer(f"{address} answered something other than HTTP: {type(error).__name__} {error}") from None
    finally:
        connection.close()
    if response.status != 200:
        said = body.decode(errors="replace").strip().splitlines()
        hint = f": {said[0]}" if said else ""
        raise BadAnswer(f"GET {STATUS_PATH} at {address} answered {response.status} {response.reason}{hint}")
    try:
        status = json.loads(body)
    except ValueError as error:
        raise BadAnswer(f"GET {STATUS_PATH} at {address} answered something other than JSON: {error}") from None
    if not isinstance(status, dict):
        raise BadAnswer(f"GET {STATUS_PATH} at {address} answered a JSON {type(status).__name__}, not an object")
    return status


@dataclass(frozen=True)
class Answer:
    status: dict
    received: float
    """time.time() when it arrived."""


@dataclass(frozen=True)
class Reading:
    """What the poller knows, replaced whole at each poll (the main thread reads it)."""

    latest: Answer | None
    """The last answer, or None before the first."""
    earlier: Answer | None
    """The answer before it, from which rates and recent percentiles are reckoned."""
    error: str | None
    """Why the last poll got no answer; None when it got one."""
    attempted: float
    """time.time() of the last poll."""


class _Poller(threading.Thread):
    def __init__(self, options: Options) -> None:
        # A daemon: a fetch that hangs until its timeout must not keep `q` from ending maitred top.
        super().__init__(name="maitred-top-poller", daemon=True)
        self.options = options
        self.reading = Reading(None, None, "no answer yet", time.time())
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            started = time.monotonic()
            attempted = time.time()
            try:
                status = fetch(self.options.address)
            except BadAnswer as error:
                previous = self.reading
                self.reading = Reading(previous.latest, previous.earlier, str(error), attempted)
            else:
                self.reading = Reading(Answer(status, time.time()), self.reading.latest, None, attempted)
            self.stopping.wait(max(0.0, self.options.interval - (time.monotonic() - started)))


# ---------------------------------------------------------------------------------------------
# From two answers to the lines of the screen. Plain text and a style for each line: no
# curses here.

PLAIN, TITLE, HEADING, ALERT = range(4)

Line = tuple[str, int]


def _printable(value: object) -> str:
    """Anything the server reports, as printable ASCII: a request's path is the client's to
    choose, and a control character in it must not reach the terminal. One character per
    cell keeps the truncation to the screen's width exact."""
    text = str(value)
    if text.isascii() and text.isprintable():
        return text
    return "".join(c if c.isascii() and c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 0.001:
        return f"{seconds * 1e6:.0f}us"
    if seconds < 1:
        return f"{seconds * 1e3:.1f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


# The order in which the names of a count are shown, as a reader follows them (the server
# sends them sorted by name). Names not listed, which a newer server may add, follow. The
# lobby's own lists (worker/scoreboard.rs, observe/status.rs) are the definition: tests/
# test_top.py fails when these name other states than a running server sends.
WORKER_STATES = ("idle", "busy", "starting", "held", "retiring")
CONNECTION_STATES = ("reading", "queued", "in_service", "writing", "websocket", "idle", "hibernating")
KERNEL_COUNTERS = ("ListenOverflows", "ListenDrops")
SHED_REASONS = ("abandoned", "overload", "deadline", "queue_timeout")
EXIT_REASONS = (
    "crash",
    "oom_kill",
    "timeout",
    "max_requests",
    "memory",
    "lifetime",
    "reload",
    "scale_down",
    "boot_failed",
    "wedged",
    "stopped",
)


def _ordered(mapping: dict, order: Sequence[str] = ()) -> list[tuple[str, object]]:
    """`mapping`'s items, those named in `order` first and in that order."""
    first = [(name, mapping[name]) for name in order if name in mapping]
    return first + [(name, value) for name, value in mapping.items() if name not in order]


def _counts(mapping: dict, order: Sequence[str] = ()) -> str:
    """`name value` pairs."""
    pairs = _ordered(mapping, order)
    return "  ".join(f"{_printable(name)} {_printable(value)}" for name, value in pairs) or "none"


def _same_server(latest: Answer, earlier: Answer | None) -> Answer | None:
    """`earlier` if its counters are the ones `latest` continues: the same lobby, later. A new
    lobby (a restart or an upgrade) starts its counters again."""
    if earlier is None:
        return None
    now, then = latest.status["server"], earlier.status["server"]
    if now["pid"] != then["pid"] or now["uptime_seconds"] <= then["uptime_seconds"]:
        return None
    return earlier


def quantile(bounds: Sequence[float], counts: Sequence[int], fraction: float) -> float | None:
    """The `fraction` quantile of a histogram's observations, from cumulative counts
    (counts[i]: observations <= bounds[i]; the last, one more than the bounds, all of them),
    assuming the observations spread evenly within their bucket. None when there are none;
    inf when it lies beyond the last bound."""
    total = counts[-1]
    if total <= 0:
        return None
    rank = fraction * total
    for index, bound in enumerate(bounds):
        if counts[index] >= rank:
            below = counts[index - 1] if index else 0
            lower = bounds[index - 1] if index else 0.0
            # Never empty: the bucket before it held fewer than `rank`, this one at least.
            inside = counts[index] - below
            return lower + (bound - lower) * (rank - below) / inside
    return float("inf")


def _recent_quantiles(now: dict, then: dict) -> tuple[int, float | None, float | None] | None:
    """How many observations a cumulative histogram took between two answers, and their p50
    and p99; None when the two cannot be compared (other buckets)."""
    if now["bounds"] != then["bounds"] or len(now["counts"]) != len(then["counts"]):
        return None
    counts = [a - b for a, b in zip(now["counts"], then["counts"])]
    return counts[-1], quantile(now["bounds"], counts, 0.5), quantile(now["bounds"], counts, 0.99)


def _beyond(value: float | None, bounds: Sequence[float]) -> str:
    if value is not None and value == float("inf"):
        return f">{_duration(bounds[-1])}"
    return _duration(value)


def _header(options: Options, reading: Reading) -> Line:
    clock = time.strftime("%H:%M:%S", time.localtime(reading.attempted))
    return (f"maitred top  stats {_printable(options.address)}  every {options.interval:g}s  {clock}  (q quits)", TITLE)


def screen_lines(options: Options, reading: Reading) -> list[Line]:
    """The whole screen, top to bottom, before it is cut to the terminal's size."""
    lines = [_header(options, reading)]
    if reading.error is not None or reading.latest is None:
        last = time.strftime("%H:%M:%S", time.localtime(reading.latest.received)) if reading.latest else "never"
        lines.append((reading.error or "no answer yet", ALERT))
        lines.append((f"trying again every {options.interval:g}s; last answer: {last}", PLAIN))
        return lines
    try:
        lines += _status_lines(reading.latest, _same_server(reading.latest, reading.earlier))
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
        # A field missing or of another type than docs/METRICS.md says: say so, do not crash.
        lines.append((f"unexpected {STATUS_PATH} from {options.address}: {type(error).__name__} {error}", ALERT))
    return lines


def _status_lines(latest: Answer, earlier: Answer | None) -> list[Line]:
    status = latest.status
    server = status["server"]
    lines: list[Line] = [
        (
            (
                f"maitred {_printable(server['version'])}  lobby pid {server['pid']}  "
                f"up {_duration(server['uptime_seconds'])}  generation {server['generation']}"
            ),
            HEADING,
        )
    ]

    # Seconds of the server's time between the two answers.
    span = server["uptime_seconds"] - earlier.status["server"]["uptime_seconds"] if earlier else None
    answered = sum(status["requests"].values())
    if earlier is not None:
        rate = f"{(answered - sum(earlier.status['requests'].values())) / span:.1f}/s"
    else:
        rate = "-/s"
    lines.append(
        (f"requests {answered}  {rate}   {_counts(status['requests'])}   refused: {_counts(status['refusals'])}", PLAIN)
    )

    queue = status["queue"]
    waits = status["queue_wait_seconds"]
    recent = _recent_quantiles(waits, earlier.status["queue_wait_seconds"]) if earlier else None
    if recent is None:
        percentiles = "queue wait p50 -  p99 -"
    else:
        taken, p50, p99 = recent
        percentiles = (
            f"queue wait p50 {_beyond(p50, waits['bounds'])}  p99 {_beyond(p99, waits['bounds'])}"
            f"  ({taken} requests in the last {span:.1f}s)"
        )
    lines.append(
        (
            f"queue {queue['waiting']} waiting, oldest {_duration(queue['oldest_wait_seconds'])}   {percentiles}",
            ALERT if queue["waiting"] else PLAIN,
        )
    )

    workers = "  ".join(f"{count} {_printable(state)}" for state, count in _ordered(status["workers"], WORKER_STATES))
    lines.append((f"workers {workers}  (target {server['workers_target']})", PLAIN))
    connections = "  ".join(
        f"{count} {_printable(state).replace('_', ' ')}"
        for state, count in _ordered(status["connections"], CONNECTION_STATES)
    )
    limit = server["max_connections"]
    lines.append((f"connections {connections}  (max {'-' if limit is None else limit})", PLAIN))
    listeners = "   ".join(
        f"{_printable(listener['name'])} queue {'-' if listener['queue'] is None else listener['queue']}"
        f"/{listener['backlog']}"
        for listener in status["listeners"]
    )
    lines.append((f"listeners {listeners or 'none'}", PLAIN))
    overflows = status["listen_overflows"]
    lines.append(
        (
            f"listen overflows (machine-wide) {_counts(overflows, KERNEL_COUNTERS)}",
            ALERT if earlier and overflows != earlier.status["listen_overflows"] else PLAIN,
        )
    )
    lines.append((f"worker exits {_counts(status['worker_exits'], EXIT_REASONS)}", PLAIN))
    overload = status["overload"]
    patience = "-" if overload["patience_seconds"] is None else _duration(overload["patience_seconds"])
    lines.append(
        (
            f"overload: {_printable(overload['policy'])}, clients wait {patience}   shed {_counts(overload['shed'], SHED_REASONS)}",
            ALERT if earlier and overload["shed"] != earlier.status["overload"]["shed"] else PLAIN,
        )
    )

    lines.append(("", PLAIN))
    diagnoses = status["diagnoses"]
    if not diagnoses:
        lines.append(("diagnoses: none", PLAIN))
    for diagnosis in diagnoses:
        lines.append(
            (
                (
                    f"! {_printable(diagnosis['name'])} [{_printable(diagnosis['scenario'])}] "
                    f"for {_duration(diagnosis['since_seconds'])}: {_printable(diagnosis['message'])}"
                    f"  fix: {_printable(diagnosis['fix'])}"
                ),
                ALERT,
            )
        )

    lines.append(("", PLAIN))
    heading = ("PID", "GEN", "STATE", "SERVED", "ADMIT", "STREAMS", "LAG", "RSS MB", "AGE")
    lines.append((_row(heading, "REQUEST"), HEADING))
    for worker in status["scoreboard"]:
        rss = worker["rss_bytes"]
        cells = (worker["pid"], worker["generation"], _printable(worker["state"]), worker["served"])
        cells += _asgi_counts(worker) + ("-" if rss is None else f"{rss / 2**20:.1f}", _duration(worker["age_seconds"]))
        lines.append((_row(cells, _doing(worker["request"])), PLAIN))
        threads = worker.get("threads") or []
        if len(threads) > 1:
            # A line per thread (--threads): each is a seat of its own.
            for number, request in enumerate(threads):
                cells = ("", "", f"thread {number}", "", "", "", "", "", "")
                lines.append((_row(cells, _doing(request) or "-"), PLAIN))
    return lines


# The scoreboard's columns: each one's width, and whether it is aligned left.
_COLUMNS = ((8, False), (4, False), (9, True), (8, False), (6, False), (7, False), (6, False), (8, False), (8, False))


def _row(cells: tuple, request: str) -> str:
    """A scoreboard row: its cells in their columns, then the request."""
    aligned = (f"{cell!s:<{width}}" if left else f"{cell!s:>{width}}" for cell, (width, left) in zip(cells, _COLUMNS))
    return f"{' '.join(aligned)}  {request}"


def _asgi_counts(worker: dict) -> tuple[str, str, str]:
    """An ASGI worker's requests admitted whose answers have not started, its open streams and its
    event loop's last lag (docs/ASGI.md, "Streams and admission"); dashes for a WSGI worker, and
    for a lag a lobby that does not say."""
    if not worker.get("asgi"):
        return "-", "-", "-"
    return str(worker["admitted"]), str(worker["streams"]), _duration(worker.get("loop_lag_seconds"))


def _doing(request: dict | None) -> str:
    """What a worker or one of its threads is busy with, or nothing."""
    if request is None:
        return ""
    return f"{_printable(request['method'])} {_printable(request['path'])} for {_duration(request['elapsed_seconds'])}"


# ---------------------------------------------------------------------------------------------
# The terminal.


def _draw(window: curses.window, lines: list[Line], styles: dict[int, int]) -> None:
    height, width = window.getmaxyx()
    window.erase()
    if len(lines) > height:
        hidden = len(lines) - height + 1
        lines = [*lines[: height - 1], (f"... {hidden} more lines: enlarge the terminal", ALERT)]
    for row, (text, style) in enumerate(lines):
        # One column short of the edge: writing the bottom-right cell makes curses fail.
        if width > 1:
            try:
                window.addnstr(row, 0, text, width - 1, styles[style])
            except curses.error:
                pass  # the terminal shrank after getmaxyx; the resize that follows redraws
    window.refresh()


def _show(window: curses.window, options: Options) -> None:
    try:
        curses.curs_set(0)
    except curses.error:
        pass  # a terminal that cannot hide its cursor shows it
    styles = {PLAIN: curses.A_NORMAL, TITLE: curses.A_REVERSE, HEADING: curses.A_BOLD, ALERT: curses.A_BOLD}
    window.timeout(KEY_POLL_MS)
    poller = _Poller(options)
    poller.start()
    try:
        shown: Reading | None = None
        while True:
            key = window.getch()
            if key in (ord("q"), ord("Q")):
                return
            reading = poller.reading
            if reading is not shown or key == curses.KEY_RESIZE:
                _draw(window, screen_lines(options, reading), styles)
                shown = reading
    finally:
        poller.stopping.set()


def run(options: Options) -> int:
    """Shows the view until `q` (or Ctrl-C); 0. Raises CannotShow without a terminal."""
    if not (os.isatty(sys.stdin.fileno()) and os.isatty(sys.stdout.fileno())):
        raise CannotShow("maitred top needs a terminal: its standard input and output must be one")
    try:
        curses.wrapper(_show, options)
    except KeyboardInterrupt:
        pass  # Ctrl-C quits as q does; curses.wrapper has restored the terminal
    except curses.error as error:
        raise CannotShow(f"maitred top cannot use this terminal (TERM={os.environ.get('TERM', '')}): {error}") from None
    return 0
