//! maitred-stub: the real lobby, seating requests at native stub workers that answer each one at
//! once, so that a load measures the lobby alone: how many requests one lobby thread drives on
//! one core (issue 18, "The lobby's own ceiling"; bench/ceiling.py runs it).
//!
//! One binary, three roles, chosen by its first argument:
//! - `maitred-stub [--port PORT] [--workers N] [--worker-cpu CPU] [--log-level LEVEL]`: the
//!   lobby, `maitred_lobby::run` in this process, listening on 127.0.0.1:PORT. It starts the stub
//!   zygote first, before the lobby's event loop and threads exist.
//!   Options for tests: `--threads N` (with `--websocket-echo`, the `--worker-connections` of
//!   its one channel), `--graceful-timeout S`, `--queue-timeout S`,
//!   `--access-logfile PATH`, `--access-logformat FORMAT`, `--stats-port PORT` (on 127.0.0.1), and
//!   `--websocket-echo` (workers that are ASGI and echo WebSockets, `echo.rs`) with the lobby's
//!   WebSocket limits `--ws-max-size`, `--ws-ping-interval`, `--ws-ping-timeout`.
//! - `maitred-stub zygote FD [CPU] [--websocket-echo]`: the stub zygote on control channel FD
//!   (docs/PROTOCOL.md, section 1). With CPU, it moves itself to that CPU first, so that every
//!   worker runs there.
//! - `maitred-stub worker FD[,FD...] [--websocket-echo]`: a stub worker on channels FD, one
//!   thread each (sections 2 to 5).
//!
//! The zygote and the workers are this binary started again (fork and exec, by
//! `std::process::Command`), not bare forks of a running process: the crate needs no unsafe
//! code, and a worker starts as small as it can be. The zygote is still started before the
//! lobby, as the CLI forks the real one, and the lobby reaps it by its pid.
//!
//! Every process but the lobby leaves the lobby's signals to the lobby, as the real zygote and
//! workers do: a Ctrl-C reaches the whole process group, and only the lobby decides.

#![forbid(unsafe_code)]

mod echo;
mod worker;
mod zygote;

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::process::{Command, Stdio};
use std::time::Duration;

use maitred_lobby::{
    AccessFormat, AllowList, BindAddress, Config, Forwarding, HalfClose, HttpProtocols, Level, QueuePolicy, Succession,
    WebSocketLimits,
};

const USAGE: &str = "usage: maitred-stub [--port PORT] [--workers N] [--threads N] [--worker-cpu CPU] [--log-level \
                     LEVEL] [--graceful-timeout S] [--queue-timeout S] [--websocket-echo] [--ws-max-size BYTES] \
                     [--ws-ping-interval S] [--ws-ping-timeout S] [--websocket-seats N] [--access-logfile PATH] \
                     [--access-logformat FORMAT] [--stats-port PORT]";

/// Makes the workers ASGI workers that echo WebSockets.
pub(crate) const ECHO_FLAG: &str = "--websocket-echo";

/// The signals the lobby acts on (docs/SIGNALS.md), which the zygote and the workers leave to it.
const LOBBY_SIGNALS: [i32; 8] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGQUIT,
    libc::SIGHUP,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGTTIN,
    libc::SIGTTOU,
];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let code = match args.get(1).map(String::as_str) {
        Some("zygote") => role(&args, |fd, cpu| zygote::run(fd, cpu, echoes(&args))),
        Some("worker") => workers(&args),
        _ => lobby(&args),
    };
    std::process::exit(code);
}

/// The zygote's or a worker's life: its descriptor and optional CPU from its arguments, its
/// signals left to the lobby, then `serve`.
fn role(args: &[String], serve: impl FnOnce(OwnedFd, Option<usize>) -> Result<i32, String>) -> i32 {
    maitred_sys::process::block_in_this_thread(&LOBBY_SIGNALS);
    let name = &args[1];
    let fd = match args.get(2).and_then(|fd| fd.parse::<RawFd>().ok()).map(maitred_sys::fd::adopt) {
        Some(Ok(fd)) => fd,
        _ => {
            eprintln!("maitred-stub {name}: expected an open descriptor as its argument");
            return 2;
        }
    };
    let cpu = args.get(3).and_then(|cpu| cpu.parse().ok());
    serve(fd, cpu).unwrap_or_else(|error| {
        eprintln!("maitred-stub {name} {}: {error}", std::process::id());
        1
    })
}

/// Whether this zygote or worker was told to echo WebSockets.
fn echoes(args: &[String]) -> bool {
    args.iter().skip(2).any(|arg| arg == ECHO_FLAG)
}

