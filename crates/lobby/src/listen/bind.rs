//! Listen sockets: made with socket2 so the backlog is ours to choose (std hard-codes 128),
//! and reported with what the kernel actually grants (docs/SCENARIOS.md, S2).

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::OwnedFd;
use std::path::PathBuf;

use socket2::{Domain, SockAddr, Socket, Type};

use crate::config::BindAddress;

const SOMAXCONN_PATH: &str = "/proc/sys/net/core/somaxconn";
/// Linux's compiled-in default, for a kernel that does not expose the sysctl.
const FALLBACK_SOMAXCONN: u32 = 4096;

/// The kernel's cap on any listen backlog.
pub fn somaxconn() -> u32 {
    std::fs::read_to_string(SOMAXCONN_PATH).ok().and_then(|text| text.trim().parse().ok()).unwrap_or(FALLBACK_SOMAXCONN)
}

/// A bound, listening socket and what it is, for logs and for the environ.
#[derive(Debug)]
pub struct Listener {
    pub socket: Socket,
    /// `http://127.0.0.1:8000`, `unix:/run/app.sock`, ...
    pub display: String,
    /// SERVER_NAME and SERVER_PORT for requests that arrive here.
    pub server_name: String,
    pub server_port: u16,
    pub backlog_requested: u32,
    pub backlog_granted: u32,
    /// The socket file to remove at shutdown.
    pub unix_path: Option<PathBuf>,
}

/// Binds and listens; the error names the address and the reason. `inherited` is the socket a
/// binary upgrade passed for this address, already bound and listening: it is used as it is,
/// so that the connections in its queue are not lost.
pub fn bind(address: &BindAddress, backlog: Option<u32>, inherited: Option<OwnedFd>) -> Result<Listener, String> {
    let cap = somaxconn();
    let requested = backlog.unwrap_or(cap);
    let granted = requested.min(cap);
    let describe = |e: io::Error, what: &str| format!("cannot {what} {}: {e}", describe_bind(address));
    let (socket, display, server_name, server_port, unix_path) = match address {
        BindAddress::Tcp { host, port } => {
            let (socket, bound) = match inherited {
                Some(fd) => {
                    let socket = Socket::from(fd);
                    let bound = socket.local_addr().ok().and_then(|a| a.as_socket());
                    let bound =
                        bound.ok_or_else(|| describe(io::ErrorKind::InvalidInput.into(), "use the socket for"))?;
                    (socket, bound)
                }
                None => {
                    let addr = resolve(host, *port).map_err(|e| describe(e, "resolve"))?;
                    let socket =
                        Socket::new(Domain::for_address(addr), Type::STREAM, None).map_err(|e| describe(e, "bind"))?;
                    socket.set_reuse_address(true).map_err(|e| describe(e, "bind"))?;
                    if addr.is_ipv6() {
                        socket.set_only_v6(true).map_err(|e| describe(e, "bind"))?;
                    }
                    socket.bind(&addr.into()).map_err(|e| describe(e, "bind"))?;
                    let bound = socket.local_addr().ok().and_then(|a| a.as_socket()).unwrap_or(addr);
                    (socket, bound)
                }
            };
            let display = match bound {
                SocketAddr::V6(v6) => format!("http://[{}]:{}", v6.ip(), v6.port()),
                SocketAddr::V4(v4) => format!("http://{v4}"),
            };
            (socket, display, host.clone(), bound.port(), None)
        }
        BindAddress::Unix(path) => {
            let socket = match inherited {
                Some(fd) => Socket::from(fd),
                None => {
                    remove_stale_socket(path).map_err(|e| describe(e, "bind"))?;
                    let socket = Socket::new(Domain::UNIX, Type::STREAM, None).map_err(|e| describe(e, "bind"))?;
                    let addr = SockAddr::unix(path).map_err(|e| describe(e, "bind"))?;
                    socket.bind(&addr).map_err(|e| describe(e, "bind"))?;
                    socket
                }
            };
            let name = path.display().to_string();
            (socket, format!("unix:{name}"), name, 0, Some(path.clone()))
        }
        BindAddress::Fd(fd) => {
            // The operator, or the service manager (socket activation), handed us this
            // descriptor to own (fd://N).
            let socket = Socket::from(
                maitred_sys::fd::adopt(*fd).map_err(|e| format!("fd://{fd}: file descriptor {fd} is not open: {e}"))?,
            );
            let activation = activation_name(*fd);
            let origin = match &activation {
                None => format!("fd {fd}"),
                Some(name) if name.is_empty() => format!("fd {fd}, socket activation"),
                Some(name) => format!("fd {fd}, socket activation: {name}"),
            };
            let local = inherited_listener(&socket).map_err(|why| {
                let advice = if activation.is_some() { SOCKET_UNIT_ADVICE } else { "" };
                format!("cannot use {} ({origin}): {why}{advice}", describe_bind(address))
            })?;
            let (display, name, port) = match local.as_socket() {
                Some(addr) => (format!("http://{addr} ({origin})"), addr.ip().to_string(), addr.port()),
                None => {
                    let path = match (local.as_pathname(), local.as_abstract_namespace()) {
                        (Some(path), _) => path.display().to_string(),
                        (None, Some(name)) => format!("@{}", String::from_utf8_lossy(name)),
                        (None, None) => String::new(),
                    };
                    (format!("unix:{path} ({origin})"), path, 0)
                }
            };
            (socket, display, name, port, None)
        }
    };
    socket.set_nonblocking(true).map_err(|e| describe(e, "bind"))?;
    socket.set_cloexec(true).map_err(|e| describe(e, "bind"))?;
    if socket.local_addr().is_ok_and(|a| a.as_socket().is_some()) {
        // Accepted sockets inherit it, which saves a setsockopt per connection: small answers
        // go out at once rather than waiting for an ACK (Nagle).
        socket.set_tcp_nodelay(true).map_err(|e| describe(e, "bind"))?;
    }
    // listen() on an already listening socket (fd://) just sets the new backlog.
    socket.listen(requested.min(i32::MAX as u32) as i32).map_err(|e| describe(e, "listen on"))?;
    Ok(Listener {
        socket,
        display,
        server_name,
        server_port,
        backlog_requested: requested,
        backlog_granted: granted,
        unix_path,
    })
}

