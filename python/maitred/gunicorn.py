"""Every setting gunicorn documents, and what maitred does with it in a config file.

One table, read by the config-file reader (config/config_file.py) and by docs/GUNICORN.md's
migration table (`markdown_table()`; tests/test_gunicorn_config.py checks that the committed
document is what it makes). The list is gunicorn's settings reference
(docs/content/reference/settings.md in benoitc/gunicorn, release 26.1), which includes every
setting of the releases before it.

A row's `verdict` says what a gunicorn config file renamed to maitred.conf.py gets, and what
gunicorn's flags for it get on maitred's command line and in MAITRED_CMD_ARGS:

- SAME: maitred has a setting of this name and meaning.
- MAPPED: maitred has it under another name (`target`); the gunicorn name is accepted too.
- HOOK: a server hook, described in docs/HOOKS.md.
- IGNORED: maitred cannot honour it; the config file or command line is read, and one warning
  line names the setting and why, unless its value is one of `harmless` (it asks for nothing
  maitred does not already do). gunicorn's Docker advice, `--worker-tmp-dir /dev/shm`, must not
  stop a container that was started with it.
- REFUSED: honouring it silently wrong would be dangerous (traffic the operator believes
  encrypted or authenticated would not be); a config file or flag that turns it on is refused
  with the reason.
"""

from __future__ import annotations

import enum
import ssl
from dataclasses import dataclass


class Verdict(enum.Enum):
    SAME = "same"
    MAPPED = "mapped"
    HOOK = "hook"
    IGNORED = "ignored"
    REFUSED = "refused"


@dataclass(frozen=True)
class GunicornSetting:
    name: str
    flags: tuple[str, ...]
    """gunicorn's command-line flags for it (none for config-file-only settings)."""
    verdict: Verdict
    why: str = ""
    """For IGNORED and REFUSED: the reason, one clause. For MAPPED: what differs, if anything."""
    harmless: tuple[object, ...] = ()
    """For IGNORED and REFUSED: values that ask for nothing maitred does not do anyway."""
    target: str | None = None
    """For MAPPED: maitred's name."""
    flag_sets: object = None
    """For flags that take no value on gunicorn's command line (`--daemon`, `--no-sendfile`): the
    value giving one sets. None: the flags take a value, as most do."""


_SAME = Verdict.SAME
_MAPPED = Verdict.MAPPED
_HOOK = Verdict.HOOK
_IGNORED = Verdict.IGNORED
_REFUSED = Verdict.REFUSED

_OFF = (None, False, "", 0, (), [], {})
_HTTP2_FIXED = "maitred's HTTP/2 windows and frame size are fixed: 256 KiB a stream, 1 MiB a connection (docs/HTTP2.md)"
_DIRTY = "maitred has no dirty-worker pool: every worker runs the application"
_CONTROL = "maitred has no control socket: use signals (docs/SIGNALS.md) and --stats"
_LOGGING = "maitred writes its own log lines (--error-logfile, --access-logfile); no Python logging configuration"
_SYSLOG = "maitred does not write to syslog: give --error-logfile, or let systemd's journal take standard error"
_STATSD = "maitred does not send StatsD: its metrics are Prometheus's, at --stats (docs/METRICS.md)"
_PARSER = "maitred's HTTP parser has fixed rules (docs/CONFORMANCE.md)"
_HOOKS = "hooks: see docs/HOOKS.md"