/// A worker's life: a thread per channel in its first argument (`FD,FD,...`), each serving its
/// channel as a worker with one thread does.
fn workers(args: &[String]) -> i32 {
    maitred_sys::process::block_in_this_thread(&LOBBY_SIGNALS);
    let echo = echoes(args);
    let fds: Option<Vec<OwnedFd>> = args
        .get(2)
        .map(|list| {
            list.split(',').map(|fd| fd.parse::<RawFd>().ok().and_then(|fd| maitred_sys::fd::adopt(fd).ok())).collect()
        })
        .and_then(|fds: Vec<Option<OwnedFd>>| fds.into_iter().collect());
    let Some(mut fds) = fds.filter(|fds| !fds.is_empty()) else {
        eprintln!("maitred-stub worker: expected open descriptors as its argument, FD[,FD...]");
        return 2;
    };
    let first = fds.remove(0);
    let others: Vec<_> = fds.into_iter().map(|fd| std::thread::spawn(move || worker::run(fd, echo))).collect();
    let results = std::iter::once(worker::run(first, echo))
        .chain(others.into_iter().map(|thread| thread.join().unwrap_or_else(|_| Err("its thread panicked".into()))));
    let mut code = 0;
    for result in results {
        if let Err(error) = result {
            eprintln!("maitred-stub worker {}: {error}", std::process::id());
            code = 1;
        }
    }
    code
}

/// What the lobby's command line says.
struct Options {
    port: u16,
    workers: usize,
    threads: usize,
    worker_cpu: Option<usize>,
    log_level: Level,
    graceful_timeout: Duration,
    queue_timeout: Option<Duration>,
    websocket_echo: bool,
    websocket: WebSocketLimits,
    access_logfile: Option<String>,
    access_log_format: Option<AccessFormat>,
    stats_port: Option<u16>,
}

impl Options {
    fn parse(args: &[String]) -> Result<Options, String> {
        let mut options = Options {
            port: 8000,
            workers: 1,
            threads: 1,
            worker_cpu: None,
            log_level: Level::Info,
            graceful_timeout: Duration::from_secs(10),
            queue_timeout: None,
            websocket_echo: false,
            // The CLI's defaults (python/maitred/config/table_lobby.py).
            websocket: WebSocketLimits {
                max_size: 16 << 20,
                ping_interval: Duration::from_secs(20),
                ping_timeout: Duration::from_secs(20),
                per_message_deflate: true,
            },
            access_logfile: None,
            access_log_format: None,
            stats_port: None,
        };
        let mut rest = args.iter();
        while let Some(flag) = rest.next() {
            if flag == ECHO_FLAG {
                options.websocket_echo = true;
                continue;
            }
            let value = rest.next().ok_or_else(|| format!("{flag} needs a value"))?;
            let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}");
            let seconds = || {
                value
                    .parse::<f64>()
                    .map_err(|e| bad(&e))
                    .and_then(|s| Duration::try_from_secs_f64(s).map_err(|e| bad(&e)))
            };
            match flag.as_str() {
                "--port" => options.port = value.parse().map_err(|e| bad(&e))?,
                "--workers" => options.workers = value.parse().map_err(|e| bad(&e))?,
                "--threads" => options.threads = value.parse().map_err(|e| bad(&e))?,
                "--worker-cpu" => options.worker_cpu = Some(value.parse().map_err(|e| bad(&e))?),
                "--log-level" => options.log_level = Level::parse(value).ok_or_else(|| bad(&"no such level"))?,
                "--graceful-timeout" => options.graceful_timeout = seconds()?,
                "--queue-timeout" => options.queue_timeout = Some(seconds()?),
                "--ws-max-size" => options.websocket.max_size = value.parse().map_err(|e| bad(&e))?,
                "--ws-ping-interval" => options.websocket.ping_interval = seconds()?,
                "--ws-ping-timeout" => options.websocket.ping_timeout = seconds()?,
                "--access-logfile" => options.access_logfile = Some(value.clone()),
                "--access-logformat" => {
                    options.access_log_format = Some(AccessFormat::parse(value).map_err(|e| bad(&e))?)
                }
                "--stats-port" => options.stats_port = Some(value.parse().map_err(|e| bad(&e))?),
                _ => return Err(format!("unknown option {flag}")),
            }
        }
        if options.workers == 0 || options.threads == 0 {
            return Err("--workers and --threads must be at least 1".into());
        }
        if options.websocket.max_size == 0 || options.websocket.max_size > maitred_wire::MAX_WS_MESSAGE {
            return Err(format!("--ws-max-size must be from 1 to {}", maitred_wire::MAX_WS_MESSAGE));
        }
        Ok(options)
    }
}

