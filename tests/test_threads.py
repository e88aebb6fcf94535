"""Threads per worker (--threads; docs/PROTOCOL.md, section 4; docs/DEPLOY.md): each thread a
seat of its own in the lobby's one FIFO, and what is per request staying per request."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

from client import Reply, get, status_of
from conftest import HOST, eventually, free_port, workers_of

APPS = Path(__file__).resolve().parent / "apps"


class Request(threading.Thread):
    """One GET in the background, timed from its own start."""

    def __init__(self, port: int, path: str) -> None:
        super().__init__(daemon=True)
        self.port, self.path = port, path
        self.reply: Reply | None = None
        self.error: BaseException | None = None
        self.took = float("inf")

    def run(self) -> None:
        started = time.monotonic()
        try:
            self.reply = get(self.port, self.path, timeout=30)
        except BaseException as error:  # noqa: BLE001 - reported by the test's assertions
            self.error = error
        self.took = time.monotonic() - started


def send(port: int, path: str) -> Request:
    request = Request(port, path)
    request.start()
    return request


def busy_threads(stats: int) -> int:
    return sum(1 for worker in status_of(stats)["scoreboard"] for line in worker["threads"] if line is not None)


def test_a_worker_runs_as_many_requests_at_once_as_it_has_threads(maitred_server):
    server = maitred_server("-w", "1", "--threads", "4", "threaded:app", cwd=APPS)
    requests = [send(server.port, "/sleep?seconds=1") for _ in range(4)]
    for request in requests:
        request.join(30)

    replies = [request.reply for request in requests]
    assert all(reply is not None and reply.status == 200 for reply in replies), [r.error for r in requests]
    pids = {reply.body.split()[0] for reply in replies}
    names = {reply.body.split()[1] for reply in replies}
    assert len(pids) == 1, "one worker process"
    assert len(names) == 4, f"each request in a thread of its own: {names}"
    assert {reply.body.split()[2] for reply in replies} == {b"True"}, "wsgi.multithread"
    # Together, not one after the other (4 s).
    assert max(request.took for request in requests) < 2.5, [round(r.took, 2) for r in requests]


def test_a_thread_running_python_does_not_keep_its_neighbour_from_a_request(maitred_server):
    """The GIL changes hands every few milliseconds: a request seated at the free thread while
    the other runs Python for longer than the lobby's 2 s read check is read, not taken for a
    wedged worker."""
    stats = free_port()
    server = maitred_server("-w", "1", "--threads", "2", "--stats", f"{HOST}:{stats}", "threaded:app", cwd=APPS)
    spinning = send(server.port, "/spin?seconds=3")
    assert eventually(lambda: busy_threads(stats) == 1, 10)
    started = time.monotonic()
    quick = get(server.port, "/who")
    took = time.monotonic() - started
    spinning.join(30)
    assert quick.status == 200 and took < 1.0, (quick, took)
    assert spinning.reply is not None and spinning.reply.status == 200, spinning.error or spinning.reply
    assert quick.body.split()[0] == spinning.reply.body.split()[0], "one worker, never replaced"
    assert "wedged" not in server.stderr()


def _in_app_of(port: int, path: str, clients: int, each: int) -> list[int]:
    """`clients` clients at once, each sending `path` `each` times one after the other: how many
    requests were in the application when each came, itself included."""
    counts: list[int] = []

    def client() -> None:
        for _ in range(each):
            reply = get(port, path, timeout=30)
            assert reply.status == 200, reply
            counts.append(int(reply.body.split()[3]))

    running = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join(60)
    assert len(counts) == clients * each, f"{len(counts)} of {clients * each} answered"
    return counts


def test_a_second_thread_takes_a_request_only_while_its_worker_has_cpu_to_spare(maitred_server):
    """Issue 47, item 9 (docs/DEPLOY.md, Threads or workers): requests that compute are run one
    at a time by a worker of four threads, since a second would only wait for the GIL; requests
    that wait on I/O are run four at a time."""
    server = maitred_server("-w", "1", "--threads", "4", "threaded:app", cwd=APPS)
    # The first answer sets the typical request's time, past four times which a request counts
    # as slow, and its neighbours may share the GIL with it.
    assert get(server.port, "/spin?seconds=0.02").status == 200
    computing = _in_app_of(server.port, "/spin?seconds=0.02", clients=4, each=8)
    alongside = sum(1 for count in computing if count > 1)
    assert alongside <= len(computing) // 8, f"{alongside} of {len(computing)} ran beside another: {computing}"
    # Shorter than four typical requests: only the CPU to spare lets a second thread in. The gate
    # counts the machine's runnable threads too (worker/gate.rs), so while something else keeps
    # the cores busy (a build beside the tests) it rightly keeps the threads idle: such a pass is
    # run again, and only a pass with CPU to spare decides.
    passes = []
    for _ in range(3):
        with _MachineLoad() as load:
            waiting = _in_app_of(server.port, "/sleep?seconds=0.03", clients=4, each=6)
        passes.append((waiting, load.busy_share()))
        if load.busy_share() < 0.5:
            break
    assert passes[-1][1] < 0.5, f"the machine had no CPU to spare in three passes: {passes}"
    assert sum(1 for count in waiting if count > 1) >= len(waiting) // 2, f"the threads were not used: {passes}"
    assert max(waiting) == 4, passes


class _MachineLoad(threading.Thread):
    """Samples the machine's runnable threads (the fourth field of /proc/loadavg, less this
    reader) every 5 ms while in use: the share of samples in which the gate's machine test
    (worker/gate.rs: runnable + 1 within 0.9 of the CPUs) had no room."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[int] = []
        self.done = threading.Event()
        self.limit = 0.9 * len(os.sched_getaffinity(0)) - 1

    def run(self) -> None:
        while not self.done.wait(0.005):
            with open("/proc/loadavg") as loadavg:
                self.samples.append(int(loadavg.read().split()[3].split("/")[0]) - 1)

    def busy_share(self) -> float:
        return sum(1 for n in self.samples if n > self.limit) / max(1, len(self.samples))

    def __enter__(self) -> _MachineLoad:  # noqa: PYI034 (3.10 has no typing.Self)
        self.start()
        return self

    def __exit__(self, *_) -> None:
        self.done.set()
        self.join()


