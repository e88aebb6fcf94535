"""tests/apps/heap.py, imported by an application that sets the collector's first threshold
itself, as some do to collect less often: --gc-threshold leaves it as the application set it."""

import gc

from heap import asgi, wsgi

OWN_THRESHOLD = 50_000
gc.set_threshold(OWN_THRESHOLD)

__all__ = ["asgi", "wsgi"]
