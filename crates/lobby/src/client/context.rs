//! What a client connection's task is handed: the settings of the exchange, the queue, the
//! budgets its requests draw on, and where its idle connection goes. It holds nothing of the
//! workers, their supervision or the observation: the lobby's start (`run.rs`) builds it, the
//! reload (`supervise/reload.rs`) gives it new settings, and an upgrade names the new lobby that
//! takes its idle connections (`process/upgrade`).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use maitred_protocol::{Limits, ProxyVersions};
use tokio::sync::watch;

use super::asleep::{Hibernation, TakesIdleConnections};
use super::counts::Counts;
use super::heads::HeadBudget;
use super::proxies::{AllowList, Forwarding};
use super::states::ConnectionStates;
use super::tls::certificates::Certificates;
use crate::log::access_format::AccessFormat;
use crate::seating::spool::SpillBudget;
use crate::seating::websocket::WebSockets;
use crate::seating::Seating;

/// Which protocols clients may speak, and HTTP/2's limits. The protocols are read as the lobby
/// starts (TLS offers them by ALPN from then on); the limits from each new connection on.
#[derive(Clone, Debug)]
pub struct HttpProtocols {
    /// HTTP/1.0 and HTTP/1.1.
    pub http1: bool,
    /// HTTP/2: by ALPN on TLS listeners, with prior knowledge on plain ones.
    pub http2: bool,
    /// `--http2-max-concurrent-streams`: the streams one connection may have open at once.
    pub max_concurrent_streams: u32,
}

impl Default for HttpProtocols {
    fn default() -> HttpProtocols {
        HttpProtocols { http1: true, http2: true, max_concurrent_streams: 100 }
    }
}

/// `--ws-max-size`, `--ws-ping-interval`, `--ws-ping-timeout` and `--ws-per-message-deflate`.
#[derive(Clone, Copy, Debug)]
pub struct WebSocketLimits {
    /// The largest message, either way; a larger one from the client closes with 1009.
    pub max_size: usize,
    /// How long a WebSocket may be silent before the lobby pings it.
    pub ping_interval: Duration,
    /// How long the lobby waits for the pong before it closes with 1011.
    pub ping_timeout: Duration,
    /// Whether a client's permessage-deflate offer is taken (RFC 7692).
    pub per_message_deflate: bool,
}

/// The settings a connection acts on, as `Config` has them (`Config::client_settings`); a
/// reload replaces them, and each connection reads them afresh for its next request.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub limits: Limits,
    pub header_timeout: Duration,
    pub body_min_rate: u64,
    pub send_timeout: Duration,
    pub keep_alive: Duration,
    pub queue_timeout: Option<Duration>,
    pub max_spill: u64,
    /// `--half-close abandon`: a client that shuts its sending side while its request waits
    /// has left.
    pub half_close_leaves: bool,
    /// `--wsgi-chunked-body stream`: a fast chunked upload streams to a WSGI application too.
    pub wsgi_chunked_streams: bool,
    pub access_log_format: AccessFormat,
    pub forwarding: Forwarding,
    pub proxy_protocol: Option<ProxyVersions>,
    pub proxy_allow_ips: AllowList,
    pub websocket: WebSocketLimits,
    pub http: HttpProtocols,
}

/// What every connection's task shares.
pub(crate) struct Context {
    /// Read through `settings()`, replaced by `reconfigure`.
    pub settings: RefCell<Rc<Settings>>,
    /// The protocols as the lobby started: TLS offered them by ALPN, and a reload cannot
    /// change what it offered.
    pub protocols: HttpProtocols,
    pub seating: Rc<Seating>,
    /// Turns true once a shutdown has begun.
    pub shutdown: watch::Receiver<bool>,
    /// Keep-alive connections idle long enough to give up their tasks.
    pub hibernation: Rc<Hibernation>,
    /// Answer bytes waiting in temporary files for slow clients (`--max-spill-total`).
    pub spill_budget: Rc<SpillBudget>,
    /// Incomplete request heads' memory (`--max-head-memory`).
    pub heads: Rc<HeadBudget>,
    pub counts: Counts,
    /// Which workers take WebSockets, and the stop's going-away signal.
    pub websockets: Rc<WebSockets>,
    /// How many connections are in each state, and for how long.
    pub connection_states: Rc<ConnectionStates>,
    /// The TLS listeners' certificate (`--certfile`); None: no TLS.
    pub tls: Option<Rc<Certificates>>,
    /// Once a new maitred has taken over (SIGUSR2): where idle connections go instead of
    /// being closed.
    pub successor: RefCell<Option<Rc<dyn TakesIdleConnections>>>,
}

impl Context {
    /// The settings in force now.
    pub fn settings(&self) -> Rc<Settings> {
        self.settings.borrow().clone()
    }

    /// Takes the settings a reload read; connections use them from their next request on.
    pub fn reconfigure(&self, settings: Settings) {
        *self.settings.borrow_mut() = Rc::new(settings);
    }

    /// The request limits in force now.
    pub fn limits(&self) -> Limits {
        self.settings.borrow().limits.clone()
    }

    /// From a binary upgrade's success on: idle connections go to `successor`.
    pub fn hand_over_to(&self, successor: Rc<dyn TakesIdleConnections>) {
        *self.successor.borrow_mut() = Some(successor);
    }

    /// The drain is over: no idle connection goes to the new maitred any more.
    pub fn stop_handing_over(&self) {
        self.successor.borrow_mut().take();
    }

    /// Whether connections close once answered: a shutdown has begun and no new maitred takes
    /// them over.
    pub fn closing(&self) -> bool {
        *self.shutdown.borrow() && self.successor.borrow().is_none()
    }

    /// Whether a new maitred takes this one's idle connections (SIGUSR2).
    pub fn handing_over(&self) -> bool {
        self.successor.borrow().is_some()
    }

    /// The new maitred that takes this one's idle connections, during an upgrade.
    pub fn successor(&self) -> Option<Rc<dyn TakesIdleConnections>> {
        self.successor.borrow().clone()
    }
}
