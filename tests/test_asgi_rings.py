"""How an ASGI worker's answers wake the lobby (docs/PROTOCOL.md, section 4): the answers of one
turn of the loop ring once, at the turn's end; a lobby about to sleep reads the answers not rung
for yet; and the watchdog's thread rings for an answer written before the loop blocked."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

from client import get, read_reply
from conftest import HOST, Server, eventually

TIMEOUT = 10.0
APPS = Path(__file__).resolve().parent / "apps"


def sleeps(pid: int) -> int:
    """How many times the lobby's event loop has slept: its thread's voluntary context switches."""
    status = Path(f"/proc/{pid}/task/{pid}/status").read_text()
    return int(status.split("voluntary_ctxt_switches:")[1].split()[0])


def gated(maitred_server: Callable[..., Server], marks: Path) -> tuple[Server, int]:
    """tests/apps/gated.py on one worker, and its port."""
    server = maitred_server("gated:app", "-w", "1", cwd=APPS, env={"GATED_MARKS": str(marks)})
    return server, int(server.url.rsplit(":", 1)[1])


def marks_written(marks: Path, count: int) -> list[str]:
    """The application's marks, once `count` are written: it marks "answered" after its answer's
    last send, so a client may have read the answer before the mark is in the file."""

    def written() -> list[str]:
        return [line.split()[0] for line in marks.read_text().splitlines()]

    assert eventually(lambda: len(written()) >= count, TIMEOUT), written()
    return written()


def wait_at_the_gate(port: int, targets: list[str]) -> list[socket.socket]:
    """A connection for each target, whose request waits at the gate, in the order given."""
    sockets = []
    for number, target in enumerate(targets, 1):
        sockets.append(socket.create_connection((HOST, port), timeout=TIMEOUT))
        sockets[-1].sendall(f"GET {target} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
        assert eventually(lambda number=number: get(port, "/waiting").body == str(number).encode(), TIMEOUT)
    return sockets


def test_the_answers_of_one_turn_of_the_loop_wake_the_lobby_once(
    maitred_server: Callable[..., Server], tmp_path: Path
) -> None:
    # Twenty requests wait at a gate on one worker's loop. Opened, the gate lets them go in one
    # turn of the loop, each answering 0.5 ms of CPU after the last. Their bells are rung once
    # the turn has run, and the lobby, woken by the first, reads them all before it sleeps
    # again, so the other rings are not sent: the lobby sleeps a few times in all (for the
    # request that opens the gate, its connection, a timer of its own), not once an answer
    # (22 to 24 times when each answer rang at once).
    waiting = 20
    server, port = gated(maitred_server, tmp_path / "marks")
    sockets = wait_at_the_gate(port, ["/wait"] * waiting)
    try:
        before = sleeps(server.pid)
        assert get(port, "/open").body == b"open"
        assert all(read_reply(sock).body == b"done" for sock in sockets)
        slept = sleeps(server.pid) - before
    finally:
        for sock in sockets:
            sock.close()
    assert slept <= waiting // 2, f"the lobby slept {slept} times for {waiting} answers of one turn"


def test_an_answer_not_rung_for_is_read_when_the_lobby_is_about_to_sleep(
    maitred_server: Callable[..., Server], tmp_path: Path
) -> None:
    # Two requests let through in one turn: the first answers, its ring left to the end of the
    # turn; the second then holds the loop, and the interpreter's lock, so that neither the loop
    # nor the watchdog's thread rings. Another client's request wakes the lobby: before it
    # sleeps again, it finds the first answer in the ring and sends it, while the loop is held.
    marks = tmp_path / "marks"
    release = tmp_path / "release"
    release.write_bytes(b"0")
    _, port = gated(maitred_server, marks)
    sockets = wait_at_the_gate(port, ["/wait", f"/wait?hold={release}"])
    sockets.append(socket.create_connection((HOST, port), timeout=TIMEOUT))
    try:
        assert get(port, "/open").body == b"open"
        assert eventually(lambda: marks.exists() and marks.read_text().startswith("answered"), TIMEOUT)
        sockets[2].sendall(b"GET /waiting HTTP/1.1\r\nHost: test\r\n\r\n")
        assert read_reply(sockets[0]).body == b"done"
        assert "released" not in marks.read_text(), "the first answer waited for the loop to be released"
        with release.open("r+b") as flag:  # not truncated: the worker has it mapped
            flag.write(b"1")
        assert read_reply(sockets[1]).body == b"done"
        assert read_reply(sockets[2]).body == b"2"
    finally:
        for sock in sockets:
            sock.close()
    assert marks_written(marks, 3) == ["answered", "released", "answered"]


def test_an_answer_written_before_the_loop_blocks_does_not_wait_for_the_block(
    maitred_server: Callable[..., Server], tmp_path: Path
) -> None:
    # Two requests let through in one turn: the first answers, its ring left to the end of the
    # turn; the second then blocks the loop for 3 s. The watchdog's thread rings for the first
    # while the loop is blocked, so its answer arrives before the block ends.
    marks = tmp_path / "marks"
    server, port = gated(maitred_server, marks)
    sockets = wait_at_the_gate(port, ["/wait", "/wait?block=3"])
    try:
        assert get(port, "/open").body == b"open"
        assert read_reply(sockets[0]).body == b"done"
        assert "unblocked" not in marks.read_text(), "the first answer waited for the loop's block to end"
        assert read_reply(sockets[1]).body == b"done"
    finally:
        for sock in sockets:
            sock.close()
    assert marks_written(marks, 3) == ["answered", "unblocked", "answered"]
    server.wait_for_log("diagnosis S2 (blocked_event_loop)", TIMEOUT)
