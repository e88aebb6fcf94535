"""A bare ASGI application that echoes every WebSocket message as it came, text or bytes, the
way Autobahn|Testsuite's fuzzingclient wants its server to (tests/test_autobahn.py). Plain HTTP
is answered with the worker's pid, so that a test can tell the workers apart.

With WEBSOCKET_ECHO_EVENTS set, each disconnect is a line `disconnect CODE REASON` in that file
(REASON empty when none came).
With WEBSOCKET_ECHO_HOLD set, a worker's import waits while that file exists: a test holds a new
worker back.
"""

import os
import time

_hold = os.environ.get("WEBSOCKET_ECHO_HOLD")
while _hold and os.path.exists(_hold):
    time.sleep(0.01)


def record(line: str) -> None:
    path = os.environ.get("WEBSOCKET_ECHO_EVENTS")
    if path:
        with open(path, "a") as events:
            events.write(f"{line}\n")


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
    elif scope["type"] == "http":
        body = str(os.getpid()).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": body})
    else:
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                record(f"disconnect {message['code']} {message.get('reason', '')}".rstrip())
                return
            if message.get("text") is not None:
                await send({"type": "websocket.send", "text": message["text"]})
            else:
                await send({"type": "websocket.send", "bytes": message["bytes"]})
