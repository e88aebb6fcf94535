"""The objects every maitred environ shares: ``wsgi.file_wrapper`` and ``wsgi.errors``."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import IO

from maitred import log


class FileWrapper:
    """``wsgi.file_wrapper`` (PEP 3333, "Optional Platform-Specific File Handling").

    When an application returns one around a regular file that has a ``fileno()``, the
    worker does not read the file at all: it passes the descriptor to the lobby, which sends
    the bytes itself. Around anything else it is an iterator of ``block_size`` blocks.
    """

    def __init__(self, filelike: IO[bytes], block_size: int = 8192) -> None:
        self.filelike = filelike
        self.block_size = block_size

    def __iter__(self) -> FileWrapper:
        return self

    def __next__(self) -> bytes:
        block = self.filelike.read(self.block_size)
        if not block:
            raise StopIteration
        return block

    def close(self) -> None:
        close = getattr(self.filelike, "close", None)
        if close is not None:
            close()


class ErrorStream:
    """``wsgi.errors``: the application's lines go to the error log through the worker's
    non-blocking path (`maitred.log`), marked ``[app]`` at INFO (or at the level a line begins
    with), never waiting: lines that find no room are dropped and counted, as maitred's own
    are, and a runaway loop is held to `log.AppLines.PER_SECOND` lines a second. A line is
    written once its newline comes, or at `flush`."""

    def __init__(self) -> None:
        self._lines = log.AppLines("info")
        self._partial = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            *lines, self._partial = (self._partial + text).split("\n")
            for line in lines:
                self._lines.write(line)
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for text in lines:
            self.write(text)

    def flush(self) -> None:
        with self._lock:
            if self._partial:
                self._lines.write(self._partial)
                self._partial = ""
