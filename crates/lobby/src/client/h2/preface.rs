//! A plain connection, where only HTTP/2 is spoken, that opened with neither the preface nor an
//! HTTP/1.x request (docs/HTTP2.md, "Where it is spoken"): HTTP/2's connection error, written
//! by the lobby, and one log line.

use bytes::BytesMut;
use h2::Reason;
use tokio::io::AsyncWriteExt;

use super::reasons::Http2Refusal;
use super::{GOAWAY, SETTINGS};
use crate::client::context::Context;
use crate::client::exchange::{self, LINGER_AFTER_REFUSAL};
use crate::client::peer::{ClientStream, Peer};
use crate::client::states::ConnectionState;
use crate::log;

/// The answer to an invalid preface (RFC 9113 3.4: a connection error, PROTOCOL_ERROR): the
/// server's preface, an empty SETTINGS frame, then GOAWAY saying why. Written by the lobby, as
/// the h2 crate closes without a word when the preface is wrong.
fn invalid_preface_answer() -> Vec<u8> {
    const DEBUG_DATA: &[u8] = b"invalid connection preface";
    let mut out = vec![0, 0, 0, SETTINGS, 0, 0, 0, 0, 0];
    let length = (8 + DEBUG_DATA.len()) as u8;
    out.extend_from_slice(&[0, 0, length, GOAWAY, 0, 0, 0, 0, 0]);
    // The last stream the server took: none.
    out.extend_from_slice(&0u32.to_be_bytes());
    out.extend_from_slice(&u32::from(Reason::PROTOCOL_ERROR).to_be_bytes());
    out.extend_from_slice(DEBUG_DATA);
    out
}

/// Of a plain connection's first bytes that are no protocol maitred speaks, how many its log
/// line shows.
const SHOWN_OF_A_BAD_PREFACE: usize = 32;

/// A connection error for an invalid preface (RFC 9113 3.4), with one log line: the server's
/// preface and GOAWAY (PROTOCOL_ERROR), then the close, once what the client still sends is
/// drained.
pub(in crate::client) async fn refuse_preface<S: ClientStream>(
    context: &Context,
    mut stream: S,
    first: BytesMut,
    peer: &Peer,
) {
    let _mark = context.connection_states.mark(ConnectionState::Writing);
    log::info_limited!(
        "HTTP/2 connection from {} refused: it opened with {:?}, neither the HTTP/2 preface nor an HTTP/1.x \
         request (--http-protocols h2); GOAWAY PROTOCOL_ERROR, connection closed",
        peer.display(),
        String::from_utf8_lossy(&first[..first.len().min(SHOWN_OF_A_BAD_PREFACE)])
    );
    context.counts.http2_refused(Http2Refusal::InvalidPreface);
    // Not needed to refuse it, and not to be held while the client is drained.
    drop(first);
    let answer = invalid_preface_answer();
    let written = tokio::time::timeout(context.settings().send_timeout, stream.write_all(&answer));
    if let Ok(Ok(())) = written.await {
        exchange::linger(&mut stream, LINGER_AFTER_REFUSAL).await;
    }
}
