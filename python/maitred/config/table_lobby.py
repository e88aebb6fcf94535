"""The settings table's rows whose values the lobby receives (`for_lobby`): workers, requests,
proxies and logging, in --help's order (listening's are in table_listening.py, WebSockets' in
table_websockets.py, TLS's in table_tls.py). table.py puts them after listening's.

May import: setting.py and values.py (and maitred.log, for the level names).
"""

from __future__ import annotations

from maitred import log
from maitred.config.setting import Setting
from maitred.config.values import (
    ACCESS_LOG_FORMAT,
    SECURE_SCHEME_HEADERS,
    _access_log_format,
    _address_list,
    _address_list_value,
    _http_protocols,
    _http_protocols_value,
    _log_destination,
    _log_level,
    _proxy_protocol,
    _proxy_protocol_value,
    _secure_scheme_headers,
    _secure_scheme_headers_value,
    _whole_number,
    _workers,
    one_of,
    seconds,
    seconds_off_or_at_least,
)

# The worker channel carries the request-target and header names as `str16` and the header count as `u16`
# (docs/PROTOCOL.md section 2), so no request limit may exceed 65535. A limit of 0 (none of its own) is safe
# too: the lobby takes no head over 64 KiB (crates/protocol MAX_HEAD_SIZE), so no target or name reaches 65535.
WIRE_LIMIT = 65535

