"""The error log's line format, shared by every Python process of maitred.

The lobby (Rust) writes the same format, so one log reads as one story:
``[2026-11-22 05:30:00 +0000] [1234] [INFO] message``. Everything goes to standard
error, which the CLI has already pointed at ``--error-logfile``.
"""

import os
import sys
import time

LEVELS = ("debug", "info", "warning", "error", "critical")

_threshold = LEVELS.index("info")


def configure(level: str) -> None:
    """Sets the lowest level that is written; `level` is one of LEVELS."""
    global _threshold
    _threshold = LEVELS.index(level)


def log(level: str, message: str) -> None:
    """Writes one line (or a traceback's several) at `level` if it passes the threshold."""
    if LEVELS.index(level) < _threshold:
        return
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %z")
    sys.stderr.write(f"[{stamp}] [{os.getpid()}] [{level.upper()}] {message}\n")
    sys.stderr.flush()
