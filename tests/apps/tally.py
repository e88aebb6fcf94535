"""Keeps a tally of the requests it runs: appends a line, "PID PATH", to the file named by the
TALLY environment variable as each request starts, then sleeps ?sleep=S seconds (0 by default)
and answers "done".
"""

import os
import time
from urllib.parse import parse_qs


def app(environ, start_response):
    with open(os.environ["TALLY"], "a") as tally:
        tally.write(f"{os.getpid()} {environ['PATH_INFO']}\n")
    time.sleep(float(parse_qs(environ["QUERY_STRING"]).get("sleep", ["0"])[0]))
    body = b"done\n"
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
