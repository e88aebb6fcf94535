//! HTTP/1.0 and HTTP/1.1 for maitred, without I/O.
//!
//! [`RequestDecoder`] turns the bytes a client sent into [`Event`]s: a request head, body
//! data, the end of the request; then the next request on the same connection. The
//! response side writes heads ([`write_response_head`]), chunks ([`write_chunk`]) and the
//! server's own refusals ([`write_error_response`]) into byte buffers. Nothing here owns a
//! socket, a task or a clock: the caller moves the bytes and keeps the time, and every state
//! can be tested with plain byte strings. [`decode_proxy_header`] reads the PROXY protocol
//! header a proxy may send before the first request.
//!
//! # Strictness
//!
//! The decoder follows RFC 9112 the way a server that sits behind or in front of other
//! parsers must: whenever the RFC lets a recipient choose between accepting something odd and
//! rejecting it, it rejects, because two parsers that disagree about where a request ends
//! are how requests get smuggled. In particular it refuses bare LF and bare CR line endings,
//! obsolete line folding, whitespace before a field's colon, Content-Length together with
//! Transfer-Encoding, repeated or list-valued Content-Length, transfer codings other than
//! `chunked`, HTTP/1.1 requests without exactly one Host, an empty Host beside a path or `*`
//! target, control characters anywhere in the head, and non-ASCII bytes in the request
//! target. Every refusal is a [`RequestError`] with the status to answer and a short reason;
//! `docs/CONFORMANCE.md` lists where this differs from the gunicorn and llhttp test corpora,
//! and why.

mod chunked;
mod error;
mod fields;
mod head;
mod proxy;
mod request;
mod response;
mod syntax;

pub use error::{ErrorKind, RequestError, Section};
pub use proxy::{decode_proxy_header, ProxyError, ProxyHeader, ProxyVersions, V1_MAX_LINE, V2_FIXED_LEN, V2_SIGNATURE};
pub use request::{BodyLength, Event, Limits, RequestDecoder, RequestHead, Version};
pub use response::{
    reason_phrase, write_chunk, write_error_response, write_response_head, Framing, ResponseContext, CONTINUE,
    LAST_CHUNK,
};

/// The most a header section (request line and field lines) or a trailer section may hold,
/// whatever the limits say: 64 KiB, counted from its first byte to the last byte of its last
/// line, before the final line break. With gunicorn's default limits a head could in theory
/// reach 800 KB (100 fields of 8190 bytes); no real client needs that, and this ceiling keeps
/// the memory a connection can pin bounded even when a limit is set to 0 ("unlimited").
pub const MAX_HEAD_SIZE: usize = 64 * 1024;

/// The most a chunk-size line (the size, its extensions, not the CRLF) may hold. Chunk
/// extensions carry nothing this server uses, and without a bound a client could keep one
/// line open forever.
pub const MAX_CHUNK_LINE: usize = 4096;

#[cfg(test)]
mod tests;
