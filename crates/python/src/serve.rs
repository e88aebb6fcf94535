//! The lobby's entry point for the CLI:
//! `maitred._native.serve(settings, control_fd, zygote_pid, succession, reread=None, hooks=None)`.
//!
//! The CLI has validated every setting and forked the zygote; from here this process is the
//! lobby. The GIL is released for the whole run: no Python code runs in the lobby, except the
//! config file read again for a reload (SIGHUP) and the server hooks, each on a thread of its
//! own.
//!
//! Imports no module of this crate: the lobby is `maitred_lobby`.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
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
    let config = config_from(&Settings::of(settings))?;
    let given = Settings::of(succession);
    let succession = Succession {
        command: given.required("command")?,
        directory: given.required::<String>("directory")?.into(),
        pid_file: given.optional::<String>("pid_file")?.map(Into::into),
        // The CLI hands these descriptors over and no longer uses them.
        predecessor: given.optional::<i32>("predecessor")?.map(maitred_sys::fd::adopt).transpose()?,
        inherited: given
            .required::<HashMap<String, i32>>("inherited")?
            .into_iter()
            .map(|(bind, fd)| {
                let bind = bind_address(py, &bind)?;
                // As `predecessor`: a listen socket the CLI hands over, one per bind.
                Ok((bind, maitred_sys::fd::adopt(fd)?))
            })
            .collect::<PyResult<_>>()?,
    };
    given.all_read()?;
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
        let config = config_from(&Settings::of(&settings)).map_err(|e| e.value(py).to_string())?;
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

/// The lobby's `Config` from the CLI's settings dict (`maitred.config.lobby_settings`), which
/// must hold exactly the keys read here.
fn config_from(settings: &Settings<'_, '_>) -> PyResult<Config> {
    let py = settings.dict.py();
    let binds =
        settings.required::<Vec<String>>("bind")?.iter().map(|b| bind_address(py, b)).collect::<PyResult<Vec<_>>>()?;
    let log_level: String = settings.required("log_level")?;
    let config = Config {
        binds,
        workers: settings.required("workers")?,
        threads: settings.required("threads")?,
        worker_connections: settings.required("worker_connections")?,
        backlog: settings.optional("backlog")?,
        timeout: settings.seconds("timeout")?,
        graceful_timeout: settings.seconds("graceful_timeout")?,
        lobby_timeout: Some(settings.seconds("lobby_timeout")?).filter(|limit| !limit.is_zero()),
        keep_alive: settings.seconds("keep_alive")?,
        header_timeout: settings.seconds("header_timeout")?,
        body_min_rate: settings.required("body_min_rate")?,
        send_timeout: settings.seconds("send_timeout")?,
        max_spill: settings.required("max_spill")?,
        max_spill_total: settings.required("max_spill_total")?,
        max_head_memory: settings.required("max_head_memory")?,
        limit_request_line: settings.required("limit_request_line")?,
        limit_request_fields: settings.required("limit_request_fields")?,
        limit_request_field_size: settings.required("limit_request_field_size")?,
        max_requests: settings.required("max_requests")?,
        max_requests_jitter: settings.required("max_requests_jitter")?,
        max_worker_memory: settings.required("max_worker_memory")?,
        max_worker_lifetime: settings
            .optional::<f64>("max_worker_lifetime")?
            .map(Duration::try_from_secs_f64)
            .transpose()
            .map_err(|e| PyValueError::new_err(format!("setting 'max_worker_lifetime': {e}")))?,
        max_worker_lifetime_jitter: settings.seconds("max_worker_lifetime_jitter")?,
        access_logfile: settings.optional("access_logfile")?,
        access_log_format: AccessFormat::parse(&settings.required::<String>("access_log_format")?)
            .map_err(|e| PyValueError::new_err(format!("setting 'access_log_format': {e}")))?,
        error_logfile: settings.optional::<String>("error_logfile")?.filter(|path| path != "-"),
        preload: settings.required("preload")?,
        log_level: Level::parse(&log_level)
            .ok_or_else(|| PyValueError::new_err(format!("unknown log level '{log_level}'")))?,
        max_body: settings.optional("max_body")?,
        queue_timeout: settings.optional::<f64>("queue_timeout")?.map(Duration::from_secs_f64),
        queue_policy: match settings.required::<String>("queue_policy")?.as_str() {
            "adaptive" => QueuePolicy::Adaptive,
            "fifo" => QueuePolicy::Fifo,
            other => return Err(PyValueError::new_err(format!("setting 'queue_policy': unknown policy '{other}'"))),
        },
        request_deadline: settings.optional::<f64>("request_deadline")?.map(Duration::from_secs_f64),
        half_close: match settings.required::<String>("half_close")?.as_str() {
            "abandon" => HalfClose::Abandon,
            "serve" => HalfClose::Serve,
            other => return Err(PyValueError::new_err(format!("setting 'half_close': unknown action '{other}'"))),
        },
        wsgi_chunked_streams: match settings.required::<String>("wsgi_chunked_body")?.as_str() {
            "stream" => true,
            "whole" => false,
            other => return Err(PyValueError::new_err(format!("setting 'wsgi_chunked_body': unknown way '{other}'"))),
        },
        max_connections: settings.optional("max_connections")?,
        app: settings.required("app")?,
        stats: settings.optional::<String>("stats")?.map(|text| bind_address(py, &text)).transpose()?,
        drop_to: settings.optional::<(u32, u32, Vec<u32>)>("drop_to")?.map(|(uid, gid, groups)| Credentials {
            uid,
            gid,
            groups,
        }),
        forwarding: Forwarding {
            allow: allow_list(settings, "forwarded_allow_ips")?,
            secure_scheme_headers: settings
                .required::<HashMap<String, String>>("secure_scheme_headers")?
                .into_iter()
                .collect(),
        },
        proxy_protocol: proxy_versions(&settings.required::<String>("proxy_protocol")?)?,
        http: http_protocols(settings)?,
        proxy_allow_ips: allow_list(settings, "proxy_allow_ips")?,
        websocket: WebSocketLimits {
            max_size: settings.required("ws_max_size")?,
            ping_interval: settings.seconds("ws_ping_interval")?,
            ping_timeout: settings.seconds("ws_ping_timeout")?,
            per_message_deflate: settings.required("ws_per_message_deflate")?,
        },
        tls: tls_settings(settings)?,
        plain_binds: settings
            .required::<Vec<String>>("plain_binds")?
            .iter()
            .map(|b| bind_address(py, b))
            .collect::<PyResult<_>>()?,
    };
    settings.all_read()?;
    Ok(config)
}

