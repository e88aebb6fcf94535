//! Why a request was refused.

use std::fmt;

/// The part of a message a field-line error was found in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Section {
    /// The header section, after the request line.
    Head,
    /// The trailer section after the last chunk of a chunked body.
    Trailers,
}

impl Section {
    fn noun(self) -> &'static str {
        match self {
            Section::Head => "header",
            Section::Trailers => "trailer",
        }
    }
}

/// What exactly was wrong with a request. Every kind maps to one status code
/// ([`RequestError::status`]) and one short reason ([`RequestError`]'s `Display`).
///
/// Bytes quoted in a kind (`byte`, `coding`, `name`) come from the request; they are
/// kept printable so that a reason can be echoed in an error body or a log line as is.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    // ---- request line ----
    /// A byte that is not a `tchar` in the method.
    InvalidMethod { byte: u8 },
    /// The request line does not have the shape `method SP target SP version`: it starts with
    /// a space, ends after the method, or has two spaces in a row.
    MalformedRequestLine,
    /// A byte that is not visible ASCII in the request target.
    InvalidTarget { byte: u8 },
    /// The target is neither origin-form (`/path`), absolute-form (`scheme://authority...`)
    /// nor asterisk-form (`*`).
    InvalidTargetForm,
    /// `*` as the target of a method other than OPTIONS.
    AsteriskFormWithoutOptions,
    /// The request line ends after the target (an HTTP/0.9 request).
    MissingVersion,
    /// The version is not `HTTP/` DIGIT `.` DIGIT.
    InvalidVersion,
    /// A well-formed version whose major number is not 1. Status 505.
    UnsupportedVersion { major: u8 },
    /// CONNECT asks for a tunnel, which this server does not offer. Status 501.
    ConnectNotSupported,
    /// The method alone reaches the request-line limit, so no target and version can follow
    /// within it. Status 400, not 414: what is too long is not the URI.
    MethodTooLong { limit: usize },
    /// The request line is longer than the limit (and the method alone is not). Status 414.
    RequestLineTooLong { limit: usize },

    // ---- line structure ----
    /// A line ended by LF alone (RFC 9112 §2.2 lets a recipient accept it; this server does not).
    BareLf,
    /// A CR not followed by LF.
    BareCr,
    /// A field line starting with whitespace right after the request line (RFC 9112 §2.2).
    WhitespaceAfterRequestLine,
    /// A field line starting with whitespace: obsolete line folding (RFC 9112 §5.2).
    ObsoleteLineFolding,

    // ---- field lines (header and trailer sections) ----
    /// A field line without a colon.
    MissingColon,
    /// Whitespace between a field name and its colon (RFC 9112 §5.1).
    WhitespaceBeforeColon,
    /// A byte that is not a `tchar` in a field name, or an empty name.
    InvalidFieldName { byte: u8 },
    /// A control character (other than HTAB) in a field value.
    InvalidFieldValue { byte: u8 },
    /// An HTTP/2 field value that starts or ends with whitespace (RFC 9113 §8.2.1), which
    /// HTTP/1.1 would trim as optional whitespace.
    FieldValueWhitespace,
    /// One field line is longer than the limit. Status 431.
    FieldTooLong { section: Section, limit: usize },
    /// More field lines than the limit. Status 431.
    TooManyFields { section: Section, limit: usize },
    /// The whole section is larger than [`crate::MAX_HEAD_SIZE`]. Status 431.
    SectionTooLarge { section: Section, limit: usize },

    // ---- header semantics ----
    /// A Content-Length that is not `1*DIGIT` or does not fit in 64 bits.
    InvalidContentLength,
    /// Content-Length given twice, or as a list, even with equal values.
    RepeatedContentLength,
    /// Both Content-Length and Transfer-Encoding: the framing is ambiguous (request smuggling).
    ContentLengthWithTransferEncoding,
    /// Transfer-Encoding in an HTTP/1.0 request (RFC 9112 §6.1: the framing is faulty).
    TransferEncodingInHttp10,
    /// A Transfer-Encoding that is empty or has a member that is not a token.
    InvalidTransferEncoding,
    /// `chunked` is not the last transfer coding (or is absent): the body length is unknown.
    ChunkedNotLast,
    /// `chunked` applied more than once.
    ChunkedRepeated,
    /// A transfer coding other than `chunked`. Status 501.
    UnsupportedTransferCoding { coding: String },
    /// An HTTP/1.1 request without Host (RFC 9112 §3.2).
    MissingHost,
    /// More than one Host field line (RFC 9112 §3.2).
    RepeatedHost,
    /// A Host value (or HTTP/2 `:authority`) that is not `uri-host [ ":" port ]`: a userinfo
    /// (`user@host`) among others.
    InvalidHost,
    /// An HTTP/2 `host` field that names another authority than `:authority` (RFC 9113 §8.3.1).
    HostDiffersFromAuthority,
    /// A Host whose host is empty (`Host:`, `Host: :80`) for a target that takes its
    /// authority from Host (a path or `*`): the target URI would be an `http` URI with an
    /// empty host, which RFC 9110 §4.2.1 says to reject as invalid.
    EmptyHost,
    /// More than one Content-Type field line: the media type would be ambiguous.
    RepeatedContentType,
    /// An expectation other than `100-continue`. Status 417.
    UnsupportedExpectation,
    /// The body is larger than `Limits::max_body`. Status 413.
    BodyTooLarge { limit: u64 },

    // ---- chunked body ----
    /// A chunk-size that is not `1*HEXDIG`, or junk after it.
    InvalidChunkSize,
    /// A chunk-size beyond 64 bits.
    ChunkSizeTooLarge,
    /// A chunk extension that is not `;name[=token / quoted-string]`.
    InvalidChunkExtension,
    /// A chunk-size line longer than [`crate::MAX_CHUNK_LINE`].
    ChunkLineTooLong { limit: usize },
    /// Chunk data not followed by CRLF.
    MissingChunkTerminator,
    /// A trailer field that controls framing, routing or the connection.
    ForbiddenTrailer { name: String },

    // ---- end of input ----
    /// The peer closed the connection inside a request head.
    IncompleteHead,
    /// The peer closed the connection inside a request body.
    IncompleteBody,
}