GUNICORN_SETTINGS: tuple[GunicornSetting, ...] = (
    # Config file
    GunicornSetting("config", ("-c", "--config"), _SAME),
    GunicornSetting("wsgi_app", (), _MAPPED, "used when the command line gives no application", target="app"),
    # Debugging
    GunicornSetting("reload", ("--reload",), _SAME),
    GunicornSetting(
        "reload_engine", ("--reload-engine",), _IGNORED, "--reload always watches with inotify (watchfiles)", ("auto",)
    ),
    GunicornSetting("reload_extra_files", ("--reload-extra-file",), _SAME),
    GunicornSetting("spew", ("--spew",), _IGNORED, "no tracing of every line executed", _OFF, flag_sets=True),
    GunicornSetting("check_config", ("--check-config",), _SAME),
    GunicornSetting("print_config", ("--print-config",), _SAME),
    # Logging
    GunicornSetting("accesslog", ("--access-logfile",), _MAPPED, target="access_logfile"),
    GunicornSetting(
        "disable_redirect_access_to_syslog",
        ("--disable-redirect-access-to-syslog",),
        _IGNORED,
        _SYSLOG,
        _OFF,
        flag_sets=True,
    ),
    GunicornSetting("access_log_format", ("--access-logformat",), _SAME),
    GunicornSetting("errorlog", ("--error-logfile", "--log-file"), _MAPPED, target="error_logfile"),
    GunicornSetting("loglevel", ("--log-level",), _MAPPED, target="log_level"),
    GunicornSetting("capture_output", ("--capture-output",), _SAME),
    GunicornSetting("logger_class", ("--logger-class",), _IGNORED, _LOGGING, ("gunicorn.glogging.Logger",)),
    GunicornSetting("logconfig", ("--log-config",), _IGNORED, _LOGGING, _OFF),
    GunicornSetting("logconfig_dict", (), _IGNORED, _LOGGING, _OFF),
    GunicornSetting("logconfig_json", ("--log-config-json",), _IGNORED, _LOGGING, _OFF),
    GunicornSetting("syslog_addr", ("--log-syslog-to",), _IGNORED, _SYSLOG),
    GunicornSetting("syslog", ("--log-syslog",), _IGNORED, _SYSLOG, _OFF, flag_sets=True),
    GunicornSetting("syslog_prefix", ("--log-syslog-prefix",), _IGNORED, _SYSLOG, _OFF),
    GunicornSetting("syslog_facility", ("--log-syslog-facility",), _IGNORED, _SYSLOG, ("user",)),
    GunicornSetting(
        "enable_stdio_inheritance",
        ("-R", "--enable-stdio-inheritance"),
        _IGNORED,
        "maitred does not daemonize, so standard streams are always inherited",
        _OFF,
        flag_sets=True,
    ),
    GunicornSetting("statsd_host", ("--statsd-host",), _IGNORED, _STATSD, _OFF),
    GunicornSetting("dogstatsd_tags", ("--dogstatsd-tags",), _IGNORED, _STATSD, _OFF),
    GunicornSetting("statsd_prefix", ("--statsd-prefix",), _IGNORED, _STATSD, _OFF),
    GunicornSetting(
        "enable_backlog_metric",
        ("--enable-backlog-metric",),
        _IGNORED,
        "the queue's length is always at --stats (maitred_queue_length)",
        _OFF,
        flag_sets=True,
    ),
    # Process naming
    GunicornSetting("proc_name", ("-n", "--name"), _IGNORED, "maitred does not rename its processes", _OFF),
    GunicornSetting("default_proc_name", (), _IGNORED, "maitred does not rename its processes", ("gunicorn",)),
    # SSL
    GunicornSetting("keyfile", ("--keyfile",), _SAME),
    GunicornSetting("certfile", ("--certfile",), _SAME),
    GunicornSetting(
        "ssl_version",
        ("--ssl-version",),
        _IGNORED,
        "maitred speaks TLS 1.2 and 1.3, always (rustls; docs/TLS.md); gunicorn deprecates the setting too",
        # ssl.PROTOCOL_TLS and ssl.PROTOCOL_TLS_SERVER (gunicorn's default), and their names as
        # --ssl-version takes them: they ask for the best version both sides speak.
        (ssl.PROTOCOL_TLS, ssl.PROTOCOL_TLS_SERVER, "TLS", "TLS_SERVER"),
    ),
    GunicornSetting("cert_reqs", ("--cert-reqs",), _SAME),
    GunicornSetting("ca_certs", ("--ca-certs",), _SAME),
    GunicornSetting(
        "suppress_ragged_eofs",
        ("--suppress-ragged-eofs",),
        _IGNORED,
        "a client's close without close_notify always ends its connection quietly: HTTP/1.1's framing "
        "tells a cut answer",
        (True,),
        flag_sets=True,
    ),
    GunicornSetting(
        "do_handshake_on_connect",
        ("--do-handshake-on-connect",),
        _IGNORED,
        "the lobby always finishes the handshake first, within --header-timeout, away from the workers",
        (True, False),
        flag_sets=True,
    ),
    GunicornSetting("ciphers", ("--ciphers",), _SAME),
    GunicornSetting(
        "ssl_context",
        (),
        _REFUSED,
        "a Python SSLContext cannot configure rustls: set --certfile, --keyfile, --ca-certs, --cert-reqs and "
        "--ciphers instead",
    ),
    # Security
    GunicornSetting("limit_request_line", ("--limit-request-line",), _SAME),
    GunicornSetting("limit_request_fields", ("--limit-request-fields",), _SAME),
    GunicornSetting("limit_request_field_size", ("--limit-request-field_size",), _SAME),
    # Server hooks
    *(
        GunicornSetting(hook, (), _HOOK, _HOOKS)
        for hook in (
            "on_starting",
            "on_reload",
            "when_ready",
            "pre_fork",
            "post_fork",
            "post_worker_init",
            "worker_int",
            "worker_abort",
            "pre_exec",
            "pre_request",
            "post_request",
            "child_exit",
            "worker_exit",
            "nworkers_changed",
            "on_exit",
        )
    ),
    # Server mechanics
    GunicornSetting("preload_app", ("--preload",), _MAPPED, target="preload"),
    GunicornSetting(
        "sendfile",
        ("--no-sendfile",),
        _IGNORED,
        "the lobby always sends wsgi.file_wrapper files with sendfile()",
        (None, True),
        flag_sets=False,
    ),
    GunicornSetting(
        "reuse_port",
        ("--reuse-port",),
        _IGNORED,
        "one lobby owns each address; a binary upgrade (SIGUSR2) hands its sockets over",
        _OFF,
        flag_sets=True,
    ),
    GunicornSetting("chdir", ("--chdir",), _SAME),
    GunicornSetting(
        "daemon",
        ("-D", "--daemon"),
        _IGNORED,
        "maitred does not daemonize: run it under a service manager (docs/SYSTEMD.md)",
        _OFF,
        flag_sets=True,
    ),
    GunicornSetting("raw_env", ("-e", "--env"), _MAPPED, target="env"),
    GunicornSetting("pidfile", ("-p", "--pid"), _MAPPED, target="pid"),
    GunicornSetting(
        "worker_tmp_dir", ("--worker-tmp-dir",), _IGNORED, "maitred's workers keep no heartbeat file", _OFF
    ),
    GunicornSetting("user", ("-u", "--user"), _SAME),
    GunicornSetting("group", ("-g", "--group"), _SAME),
    GunicornSetting("umask", ("-m", "--umask"), _SAME),
    GunicornSetting("initgroups", ("--initgroups",), _SAME),
    GunicornSetting(
        "tmp_upload_dir",
        (),
        _IGNORED,
        "the lobby keeps large request bodies in temporary files of its own (TMPDIR)",
        _OFF,
    ),
    GunicornSetting("secure_scheme_headers", (), _SAME),
    GunicornSetting("forwarded_allow_ips", ("--forwarded-allow-ips",), _SAME),
    GunicornSetting(
        "pythonpath",
        ("--pythonpath",),
        _IGNORED,
        "give the application's directory with --chdir, or set PYTHONPATH",
        _OFF,
    ),
    GunicornSetting(
        "paste", ("--paste", "--paster"), _IGNORED, "give the application as MODULE:CALLABLE; no PasteDeploy", _OFF
    ),
    GunicornSetting("raw_paste_global_conf", ("--paste-global",), _IGNORED, "no PasteDeploy", _OFF),
    GunicornSetting("proxy_protocol", ("--proxy-protocol",), _SAME),
    GunicornSetting("proxy_allow_ips", ("--proxy-allow-from",), _SAME),
    GunicornSetting("protocol", ("--protocol",), _IGNORED, "maitred speaks HTTP only, not uwsgi", ("http",)),
    GunicornSetting("uwsgi_allow_ips", ("--uwsgi-allow-from",), _IGNORED, "maitred speaks HTTP only, not uwsgi"),
    GunicornSetting("permit_obsolete_folding", ("--permit-obsolete-folding",), _IGNORED, _PARSER, _OFF, flag_sets=True),
    GunicornSetting("strip_header_spaces", ("--strip-header-spaces",), _IGNORED, _PARSER, _OFF, flag_sets=True),
    GunicornSetting(
        "permit_unconventional_http_method",
        ("--permit-unconventional-http-method",),
        _IGNORED,
        _PARSER,
        _OFF,
        flag_sets=True,
    ),
    GunicornSetting(
        "permit_unconventional_http_version",
        ("--permit-unconventional-http-version",),
        _IGNORED,
        _PARSER,
        _OFF,
        flag_sets=True,
    ),
    GunicornSetting("casefold_http_method", ("--casefold-http-method",), _IGNORED, _PARSER, _OFF, flag_sets=True),
    GunicornSetting(
        "forwarder_headers",
        ("--forwarder-headers",),
        _IGNORED,
        "maitred does not take SCRIPT_NAME or PATH_INFO from request headers",
    ),
    GunicornSetting(
        "header_map",
        ("--header-map",),
        _IGNORED,
        "maitred always drops header names containing '_' (gunicorn's 'drop')",
        ("drop",),
    ),
    GunicornSetting("root_path", ("--root-path",), _IGNORED, "SCRIPT_NAME is always empty", _OFF),
    # Server socket
    GunicornSetting("bind", ("-b", "--bind"), _SAME),
    GunicornSetting("backlog", ("--backlog",), _SAME),
    # Worker processes
    GunicornSetting("workers", ("-w", "--workers"), _SAME),
    GunicornSetting(
        "worker_class",
        ("-k", "--worker-class"),
        _IGNORED,
        "maitred's workers are its own: each thread runs one request at a time, like gunicorn's sync and "
        "gthread workers (threads come from --threads), an ASGI application's event loop runs "
        "--worker-connections at once, like uvicorn's workers, and the lobby holds slow and idle connections",
        (
            "sync",
            "gunicorn.workers.sync.SyncWorker",
            "gthread",
            "gunicorn.workers.gthread.ThreadWorker",
            "uvicorn.workers.UvicornWorker",
            "uvicorn_worker.UvicornWorker",
        ),
    ),
    GunicornSetting("threads", ("--threads",), _SAME),
    GunicornSetting("worker_connections", ("--worker-connections",), _SAME),
    GunicornSetting("max_requests", ("--max-requests",), _SAME),
    GunicornSetting("max_requests_jitter", ("--max-requests-jitter",), _SAME),
    GunicornSetting("timeout", ("-t", "--timeout"), _SAME),
    GunicornSetting("graceful_timeout", ("--graceful-timeout",), _SAME),
    GunicornSetting(
        "keepalive",
        ("--keep-alive",),
        _MAPPED,
        "maitred's default is 75 seconds: an idle connection costs it no worker",
        target="keep_alive",
    ),
    # ASGI
    GunicornSetting("asgi_loop", ("--asgi-loop",), _MAPPED, target="loop"),
    GunicornSetting(
        "asgi_lifespan",
        ("--asgi-lifespan",),
        _IGNORED,
        "maitred runs the lifespan of an application that has one (auto)",
        ("auto",),
    ),
    GunicornSetting(
        "asgi_disconnect_grace_period",
        ("--asgi-disconnect-grace-period",),
        _IGNORED,
        "the application hears http.disconnect when its client leaves; --timeout bounds the rest",
    ),
    # HTTP/2
    GunicornSetting(
        "http_protocols",
        ("--http-protocols",),
        _SAME,
        "maitred's default is h1,h2 (gunicorn's: h1), and h2 is spoken on plain listeners too, to clients that "
        "open with its preface (docs/HTTP2.md)",
    ),
    GunicornSetting(
        "http2_cleartext",
        ("--http2-cleartext",),
        _IGNORED,
        "maitred takes HTTP/2 with prior knowledge on every plain listener while --http-protocols has h2, and "
        "never by Upgrade: h2c",
        (*_OFF, "off", "prior-knowledge"),
    ),
    GunicornSetting("http2_max_concurrent_streams", ("--http2-max-concurrent-streams",), _SAME),
    GunicornSetting("http2_initial_window_size", ("--http2-initial-window-size",), _IGNORED, _HTTP2_FIXED),
    GunicornSetting("http2_max_frame_size", ("--http2-max-frame-size",), _IGNORED, _HTTP2_FIXED),
    GunicornSetting(
        "http2_max_header_list_size",
        ("--http2-max-header-list-size",),
        _IGNORED,
        "a header block is held to 64 KiB decoded, as an HTTP/1.1 head is; its fields to --limit-request-fields "
        "and --limit-request-field-size",
    ),
    GunicornSetting("http_parser", ("--http-parser",), _IGNORED, _PARSER, ("auto",)),
    # Dirty arbiters
    GunicornSetting("dirty_apps", ("--dirty-app",), _IGNORED, _DIRTY, _OFF),
    GunicornSetting("dirty_workers", ("--dirty-workers",), _IGNORED, _DIRTY, _OFF),
    GunicornSetting("dirty_timeout", ("--dirty-timeout",), _IGNORED, _DIRTY),
    GunicornSetting("dirty_threads", ("--dirty-threads",), _IGNORED, _DIRTY),
    GunicornSetting("dirty_graceful_timeout", ("--dirty-graceful-timeout",), _IGNORED, _DIRTY),
    GunicornSetting("on_dirty_starting", (), _IGNORED, _DIRTY),
    GunicornSetting("dirty_post_fork", (), _IGNORED, _DIRTY),
    GunicornSetting("dirty_worker_init", (), _IGNORED, _DIRTY),
    GunicornSetting("dirty_worker_exit", (), _IGNORED, _DIRTY),
    # Control socket
    GunicornSetting("control_socket", ("--control-socket",), _IGNORED, _CONTROL),
    GunicornSetting("control_socket_mode", ("--control-socket-mode",), _IGNORED, _CONTROL),
    GunicornSetting("control_socket_disable", ("--no-control-socket",), _IGNORED, _CONTROL, flag_sets=True),
)

