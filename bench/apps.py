"""The WSGI applications the benchmark serves: plain WSGI, no framework, the same for every server.

Run from this directory (the harness puts it on PYTHONPATH), e.g. ``gunicorn apps:hello``.
"""

import time

HELLO_BODY = b"Hello world\n"  # 12 bytes, the same fixed body nginx serves as the ceiling.
_HEADERS = [("Content-Type", "text/plain"), ("Content-Length", str(len(HELLO_BODY)))]


def hello(environ, start_response):
    """The smallest useful response: measures the server, not the application."""
    start_response("200 OK", _HEADERS)
    return [HELLO_BODY]


def sleep_1ms(environ, start_response):
    """An application that holds its worker for 1 ms, like a fast database query (scenario S1)."""
    time.sleep(0.001)
    start_response("200 OK", _HEADERS)
    return [HELLO_BODY]
