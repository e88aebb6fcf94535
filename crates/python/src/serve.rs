//! The lobby's entry point for the CLI:
//! `maitred._native.serve(settings, control_fd, zygote_pid, succession, reread=None, hooks=None)`.
//!
//! The CLI has validated every setting and forked the zygote; from here this process is the
//! lobby. The GIL is released for the whole run: no Python code runs in the lobby, except the
//! config file read again for a reload (SIGHUP) and the server hooks, each on a thread of its
//! own.
//!
//! Imports no module of this crate: the lobby is `maitred_lobby`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use maitred_lobby::{
    AccessFormat, AllowList, BindAddress, CertReqs, Config, Credentials, Forwarding, HalfClose, HookFailed,
    HttpProtocols, Level, LobbyHook, ProxyVersions, QueuePolicy, Reread, Rereader, ServerHooks, Succession,
    TlsSettings, WebSocketLimits,
};
use pyo3::conversion::FromPyObjectOwned;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

pyo3::create_exception!(_native, StartupError, pyo3::exceptions::PyException);

/// Runs the lobby until it shuts down and returns the exit code. Takes ownership of
/// `control_fd`. Raises StartupError with one line for the operator when it cannot start.
///
/// `reread`, given when there is a config file, is called (on a thread of the lobby's, with the
/// GIL) for each SIGHUP: it returns `(settings, kept)`, the settings as `serve` takes them and
/// the names of those that changed but cannot change without a new lobby, or raises an
/// exception whose message says what is wrong with the file.
///
/// `succession` is how a binary upgrade (SIGUSR2) starts the next maitred: `command` (the
/// command line, interpreter first), `directory` (where it was started), `pid_file`, and
/// `predecessor`, the descriptor of the channel to the lobby this one replaces, if any, and
/// `inherited`, the listen sockets it passed, by the --bind address each listens on (the lobby
/// takes ownership of them all).
///
/// `hooks`, given when there is a config file, is maitred.hooks.LobbyHooks: the lobby calls its
/// methods (on a thread of its own, with the GIL) to run the config file's server hooks, and
/// reads `names`, the hooks that are set.
#[pyfunction]
#[pyo3(signature = (settings, control_fd, zygote_pid, succession, reread=None, hooks=None))]
fn serve(
    py: Python<'_>,
    settings: &Bound<'_, PyDict>,
    control_fd: i32,
    zygote_pid: i32,
    succession: &Bound<'_, PyDict>,
    reread: Option<Py<PyAny>>,
    hooks: Option<Bound<'_, PyAny>>,
) -> PyResult<i32> {
    let config = config_from(settings)?;
    let succession = Succession {
        command: required(succession, "command")?,
        directory: required::<String>(succession, "directory")?.into(),
        pid_file: optional::<String>(succession, "pid_file")?.map(Into::into),
        // The CLI hands these descriptors over and no longer uses them.
        predecessor: optional::<i32>(succession, "predecessor")?.map(maitred_sys::fd::adopt).transpose()?,
        inherited: required::<HashMap<String, i32>>(succession, "inherited")?
            .into_iter()
            .map(|(bind, fd)| {
                let bind = bind_address(py, &bind)?;
                // As `predecessor`: a listen socket the CLI hands over, one per bind.
                Ok((bind, maitred_sys::fd::adopt(fd)?))
            })
            .collect::<PyResult<_>>()?,
    };
    let rereader = reread.map(|reread| -> Rereader { Arc::new(move || call_reread(&reread)) });
    let hooks = hooks.map(|hooks| server_hooks(&hooks)).transpose()?;
    // The CLI hands this descriptor over and no longer uses it.
    let control = maitred_sys::fd::adopt(control_fd)?;
    // Python's SIGINT handler only sets a flag for the interpreter, which will not run
    // until the lobby returns; the lobby handles SIGINT itself.
    maitred_sys::process::default_action(libc::SIGINT);
    py.detach(move || maitred_lobby::run(config, control, zygote_pid, rereader, succession, hooks))
        .map_err(|e| StartupError::new_err(e.0))
}