BY_NAME = {setting.name: setting for setting in GUNICORN_SETTINGS}
IGNORED_WITH_FLAGS = tuple(s for s in GUNICORN_SETTINGS if s.verdict is Verdict.IGNORED and s.flags)
"""What the command line accepts with a warning (config/command_line.py), as a config file does."""
BY_FLAG = {flag: setting for setting in GUNICORN_SETTINGS for flag in setting.flags}


def asks_nothing_more(setting: GunicornSetting, value: object) -> bool:
    """Whether a value of an IGNORED or REFUSED setting is one of its `harmless` ones."""
    # Compared with the type too: True == 1, but `threads = True` is not `threads = 1`.
    return any(type(value) is type(quiet) and value == quiet for quiet in setting.harmless)


def markdown_table() -> str:
    """docs/GUNICORN.md's migration table, made from GUNICORN_SETTINGS."""
    rows = [
        "| gunicorn setting | gunicorn flags | In maitred | Why, or what differs |",
        "|---|---|---|---|",
    ]
    for setting in GUNICORN_SETTINGS:
        flags = ", ".join(f"`{flag}`" for flag in setting.flags)
        if setting.verdict is Verdict.SAME:
            ours = f"`{setting.name}`"
        elif setting.verdict is Verdict.MAPPED:
            ours = f"as `{setting.target}`"
        elif setting.verdict is Verdict.HOOK:
            ours = "hook"
        elif setting.verdict is Verdict.IGNORED:
            ours = "ignored, with a warning"
        else:
            ours = "refused"
        why = setting.why
        if setting.harmless and setting.verdict in (Verdict.IGNORED, Verdict.REFUSED):
            quiet = ", ".join(f"`{value!r}`" for value in setting.harmless)
            why += f" (accepted silently when set to {quiet})"
        rows.append(f"| `{setting.name}` | {flags} | {ours} | {why.replace('|', chr(92) + '|')} |")
    return "\n".join(rows)
