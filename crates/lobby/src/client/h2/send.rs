//! An HTTP/2 stream's answer: the worker's head as HTTP/2 fields (connection-specific ones
//! dropped, RFC 9113 8.2.2; Date and Server added as for HTTP/1.1), then its body as DATA frames
//! sent within the client's window. A wait for window that brings nothing for
//! `--send-timeout` cuts the connection, as an HTTP/1.1 client that takes no byte is cut.

use std::future::poll_fn;
use std::os::unix::fs::FileExt;
use std::time::Duration;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{Reason, SendStream};
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, DATE, RETRY_AFTER, SERVER};
use maitred_protocol::{is_hop_by_hop, reason_phrase};

use super::head::Head;
use super::reasons::{Http2Refusal, StreamStage};
use super::Shared;
use crate::client::exchange::http_date;
use crate::log::{self, debug};
use crate::seating::spool::{AnswerReceiver, ResponsePart};

/// File bytes (a `wsgi.file_wrapper` file, or the spool's spill) are read and sent this many
/// at a time: HTTP/2 frames them, so they cannot go with sendfile(2).
const FILE_CHUNK: usize = 64 * 1024;

/// What went to the client, for the access log and the metrics.
#[derive(Default)]
pub(super) struct Sent {
    pub(super) status: u16,
    pub(super) body_bytes: u64,
    /// The application's header fields, when the access log writes some (`{name}o`).
    pub(super) headers: Vec<(Bytes, Bytes)>,
}

/// Why an answer stopped.
enum Cut {
    /// The client reset the stream.
    Reset,
    /// The connection ended, or the answer broke (the stream is reset).
    Gone,
    /// The client gave no window for `--send-timeout`.
    Stalled(Duration),
}

impl From<h2::Error> for Cut {
    fn from(e: h2::Error) -> Cut {
        if e.is_reset() && e.is_remote() {
            Cut::Reset
        } else {
            Cut::Gone
        }
    }
}

/// Sends the answer from its first part on. Returns whether it was sent whole.
pub(super) async fn answer(
    shared: &Shared,
    head: &Head,
    mut respond: SendResponse<Bytes>,
    first: ResponsePart,
    responses: &AnswerReceiver,
    sent: &mut Sent,
) -> bool {
    let limit = shared.context.settings().send_timeout;
    let result = async {
        let (status, headers, body, end) = match first {
            ResponsePart::Head { status, headers, body, end, .. } => (status, headers, body, end),
            // The lobby's answer on the worker's behalf (502, 504, 503): counted as answered,
            // like the worker's own, by the caller.
            ResponsePart::Refused { status, detail, retry_after } => {
                error_response(shared, &mut respond, status, &detail, retry_after);
                sent.status = status;
                return Ok(());
            }
            // The worker's answer broke before its head, or a WebSocket part (never asked for
            // over HTTP/2, `stream.rs` sets no WebSocket link).
            ResponsePart::Abort
            | ResponsePart::Body { .. }
            | ResponsePart::File { .. }
            | ResponsePart::WebSocket(_) => {
                respond.send_reset(Reason::INTERNAL_ERROR);
                return Err(Cut::Gone);
            }
        };
        sent.status = status;
        // HEAD, 204 and 304 carry no body, whatever the application wrote.
        let bodiless = head.method.as_ref() == b"HEAD" || status == 204 || status == 304;
        let response = response_head(status, &headers);
        if log::access_log_enabled() && shared.context.settings().access_log_format.uses_response_headers() {
            sent.headers = headers;
        }
        let mut stream = shared.send_head(&mut respond, response, end && (bodiless || body.is_empty()))?;
        if bodiless {
            if !end {
                // The rest is not needed: the stream has ended.
                return drain(responses).await;
            }
            return Ok(());
        }
        send_data(&mut stream, body, end, limit, sent).await?;
        let mut last = end;
        while !last {
            let part = tokio::select! {
                part = responses.recv() => part,
                reset = poll_fn(|cx| stream.poll_reset(cx)) => {
                    return Err(if reset.is_ok() && !shared.ended.get() { Cut::Reset } else { Cut::Gone });
                }
            };
            match part {
                Some(ResponsePart::Body { data, end }) => {
                    send_data(&mut stream, data, end, limit, sent).await?;
                    last = end;
                }
                Some(ResponsePart::File { file, offset, count, end, spilled }) => {
                    send_file(&mut stream, &file, offset, count, end, limit, sent).await?;
                    if spilled {
                        responses.spilled_sent(count);
                    }
                    last = end;
                }
                // The answer broke after its head, or the lobby dropped it (a shutdown past
                // --graceful-timeout): the client learns it by the reset.
                _ => {
                    stream.send_reset(Reason::INTERNAL_ERROR);
                    return Err(Cut::Gone);
                }
            }
        }
        Ok(())
    };
    match result.await {
        Ok(()) => true,
        Err(Cut::Reset) => {
            shared.client_reset(StreamStage::Writing);
            false
        }
        Err(Cut::Gone) => {
            debug!("an HTTP/2 stream of {} ended before its answer did", shared.peer_text);
            false
        }
        Err(Cut::Stalled(limit)) => {
            shared.cut(
                Http2Refusal::ZeroWindow,
                format!(
                    "it gave no window for its answer (or read nothing) for {} s (--send-timeout)",
                    limit.as_secs_f64()
                ),
            );
            false
        }
    }
}