/// `--certfile` and the TLS settings beside it (docs/TLS.md); None without a certificate.
/// The CLI has checked them.
fn tls_settings(settings: &Settings<'_, '_>) -> PyResult<Option<TlsSettings>> {
    // All read, with a certificate or without: the dict holds them either way.
    let certfile = settings.optional::<String>("certfile")?;
    let keyfile = settings.optional::<String>("keyfile")?;
    let ca_certs = settings.optional::<String>("ca_certs")?;
    let cert_reqs = settings.required::<String>("cert_reqs")?;
    let ciphers = settings.optional("ciphers")?.unwrap_or_default();
    let Some(certfile) = certfile else { return Ok(None) };
    Ok(Some(TlsSettings {
        certfile: certfile.into(),
        keyfile: keyfile.ok_or_else(|| PyValueError::new_err("setting 'keyfile' is missing"))?.into(),
        ca_certs: ca_certs.map(Into::into),
        cert_reqs: match cert_reqs.as_str() {
            "none" => CertReqs::None,
            "optional" => CertReqs::Optional,
            "required" => CertReqs::Required,
            other => return Err(PyValueError::new_err(format!("setting 'cert_reqs': unknown value '{other}'"))),
        },
        ciphers,
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
fn http_protocols(settings: &Settings<'_, '_>) -> PyResult<HttpProtocols> {
    let protocols = settings.required::<Vec<String>>("http_protocols")?;
    if let Some(other) = protocols.iter().find(|name| !matches!(name.as_str(), "h1" | "h2")) {
        return Err(PyValueError::new_err(format!("setting 'http_protocols': unknown protocol '{other}'")));
    }
    Ok(HttpProtocols {
        http1: protocols.iter().any(|name| name == "h1"),
        http2: protocols.iter().any(|name| name == "h2"),
        max_concurrent_streams: settings.required("http2_max_concurrent_streams")?,
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

fn allow_list(settings: &Settings<'_, '_>, key: &str) -> PyResult<AllowList> {
    AllowList::parse(&settings.required::<Vec<String>>(key)?)
        .map_err(|e| PyValueError::new_err(format!("setting '{key}': {e}")))
}

/// A dict the CLI hands the lobby, and the keys read from it. Each key must be there (its value
/// may be None where a setting is optional), and each key there must be read: a setting renamed
/// on one side of the Rust/Python line is an error at start, not a value silently dropped or
/// left unset.
struct Settings<'a, 'py> {
    dict: &'a Bound<'py, PyDict>,
    read: RefCell<BTreeSet<String>>,
}

impl<'a, 'py> Settings<'a, 'py> {
    fn of(dict: &'a Bound<'py, PyDict>) -> Settings<'a, 'py> {
        Settings { dict, read: RefCell::new(BTreeSet::new()) }
    }

    fn value(&self, key: &str) -> PyResult<Bound<'py, PyAny>> {
        self.read.borrow_mut().insert(key.to_string());
        self.dict.get_item(key)?.ok_or_else(|| PyValueError::new_err(format!("setting '{key}' is missing")))
    }

    fn required<T: FromPyObjectOwned<'py>>(&self, key: &str) -> PyResult<T> {
        self.value(key)?
            .extract()
            .map_err(Into::<PyErr>::into)
            .map_err(|e| PyValueError::new_err(format!("setting '{key}': {e}")))
    }

    fn optional<T: FromPyObjectOwned<'py>>(&self, key: &str) -> PyResult<Option<T>> {
        let value = self.value(key)?;
        if value.is_none() {
            return Ok(None);
        }
        value
            .extract()
            .map(Some)
            .map_err(Into::<PyErr>::into)
            .map_err(|e| PyValueError::new_err(format!("setting '{key}': {e}")))
    }

    fn seconds(&self, key: &str) -> PyResult<Duration> {
        let value: f64 = self.required(key)?;
        Duration::try_from_secs_f64(value).map_err(|e| PyValueError::new_err(format!("setting '{key}': {e}")))
    }

    /// Err naming the keys given and never read.
    fn all_read(&self) -> PyResult<()> {
        let read = self.read.borrow();
        let unread: Vec<String> =
            self.dict.keys().iter().map(|key| key.to_string()).filter(|key| !read.contains(key)).collect();
        if unread.is_empty() {
            return Ok(());
        }
        Err(PyValueError::new_err(format!("the lobby reads no setting named {}", unread.join(", "))))
    }
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