def test_one_thread_keeps_wsgi_multithread_false(maitred_server):
    server = maitred_server("-w", "1", "threaded:app", cwd=APPS)
    assert get(server.port, "/who").body.split()[2] == b"False"


def test_quick_requests_never_wait_behind_busy_threads_while_one_is_free(maitred_server):
    """The issue's test: -w 2 --threads 2, three 2-second requests in flight, then ten quick
    ones one after another: the fourth seat serves each at once."""
    stats = free_port()
    server = maitred_server("-w", "2", "--threads", "2", "--stats", f"{HOST}:{stats}", "threaded:app", cwd=APPS)
    assert len(workers_of(server.pid, 2)) == 2
    assert eventually(lambda: [worker["state"] for worker in status_of(stats)["scoreboard"]] == ["idle"] * 2, 10)
    slow = [send(server.port, "/sleep?seconds=2") for _ in range(3)]
    assert eventually(lambda: busy_threads(stats) == 3, 10), status_of(stats)["scoreboard"]
    quick = []
    for _ in range(10):
        started = time.monotonic()
        reply = get(server.port, "/who")
        quick.append(time.monotonic() - started)
        assert reply.status == 200
    assert max(quick) < 0.5, f"quick requests took {[round(took, 3) for took in quick]} s"
    for request in slow:
        request.join(30)
    assert all(request.reply is not None and request.reply.status == 200 for request in slow)


def test_the_scoreboard_shows_each_threads_request(maitred_server):
    stats = free_port()
    server = maitred_server("-w", "1", "--threads", "3", "--stats", f"{HOST}:{stats}", "threaded:app", cwd=APPS)
    slow = [send(server.port, "/sleep?seconds=1") for _ in range(2)]
    assert eventually(lambda: busy_threads(stats) == 2, 10)
    (worker,) = status_of(stats)["scoreboard"]
    assert len(worker["threads"]) == 3
    assert [line["path"] for line in worker["threads"] if line is not None] == ["/sleep", "/sleep"]
    assert worker["state"] == "busy" and worker["request"]["path"] == "/sleep"
    assert status_of(stats)["seats"] == {"busy": 2, "free": 1}
    metrics = get(stats, "/metrics").body.decode()
    assert 'maitred_seats{state="busy"} 2' in metrics and 'maitred_seats{state="free"} 1' in metrics, metrics
    for request in slow:
        request.join(30)


