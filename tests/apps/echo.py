"""Answers "PID LENGTH": the worker's pid and the length of the request body it read.

?sleep=S    sleeps S seconds first
"""

import os
import time
from urllib.parse import parse_qs


def app(environ, start_response):
    query = parse_qs(environ["QUERY_STRING"])
    if "sleep" in query:
        time.sleep(float(query["sleep"][0]))
    length = len(environ["wsgi.input"].read())
    body = f"{os.getpid()} {length}\n".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