/// What a socket unit needs for maitred, said after an inherited socket is refused.
const SOCKET_UNIT_ADVICE: &str =
    " (maitred needs ListenStream= sockets, TCP or Unix, with Accept=no in the .socket unit; docs/SYSTEMD.md)";

/// An inherited socket's address, once it is known to be a listening TCP or Unix stream
/// socket; otherwise what it is instead.
fn inherited_listener(socket: &Socket) -> Result<SockAddr, String> {
    let local = socket.local_addr().map_err(|e| e.to_string())?;
    let domain = socket.domain().map_err(|e| e.to_string())?;
    if ![Domain::IPV4, Domain::IPV6, Domain::UNIX].contains(&domain) {
        return Err(format!("a socket of address family {}, neither TCP nor Unix", local.family()));
    }
    match socket.r#type() {
        Ok(Type::STREAM) => {}
        Ok(Type::DGRAM) => return Err("a datagram socket, not a stream socket".into()),
        Ok(Type::SEQPACKET) => return Err("a seqpacket socket, not a stream socket".into()),
        Ok(_) => return Err("not a stream socket".into()),
        Err(e) => return Err(e.to_string()),
    }
    if !socket.is_listener().map_err(|e| e.to_string())? {
        if socket.peer_addr().is_ok() {
            return Err("a connected socket, not a listening one".into());
        }
        return Err("a socket that is not listening".into());
    }
    Ok(local)
}

/// The name a service manager gave `fd` (LISTEN_FDNAMES, empty when it gave none), when `fd` is
/// one of the sockets it passed to this process by socket activation (LISTEN_FDS from fd 3, for
/// the process LISTEN_PID); None otherwise. The CLI (python/maitred/config/service_manager.py) turned those
/// sockets into `fd://N` binds; this only says where they came from, in the log.
fn activation_name(fd: i32) -> Option<String> {
    let pid: u32 = std::env::var("LISTEN_PID").ok()?.parse().ok()?;
    let count: i32 = std::env::var("LISTEN_FDS").ok()?.parse().ok()?;
    if pid != std::process::id() || !(LISTEN_FDS_START..LISTEN_FDS_START.saturating_add(count)).contains(&fd) {
        return None;
    }
    let names = std::env::var("LISTEN_FDNAMES").unwrap_or_default();
    Some(names.split(':').nth((fd - LISTEN_FDS_START) as usize).unwrap_or_default().to_string())
}

/// The first descriptor socket activation passes (SD_LISTEN_FDS_START).
pub const LISTEN_FDS_START: i32 = 3;

fn describe_bind(address: &BindAddress) -> String {
    match address {
        BindAddress::Tcp { host, port } if host.contains(':') => format!("[{host}]:{port}"),
        BindAddress::Tcp { host, port } => format!("{host}:{port}"),
        BindAddress::Unix(path) => format!("unix:{}", path.display()),
        BindAddress::Fd(fd) => format!("fd://{fd}"),
    }
}

fn resolve(host: &str, port: u16) -> io::Result<SocketAddr> {
    (host, port).to_socket_addrs()?.next().ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "host has no address"))
}