def test_a_thread_past_timeout_gets_504_and_the_others_finish_before_the_worker_is_replaced(maitred_server):
    stats = free_port()
    server = maitred_server(
        "-w", "1", "--threads", "2", "--timeout", "3", "--graceful-timeout", "5", "--stats", f"{HOST}:{stats}",
        "threaded:app", cwd=APPS,
    )  # fmt: skip
    (first,) = workers_of(server.pid, 1)
    stuck = send(server.port, "/sleep?seconds=30")

    def stuck_for(seconds: float) -> bool:
        request = status_of(stats)["scoreboard"][0]["request"]
        return request is not None and request["elapsed_seconds"] >= seconds

    # Sent 1.5 s into the stuck one, it is still running when that one passes its 3 s, and
    # ends well within its own.
    assert eventually(lambda: stuck_for(1.5), 10)
    finishing = send(server.port, "/sleep?seconds=2")
    stuck.join(30)
    finishing.join(30)

    assert stuck.reply is not None and stuck.reply.status == 504, stuck.error or stuck.reply
    # Its neighbour was running when the worker timed out, yet answered: the worker waited for it.
    assert finishing.reply is not None and finishing.reply.status == 200, finishing.error or finishing.reply
    server.wait_for_log("it takes no new request, and it is killed once its other threads have finished", 10)
    server.wait_for_log("Thread", 10)  # the stack dump names every thread
    assert eventually(lambda: workers_of(server.pid) - {first}, 15), "the worker was not replaced"
    assert get(server.port, "/who").status == 200


def test_a_worker_that_dies_costs_a_502_for_each_request_it_held_and_nothing_more(maitred_server):
    stats = free_port()
    server = maitred_server("-w", "1", "--threads", "2", "--stats", f"{HOST}:{stats}", "threaded:app", cwd=APPS)
    held = send(server.port, "/sleep?seconds=5")
    assert eventually(lambda: busy_threads(stats) == 1, 10)
    dying = send(server.port, "/exit?after=0.2")
    held.join(30)
    dying.join(30)

    assert dying.reply is not None and dying.reply.status == 502, dying.error or dying.reply
    assert held.reply is not None and held.reply.status == 502, held.error or held.reply
    assert held.took < 4, "the held request was answered when the worker died, not at the end of its sleep"
    assert get(server.port, "/who").status == 200


def test_max_requests_counts_the_requests_of_every_thread(maitred_server):
    server = maitred_server("-w", "1", "--threads", "2", "--max-requests", "4", "threaded:app", cwd=APPS)
    served = [get(server.port, "/who").body.split()[:2] for _ in range(8)]
    first = served[0][0]
    # Each request goes to the longest-idle seat, so both threads took some: four together.
    assert len({thread for pid, thread in served if pid == first}) == 2, served
    assert [pid for pid, _ in served].count(first) == 4, served
    assert all(pid != first for pid, _ in served[4:]), "the worker took more than --max-requests"


HOOKS = """
import json, threading

def _record(hook, req):
    with open({records!r}, "a") as file:
        file.write(json.dumps({{"hook": hook, "query": req.query, "thread": threading.current_thread().name}}) + "\\n")

def pre_request(worker, req):
    _record("pre_request", req)

def post_request(worker, req, environ, resp):
    _record("post_request", req)
"""


def test_pre_request_and_post_request_run_in_the_requests_own_thread(maitred_server, tmp_path):
    records = tmp_path / "records.jsonl"
    config = tmp_path / "hooks.conf.py"
    config.write_text(HOOKS.format(records=str(records)))
    server = maitred_server("-w", "1", "--threads", "2", "-c", str(config), "threaded:app", cwd=APPS)
    requests = [send(server.port, f"/sleep?seconds=0.3&n={n}") for n in range(4)]
    for request in requests:
        request.join(30)
    answered_in = {}
    for number, request in enumerate(requests):
        assert request.reply is not None and request.reply.status == 200, request.error
        answered_in[f"seconds=0.3&n={number}"] = request.reply.body.split()[1].decode()
    assert len(set(answered_in.values())) == 2, f"both threads served: {answered_in}"

    def hooked() -> list[dict]:
        return [json.loads(line) for line in records.read_text().splitlines()] if records.exists() else []

    # post_request is written after the client has its answer.
    assert eventually(lambda: len(hooked()) == 8, 10), hooked()
    for record in hooked():
        assert record["thread"] == answered_in[record["query"]], record


def test_a_client_that_leaves_cancels_its_own_request_and_no_other(maitred_server):
    server = maitred_server("-w", "1", "--threads", "2", "drip:app", cwd=APPS)
    staying = send(server.port, "/drip?seconds=1")
    leaving = socket.create_connection((HOST, server.port), timeout=10)
    leaving.sendall(b"GET /drip?seconds=5 HTTP/1.1\r\nHost: test\r\n\r\n")
    assert leaving.recv(1024).startswith(b"HTTP/1.1 200 OK")
    leaving.close()
    server.wait_for_log("client went away during GET /drip?seconds=5 HTTP/1.1; response abandoned", 10)
    staying.join(30)
    assert staying.reply is not None and staying.reply.status == 200, staying.error
    assert staying.reply.body.count(b"line ") == 20, "the other thread's answer came whole"


