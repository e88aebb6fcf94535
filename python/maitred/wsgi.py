"""The objects every maitred environ shares: ``wsgi.file_wrapper`` and ``wsgi.errors``."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import IO


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
    """``wsgi.errors``: text goes straight to standard error (the error log), flushed at
    once so that it interleaves correctly with the server's own lines."""

    def write(self, text: str) -> int:
        written = sys.stderr.write(text)
        sys.stderr.flush()
        return written

    def writelines(self, lines: Iterable[str]) -> None:
        sys.stderr.writelines(lines)
        sys.stderr.flush()

    def flush(self) -> None:
        sys.stderr.flush()
