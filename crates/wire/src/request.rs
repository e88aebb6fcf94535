//! The payload of `REQUEST` (docs/PROTOCOL.md, section 3): a request's head, as the lobby
//! encodes it and a worker decodes it.

use super::{Reader, WireError, Writer};

/// In a `REQUEST`'s url-scheme byte, beside https (1): a client certificate's subject follows.
pub(crate) const SCHEME_CLIENT_SUBJECT: u8 = 2;

/// A `REQUEST`'s protocol byte: HTTP/1.0 and HTTP/1.1 keep the values they had as the HTTP
/// minor version, and HTTP/2 follows.
pub const HTTP_1_0: u8 = 0;
pub const HTTP_1_1: u8 = 1;
pub const HTTP_2: u8 = 2;

/// The head of a `REQUEST` frame, borrowing from the payload it was decoded from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request<'a> {
    /// The protocol the client spoke: [`HTTP_1_0`], [`HTTP_1_1`] or [`HTTP_2`].
    pub http_version: u8,
    pub method: &'a [u8],
    pub target: &'a [u8],
    pub peer_addr: &'a [u8],
    pub peer_port: u16,
    pub server_name: &'a [u8],
    pub server_port: u16,
    /// `wsgi.url_scheme` is https (the connection is TLS, or a trusted proxy said so);
    /// otherwise http.
    pub https: bool,
    /// The subject of the client certificate the lobby verified (TLS with `--cert-reqs`),
    /// as RFC 4514 writes a distinguished name.
    pub client_subject: Option<&'a [u8]>,
    pub headers: Vec<(&'a [u8], &'a [u8])>,
    pub body_len: u64,
    /// The body when it travels inline; empty when it comes as a file descriptor.
    pub inline_body: &'a [u8],
}

impl<'a> Request<'a> {
    /// Appends the payload of a `REQUEST` frame (without its frame header).
    pub fn encode_payload(&self, out: &mut Vec<u8>) -> Result<(), WireError> {
        let mut w = Writer::new(out);
        w.u8(self.http_version);
        w.str16("method", self.method)?;
        w.str16("target", self.target)?;
        w.str16("peer address", self.peer_addr)?;
        w.u16(self.peer_port);
        w.str16("server name", self.server_name)?;
        w.u16(self.server_port);
        w.u8(u8::from(self.https) | if self.client_subject.is_some() { SCHEME_CLIENT_SUBJECT } else { 0 });
        if let Some(subject) = self.client_subject {
            w.str16("client subject", subject)?;
        }
        w.headers(&self.headers)?;
        w.u64(self.body_len);
        w.raw(self.inline_body);
        Ok(())
    }

    /// Decodes a `REQUEST` payload. `body_in_file` is the frame's `FD` flag.
    pub fn decode_payload(payload: &'a [u8], body_in_file: bool) -> Result<Request<'a>, WireError> {
        let mut r = Reader::new(payload);
        let http_version = r.u8("http version")?;
        let method = r.str16("method")?;
        let target = r.str16("target")?;
        let peer_addr = r.str16("peer address")?;
        let peer_port = r.u16("peer port")?;
        let server_name = r.str16("server name")?;
        let server_port = r.u16("server port")?;
        let scheme = r.u8("url scheme")?;
        if scheme & !(1 | SCHEME_CLIENT_SUBJECT) != 0 {
            return Err(WireError::BadValue("url scheme", scheme));
        }
        let https = scheme & 1 != 0;
        let client_subject = if scheme & SCHEME_CLIENT_SUBJECT != 0 { Some(r.str16("client subject")?) } else { None };
        let headers = r.headers()?;
        let body_len = r.u64("body length")?;
        let inline_body = r.rest();
        let expected_inline = if body_in_file { 0 } else { body_len };
        if inline_body.len() as u64 != expected_inline {
            return if (inline_body.len() as u64) < expected_inline {
                Err(WireError::Truncated("body"))
            } else {
                Err(WireError::TrailingBytes(inline_body.len() - expected_inline as usize))
            };
        }
        Ok(Request {
            http_version,
            method,
            target,
            peer_addr,
            peer_port,
            server_name,
            server_port,
            https,
            client_subject,
            headers,
            body_len,
            inline_body,
        })
    }
}