/// A request this server refuses, and why. The connection cannot carry further requests
/// after one: the decoder keeps returning the same error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestError {
    kind: ErrorKind,
}

impl RequestError {
    pub(crate) fn new(kind: ErrorKind) -> RequestError {
        RequestError { kind }
    }

    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }

    /// Every status that `status` returns, for counters shown at zero before the first refusal.
    pub const STATUSES: [u16; 7] = [400, 413, 414, 417, 431, 501, 505];

    /// The status code to answer with.
    pub fn status(&self) -> u16 {
        match self.kind {
            ErrorKind::RequestLineTooLong { .. } => 414,
            ErrorKind::FieldTooLong { .. } | ErrorKind::TooManyFields { .. } | ErrorKind::SectionTooLarge { .. } => 431,
            ErrorKind::BodyTooLarge { .. } => 413,
            ErrorKind::UnsupportedExpectation => 417,
            ErrorKind::UnsupportedVersion { .. } => 505,
            ErrorKind::ConnectNotSupported | ErrorKind::UnsupportedTransferCoding { .. } => 501,
            _ => 400,
        }
    }
}

/// Shows a request byte in a reason: printable ASCII as itself, anything else in hex.
struct ShownByte(u8);

impl fmt::Display for ShownByte {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_ascii_graphic() {
            write!(f, "'{}'", self.0 as char)
        } else {
            write!(f, "0x{:02X}", self.0)
        }
    }
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ErrorKind::*;
        match &self.kind {
            InvalidMethod { byte } => write!(f, "invalid character {} in the request method", ShownByte(*byte)),
            MalformedRequestLine => f.write_str("malformed request line"),
            InvalidTarget { byte } => write!(f, "invalid character {} in the request target", ShownByte(*byte)),
            InvalidTargetForm => f.write_str("request target is not a path, an absolute URI or '*'"),
            AsteriskFormWithoutOptions => f.write_str("request target '*' is only allowed with OPTIONS"),
            MissingVersion => f.write_str("request line without HTTP version"),
            InvalidVersion => f.write_str("invalid HTTP version"),
            UnsupportedVersion { major } => write!(f, "HTTP/{major}.x is not supported"),
            ConnectNotSupported => f.write_str("CONNECT is not supported"),
            MethodTooLong { limit } => write!(f, "request method too long for the {limit}-byte request line limit"),
            RequestLineTooLong { limit } => write!(f, "request line longer than {limit} bytes"),
            BareLf => f.write_str("line ending without CR (bare LF)"),
            BareCr => f.write_str("CR not followed by LF"),
            WhitespaceAfterRequestLine => f.write_str("whitespace between the request line and the first header field"),
            ObsoleteLineFolding => f.write_str("obsolete line folding (field line starting with whitespace)"),
            MissingColon => f.write_str("field line without a colon"),
            WhitespaceBeforeColon => f.write_str("whitespace between field name and colon"),
            InvalidFieldName { byte } => write!(f, "invalid character {} in a field name", ShownByte(*byte)),
            InvalidFieldValue { byte } => write!(f, "invalid character {} in a field value", ShownByte(*byte)),
            FieldValueWhitespace => f.write_str("a field value starts or ends with whitespace"),
            FieldTooLong { section, limit } => write!(f, "{} field longer than {limit} bytes", section.noun()),
            TooManyFields { section, limit } => write!(f, "more than {limit} {} fields", section.noun()),
            SectionTooLarge { section, limit } => write!(f, "{} section larger than {limit} bytes", section.noun()),
            InvalidContentLength => f.write_str("invalid Content-Length"),
            RepeatedContentLength => f.write_str("repeated Content-Length"),
            ContentLengthWithTransferEncoding => f.write_str("Content-Length and Transfer-Encoding both present"),
            TransferEncodingInHttp10 => f.write_str("Transfer-Encoding in an HTTP/1.0 request"),
            InvalidTransferEncoding => f.write_str("invalid Transfer-Encoding"),
            ChunkedNotLast => f.write_str("chunked is not the final transfer coding"),
            ChunkedRepeated => f.write_str("chunked applied more than once"),
            UnsupportedTransferCoding { coding } => write!(f, "unsupported transfer coding '{coding}'"),
            MissingHost => f.write_str("missing Host header"),
            RepeatedHost => f.write_str("repeated Host header"),
            InvalidHost => f.write_str("invalid Host header"),
            HostDiffersFromAuthority => f.write_str("the host field differs from :authority"),
            EmptyHost => f.write_str("empty host in the Host header"),
            RepeatedContentType => f.write_str("repeated Content-Type header"),
            UnsupportedExpectation => f.write_str("unsupported expectation (only 100-continue is)"),
            BodyTooLarge { limit } => write!(f, "request body larger than {limit} bytes"),
            InvalidChunkSize => f.write_str("invalid chunk size"),
            ChunkSizeTooLarge => f.write_str("chunk size too large"),
            InvalidChunkExtension => f.write_str("invalid chunk extension"),
            ChunkLineTooLong { limit } => write!(f, "chunk size line longer than {limit} bytes"),
            MissingChunkTerminator => f.write_str("chunk data not followed by CRLF"),
            ForbiddenTrailer { name } => write!(f, "field '{name}' is not allowed in a trailer"),
            IncompleteHead => f.write_str("connection closed inside the request head"),
            IncompleteBody => f.write_str("connection closed inside the request body"),
        }
    }
}

impl std::error::Error for RequestError {}

impl From<ErrorKind> for RequestError {
    /// A refusal found outside the decoder: by HTTP/2's reading of a head, which applies the
    /// same rules (`rules.rs`).
    fn from(kind: ErrorKind) -> RequestError {
        RequestError { kind }
    }
}

/// Request text quoted in a reason (a coding or field name, already checked to be a token),
/// cut to a length that keeps reasons short.
pub(crate) fn quoted(token: &[u8]) -> String {
    const MAX_QUOTED: usize = 40;
    let shown = &token[..token.len().min(MAX_QUOTED)];
    let mut text = String::from_utf8_lossy(shown).into_owned();
    if token.len() > MAX_QUOTED {
        text.push_str("...");
    }
    text
}