ROWS: tuple[Setting, ...] = (
    Setting(
        "workers",
        "workers",
        ("-w", "--workers"),
        "INT",
        _workers,
        1,
        "Number of worker processes, or auto: one per CPU of the cgroup's quota (docs/DEPLOY.md, Containers).",
    ),
    Setting(
        "workers",
        "threads",
        ("--threads",),
        "INT",
        # The zygote passes a worker's channels, one per thread, in one message, whose room the
        # lobby sizes for 64 (crates/sys/src/fdpass.rs).
        _whole_number(1, 64),
        1,
        "Threads per worker, each running one request at a time; the lobby seats a request only where a thread "
        "is free. For applications that wait on I/O (docs/DEPLOY.md, Threads or workers).",
    ),
    Setting(
        "workers",
        "interface",
        ("--interface",),
        "INTERFACE",
        one_of("auto", "asgi", "wsgi"),
        "auto",
        "The application's interface: asgi, wsgi, or auto, which tells an ASGI 3 application (a coroutine "
        "function of scope, receive, send) from a WSGI one by its signature, importing it once at start "
        "(docs/ASGI.md).",
        for_lobby=False,
    ),
    Setting(
        "workers",
        "worker_connections",
        ("--worker-connections",),
        "INT",
        # Not descriptors (one channel): past the region's 1024 slots, admission waits for one.
        _whole_number(1, 4096),
        32,
        "ASGI: requests each worker may hold whose answers have not started; the lobby admits more only while "
        "fewer wait and the worker's event loop keeps up, and queues the rest. An answer that has started (a "
        "stream, an open WebSocket) costs nothing against it (docs/ASGI.md, Streams and admission).",
    ),
    Setting(
        "workers",
        "loop",
        ("--loop",),
        "LOOP",
        one_of("auto", "asyncio", "uvloop"),
        "auto",
        "ASGI: the event loop, asyncio or uvloop; auto takes uvloop when it is installed, else asyncio's.",
        for_lobby=False,
    ),
    Setting(
        "workers",
        "timeout",
        ("-t", "--timeout"),
        "SECONDS",
        seconds(allow_zero=False),
        30.0,
        "A request running longer than this gets 504 and its worker's Python stack is logged; the worker is "
        "killed and replaced (with --threads, once its other threads have finished, within --graceful-timeout). "
        "Once its answer has started, WSGI: cut only when it sends nothing for this long; ASGI: never cut. "
        "ASGI: the request's task is cancelled, and the worker killed only if its event loop is blocked.",
    ),
    Setting(
        "workers",
        "graceful_timeout",
        ("--graceful-timeout",),
        "SECONDS",
        seconds(allow_zero=True),
        30.0,
        "On SIGTERM or SIGINT, how long requests in progress may run before their workers are killed; then open "
        "ASGI streams end cleanly, WebSockets with 1001 (a retiring worker's too: docs/SIGNALS.md).",
    ),
    Setting(
        "workers",
        "lobby_timeout",
        ("--lobby-timeout",),
        "SECONDS",
        # The watchdog sees a heartbeat a second apart, at looks a second apart: a healthy
        # loop can seem still for two seconds (process/watchdog.rs).
        seconds_off_or_at_least(5),
        30.0,
        "If the lobby's event loop makes no progress for this long, it logs where its thread is and exits with "
        "code 70, for the service manager to restart maitred; time the process was stopped or starved of CPU "
        "does not count (0: never; docs/SIGNALS.md).",
    ),
    Setting(
        "workers",
        "max_requests",
        ("--max-requests",),
        "INT",
        _whole_number(0),
        0,
        "Replace a worker after it has served this many requests (0: never).",
    ),
    Setting(
        "workers",
        "max_requests_jitter",
        ("--max-requests-jitter",),
        "INT",
        _whole_number(0),
        0,
        "Add a random 0 to N to each worker's --max-requests, so that workers do not all restart at once.",
    ),
    Setting(
        "workers",
        "max_worker_memory",
        ("--max-worker-memory",),
        "MB",
        _whole_number(0),
        0,
        "Replace a worker whose resident memory is above this many megabytes (MiB) after a request: it takes "
        "no further request (0: no limit).",
    ),
    Setting(
        "workers",
        "max_worker_lifetime",
        ("--max-worker-lifetime",),
        "SECONDS",
        seconds(allow_zero=False),
        None,
        "Replace a worker after it has served for this long: once it has answered the request it holds, "
        "at once if it is idle.",
        default_text="off",
    ),
    Setting(
        "workers",
        "max_worker_lifetime_jitter",
        ("--max-worker-lifetime-jitter",),
        "SECONDS",
        seconds(allow_zero=True),
        0.0,
        "Add a random 0 to N seconds to each worker's --max-worker-lifetime, so that workers do not all "
        "restart at once.",
    ),
    Setting(
        "workers",
        "preload",
        ("--preload",),
        None,
        None,
        False,
        "Import the application once, before forking the workers.",
        default_text="off",
    ),
    Setting(
        "requests",
        "keep_alive",
        ("--keep-alive",),
        "SECONDS",
        seconds(allow_zero=True),
        75.0,
        "How long an idle keep-alive connection is held open (0: close after each response). "
        "An idle connection costs no worker; keep this above your proxy's idle timeout.",
    ),
    Setting(
        "requests",
        "http_protocols",
        ("--http-protocols",),
        "LIST",
        _http_protocols,
        ["h1", "h2"],
        "Protocols clients may speak, comma-separated: h1 (HTTP/1.0 and HTTP/1.1) and h2 (HTTP/2: offered by "
        "ALPN on TLS listeners, and taken on plain ones from clients that open with its preface, as curl "
        "--http2-prior-knowledge does; docs/HTTP2.md). Read at start.",
        default_text="h1,h2",
        from_python=_http_protocols_value,
    ),
    Setting(
        "requests",
        "http2_max_concurrent_streams",
        ("--http2-max-concurrent-streams",),
        "INT",
        _whole_number(1, 2**31 - 1),
        100,
        "Most HTTP/2 streams (requests) one connection may have open at once; each is a request in the one "
        "queue, under the same limits as an HTTP/1.1 one.",
    ),
    Setting(
        "requests",
        "header_timeout",
        ("--header-timeout",),
        "SECONDS",
        seconds(allow_zero=False),
        10.0,
        "Time allowed for a request's head, and for each gap in its body, to arrive; the client gets 408 after that.",
    ),
    Setting(
        "requests",
        "body_min_rate",
        ("--body-min-rate",),
        "BYTES",
        _whole_number(0),
        500,
        "Slowest a request body may arrive, in bytes per second, after its first --header-timeout: a body "
        "must be complete within --header-timeout plus its size divided by this, or the client gets 408 "
        "(0: no such deadline; the gap limit of --header-timeout still applies).",
    ),
    Setting(
        "requests",
        "send_timeout",
        ("--send-timeout",),
        "SECONDS",
        seconds(allow_zero=False),
        60.0,
        "A client that takes no byte of its answer for this long is disconnected. A client that keeps reading "
        "is never cut, however slowly it reads.",
    ),
    Setting(
        "requests",
        "max_spill",
        ("--max-spill",),
        "BYTES",
        _whole_number(0),
        1 << 30,
        "Most bytes of one answer that wait for a slow client in a temporary file (past the 256 KiB kept in "
        "memory); beyond it the lobby stops reading that answer from its worker until the client has caught up "
        "(0: no file; the worker waits for the client).",
    ),
    Setting(
        "requests",
        "max_spill_total",
        ("--max-spill-total",),
        "BYTES",
        _whole_number(0),
        4 << 30,
        "Most bytes of all answers waiting in temporary files at once; beyond it, answers that spill wait for "
        "their clients as with --max-spill.",
    ),
    Setting(
        "requests",
        "max_head_memory",
        ("--max-head-memory",),
        "BYTES",
        _whole_number(1),
        64 << 20,
        "Memory shared by all requests whose head has not fully arrived; beyond it the oldest incomplete heads "
        "get 408 first, and complete requests are served as usual.",
    ),
    Setting(
        "requests",
        "queue_timeout",
        ("--queue-timeout",),
        "SECONDS",
        seconds(allow_zero=False),
        None,
        "A request that has waited longer than this for a free worker gets 503 with Retry-After.",
        default_text="off",
    ),
    Setting(
        "requests",
        "queue_policy",
        ("--queue-policy",),
        "POLICY",
        one_of("adaptive", "fifo"),
        "adaptive",
        "Past capacity: adaptive answers 503 with Retry-After to the requests that can no longer be answered in "
        "time, once clients are seen giving up or --request-deadline says how long they wait; fifo serves every "
        "request in arrival order however long it waited (docs/TUNING.md, Overload).",
    ),
    Setting(
        "requests",
        "request_deadline",
        ("--request-deadline",),
        "SECONDS",
        seconds(allow_zero=False),
        None,
        "How long clients wait for an answer, counted from the X-Request-Start of a proxy in "
        "--forwarded-allow-ips, or else from when the request was read: one that used it up gets 503 without "
        "running (and, with --queue-policy adaptive, one that waited over half of it).",
        default_text="off",
    ),
    Setting(
        "requests",
        "half_close",
        ("--half-close",),
        "ACTION",
        one_of("abandon", "serve"),
        "abandon",
        "A client that shuts its sending side while its request waits: abandon takes it as gone and drops the "
        "request, as nginx does; serve answers it (for clients that half-close after sending).",
    ),
    Setting(
        "requests",
        "wsgi_chunked_body",
        ("--wsgi-chunked-body",),
        "HOW",
        one_of("stream", "whole"),
        "stream",
        "A large chunked upload to a WSGI application that arrives fast: stream passes it on as it arrives, "
        "without CONTENT_LENGTH (wsgi.input_terminated: read it to its end), as gunicorn and granian do; whole "
        "reads it whole first and passes its CONTENT_LENGTH, as behind nginx, for applications that take a body "
        "without one as empty (Django 5.2). A chunked body that is whole when its worker takes it has its "
        "CONTENT_LENGTH either way (docs/PROXIES.md).",
    ),
    Setting(
        "requests",
        "max_body",
        ("--max-body",),
        "BYTES",
        _whole_number(0),
        None,
        "Largest request body accepted.",
        default_text="unlimited",
    ),
    Setting(
        "requests",
        "limit_request_line",
        ("--limit-request-line",),
        "BYTES",
        _whole_number(0, WIRE_LIMIT),
        8190,
        "Longest request line (method, target and version) accepted (0: no limit beyond the 64 KiB head ceiling).",
    ),
    Setting(
        "requests",
        "limit_request_fields",
        ("--limit-request-fields",),
        "INT",
        _whole_number(1, WIRE_LIMIT),
        100,
        "Most header fields accepted in one request.",
    ),
    Setting(
        "requests",
        "limit_request_field_size",
        ("--limit-request-field_size",),
        "BYTES",
        _whole_number(0, WIRE_LIMIT),
        8190,
        "Longest header field (name and value) accepted (0: no limit beyond the 64 KiB head ceiling).",
    ),
    Setting(
        "proxies",
        "forwarded_allow_ips",
        ("--forwarded-allow-ips",),
        "LIST",
        _address_list,
        ["127.0.0.1", "::1"],
        "Peers trusted to say who the client is: comma-separated addresses and networks (10.0.0.0/8), or * "
        "for all. From them (and from any Unix-socket peer) X-Forwarded-For or Forwarded set REMOTE_ADDR, and "
        "secure_scheme_headers set wsgi.url_scheme (docs/PROXIES.md).",
        default_text="127.0.0.1,::1, or $FORWARDED_ALLOW_IPS",
        from_python=_address_list_value,
        environ="FORWARDED_ALLOW_IPS",
    ),
    Setting(
        "proxies",
        "secure_scheme_headers",
        ("--secure-scheme-headers",),
        "NAME=VALUE,...",
        _secure_scheme_headers,
        SECURE_SCHEME_HEADERS,
        "Headers by which a trusted peer says the client used https: with this value https, with any other "
        "http; headers that disagree get 400. A dict in a config file, as in gunicorn's; empty: none. The "
        "default is gunicorn's: X-FORWARDED-PROTO https, X-FORWARDED-SSL on, X-FORWARDED-PROTOCOL ssl.",
        default_text="gunicorn's three",
        from_python=_secure_scheme_headers_value,
    ),
    Setting(
        "proxies",
        "proxy_protocol",
        ("--proxy-protocol",),
        "MODE",
        _proxy_protocol,
        "off",
        "Every connection must begin with a PROXY protocol header (HAProxy's send-proxy), whose client becomes "
        "REMOTE_ADDR: v1, v2, or auto for either (the flag alone); off. Put the flag after the application, or "
        "give its mode, as its value is optional.",
        from_python=_proxy_protocol_value,
        const="auto",
    ),
    Setting(
        "proxies",
        "proxy_allow_ips",
        ("--proxy-allow-from",),
        "LIST",
        _address_list,
        ["127.0.0.1", "::1"],
        "Peers that may send a PROXY protocol header (addresses, networks, or *); under --proxy-protocol any "
        "other gets 400.",
        default_text="127.0.0.1,::1",
        from_python=_address_list_value,
    ),
    Setting(
        "logging",
        "access_logfile",
        ("--access-logfile",),
        "FILE",
        _log_destination,
        None,
        "Where to write one line per request ('-': standard output).",
        default_text="off",
    ),
    Setting(
        "logging",
        "access_log_format",
        ("--access-logformat",),
        "FORMAT",
        _access_log_format,
        ACCESS_LOG_FORMAT,
        "What each access-log line says: gunicorn's atoms, maitred's queue_ms and app_ms, or 'json' for "
        "one JSON object per line (docs/LIMITS.md, The access log's format).",
        default_text="gunicorn's combined log format",
    ),
    Setting(
        "logging",
        "error_logfile",
        ("--error-logfile",),
        "FILE",
        _log_destination,
        "-",
        "Where every process of maitred writes its log ('-': standard error).",
    ),
    Setting(
        "logging",
        "log_level",
        ("--log-level",),
        "LEVEL",
        _log_level,
        "info",
        f"Lowest level written to the error log: {', '.join(log.LEVELS)}.",
    ),
)
