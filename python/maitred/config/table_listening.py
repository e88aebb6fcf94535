"""The settings table's listening rows, whose values the lobby receives (`for_lobby`): where it
listens, its listen queue, how many connections it holds, and its stats listener. table.py puts
them first.

May import: setting.py and values.py.
"""

from __future__ import annotations

from maitred.config.setting import Setting
from maitred.config.values import _bind_address, _stats_address, _whole_number

ROWS: tuple[Setting, ...] = (
    Setting(
        "listening",
        "bind",
        ("-b", "--bind"),
        "ADDRESS",
        _bind_address,
        ("127.0.0.1:8000",),
        "Address to listen on: HOST:PORT, [IPV6]:PORT, unix:PATH or fd://N (an inherited listening socket); "
        "with --certfile, http://ADDRESS speaks plain HTTP beside TLS (docs/TLS.md). Repeat the flag to listen "
        "on several. Under socket activation (LISTEN_FDS, docs/SYSTEMD.md) the sockets passed are served instead.",
        repeatable=True,
    ),
    Setting(
        "listening",
        "backlog",
        ("--backlog",),
        "INT",
        _whole_number(1, 2**31 - 1),
        None,
        "Length of the listen queue. The kernel caps it at net.core.somaxconn; the log says what was granted.",
        default_text="net.core.somaxconn",
    ),
    Setting(
        "listening",
        "max_connections",
        ("--max-connections",),
        "INT",
        _whole_number(1),
        None,
        "Most client connections held open at once.",
        default_text="as many as the file-descriptor limit allows",
    ),
    Setting(
        "listening",
        "stats",
        ("--stats",),
        "ADDRESS",
        _stats_address,
        None,
        "Address of the stats listener, HOST:PORT or unix:PATH: Prometheus metrics at /metrics, the same "
        "with the worker scoreboard and the diagnoses at /status.json, and a live page at / "
        "(docs/METRICS.md), answered by the lobby without touching a worker. Keep it off the "
        "public network.",
        default_text="off",
    ),
)
