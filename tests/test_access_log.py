"""The access log's format (--access-logformat): gunicorn's atoms, maitred's queue_ms and
app_ms, the json form, a wrong format refused at start, and a new format on SIGHUP.
docs/LIMITS.md ("The access log's format") describes each atom."""

from __future__ import annotations

import datetime
import json
import re
import signal
import socket
from pathlib import Path

from client import read_reply
from conftest import HOST, Server, wait_until
from test_cli import assert_one_error_line

# gunicorn's default format, which is maitred's.
GUNICORN_DEFAULT = '%(h)s %(l)s %(u)s %(t)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s"'

APP = """\
import os, time
from urllib.parse import parse_qs


def app(environ, start_response):
    query = parse_qs(environ["QUERY_STRING"])
    if "sleep" in query:
        time.sleep(float(query["sleep"][0]))
    body = f"{os.getpid()}\\n".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("X-Trace", "trace-7"),
                              ("Content-Length", str(len(body)))])
    return [body]
"""

# alice:secret
REQUEST = (
    b"GET /p/q?a=1&b=2&sleep=0.2 HTTP/1.1\r\n"
    b"Host: test\r\n"
    b"Referer: http://ref.example/\r\n"
    b"User-Agent: access-test/1.0\r\n"
    b"Authorization: Basic YWxpY2U6c2VjcmV0\r\n"
    b"X-Request-Id: req-42\r\n"
    b"\r\n"
)


def serve(maitred_server, app_dir: Path, *args: str, env: dict[str, str] | None = None) -> tuple[Server, Path]:
    (app_dir / "logged.py").write_text(APP)
    access_log = app_dir / "access.log"
    server = maitred_server("--access-logfile", str(access_log), *args, "logged:app", cwd=app_dir, env=env)
    return server, access_log


def request(server: Server, raw: bytes = REQUEST) -> int:
    """Sends `raw`; returns the pid of the worker that answered."""
    with socket.create_connection((HOST, server.port), timeout=20) as sock:
        sock.sendall(raw)
        reply = read_reply(sock)
    assert reply.status == 200
    return int(reply.body)


def lines(access_log: Path, count: int) -> list[str]:
    wait_until(lambda: access_log.exists() and access_log.read_text().count("\n") >= count, 5, f"{count} lines")
    found = access_log.read_text().splitlines()
    assert len(found) == count, found
    return found


TIME = r"\[\d{2}/[A-Z][a-z]{2}/\d{4}:\d{2}:\d{2}:\d{2} \+0000\]"


def test_the_default_line_is_gunicorns_default_format(maitred_server, app_dir):
    # The same request, once without a format and once with gunicorn's default spelt out:
    # the same line, which is today's (the combined log format).
    plain, plain_log = serve(maitred_server, app_dir)
    request(plain, REQUEST.replace(b"Authorization: Basic YWxpY2U6c2VjcmV0\r\n", b""))
    other = app_dir.parent / "other"
    other.mkdir()
    spelt, spelt_log = serve(maitred_server, other, "--access-logformat", GUNICORN_DEFAULT)
    request(spelt, REQUEST.replace(b"Authorization: Basic YWxpY2U6c2VjcmV0\r\n", b""))
    expected = re.compile(
        rf'^127\.0\.0\.1 - - {TIME} "GET /p/q\?a=1&b=2&sleep=0\.2 HTTP/1\.1" 200 \d+ '
        r'"http://ref\.example/" "access-test/1\.0"$'
    )
    [first] = lines(plain_log, 1)
    [second] = lines(spelt_log, 1)
    assert expected.match(first), first
    time_of = re.compile(TIME)
    assert time_of.sub("[T]", first) == time_of.sub("[T]", second)


def test_every_gunicorn_atom_and_maitreds_own(maitred_server, app_dir):
    atoms = [*"hlutrmUqHsBbfaTMDLp", "{x-request-id}i", "{X-Trace}o", "{X-Missing}o", "{ACCESS_TEST_VAR}e"]
    atoms += ["{ACCESS_TEST_UNSET}e", "queue_ms", "app_ms"]
    format_ = "%%|" + "|".join(f"%({atom})s" for atom in atoms)
    server, access_log = serve(maitred_server, app_dir, "--access-logformat", format_, env={"ACCESS_TEST_VAR": 'a "b"'})
    pid = request(server)
    [line] = lines(access_log, 1)
    fields = line.split("|")
    assert fields.pop(0) == "%"
    values = dict(zip(atoms, fields, strict=True))
    assert re.fullmatch(TIME, values.pop("t")), line
    seconds, millis, micros = int(values.pop("T")), int(values.pop("M")), int(values.pop("D"))
    decimal = float(values.pop("L"))
    # The app sleeps 0.2 s; the request, its time in the worker and its wait agree with that.
    assert 0.2 <= decimal < 5 and seconds == int(decimal), line
    assert millis == micros // 1000 and abs(micros / 1e6 - decimal) < 1e-5, line
    app_ms, queue_ms = float(values.pop("app_ms")), float(values.pop("queue_ms"))
    assert 200 <= app_ms <= micros / 1e3, line
    assert 0 <= queue_ms < 200, line
    assert values == {
        "h": "127.0.0.1",
        "l": "-",
        "u": "alice",
        "r": "GET /p/q?a=1&b=2&sleep=0.2 HTTP/1.1",
        "m": "GET",
        "U": "/p/q",
        "q": "a=1&b=2&sleep=0.2",
        "H": "HTTP/1.1",
        "s": "200",
        "B": str(len(f"{pid}\n")),
        "b": str(len(f"{pid}\n")),
        "f": "http://ref.example/",
        "a": "access-test/1.0",
        "p": f"<{pid}>",
        "{x-request-id}i": "req-42",
        "{X-Trace}o": "trace-7",
        "{X-Missing}o": "-",
        "{ACCESS_TEST_VAR}e": 'a \\"b\\"',
        "{ACCESS_TEST_UNSET}e": "-",
    }


