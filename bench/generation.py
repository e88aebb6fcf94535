"""The application of the lifecycle scenarios (R1, R1-broken, U1): its answer names the code's
generation and the process that answered, so that a client can tell old code from new and old
workers from new ones.

The harness copies this file into each run's directory, which the server runs in and which is the
only entry of PYTHONPATH there, and writes the generation into the file VERSION beside it: a reload
is then a new VERSION, and a broken deploy is this copy with a syntax error (bench/lifecycle.py).
The repository's file is never changed.

Importing it takes IMPORT_SECONDS, like an application that loads its framework and settings:
a server that stops its old workers before the new ones have imported the code shows it.
"""

import os
import time
from pathlib import Path

IMPORT_SECONDS = 1.0

time.sleep(IMPORT_SECONDS)
GENERATION = int(Path("VERSION").read_text())


def app(environ, start_response):
    body = f"generation {GENERATION} pid {os.getpid()}\n".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
