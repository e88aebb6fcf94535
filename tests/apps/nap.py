"""A small, steady application for load tests: every request takes 5 ms of waiting (as on a
database) and answers the client's port, so a test can tell which connection it came on."""

import time


def app(environ, start_response):
    time.sleep(0.005)
    body = f"{environ['REMOTE_PORT']}\n".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