/// The lobby's view of the CLI's LobbyHooks.
fn server_hooks(hooks: &Bound<'_, PyAny>) -> PyResult<ServerHooks> {
    let names: std::collections::HashSet<String> = hooks.getattr("names")?.extract()?;
    let hooks = hooks.clone().unbind();
    Ok(ServerHooks {
        call: Arc::new(move |hook| call_hook(&hooks, hook)),
        interrupt_workers: names.contains("worker_int"),
        abort_on_timeout: names.contains("worker_abort"),
    })
}

/// Calls the LobbyHooks method for `hook`, which logs the traceback of a hook that raises and
/// returns False.
fn call_hook(hooks: &Py<PyAny>, hook: &LobbyHook) -> Result<(), HookFailed> {
    Python::attach(|py| {
        let hooks = hooks.bind(py);
        let returned = match *hook {
            LobbyHook::WhenReady => hooks.call_method0("when_ready"),
            LobbyHook::OnReload => hooks.call_method0("on_reload"),
            LobbyHook::PreExec => hooks.call_method0("pre_exec"),
            LobbyHook::WorkersChanged { new, old } => hooks.call_method1("nworkers_changed", (new, old)),
            LobbyHook::ChildExit { pid, age, zygote } => hooks.call_method1("child_exit", (pid, age, zygote)),
        };
        match returned.and_then(|succeeded| succeeded.extract::<bool>()) {
            Ok(true) => Ok(()),
            Ok(false) => Err(HookFailed),
            Err(e) => {
                // Not the hook: maitred's own call of it (a BaseException the hook raised).
                e.print(py);
                Err(HookFailed)
            }
        }
    })
}

