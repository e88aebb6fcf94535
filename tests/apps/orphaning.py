"""An application that leaves an orphan behind at each request: `sh` starts a `sleep` in the
background and exits, so the sleep's parent is gone and the kernel gives it to PID 1."""

import subprocess


def app(environ, start_response):
    subprocess.run(["sh", "-c", "sleep 600 >/dev/null 2>&1 &"], check=True)
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"left an orphan\n"]
