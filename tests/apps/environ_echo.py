"""Answers, as a JSON object, what the application received of the request.

The object holds the CGI variables REQUEST_METHOD, PATH_INFO, QUERY_STRING, RAW_URI,
SERVER_PROTOCOL, CONTENT_TYPE and CONTENT_LENGTH (those present), every HTTP_* variable, and
"body": the bytes read from wsgi.input, in base64. Environ values are latin-1 strings
(PEP 3333), so a test recovers the exact bytes with .encode("latin-1").

The response also carries the method in an "Echo-Method" header, so that a client reading
pipelined responses knows which of them answer HEAD and so have no body; the answer to HEAD
carries the JSON object, base64-encoded, in an "Echo-Environ" header instead.
"""

import base64
import json

CGI_VARIABLES = (
    "REQUEST_METHOD",
    "PATH_INFO",
    "QUERY_STRING",
    "RAW_URI",
    "SERVER_PROTOCOL",
    "CONTENT_TYPE",
    "CONTENT_LENGTH",
)


def app(environ, start_response):
    received = {name: environ[name] for name in CGI_VARIABLES if name in environ}
    received.update((name, value) for name, value in environ.items() if name.startswith("HTTP_"))
    received["body"] = base64.b64encode(environ["wsgi.input"].read()).decode("ascii")
    payload = json.dumps(received).encode("ascii")
    headers = [
        ("Content-Type", "application/json"),
        ("Content-Length", str(len(payload))),
        ("Echo-Method", environ["REQUEST_METHOD"]),
    ]
    if environ["REQUEST_METHOD"] == "HEAD":
        headers.append(("Echo-Environ", base64.b64encode(payload).decode("ascii")))
    start_response("200 OK", headers)
    return [payload]
