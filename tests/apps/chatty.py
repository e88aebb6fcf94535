"""An application that writes to the log every way applications do.

/errors         one 512-byte line to wsgi.errors
/logging        one 512-byte warning through logging to standard error (logging's own format)
/print?n=N      N numbered lines with print()
/say            one line with print(), and no flush: the worker goes on living
/crash          prints its last words, then dies by SIGKILL
/runaway        prints 200,000 lines as fast as it can
"""

import logging
import os
import signal
import sys
from urllib.parse import parse_qs

LINE = "x" * 500

logger = logging.getLogger("chatty")
_handler = logging.StreamHandler(sys.stderr)
_handler.setFormatter(logging.Formatter("%(levelname)s:%(name)s:%(message)s"))
logger.addHandler(_handler)
logger.propagate = False


def app(environ, start_response):
    path = environ["PATH_INFO"]
    pid = os.getpid()
    if path == "/errors":
        environ["wsgi.errors"].write(f"error line from {pid} {LINE}\n")
    elif path == "/logging":
        logger.warning("logged from %d %s", pid, LINE)
    elif path == "/print":
        for n in range(int(parse_qs(environ["QUERY_STRING"])["n"][0])):
            print(f"printed line {n} from {pid}")
        sys.stdout.flush()
    elif path == "/say":
        print(f"said by {pid}, unflushed")
    elif path == "/crash":
        print(f"last words of {pid}", flush=True)
        os.kill(pid, signal.SIGKILL)
    elif path == "/runaway":
        for n in range(200_000):
            print(f"runaway line {n}")
        sys.stdout.flush()
    body = f"{pid}\n".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