/// A socket file left by a previous run blocks bind(); anything else at that path is kept.
fn remove_stale_socket(path: &std::path::Path) -> io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path),
        Ok(_) => Err(io::Error::new(io::ErrorKind::AlreadyExists, "a file that is not a socket is in the way")),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::IntoRawFd;

    #[test]
    fn grants_at_most_somaxconn() {
        let cap = somaxconn();
        let listener = bind(&BindAddress::Tcp { host: "127.0.0.1".into(), port: 0 }, Some(cap + 1000), None).unwrap();
        assert_eq!(listener.backlog_requested, cap + 1000);
        assert_eq!(listener.backlog_granted, cap);
        assert!(listener.display.starts_with("http://127.0.0.1:"));
        let default = bind(&BindAddress::Tcp { host: "127.0.0.1".into(), port: 0 }, None, None).unwrap();
        assert_eq!(default.backlog_granted, cap);
    }

    #[test]
    fn accepted_connections_inherit_tcp_nodelay() {
        let listener = bind(&BindAddress::Tcp { host: "127.0.0.1".into(), port: 0 }, Some(16), None).unwrap();
        let _client = std::net::TcpStream::connect(("127.0.0.1", listener.server_port)).unwrap();
        listener.socket.set_nonblocking(false).unwrap();
        let (accepted, _) = listener.socket.accept().unwrap();
        assert!(accepted.tcp_nodelay().unwrap());
    }

    #[test]
    fn a_busy_port_is_a_clear_error() {
        let first = bind(&BindAddress::Tcp { host: "127.0.0.1".into(), port: 0 }, Some(16), None).unwrap();
        let port = first.server_port;
        let err = bind(&BindAddress::Tcp { host: "127.0.0.1".into(), port }, Some(16), None).unwrap_err();
        assert!(err.starts_with(&format!("cannot bind 127.0.0.1:{port}:")), "{err}");
    }

    /// Binds `fd://N` for a duplicate of `socket`.
    fn bind_inherited(socket: &Socket) -> Result<Listener, String> {
        let fd = socket.try_clone().unwrap().into_raw_fd();
        bind(&BindAddress::Fd(fd), Some(16), None)
    }

    #[test]
    fn serves_an_inherited_listening_socket_tcp_or_unix() {
        let tcp = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        tcp.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into()).unwrap();
        tcp.listen(4).unwrap();
        let listener = bind_inherited(&tcp).unwrap();
        let port = tcp.local_addr().unwrap().as_socket().unwrap().port();
        assert_eq!(listener.server_port, port);
        assert!(listener.display.starts_with(&format!("http://127.0.0.1:{port} (fd ")), "{}", listener.display);

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let unix = Socket::new(Domain::UNIX, Type::STREAM, None).unwrap();
        unix.bind(&SockAddr::unix(&path).unwrap()).unwrap();
        unix.listen(4).unwrap();
        let listener = bind_inherited(&unix).unwrap();
        assert!(listener.display.starts_with(&format!("unix:{} (fd ", path.display())), "{}", listener.display);
        // The socket file belongs to whoever made it: maitred leaves it at shutdown.
        assert_eq!(listener.unix_path, None);
    }

    #[test]
    fn refuses_inherited_sockets_that_do_not_listen_for_streams() {
        let udp = Socket::new(Domain::IPV4, Type::DGRAM, None).unwrap();
        udp.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into()).unwrap();
        let err = bind_inherited(&udp).unwrap_err();
        assert!(err.contains("a datagram socket, not a stream socket"), "{err}");

        let bound = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        bound.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into()).unwrap();
        let err = bind_inherited(&bound).unwrap_err();
        assert!(err.contains("a socket that is not listening"), "{err}");

        let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(server.local_addr().unwrap()).unwrap();
        let err = bind_inherited(&Socket::from(client)).unwrap_err();
        assert!(err.contains("a connected socket, not a listening one"), "{err}");

        let (seqpacket, _other) = Socket::pair(Domain::UNIX, Type::SEQPACKET, None).unwrap();
        let err = bind_inherited(&seqpacket).unwrap_err();
        assert!(err.contains("a seqpacket socket"), "{err}");
    }

    #[test]
    fn replaces_a_stale_unix_socket_but_not_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        drop(bind(&BindAddress::Unix(path.clone()), Some(16), None).unwrap());
        assert!(bind(&BindAddress::Unix(path.clone()), Some(16), None).is_ok());
        let file = dir.path().join("plain");
        std::fs::write(&file, b"x").unwrap();
        assert!(bind(&BindAddress::Unix(file), Some(16), None).unwrap_err().contains("not a socket"));
    }

    #[test]
    fn an_inherited_socket_is_used_as_it_is_for_its_address() {
        let first = bind(&BindAddress::Tcp { host: "127.0.0.1".into(), port: 0 }, Some(16), None).unwrap();
        let port = first.server_port;
        let queued = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let address = BindAddress::Tcp { host: "127.0.0.1".into(), port };
        // The address is taken: binding it again would fail, and the queued connection is kept.
        let again = bind(&address, Some(16), Some(OwnedFd::from(first.socket))).unwrap();
        assert_eq!(again.display, format!("http://127.0.0.1:{port}"));
        assert!(again.socket.accept().is_ok());
        drop(queued);

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let unix = bind(&BindAddress::Unix(path.clone()), Some(16), None).unwrap();
        let again = bind(&BindAddress::Unix(path.clone()), Some(16), Some(OwnedFd::from(unix.socket))).unwrap();
        assert_eq!(again.unix_path, Some(path));
    }
}
