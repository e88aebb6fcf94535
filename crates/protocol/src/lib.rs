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
//!
//! # Layout
//!
//! The words several files share live here, in the crate root: [`Limits`], [`Version`],
//! [`BodyLength`], [`MAX_HEAD_SIZE`] and [`MAX_CHUNK_LINE`]; the files import them from here.
//! `error` and `syntax` import nothing of this crate, nor does `proxy`. `rules` (what a request
//! must be whatever protocol brought it: its target's form, its Host, its field values, which
//! HTTP/2's reading of a head in the lobby applies too) builds on those two. `fields` (field
//! lines), `chunked` (chunk-size lines) and `head` (the request line and header section, with
//! `fields` and `rules`) build on `error` and `syntax`; `request`, the decoder, drives those three;
//! `response` uses `syntax` only; `opening` (which protocol a plain connection's first bytes
//! speak: HTTP/2's preface or an HTTP/1.x request) imports nothing. No file imports one that imports it.

mod chunked;
mod error;
mod fields;
mod head;
mod opening;
mod proxy;
mod request;
mod response;
mod rules;
mod syntax;

pub use error::{ErrorKind, RequestError, Section};
pub use opening::{choose as choose_protocol, Opening, PREFACE};
pub use proxy::{decode_proxy_header, ProxyError, ProxyHeader, ProxyVersions, V1_MAX_LINE, V2_FIXED_LEN, V2_SIGNATURE};
pub use request::{Event, RequestDecoder, RequestHead};
pub use response::{
    is_hop_by_hop, one_part_answer_capacity, reason_phrase, write_chunk, write_error_response, write_response_head,
    Framing, ResponseContext, CONTINUE, LAST_CHUNK,
};
pub use rules::{check_field_value, check_host, check_host_matches_authority, target_form, TargetForm};

/// How much a client may send. The defaults are gunicorn's but for the request line, which
/// gets 8190 bytes where gunicorn allows 4094: RFC 9112 §3 recommends supporting request
/// lines of at least 8000 octets.
///
/// As in gunicorn, 0 means "no limit" for `max_request_line`, `max_headers` and
/// `max_header_size`; [`crate::MAX_HEAD_SIZE`] still bounds every head and trailer section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes in the request line, not counting its CRLF. Beyond: 414, or 400 if the method
    /// alone reaches the limit (a long method is not a long URI).
    pub max_request_line: usize,
    /// Field lines in the header section (and, separately, in a trailer section). Beyond: 431.
    pub max_headers: usize,
    /// Bytes in one field line: name, colon, value, the whitespace around it, and the CRLF
    /// (gunicorn counts it here, though not for the request line). Beyond: 431.
    pub max_header_size: usize,
    /// Bytes of body, after removing the chunked coding. `None`: no limit. Beyond: 413, as
    /// soon as a Content-Length or a chunk size announces it.
    pub max_body: Option<u64>,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { max_request_line: 8190, max_headers: 100, max_header_size: 8190, max_body: None }
    }
}

/// The protocol version of a request. HTTP/1.2 to HTTP/1.9 are read as HTTP/1.1
/// (RFC 9110 §2.5); other major versions are refused with 505.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Version {
    Http10,
    Http11,
}

impl Version {
    /// `"HTTP/1.0"` or `"HTTP/1.1"`, as a WSGI `SERVER_PROTOCOL` wants it.
    pub fn as_str(self) -> &'static str {
        match self {
            Version::Http10 => "HTTP/1.0",
            Version::Http11 => "HTTP/1.1",
        }
    }
}

/// How the body of a request is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyLength {
    /// No body: no Content-Length and no Transfer-Encoding (a request is never delimited by
    /// the connection closing, RFC 9112 §6.3), or `Content-Length: 0`.
    Empty,
    /// Exactly this many bytes (more than 0).
    Length(u64),
    /// The chunked transfer coding; the length is known at the end.
    Chunked,
}

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