/// Takes what a bodiless answer's worker still sends, so that the worker is not told the
/// client left: it did not.
async fn drain(responses: &AnswerReceiver) -> Result<(), Cut> {
    while let Some(part) = responses.recv().await {
        if part.is_last() {
            break;
        }
    }
    Ok(())
}

/// The worker's status and fields as an HTTP/2 head.
fn response_head(status: u16, headers: &[(Bytes, Bytes)]) -> http::Response<()> {
    let mut response = http::Response::new(());
    *response.status_mut() = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    let fields = response.headers_mut();
    for (name, value) in headers {
        if is_hop_by_hop(name) {
            continue;
        }
        match (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
            (Ok(name), Ok(value)) => {
                fields.append(name, value);
            }
            // The worker checked them for HTTP/1.1, whose rules are the same but for case.
            _ => log::warning_limited!(
                "dropped the response header {:?}, which HTTP/2 cannot carry",
                String::from_utf8_lossy(name)
            ),
        }
    }
    if !fields.contains_key(DATE) {
        if let Ok(date) = HeaderValue::from_maybe_shared(http_date()) {
            fields.insert(DATE, date);
        }
    }
    if !fields.contains_key(SERVER) {
        fields.insert(SERVER, HeaderValue::from_static("maitred"));
    }
    response
}

/// Refuses a request the lobby will not queue, with one log line and the count, as HTTP/1.1's
/// `refuse` does.
pub(super) fn refuse(shared: &Shared, respond: &mut SendResponse<Bytes>, status: u16, detail: &str) {
    log::info_limited!("{status} to {} (HTTP/2): {detail}", shared.peer_text);
    shared.context.counts.refused(status);
    shared.context.counts.answered_http2();
    error_response(shared, respond, status, detail, None);
}

/// The lobby's own answer: the status, and the reason in a text body.
fn error_response(
    shared: &Shared,
    respond: &mut SendResponse<Bytes>,
    status: u16,
    detail: &str,
    retry_after: Option<u64>,
) {
    let mut text = format!("{status} {}", reason_phrase(status));
    if !detail.is_empty() {
        text.push_str(": ");
        text.extend(detail.chars().map(|c| if c.is_control() { ' ' } else { c }));
    }
    text.push('\n');
    let mut response = response_head(status, &[]);
    let fields = response.headers_mut();
    fields.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    fields.insert(CONTENT_LENGTH, HeaderValue::from(text.len()));
    if let Some(seconds) = retry_after {
        fields.insert(RETRY_AFTER, HeaderValue::from(seconds));
    }
    // A few hundred bytes: the h2 crate holds them until the client's window takes them.
    if let Ok(mut stream) = shared.send_head(respond, response, false) {
        let _ = stream.send_data(Bytes::from(text), true);
    }
}

/// Sends `data` as the client's window allows, ending the stream with it when `end`.
async fn send_data(
    stream: &mut SendStream<Bytes>,
    mut data: Bytes,
    end: bool,
    limit: Duration,
    sent: &mut Sent,
) -> Result<(), Cut> {
    sent.body_bytes += data.len() as u64;
    if data.is_empty() {
        if end {
            stream.send_data(data, true)?;
        }
        return Ok(());
    }
    while !data.is_empty() {
        stream.reserve_capacity(data.len());
        let granted = match tokio::time::timeout(limit, poll_fn(|cx| stream.poll_capacity(cx))).await {
            Err(_) => return Err(Cut::Stalled(limit)),
            Ok(Some(Ok(granted))) => granted,
            Ok(None | Some(Err(_))) => return Err(Cut::Gone),
        };
        if granted == 0 {
            continue;
        }
        let chunk = data.split_to(granted.min(data.len()));
        stream.send_data(chunk, end && data.is_empty())?;
    }
    Ok(())
}

/// Sends `count` bytes of `file` from `offset`.
async fn send_file(
    stream: &mut SendStream<Bytes>,
    file: &std::fs::File,
    offset: u64,
    count: u64,
    end: bool,
    limit: Duration,
    sent: &mut Sent,
) -> Result<(), Cut> {
    let mut done = 0;
    while done < count {
        let mut chunk = vec![0; (count - done).min(FILE_CHUNK as u64) as usize];
        let n = match file.read_at(&mut chunk, offset + done) {
            Ok(0) | Err(_) => {
                log::warning_limited!("a file of an answer ended before the {count} bytes announced");
                stream.send_reset(Reason::INTERNAL_ERROR);
                return Err(Cut::Gone);
            }
            Ok(n) => n,
        };
        chunk.truncate(n);
        done += n as u64;
        send_data(stream, Bytes::from(chunk), end && done == count, limit, sent).await?;
    }
    if count == 0 && end {
        send_data(stream, Bytes::new(), true, limit, sent).await?;
    }
    Ok(())
}