fn lobby(args: &[String]) -> i32 {
    let options = match Options::parse(&args[1..]) {
        Ok(options) => options,
        Err(error) => {
            eprintln!("maitred-stub: {error}\n{USAGE}");
            return 2;
        }
    };
    let (control, zygote_pid) = match start_zygote(options.worker_cpu, options.websocket_echo) {
        Ok(started) => started,
        Err(error) => {
            eprintln!("maitred-stub: cannot start the stub zygote: {error}");
            return 1;
        }
    };
    let succession = Succession {
        command: args.to_vec(),
        directory: std::env::current_dir().unwrap_or_else(|_| "/".into()),
        pid_file: None,
        predecessor: None,
        inherited: Vec::new(),
    };
    match maitred_lobby::run(config(&options), control, zygote_pid, None, succession, None) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("maitred-stub: {error}");
            1
        }
    }
}

/// Starts the stub zygote on a new control channel: the lobby's end, and the zygote's pid.
fn start_zygote(worker_cpu: Option<usize>, echo: bool) -> std::io::Result<(OwnedFd, i32)> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let (ours, theirs) =
        rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?;
    let mut command = Command::new(std::env::current_exe()?);
    command.arg("zygote").arg(theirs.as_raw_fd().to_string()).args(worker_cpu.map(|cpu| cpu.to_string()));
    if echo {
        command.arg(ECHO_FLAG);
    }
    command.stdin(Stdio::null());
    maitred_sys::process::keep_across_exec(&mut command, vec![theirs.as_raw_fd()]);
    let child = command.spawn()?;
    // The lobby reaps it by its pid, as it does the CLI's zygote.
    Ok((ours, child.id() as i32))
}

/// The lobby's settings: the CLI's defaults (python/maitred/config/table_lobby.py), one TCP
/// listener, and what the options say.
fn config(options: &Options) -> Config {
    let local = || AllowList::parse(&["127.0.0.1".into(), "::1".into()]).expect("loopback addresses");
    let secure_scheme_headers =
        [("X-FORWARDED-PROTOCOL", "ssl"), ("X-FORWARDED-PROTO", "https"), ("X-FORWARDED-SSL", "on")];
    Config {
        binds: vec![BindAddress::Tcp { host: "127.0.0.1".into(), port: options.port }],
        workers: options.workers,
        threads: options.threads,
        worker_connections: options.threads,
        backlog: None,
        timeout: Duration::from_secs(30),
        graceful_timeout: options.graceful_timeout,
        lobby_timeout: Some(Duration::from_secs(30)),
        keep_alive: Duration::from_secs(75),
        header_timeout: Duration::from_secs(10),
        body_min_rate: 500,
        send_timeout: Duration::from_secs(60),
        max_spill: 1 << 30,
        max_spill_total: 4 << 30,
        max_head_memory: 64 << 20,
        limit_request_line: 8190,
        limit_request_fields: 100,
        limit_request_field_size: 8190,
        max_requests: 0,
        max_requests_jitter: 0,
        max_worker_memory: 0,
        max_worker_lifetime: None,
        max_worker_lifetime_jitter: Duration::ZERO,
        access_logfile: options.access_logfile.clone(),
        access_log_format: options.access_log_format.clone().unwrap_or_else(|| {
            AccessFormat::parse(r#"%(h)s %(l)s %(u)s %(t)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s""#)
                .expect("gunicorn's combined format")
        }),
        error_logfile: None,
        preload: false,
        log_level: options.log_level,
        max_body: None,
        queue_timeout: options.queue_timeout,
        queue_policy: QueuePolicy::Adaptive,
        request_deadline: None,
        half_close: HalfClose::Abandon,
        wsgi_chunked_streams: true,
        max_connections: None,
        app: "maitred-stub (native stub workers)".into(),
        stats: options.stats_port.map(|port| BindAddress::Tcp { host: "127.0.0.1".into(), port }),
        drop_to: None,
        forwarding: Forwarding {
            allow: local(),
            secure_scheme_headers: secure_scheme_headers
                .iter()
                .map(|(name, value)| (name.to_string(), value.to_string()))
                .collect(),
        },
        proxy_protocol: None,
        proxy_allow_ips: local(),
        websocket: options.websocket,
        tls: None,
        plain_binds: Vec::new(),
        http: HttpProtocols::default(),
    }
}