def test_json_has_every_atom_under_a_name(maitred_server, app_dir):
    server, access_log = serve(maitred_server, app_dir, "--access-logformat", "json")
    pid = request(server)
    [line] = lines(access_log, 1)
    record = json.loads(line)
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z", record.pop("time")), line
    assert 0.2 <= record.pop("request_time") < 5, line
    assert 200_000 <= record.pop("request_time_us") < 5_000_000, line
    assert 200 <= record.pop("app_ms") < 5_000, line
    assert 0 <= record.pop("queue_ms") < 200, line
    assert record == {
        "remote_addr": "127.0.0.1",
        "user": "alice",
        "request": "GET /p/q?a=1&b=2&sleep=0.2 HTTP/1.1",
        "method": "GET",
        "path": "/p/q",
        "query": "a=1&b=2&sleep=0.2",
        "protocol": "HTTP/1.1",
        "status": 200,
        "bytes": len(f"{pid}\n"),
        "referer": "http://ref.example/",
        "user_agent": "access-test/1.0",
        "pid": pid,
        "tls_version": None,
        "tls_cipher": None,
    }


def test_an_unknown_atom_is_refused_at_start_in_one_line(run_maitred, app_dir):
    (app_dir / "logged.py").write_text(APP)
    result = run_maitred("--access-logformat", "%(h)s %(x)s", "logged:app", cwd=app_dir, linger=0)
    assert result.returncode == 2
    assert_one_error_line(result.stderr, "--access-logformat", "unknown atom %(x)s")
    assert result.leftovers == []
    # The same from a config file, under gunicorn's name for the setting.
    (app_dir / "maitred.conf.py").write_text("access_log_format = '%(h)s %(s)d'\n")
    result = run_maitred("-c", "maitred.conf.py", "logged:app", cwd=app_dir, linger=0)
    assert result.returncode == 2
    assert_one_error_line(result.stderr, "access_log_format", "must be written %(s)s")


def test_sighup_takes_the_config_files_new_format(maitred_server, app_dir):
    config_file = app_dir / "maitred.conf.py"
    config_file.write_text("access_log_format = 'first %(s)s %(U)s'\n")
    server, access_log = serve(maitred_server, app_dir, "-c", str(config_file))
    request(server, b"GET /one HTTP/1.1\r\nHost: test\r\n\r\n")
    assert lines(access_log, 1) == ["first 200 /one"]
    config_file.write_text("access_log_format = 'second %(m)s %({host}i)s'\n")
    server.send_signal(signal.SIGHUP)
    server.wait_for_log("SIGHUP: reloaded", 10)
    request(server, b"GET /two HTTP/1.1\r\nHost: test\r\n\r\n")
    assert lines(access_log, 2) == ["first 200 /one", "second GET test"]
    assert server.stop() == 0


CLOCKS_APP = """\
import os


def app(environ, start_response):
    environ["wsgi.errors"].write(f"wsgi.errors from {os.getpid()}\\n")
    print(f"printed by {os.getpid()}", flush=True)
    body = f"{os.getpid()}\\n".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
"""

STAMP = re.compile(r"^\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) ([+-]\d{4})\] \[(\d+)\] ", re.MULTILINE)


def test_one_clock_for_every_process_under_a_time_zone_not_utc(maitred_server, app_dir):
    """UTC, +0000, for the lobby's lines, the zygote's, the workers' and the access log's, on a
    host whose TZ is Asia/Tokyo (+0900, no daylight saving): one log, one clock."""
    (app_dir / "clocks.py").write_text(CLOCKS_APP)
    access_log = app_dir / "access.log"
    server = maitred_server(
        *("--access-logfile", str(access_log), "--log-level", "debug", "clocks:app"),
        cwd=app_dir,
        env={"TZ": "Asia/Tokyo"},
    )
    before = datetime.datetime.now(datetime.timezone.utc)
    worker = request(server)
    log = server.wait_for_log(f"[{worker}] [INFO] [app] printed by {worker}", timeout=10)
    log = server.wait_for_log(f"wsgi.errors from {worker}", timeout=10)
    stamps = STAMP.findall(log)
    writers = {int(pid) for _, _, pid in stamps}
    assert {server.pid, worker} <= writers, log
    for written, offset, pid in stamps:
        assert offset == "+0000", f"process {pid} wrote {written} {offset}:\n{log}"
        when = datetime.datetime.strptime(written, "%Y-%m-%d %H:%M:%S").replace(tzinfo=datetime.timezone.utc)
        assert abs(when - before) < datetime.timedelta(minutes=5), f"process {pid} wrote {written}, not UTC"
    (line,) = lines(access_log, 1)
    assert re.search(TIME, line), line
    stamped = datetime.datetime.strptime(re.search(TIME, line).group(0), "[%d/%b/%Y:%H:%M:%S +0000]")
    assert abs(stamped.replace(tzinfo=datetime.timezone.utc) - before) < datetime.timedelta(minutes=5)
