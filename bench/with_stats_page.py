#!/usr/bin/env python3
"""maitred with its stats listener on and its live page open, for the overhead runs
(docs/PERFORMANCE.md, "The stats listener's cost").

Used in place of the maitred binary: `MAITRED=bench/with_stats_page.py bench/run.py ...`. It
forks a reader that does what the page at `/` does in a browser, GET /status.json every second,
then becomes maitred itself (exec) with `--stats` on a free port of 127.0.0.1. The reader ends
when maitred does. The maitred run is the one in .venv, or STATS_PAGE_MAITRED.
"""

from __future__ import annotations

import os
import sys
import time
import urllib.request
from pathlib import Path

from procs import free_port

REPO = Path(__file__).resolve().parent.parent
MAITRED = os.environ.get("STATS_PAGE_MAITRED", str(REPO / ".venv" / "bin" / "maitred"))
# The page polls once a second.
INTERVAL = 1.0


def read_like_the_page(port: int, server: int) -> None:
    url = f"http://127.0.0.1:{port}/status.json"
    while os.getppid() == server:
        started = time.monotonic()
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                answer.read()
        except OSError:
            pass  # not listening yet, or stopping
        time.sleep(max(0.0, INTERVAL - (time.monotonic() - started)))


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["--version"]:
        os.execv(MAITRED, [MAITRED, *argv])
    port = free_port()
    server = os.getpid()
    if os.fork() == 0:
        read_like_the_page(port, server)
        os._exit(0)
    os.execv(MAITRED, [MAITRED, "--stats", f"127.0.0.1:{port}", *argv])


if __name__ == "__main__":
    main()