def test_a_reload_takes_the_config_files_new_thread_count(maitred_server, tmp_path):
    stats = free_port()
    config = tmp_path / "maitred.conf.py"
    config.write_text("threads = 1\n")
    server = maitred_server("-w", "1", "-c", str(config), "--stats", f"{HOST}:{stats}", "threaded:app", cwd=APPS)
    assert get(server.port, "/who").body.split()[2] == b"False"
    config.write_text("threads = 3\n")
    server.send_signal(signal.SIGHUP)
    server.wait_for_log("SIGHUP: reloaded", 30)

    def serving() -> list[dict]:
        return [worker for worker in status_of(stats)["scoreboard"] if worker["generation"] == 2]

    assert eventually(lambda: len(serving()) == 1, 10), status_of(stats)["scoreboard"]
    assert len(serving()[0]["threads"]) == 3
    assert get(server.port, "/who").body.split()[2] == b"True"


def test_a_worker_past_its_lifetime_retires_once_whichever_thread_finds_it(maitred_server):
    """Its threads share its recycling: the lifetime ends once for the worker, which retires
    once, with one line, and the spare takes its place."""
    server = maitred_server("-w", "1", "--threads", "3", "--max-worker-lifetime", "1", "threaded:app", cwd=APPS)
    first = get(server.port, "/who").pid
    assert eventually(lambda: get(server.port, "/who").pid != first, 15), "the worker was not replaced"
    server.wait_for_log(f"worker {first} exited", 10)
    assert server.stderr().count(f"retiring worker {first}:") == 1, server.stderr()


def test_the_most_threads_a_worker_may_have_all_serve(maitred_server):
    """64, --threads' maximum: the zygote hands the lobby all of a worker's channels in one
    message, which the lobby's receive must hold whole."""
    stats = free_port()
    server = maitred_server("-w", "1", "--threads", "64", "--stats", f"{HOST}:{stats}", "threaded:app", cwd=APPS)
    assert eventually(lambda: status_of(stats)["seats"]["free"] == 64, 20), status_of(stats)["seats"]
    requests = [send(server.port, "/sleep?seconds=0.5") for _ in range(64)]
    for request in requests:
        request.join(30)
    assert {request.reply.status for request in requests if request.reply} == {200}
    assert len({request.reply.body.split()[1] for request in requests}) == 64, "each in a thread of its own"


def test_more_threads_than_a_worker_may_have_is_one_cli_line(run_maitred):
    result = run_maitred("--threads", "65", "hello:app", linger=0)
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1 and "--threads" in result.stderr and "64" in result.stderr, (
        result.stderr
    )


def test_a_stopped_worker_costs_no_request_its_busy_thread_runs(maitred_server, tmp_path):
    """Issue 31: `-w 3 --threads 2`, and a worker stopped (SIGSTOP) while one of its threads
    runs a 2 s request. A request seated at its idle thread is not taken: it goes to another
    worker, the stopped one takes nothing more (the log says so), and the request its busy
    thread runs is answered 200 once the worker is continued, not 502. The worker is then
    replaced."""
    stats = free_port()
    server = maitred_server("-w", "3", "--threads", "2", "--stats", f"{HOST}:{stats}", "threaded:app", cwd=APPS)
    assert eventually(lambda: status_of(stats)["seats"]["free"] == 6, 20), status_of(stats)["seats"]
    # Stopped once the application has the request: a worker stopped before its thread read the
    # request it was seated with gives that request to another worker, as it should (CI, on
    # CPython 3.13: the scoreboard showed it begun, and another worker answered it).
    entered = tmp_path / "entered"
    held = send(server.port, f"/sleep?seconds=2&entered={entered}")
    assert eventually(lambda: entered.exists() and entered.read_text(), 10)
    stopped = int(entered.read_text())
    assert busy_threads(stats) == 1
    os.kill(stopped, signal.SIGSTOP)
    try:
        # Six short requests at once, more than the other workers' four threads, so that one
        # waits and the stopped worker's idle thread is asked to take it (a thread whose worker
        # has no CPU to spare looks again only when a request waits: gate.rs), until the lobby
        # has noticed: each is answered, by another worker.
        deadline = time.monotonic() + 30
        while f"worker {stopped} takes no new request" not in server.stderr():
            assert time.monotonic() < deadline, server.stderr()
            burst = [send(server.port, "/sleep?seconds=0.1") for _ in range(6)]
            for request in burst:
                request.join(30)
                assert request.reply is not None and request.reply.status == 200, request.error or request.reply
                assert int(request.reply.body.split()[0]) != stopped, request.reply
    finally:
        os.kill(stopped, signal.SIGCONT)
    held.join(30)
    assert held.reply is not None and held.reply.status == 200, held.error or held.reply
    assert int(held.reply.body.split()[0]) == stopped
    assert eventually(lambda: stopped not in workers_of(server.pid) and len(workers_of(server.pid)) == 3, 15)
