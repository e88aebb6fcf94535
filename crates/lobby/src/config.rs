//! What the lobby is told to do. The CLI (Python) validates every value; this is its typed form.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use maitred_protocol::{Limits, ProxyVersions};

use crate::client::context::{HttpProtocols, Settings as ClientSettings, WebSocketLimits};
use crate::client::proxies::{AllowList, Forwarding};
use crate::client::tls::certificates::TlsSettings;
use crate::log::access_format::AccessFormat;
use crate::log::Level;
use crate::seating::overload::Policy;

/// One address to listen on, as given to `--bind`. The CLI owns the grammar (python/maitred/config)
/// and hands each one over parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BindAddress {
    /// `HOST:PORT` or `[V6]:PORT`; the host is resolved when binding.
    Tcp { host: String, port: u16 },
    /// `unix:PATH`.
    Unix(PathBuf),
    /// `fd://N`: a socket inherited already listening (systemd socket activation and the like).
    Fd(i32),
}

/// Every setting the lobby acts on.
#[derive(Clone, Debug)]
pub struct Config {
    pub binds: Vec<BindAddress>,
    pub workers: usize,
    /// Threads per worker, each a channel and a seat of its own.
    pub threads: usize,
    /// An ASGI worker's seats, each a channel: the requests its event loop runs at once. The
    /// zygote knows which interface the application has and makes a worker's channels by it.
    pub worker_connections: usize,
    /// None: the kernel's maximum (`net.core.somaxconn`).
    pub backlog: Option<u32>,
    /// How long one request may keep a worker before the worker is killed.
    pub timeout: Duration,
    /// How long a shutdown waits for queued and running requests.
    pub graceful_timeout: Duration,
    /// How long the lobby's event loop may make no progress before the lobby ends itself
    /// (`process/watchdog.rs`); None: never.
    pub lobby_timeout: Option<Duration>,
    /// How long an idle keep-alive connection is held open.
    pub keep_alive: Duration,
    /// How long a request head, and each gap inside a body, may take to arrive.
    pub header_timeout: Duration,
    /// Bytes per second a body must average after its first `header_timeout`; 0: no such limit.
    pub body_min_rate: u64,
    /// How long a client may take no byte of its answer before it is cut.
    pub send_timeout: Duration,
    /// Bytes of one answer that may wait in a temporary file for a slow client.
    pub max_spill: u64,
    /// Bytes of all answers that may wait in temporary files.
    pub max_spill_total: u64,
    /// Bytes of all incomplete request heads held at once.
    pub max_head_memory: usize,
    pub limit_request_line: usize,
    pub limit_request_fields: usize,
    pub limit_request_field_size: usize,
    /// Retire a worker after this many requests; 0 never.
    pub max_requests: u64,
    pub max_requests_jitter: u64,
    /// Retire a worker whose resident memory is above this many MiB after a request; 0 never.
    pub max_worker_memory: u64,
    /// Retire a worker once it has served this long; None never.
    pub max_worker_lifetime: Option<Duration>,
    pub max_worker_lifetime_jitter: Duration,
    /// None: no access log. `-`: standard output.
    pub access_logfile: Option<String>,
    /// `--access-logformat`, parsed; a reload may change it.
    pub access_log_format: AccessFormat,
    /// The file standard error was pointed at (`--error-logfile`), which SIGUSR1 reopens;
    /// None when it is the standard error maitred was started with.
    pub error_logfile: Option<String>,
    /// The zygote imported the application (`--preload`): a reload would need a new zygote.
    pub preload: bool,
    pub log_level: Level,
    pub max_body: Option<u64>,
    /// None: a request waits for a worker as long as it takes.
    pub queue_timeout: Option<Duration>,
    /// `--queue-policy`: adaptive sheds what cannot be answered in time; fifo serves all.
    pub queue_policy: QueuePolicy,
    /// `--request-deadline`: how long a client waits, counted from X-Request-Start if trusted.
    pub request_deadline: Option<Duration>,
    /// `--half-close`: what a client that shuts its sending side while its request waits means.
    pub half_close: HalfClose,
    /// `--wsgi-chunked-body stream`: a fast chunked upload streams to a WSGI application
    /// without its length, as to an ASGI one; otherwise it is read whole first.
    pub wsgi_chunked_streams: bool,
    /// None: as many as the file-descriptor limit allows.
    pub max_connections: Option<usize>,
    /// The application spec, for log lines.
    pub app: String,
    /// The stats listener (`--stats`): metrics, answered by the lobby.
    pub stats: Option<BindAddress>,
    /// `--user` and `--group`: who the lobby becomes once its sockets are bound.
    pub drop_to: Option<Credentials>,
    /// `--forwarded-allow-ips` and `secure_scheme_headers`: whose forwarded headers are read.
    pub forwarding: Forwarding,
    /// `--proxy-protocol`: the PROXY header versions each connection must begin with; None: off.
    pub proxy_protocol: Option<ProxyVersions>,
    /// `--proxy-allow-from`: the peers that may send a PROXY header.
    pub proxy_allow_ips: AllowList,
    /// `--certfile` and the other TLS settings; None: every listener speaks plain HTTP.
    pub tls: Option<TlsSettings>,
    /// The listeners written `http://ADDRESS`: with `tls`, they speak plain HTTP beside the
    /// TLS ones.
    pub plain_binds: Vec<BindAddress>,
    /// The limits of WebSockets (docs/PROTOCOL.md, section 5).
    pub websocket: WebSocketLimits,
    /// `--http-protocols` and HTTP/2's own limits (docs/HTTP2.md).
    pub http: HttpProtocols,
}

