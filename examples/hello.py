"""The smallest WSGI application. Serve it with: maitred --chdir examples hello:app"""


def app(environ, start_response):
    body = b"Hello, world!\n"
    start_response(
        "200 OK",
        [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))],
    )
    return [body]
