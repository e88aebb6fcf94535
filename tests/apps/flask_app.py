"""A Flask application for tests/test_frameworks.py: a form post, a JSON API, a file
download and a streamed response; and, for tests/test_proxies.py, what a body looks like to Flask."""

from __future__ import annotations

import hashlib

from flask import Flask, Response, jsonify, request, send_file, stream_with_context
from framework_support import DOWNLOAD, describe_upload, order_summary, reporting_result_type, stream_lines

app = Flask(__name__)


@app.post("/form")
def form() -> Response:
    files = {
        field: describe_upload(upload.filename or "", upload.mimetype, upload.read())
        for field, upload in request.files.items()
    }
    return jsonify(fields=request.form.to_dict(flat=False), files=files)


@app.post("/api/orders")
def orders() -> tuple[Response, int]:
    return jsonify(order_summary(request.get_json())), 201


@app.post("/upload-length")
def upload_length() -> Response:
    """What Flask makes of a request body: the length it was told and the bytes it read."""
    data = request.get_data()
    return jsonify(
        content_length=request.content_length,
        transfer_encoding=request.headers.get("Transfer-Encoding"),
        received=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
    )


@app.get("/download")
def download() -> Response:
    return send_file(DOWNLOAD, mimetype="application/octet-stream", as_attachment=True, download_name="report.bin")


@app.get("/stream")
def stream() -> Response:
    count = request.args.get("n", type=int)

    @stream_with_context
    def generate():
        # request is still usable here, which is what stream_with_context is for.
        yield from stream_lines(request.args["word"], count)

    return Response(generate(), mimetype="text/plain")


app.wsgi_app = reporting_result_type(app.wsgi_app)  # type: ignore[method-assign]
