"""maitred, a WSGI application server.

A native lobby holds every client connection and queues complete requests; worker processes
forked by a zygote only run the application. See docs/DESIGN.md.
"""

from importlib.metadata import version

__version__ = version("maitred")
