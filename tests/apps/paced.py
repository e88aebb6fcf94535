"""An application that takes ?ms=N milliseconds a request (1 by default) and answers "ok": waiting
in WSGI's `app` (a thread asleep, as on a database), awaiting in ASGI's `asgi_app`. For load
tests that need a known service time."""

import asyncio
import time
from urllib.parse import parse_qs

BODY = b"ok\n"


def milliseconds(query: str) -> float:
    return float(parse_qs(query).get("ms", ["1"])[0])


def app(environ, start_response):
    time.sleep(milliseconds(environ["QUERY_STRING"]) / 1000)
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(BODY)))])
    return [BODY]


async def asgi_app(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await asyncio.sleep(milliseconds(scope["query_string"].decode()) / 1000)
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(BODY)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": BODY})
