"""Serves a WSGI app with bjoern in N processes that share one listen socket.

    python3 bjoern_serve.py -w N -b HOST:PORT [--backlog B] MODULE:CALLABLE

bjoern runs one process and has no way to start more, so this is the prefork part: the process
imports the app, has bjoern open the listen socket, forks N-1 children that inherit it, and every
process, itself included, runs bjoern's loop on that socket (one accept queue, as in the other
prefork servers). Each process prints one line when it starts serving. The children ask the
kernel for SIGTERM when the parent dies, so stopping the parent stops them all; the harness also
stops the whole process group.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import os
import signal
import sys

import bjoern

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bjoern_serve.py", description=__doc__.splitlines()[0])
    parser.add_argument("-w", "--workers", type=int, default=1, help="processes (default: 1)")
    parser.add_argument("-b", "--bind", required=True, help="HOST:PORT to listen on")
    parser.add_argument("--backlog", type=int, help="listen backlog (default: bjoern's)")
    parser.add_argument("app", help="MODULE:CALLABLE")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    host, _, port = args.bind.rpartition(":")
    module_name, _, callable_name = args.app.partition(":")
    if not host or not port.isdigit() or not module_name or not callable_name:
        parser.error("expected -b HOST:PORT and MODULE:CALLABLE")
    app = getattr(importlib.import_module(module_name), callable_name)

    backlog = {} if args.backlog is None else {"listen_backlog": args.backlog}
    bjoern.listen(app, host, int(port), **backlog)
    parent = os.getpid()
    for _ in range(args.workers - 1):
        if os.fork() == 0:
            _die_with(parent)
            break
    print(f"bjoern_serve: process {os.getpid()} serving http://{host}:{port}", flush=True)
    bjoern.run()
    return 0


def _die_with(parent: int) -> None:
    """Makes this child get SIGTERM when its parent exits, and exits now if that already happened."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