/// Calls the CLI's `reread`; Err is one line for the log.
fn call_reread(reread: &Py<PyAny>) -> Result<Reread, String> {
    Python::attach(|py| {
        let returned = reread.call0(py).map_err(|e| e.value(py).to_string())?;
        let (settings, kept): (Bound<'_, PyDict>, Vec<String>) =
            returned.extract(py).map_err(|e: PyErr| format!("the config re-read returned something else: {e}"))?;
        let config = config_from(&settings).map_err(|e| e.value(py).to_string())?;
        Ok(Reread { config, kept })
    })
}

/// Checks an `--access-logformat` for the CLI: raises ValueError with one line saying what is
/// wrong. The lobby owns the format's grammar (maitred_lobby's log/access_format.rs); the CLI asks
/// here rather than keeping a second copy of it.
#[pyfunction]
fn check_access_log_format(format: &str) -> PyResult<()> {
    AccessFormat::parse(format).map(drop).map_err(PyValueError::new_err)
}

fn config_from(settings: &Bound<'_, PyDict>) -> PyResult<Config> {
    let py = settings.py();
    let binds =
        required::<Vec<String>>(settings, "bind")?.iter().map(|b| bind_address(py, b)).collect::<PyResult<Vec<_>>>()?;
    let log_level: String = required(settings, "log_level")?;
    Ok(Config {
        binds,
        workers: required(settings, "workers")?,
        threads: required(settings, "threads")?,
        worker_connections: required(settings, "worker_connections")?,
        backlog: optional(settings, "backlog")?,
        timeout: seconds(settings, "timeout")?,
        graceful_timeout: seconds(settings, "graceful_timeout")?,
        lobby_timeout: Some(seconds(settings, "lobby_timeout")?).filter(|limit| !limit.is_zero()),
        keep_alive: seconds(settings, "keep_alive")?,
        header_timeout: seconds(settings, "header_timeout")?,
        body_min_rate: required(settings, "body_min_rate")?,
        send_timeout: seconds(settings, "send_timeout")?,
        max_spill: required(settings, "max_spill")?,
        max_spill_total: required(settings, "max_spill_total")?,
        max_head_memory: required(settings, "max_head_memory")?,
        limit_request_line: required(settings, "limit_request_line")?,
        limit_request_fields: required(settings, "limit_request_fields")?,
        limit_request_field_size: required(settings, "limit_request_field_size")?,
        max_requests: required(settings, "max_requests")?,
        max_requests_jitter: required(settings, "max_requests_jitter")?,
        max_worker_memory: required(settings, "max_worker_memory")?,
        max_worker_lifetime: optional::<f64>(settings, "max_worker_lifetime")?
            .map(Duration::try_from_secs_f64)
            .transpose()
            .map_err(|e| PyValueError::new_err(format!("setting 'max_worker_lifetime': {e}")))?,
        max_worker_lifetime_jitter: seconds(settings, "max_worker_lifetime_jitter")?,
        access_logfile: optional(settings, "access_logfile")?,
        access_log_format: AccessFormat::parse(&required::<String>(settings, "access_log_format")?)
            .map_err(|e| PyValueError::new_err(format!("setting 'access_log_format': {e}")))?,
        error_logfile: optional::<String>(settings, "error_logfile")?.filter(|path| path != "-"),
        preload: required(settings, "preload")?,
        log_level: Level::parse(&log_level)
            .ok_or_else(|| PyValueError::new_err(format!("unknown log level '{log_level}'")))?,
        max_body: optional(settings, "max_body")?,
        queue_timeout: optional::<f64>(settings, "queue_timeout")?.map(Duration::from_secs_f64),
        queue_policy: match required::<String>(settings, "queue_policy")?.as_str() {
            "adaptive" => QueuePolicy::Adaptive,
            "fifo" => QueuePolicy::Fifo,
            other => return Err(PyValueError::new_err(format!("setting 'queue_policy': unknown policy '{other}'"))),
        },
        request_deadline: optional::<f64>(settings, "request_deadline")?.map(Duration::from_secs_f64),
        half_close: match required::<String>(settings, "half_close")?.as_str() {
            "abandon" => HalfClose::Abandon,
            "serve" => HalfClose::Serve,
            other => return Err(PyValueError::new_err(format!("setting 'half_close': unknown action '{other}'"))),
        },
        max_connections: optional(settings, "max_connections")?,
        app: required(settings, "app")?,
        stats: optional::<String>(settings, "stats")?.map(|text| bind_address(py, &text)).transpose()?,
        drop_to: optional::<(u32, u32, Vec<u32>)>(settings, "drop_to")?.map(|(uid, gid, groups)| Credentials {
            uid,
            gid,
            groups,
        }),
        forwarding: Forwarding {
            allow: allow_list(settings, "forwarded_allow_ips")?,
            secure_scheme_headers: required::<HashMap<String, String>>(settings, "secure_scheme_headers")?
                .into_iter()
                .collect(),
        },
        proxy_protocol: proxy_versions(&required::<String>(settings, "proxy_protocol")?)?,
        http: http_protocols(settings)?,
        proxy_allow_ips: allow_list(settings, "proxy_allow_ips")?,
        websocket: WebSocketLimits {
            max_size: required(settings, "ws_max_size")?,
            ping_interval: seconds(settings, "ws_ping_interval")?,
            ping_timeout: seconds(settings, "ws_ping_timeout")?,
            per_message_deflate: required(settings, "ws_per_message_deflate")?,
        },
        tls: tls_settings(settings)?,
        plain_binds: required::<Vec<String>>(settings, "plain_binds")?
            .iter()
            .map(|b| bind_address(py, b))
            .collect::<PyResult<_>>()?,
    })
}

/// `--certfile` and the TLS settings beside it (docs/TLS.md); None without a certificate.
/// The CLI has checked them.
fn tls_settings(settings: &Bound<'_, PyDict>) -> PyResult<Option<TlsSettings>> {
    let Some(certfile) = optional::<String>(settings, "certfile")? else { return Ok(None) };
    Ok(Some(TlsSettings {
        certfile: certfile.into(),
        keyfile: required::<String>(settings, "keyfile")?.into(),
        ca_certs: optional::<String>(settings, "ca_certs")?.map(Into::into),
        cert_reqs: match required::<String>(settings, "cert_reqs")?.as_str() {
            "none" => CertReqs::None,
            "optional" => CertReqs::Optional,
            "required" => CertReqs::Required,
            other => return Err(PyValueError::new_err(format!("setting 'cert_reqs': unknown value '{other}'"))),
        },
        ciphers: optional(settings, "ciphers")?.unwrap_or_default(),
    }))
}

/// A listen address the CLI has checked, in its parts: the CLI owns the grammar of addresses,
/// and `maitred.config.bind_parts` gives `("tcp", host, port)`, `("unix", path)` or
/// `("fd", n)`.
fn bind_address(py: Python<'_>, address: &str) -> PyResult<BindAddress> {
    let parts = py.import("maitred.config")?.getattr("bind_parts")?.call1((address,))?;
    let parts = parts.cast::<PyTuple>()?;
    let kind: String = parts.get_item(0)?.extract()?;
    match (kind.as_str(), parts.len()) {
        ("tcp", 3) => Ok(BindAddress::Tcp { host: parts.get_item(1)?.extract()?, port: parts.get_item(2)?.extract()? }),
        ("unix", 2) => Ok(BindAddress::Unix(parts.get_item(1)?.extract::<String>()?.into())),
        ("fd", 2) => Ok(BindAddress::Fd(parts.get_item(1)?.extract()?)),
        _ => Err(PyValueError::new_err(format!("not an address: {parts}"))),
    }
}

/// `--http-protocols` (a list of `h1` and `h2`, checked by the CLI) and
/// `--http2-max-concurrent-streams`.
fn http_protocols(settings: &Bound<'_, PyDict>) -> PyResult<HttpProtocols> {
    let protocols = required::<Vec<String>>(settings, "http_protocols")?;
    if let Some(other) = protocols.iter().find(|name| !matches!(name.as_str(), "h1" | "h2")) {
        return Err(PyValueError::new_err(format!("setting 'http_protocols': unknown protocol '{other}'")));
    }
    Ok(HttpProtocols {
        http1: protocols.iter().any(|name| name == "h1"),
        http2: protocols.iter().any(|name| name == "h2"),
        max_concurrent_streams: required(settings, "http2_max_concurrent_streams")?,
    })
}

/// `--proxy-protocol`'s modes, as gunicorn names them (the CLI has checked them).
fn proxy_versions(mode: &str) -> PyResult<Option<ProxyVersions>> {
    match mode {
        "off" => Ok(None),
        "v1" => Ok(Some(ProxyVersions::V1)),
        "v2" => Ok(Some(ProxyVersions::V2)),
        "auto" => Ok(Some(ProxyVersions::Both)),
        other => Err(PyValueError::new_err(format!("setting 'proxy_protocol': unknown mode '{other}'"))),
    }
}

fn allow_list(settings: &Bound<'_, PyDict>, key: &str) -> PyResult<AllowList> {
    AllowList::parse(&required::<Vec<String>>(settings, key)?)
        .map_err(|e| PyValueError::new_err(format!("setting '{key}': {e}")))
}

fn required<'py, T: FromPyObjectOwned<'py>>(settings: &Bound<'py, PyDict>, key: &str) -> PyResult<T> {
    match settings.get_item(key)? {
        Some(value) => value
            .extract()
            .map_err(Into::<PyErr>::into)
            .map_err(|e| PyValueError::new_err(format!("setting '{key}': {e}"))),
        None => Err(PyValueError::new_err(format!("setting '{key}' is missing"))),
    }
}

fn optional<'py, T: FromPyObjectOwned<'py>>(settings: &Bound<'py, PyDict>, key: &str) -> PyResult<Option<T>> {
    match settings.get_item(key)? {
        Some(value) if !value.is_none() => value
            .extract()
            .map(Some)
            .map_err(Into::<PyErr>::into)
            .map_err(|e| PyValueError::new_err(format!("setting '{key}': {e}"))),
        _ => Ok(None),
    }
}

fn seconds(settings: &Bound<'_, PyDict>, key: &str) -> PyResult<Duration> {
    let value: f64 = required(settings, key)?;
    Duration::try_from_secs_f64(value).map_err(|e| PyValueError::new_err(format!("setting '{key}': {e}")))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("StartupError", m.py().get_type::<StartupError>())?;
    m.add_function(wrap_pyfunction!(serve, m)?)?;
    m.add_function(wrap_pyfunction!(check_access_log_format, m)?)?;
    // The variables that carry inherited descriptors across exec: the lobby owns their names.
    m.add("UPGRADE_CHANNEL_VARIABLE", maitred_lobby::UPGRADE_CHANNEL_VARIABLE)?;
    m.add("UPGRADE_LISTENERS_VARIABLE", maitred_lobby::UPGRADE_LISTENERS_VARIABLE)?;
    m.add("ZYGOTE_CHANNEL_VARIABLE", maitred_lobby::ZYGOTE_CHANNEL_VARIABLE)?;
    m.add("LISTEN_FDS_START", maitred_lobby::LISTEN_FDS_START)?;
    // The signal that has a worker write its Python stack (before a kill at --timeout).
    m.add("STACK_SIGNAL", maitred_lobby::stack_signal())?;
    Ok(())
}
