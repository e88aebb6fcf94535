"""For HTTP/2 from a browser and through a proxy (tests/test_http2_browser_and_proxy.py). Every
answer says, in its Seen-Protocol field, the SERVER_PROTOCOL the application was given.

GET /                           a small HTML page, the browser's starting point
POST /upload                    reads the body whole and answers JSON: its length and SHA-256
GET /stream?chunks=N&size=S     N chunks of S bytes, each yielded on its own and without a
                                Content-Length, so that the answer streams; chunk n is S bytes of
                                the value n % 251, so that a lost, repeated or reordered chunk
                                changes the whole
"""

import hashlib
import json
from urllib.parse import parse_qs

PAGE = b"<!doctype html><meta charset=utf-8><title>maitred over HTTP/2</title><p>HTTP/2 from a browser</p>"


def app(environ, start_response):
    seen = ("Seen-Protocol", environ["SERVER_PROTOCOL"])
    if environ["PATH_INFO"] == "/upload":
        body = environ["wsgi.input"].read()
        answer = json.dumps({"length": len(body), "sha256": hashlib.sha256(body).hexdigest()}).encode()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(answer))), seen])
        return [answer]
    if environ["PATH_INFO"] == "/stream":
        query = parse_qs(environ["QUERY_STRING"])
        chunks, size = int(query["chunks"][0]), int(query["size"][0])
        start_response("200 OK", [("Content-Type", "application/octet-stream"), seen])
        return (bytes([number % 251]) * size for number in range(chunks))
    start_response("200 OK", [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(PAGE))), seen])
    return [PAGE]