/// The settings in force now: those the lobby started with, or what the last SIGHUP read from
/// the config file (`supervise/reload.rs`). Each part reads them afresh for its next request.
pub(crate) struct Live(RefCell<Rc<Config>>);

impl Live {
    pub fn new(config: Config) -> Live {
        Live(RefCell::new(Rc::new(config)))
    }

    pub fn now(&self) -> Rc<Config> {
        self.0.borrow().clone()
    }

    pub fn set(&self, config: Config) {
        *self.0.borrow_mut() = Rc::new(config);
    }
}

/// Who the lobby becomes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    /// The whole supplementary group list: --group alone, or with `--initgroups` the user's
    /// groups from the group database.
    pub groups: Vec<u32>,
}

/// `--queue-policy` (docs/TUNING.md, "Overload").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueuePolicy {
    /// Past capacity, answer 503 to what can no longer be answered in time.
    Adaptive,
    /// Serve every request in arrival order, however long it waited.
    Fifo,
}

/// `--half-close`: a client that shuts its sending side while its request waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HalfClose {
    /// It has left, as when it closes (nginx's default): its request is dropped.
    Abandon,
    /// It still reads: its request is answered.
    Serve,
}

impl Config {
    /// What a client connection acts on (`client/context.rs`).
    pub(crate) fn client_settings(&self) -> ClientSettings {
        ClientSettings {
            limits: Limits {
                max_request_line: self.limit_request_line,
                max_headers: self.limit_request_fields,
                max_header_size: self.limit_request_field_size,
                max_body: self.max_body,
            },
            header_timeout: self.header_timeout,
            body_min_rate: self.body_min_rate,
            send_timeout: self.send_timeout,
            keep_alive: self.keep_alive,
            queue_timeout: self.queue_timeout,
            max_spill: self.max_spill,
            half_close_leaves: self.half_close == HalfClose::Abandon,
            wsgi_chunked_streams: self.wsgi_chunked_streams,
            access_log_format: self.access_log_format.clone(),
            forwarding: self.forwarding.clone(),
            proxy_protocol: self.proxy_protocol,
            proxy_allow_ips: self.proxy_allow_ips.clone(),
            websocket: self.websocket,
            http: self.http.clone(),
        }
    }

    /// What the queue needs to know of overload (`seating/overload.rs`).
    pub(crate) fn overload_policy(&self) -> Policy {
        Policy { adaptive: self.queue_policy == QueuePolicy::Adaptive, deadline: self.request_deadline }
    }
}
