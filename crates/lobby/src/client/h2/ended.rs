//! How a connection that ended in an error is told: one log line saying what the client did,
//! with the bound it went past, and its count (`maitred_http2_refused_total`), from the error the
//! h2 crate returned and the GOAWAY it wrote (`guard.rs`).

use h2::Reason;

use super::reasons::Http2Refusal;
use super::{
    guard, Shared, H2_EMPTY_DATA_FRAMES, H2_HEADER_LIST_ABUSE_FACTOR, LOCAL_ERROR_RESETS, PENDING_ACCEPT_RESETS,
};
use crate::log::{self, debug};
use maitred_protocol::MAX_HEAD_SIZE;

/// One line for a connection that ended in an error: one the h2 crate found in what the client
/// sent (a flood, a broken rule) at info, rate-limited, saying what the client did, and counted;
/// a socket that failed or closed, or a GOAWAY (either side's) without an error, at debug; the
/// client's own GOAWAY with an error at info.
pub(super) fn ended(shared: &Shared, e: &h2::Error) {
    if let Some(refusal) = refused(e, guard::debug_data(&shared.goaway_sent.borrow())) {
        let reason = e.reason().unwrap_or(Reason::PROTOCOL_ERROR);
        log::info_limited!(
            "HTTP/2 connection from {} refused: {}; GOAWAY {reason:?}, connection closed",
            shared.peer_text,
            what_the_client_did(refusal, e)
        );
        shared.context.counts.http2_refused(refusal);
    } else if e.is_io() || e.reason() == Some(Reason::NO_ERROR) {
        debug!("HTTP/2 connection from {} ended: {e}", shared.peer_text);
    } else {
        log::info_limited!("HTTP/2 connection from {} closed: {e}", shared.peer_text);
    }
}

/// What a connection error of the h2 crate's says the client did, when the crate itself ended
/// the connection for it (with GOAWAY, whose debug data it sent is `debug_data`).
fn refused(e: &h2::Error, debug_data: &[u8]) -> Option<Http2Refusal> {
    if !(e.is_go_away() && e.is_library()) {
        return None;
    }
    Some(refusal(e.reason()?, debug_data))
}

/// The h2 crate tells its floods apart only by the debug data of the GOAWAY it sends (the
/// error it returns has lost it).
fn refusal(reason: Reason, debug_data: &[u8]) -> Http2Refusal {
    const FLOODS: [(&[u8], Http2Refusal); 5] = [
        (b"too_many_resets", Http2Refusal::RapidReset),
        (b"too_many_continuations", Http2Refusal::ContinuationFlood),
        (b"header_list_way_too_large", Http2Refusal::HeaderListTooLarge),
        (b"too_many_data_frames", Http2Refusal::EmptyDataFlood),
        (b"too_many_internal_resets", Http2Refusal::MalformedStreams),
    ];
    match reason {
        Reason::ENHANCE_YOUR_CALM => FLOODS
            .iter()
            .find(|(words, _)| *words == debug_data)
            .map_or(Http2Refusal::ProtocolError, |(_, refusal)| *refusal),
        Reason::FLOW_CONTROL_ERROR => Http2Refusal::FlowControl,
        _ => Http2Refusal::ProtocolError,
    }
}

/// The log line's words for what the client did, with the bound it went past.
fn what_the_client_did(refusal: Http2Refusal, e: &h2::Error) -> String {
    match refusal {
        Http2Refusal::RapidReset => format!(
            "it reset more than {PENDING_ACCEPT_RESETS} streams before the lobby took them (rapid reset, \
             CVE-2023-44487)"
        ),
        Http2Refusal::ContinuationFlood => format!(
            "it sent one header block in more CONTINUATION frames than a head of {} KiB needs (a CONTINUATION flood)",
            MAX_HEAD_SIZE / 1024
        ),
        Http2Refusal::HeaderListTooLarge => format!(
            "it sent a header block that decodes past {} KiB, {H2_HEADER_LIST_ABUSE_FACTOR} times the {} KiB a head \
             may have (an HPACK bomb)",
            H2_HEADER_LIST_ABUSE_FACTOR * MAX_HEAD_SIZE / 1024,
            MAX_HEAD_SIZE / 1024
        ),
        Http2Refusal::EmptyDataFlood => {
            format!("it sent more than {H2_EMPTY_DATA_FRAMES} empty DATA frames, or too many tiny ones (a flood)")
        }
        Http2Refusal::MalformedStreams => {
            format!("more than {LOCAL_ERROR_RESETS} of its streams broke the protocol and were reset (a flood)")
        }
        Http2Refusal::FlowControl => "it broke flow control (a window past 2^31-1, or data past its window)".into(),
        // `guard.rs`, `send.rs` and `opening.rs` name their own; the rest is the h2 crate's word for it.
        Http2Refusal::SettingsFlood
        | Http2Refusal::PingFlood
        | Http2Refusal::ZeroWindow
        | Http2Refusal::InvalidPreface
        | Http2Refusal::ProtocolError => {
            format!("it broke the HTTP/2 protocol ({e})")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_h2_crates_floods_are_told_apart_by_their_debug_data() {
        let calm = |debug_data: &[u8]| refusal(Reason::ENHANCE_YOUR_CALM, debug_data);
        assert_eq!(calm(b"too_many_resets"), Http2Refusal::RapidReset);
        assert_eq!(calm(b"too_many_continuations"), Http2Refusal::ContinuationFlood);
        assert_eq!(calm(b"header_list_way_too_large"), Http2Refusal::HeaderListTooLarge);
        assert_eq!(calm(b"too_many_data_frames"), Http2Refusal::EmptyDataFlood);
        assert_eq!(calm(b"too_many_internal_resets"), Http2Refusal::MalformedStreams);
        assert_eq!(calm(b""), Http2Refusal::ProtocolError);
        assert_eq!(refusal(Reason::FLOW_CONTROL_ERROR, b""), Http2Refusal::FlowControl);
        assert_eq!(refusal(Reason::PROTOCOL_ERROR, b""), Http2Refusal::ProtocolError);
    }
}
