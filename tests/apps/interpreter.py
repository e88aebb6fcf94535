"""An application that tells which interpreter runs it: the worker's Python version, its
executable, whether that Python runs without the GIL, and the file maitred's native module was
loaded from. tests/test_interpreter.py compares them with the Python that runs the tests, which
`make test-pythons` (tests/pythons.py) changes from one CPython to the next.
"""

import json
import sys
import sysconfig

import maitred._native


def app(environ, start_response):
    body = json.dumps(
        {
            "version": list(sys.version_info[:3]),
            "implementation": sys.implementation.name,
            "prefix": sys.prefix,
            "free_threaded": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
            "native": maitred._native.__file__,
        }
    ).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]
