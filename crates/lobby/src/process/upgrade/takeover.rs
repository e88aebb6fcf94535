//! The new lobby's side of a binary upgrade: it tells the old one that it serves, then takes
//! the idle connections the old one hands over, each put to sleep here as its own.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::os::fd::{AsRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use socket2::SockRef;
use tokio::sync::Semaphore;

use super::{receive, MAIN, READY};
use crate::client::asleep::{Hibernation, Sleeper};
use crate::client::peer::{Peer, Site, StreamKind};
use crate::log::{info, warning, warning_limited};
use crate::process::notify::{self, Standing};

/// In a new lobby: tells the lobby it replaces that it serves, and takes the idle connections
/// that lobby hands over until it closes the channel. Each is put to sleep here, with its
/// place under --max-connections; one that finds no place is closed.
pub(crate) async fn take_over(
    hibernation: Rc<Hibernation>,
    standing: Standing,
    predecessor: OwnedFd,
    sites: Vec<Rc<Site>>,
    connections: Arc<Semaphore>,
) {
    if let Err(e) = maitred_sys::fdpass::send(predecessor.as_raw_fd(), &[IoSlice::new(READY)], 0) {
        warning!("cannot tell the maitred being replaced that this one is ready: {e}");
        return;
    }
    let channel = match maitred_sys::reactor::register(predecessor) {
        Ok(channel) => channel,
        Err(e) => {
            warning!("cannot take connections from the maitred being replaced: {e}");
            return;
        }
    };
    let mut fds = VecDeque::new();
    let mut taken = 0u64;
    loop {
        let message = match receive(&channel, &mut fds).await {
            Ok(Some(message)) => message,
            Ok(None) => break,
            Err(e) => {
                warning!("taking connections from the maitred being replaced failed: {e}");
                break;
            }
        };
        if message == MAIN {
            notify::watch(standing.clone());
            notify::ready();
            continue;
        }
        let Some(socket) = fds.pop_front() else {
            warning_limited!("the maitred being replaced sent a connection without its socket");
            continue;
        };
        match adopt(&hibernation, socket, &message, &sites, &connections) {
            Ok(()) => taken += 1,
            Err(why) => warning_limited!("closing a connection handed over by the maitred being replaced: {why}"),
        }
    }
    info!("took over {taken} idle connections from the maitred it replaced");
}

/// Puts one handed-over connection to sleep in this lobby.
fn adopt(
    hibernation: &Hibernation,
    socket: OwnedFd,
    message: &[u8],
    sites: &[Rc<Site>],
    connections: &Arc<Semaphore>,
) -> Result<(), String> {
    let text = std::str::from_utf8(message).map_err(|_| "its state is not text".to_string())?;
    let mut fields = text.splitn(5, ' ');
    let mut next = |what: &str| fields.next().ok_or_else(|| format!("its state has no {what}: {text:?}"));
    let kind = match next("kind")? {
        "tcp" => StreamKind::Tcp,
        "unix" => StreamKind::Unix,
        other => return Err(format!("unknown kind {other:?}")),
    };
    let number = |field: &str, what: &str| field.parse::<u64>().map_err(|_| format!("bad {what} {field:?}"));
    let answered = number(next("count")?, "count")?;
    let patience = Duration::from_millis(number(next("patience")?, "patience")?);
    let port = u16::try_from(number(next("port")?, "port")?).map_err(|_| "bad port".to_string())?;
    let name = next("server name")?;
    let permit = connections.clone().try_acquire_owned().map_err(|_| "no place under --max-connections".to_string())?;
    // A connection that began with a PROXY header is never handed over (`hand_over`).
    let peer = Peer::new(SockRef::from(&socket).peer_addr().ok().and_then(|addr| addr.as_socket()), false);
    let site = sites
        .iter()
        .find(|site| site.server_port == port && site.server_name == name)
        .cloned()
        .unwrap_or_else(|| Rc::new(Site { server_name: name.to_string(), server_port: port, tls: false }));
    hibernation.put(Sleeper {
        socket,
        kind,
        peer,
        site,
        permit,
        answered,
        deadline: Instant::now() + patience,
        tls: None,
        http2: None,
    });
    Ok(())
}
