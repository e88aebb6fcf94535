//! The request head: request line (RFC 9112 §3) and header section (§5), and what the
//! header fields say about framing and the connection (§6, §9).

use std::ops::Range;

use crate::error::{quoted, ErrorKind, Section};
use crate::fields::{FieldLine, FieldScanner, FieldSpan};
use crate::rules::{check_host, target_form, TargetForm};
use crate::syntax::{is_tchar, is_token, is_vchar, list_members, parse_decimal};
use crate::{BodyLength, Limits, Version, MAX_HEAD_SIZE};

/// A complete head, as ranges of the buffer it was read from (which starts with it).
pub(crate) struct ParsedHead {
    /// Offset just past the blank line that ends the head.
    pub len: usize,
    pub method: Range<usize>,
    pub target: Range<usize>,
    pub version: Version,
    pub fields: Vec<FieldSpan>,
    pub body: BodyLength,
    pub keep_alive: bool,
    pub expect_continue: bool,
}

/// Reads a head that starts at offset 0 of the buffer, across as many calls as it takes.
pub(crate) struct HeadScanner {
    stage: Stage,
    spans: Vec<FieldSpan>,
    facts: HeadFacts,
}

enum Stage {
    RequestLine(RequestLineScanner),
    Fields { line: RequestLine, scanner: FieldScanner },
}

impl HeadScanner {
    pub fn new() -> HeadScanner {
        HeadScanner {
            stage: Stage::RequestLine(RequestLineScanner::new()),
            spans: Vec::new(),
            facts: HeadFacts::default(),
        }
    }

    /// Advances over the bytes that arrived; `Ok(None)` until the blank line has.
    pub fn advance(&mut self, buf: &[u8], limits: &Limits) -> Result<Option<ParsedHead>, ErrorKind> {
        loop {
            match &mut self.stage {
                Stage::RequestLine(scanner) => {
                    let Some(line) = scanner.advance(buf, limits.max_request_line)? else {
                        return Ok(None);
                    };
                    let form = target_form(&buf[line.method.clone()], &buf[line.target.clone()])?;
                    self.facts.host_is_authority = form != TargetForm::Absolute;
                    // The head's size ceiling counts the request line too.
                    let scanner = FieldScanner::new(Section::Head, 0, line.end, limits);
                    self.stage = Stage::Fields { line, scanner };
                }
                Stage::Fields { line, scanner } => loop {
                    match scanner.next_line(buf)? {
                        None => return Ok(None),
                        Some(FieldLine::Field(span)) => {
                            self.facts.observe(&buf[span.name.clone()], &buf[span.value.clone()])?;
                            self.spans.push(span);
                        }
                        Some(FieldLine::End { end }) => {
                            let framing = self.facts.conclude(line.version, limits)?;
                            return Ok(Some(ParsedHead {
                                len: end,
                                method: line.method.clone(),
                                target: line.target.clone(),
                                version: line.version,
                                fields: std::mem::take(&mut self.spans),
                                body: framing.body,
                                keep_alive: framing.keep_alive,
                                expect_continue: framing.expect_continue,
                            }));
                        }
                    }
                },
            }
        }
    }
}

struct RequestLine {
    method: Range<usize>,
    target: Range<usize>,
    version: Version,
    /// Offset just past the line's CRLF.
    end: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Method,
    Target,
    Version,
    LineFeed,
}

/// The request line, checked byte by byte as it arrives, so that a connection that does not
/// speak HTTP (a TLS handshake on a plain port, say) is refused at its first bytes rather
/// than after a timeout.
///
/// This is written out instead of using httparse because httparse reports every bad version
/// alike (this server must tell 505 from 400), accepts LF alone as a line end and non-ASCII
/// bytes in the target, and knows nothing of length limits.
struct RequestLineScanner {
    phase: Phase,
    pos: usize,
    method_end: usize,
    target_end: usize,
}

const VERSION_LEN: usize = b"HTTP/1.1".len();

impl RequestLineScanner {
    fn new() -> RequestLineScanner {
        RequestLineScanner { phase: Phase::Method, pos: 0, method_end: 0, target_end: 0 }
    }

    fn advance(&mut self, buf: &[u8], max_request_line: usize) -> Result<Option<RequestLine>, ErrorKind> {
        // The first byte beyond the limit; the head ceiling applies when the limit is 0.
        let limit = match max_request_line {
            0 => MAX_HEAD_SIZE,
            max => max.min(MAX_HEAD_SIZE),
        };
        while self.pos < buf.len() {
            let i = self.pos;
            let b = buf[i];
            let is_content = match self.phase {
                Phase::Method | Phase::Target => b != b'\r' && b != b'\n',
                Phase::Version => i - (self.target_end + 1) < VERSION_LEN,
                Phase::LineFeed => false,
            };
            if is_content && i >= limit {
                // A method that fills the whole line is no long URI: 400, not 414.
                return Err(if self.phase == Phase::Method {
                    ErrorKind::MethodTooLong { limit }
                } else {
                    ErrorKind::RequestLineTooLong { limit }
                });
            }
            match self.phase {
                Phase::Method => match b {
                    b' ' if i == 0 => return Err(ErrorKind::MalformedRequestLine),
                    b' ' => {
                        self.method_end = i;
                        self.phase = Phase::Target;
                    }
                    b'\r' | b'\n' => return Err(ErrorKind::MalformedRequestLine),
                    _ if is_tchar(b) => {}
                    _ => return Err(ErrorKind::InvalidMethod { byte: b }),
                },
                Phase::Target => match b {
                    b' ' if i == self.method_end + 1 => return Err(ErrorKind::MalformedRequestLine),
                    b' ' => {
                        self.target_end = i;
                        self.phase = Phase::Version;
                    }
                    b'\r' | b'\n' => return Err(ErrorKind::MissingVersion),
                    _ if is_vchar(b) => {}
                    _ => return Err(ErrorKind::InvalidTarget { byte: b }),
                },
                Phase::Version => {
                    let at = i - (self.target_end + 1);
                    let fits = match at {
                        0..=4 => b == b"HTTP/"[at],
                        5 | 7 => b.is_ascii_digit(),
                        6 => b == b'.',
                        _ => b == b'\r' || b == b'\n',
                    };
                    if !fits {
                        return Err(ErrorKind::InvalidVersion);
                    }
                    match b {
                        b'\n' => return Err(ErrorKind::BareLf),
                        b'\r' => self.phase = Phase::LineFeed,
                        _ => {}
                    }
                }
                Phase::LineFeed => {
                    if b != b'\n' {
                        return Err(ErrorKind::BareCr);
                    }
                    let version_start = self.target_end + 1;
                    let major = buf[version_start + 5] - b'0';
                    let minor = buf[version_start + 7] - b'0';
                    let version = match (major, minor) {
                        (1, 0) => Version::Http10,
                        // RFC 9110 §2.5: a higher minor version is processed as the highest
                        // this recipient implements.
                        (1, _) => Version::Http11,
                        (major, _) => return Err(ErrorKind::UnsupportedVersion { major }),
                    };
                    self.pos = i + 1;
                    return Ok(Some(RequestLine {
                        method: 0..self.method_end,
                        target: self.method_end + 1..self.target_end,
                        version,
                        end: i + 1,
                    }));
                }
            }
            self.pos = i + 1;
        }
        Ok(None)
    }
}

/// The header fields that matter to this server, gathered line by line so that conflicts
/// are refused at the line that creates them.
#[derive(Default)]
struct HeadFacts {
    content_length: Option<u64>,
    transfer_encoding: Option<TransferCodings>,
    hosts: usize,
    /// Whether Host supplies the target URI's authority (RFC 9112 §3.3): for a path or `*`,
    /// not for an absolute-form target, whose own authority wins (§3.2.2).
    host_is_authority: bool,
    content_types: usize,
    connection_close: bool,
    connection_keep_alive: bool,
    expect_continue: bool,
    expect_other: bool,
}

/// The members of all Transfer-Encoding lines, in order, reduced to what decides framing.
#[derive(Default)]
struct TransferCodings {
    members: usize,
    chunked: usize,
    last_is_chunked: bool,
    first_unsupported: Option<String>,
}

struct Framing {
    body: BodyLength,
    keep_alive: bool,
    expect_continue: bool,
}

impl HeadFacts {
    fn observe(&mut self, name: &[u8], value: &[u8]) -> Result<(), ErrorKind> {
        if name.eq_ignore_ascii_case(b"content-length") {
            if self.transfer_encoding.is_some() {
                return Err(ErrorKind::ContentLengthWithTransferEncoding);
            }
            // RFC 9110 §8.6 lets a recipient accept "42, 42" or a repeated equal value; a
            // proxy in front may have picked a different member, so neither is accepted.
            if self.content_length.is_some() || value.contains(&b',') {
                return Err(ErrorKind::RepeatedContentLength);
            }
            self.content_length = Some(parse_decimal(value).ok_or(ErrorKind::InvalidContentLength)?);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            if self.content_length.is_some() {
                return Err(ErrorKind::ContentLengthWithTransferEncoding);
            }
            let codings = self.transfer_encoding.get_or_insert_with(TransferCodings::default);
            for member in list_members(value) {
                if !is_token(member) {
                    return Err(ErrorKind::InvalidTransferEncoding);
                }
                codings.members += 1;
                codings.last_is_chunked = member.eq_ignore_ascii_case(b"chunked");
                if codings.last_is_chunked {
                    codings.chunked += 1;
                } else if codings.first_unsupported.is_none() {
                    codings.first_unsupported = Some(quoted(member));
                }
            }
        } else if name.eq_ignore_ascii_case(b"host") {
            self.hosts += 1;
            if self.hosts > 1 {
                return Err(ErrorKind::RepeatedHost);
            }
            check_host(value, self.host_is_authority)?;
        } else if name.eq_ignore_ascii_case(b"content-type") {
            self.content_types += 1;
            if self.content_types > 1 {
                return Err(ErrorKind::RepeatedContentType);
            }
        } else if name.eq_ignore_ascii_case(b"connection") {
            for option in list_members(value) {
                if option.eq_ignore_ascii_case(b"close") {
                    self.connection_close = true;
                } else if option.eq_ignore_ascii_case(b"keep-alive") {
                    self.connection_keep_alive = true;
                }
            }
        } else if name.eq_ignore_ascii_case(b"expect") {
            for expectation in list_members(value) {
                if expectation.eq_ignore_ascii_case(b"100-continue") {
                    self.expect_continue = true;
                } else {
                    self.expect_other = true;
                }
            }
        }
        Ok(())
    }

    /// Decides framing and persistence once every field has been seen.
    fn conclude(&self, version: Version, limits: &Limits) -> Result<Framing, ErrorKind> {
        if version == Version::Http11 && self.hosts == 0 {
            return Err(ErrorKind::MissingHost);
        }
        let body = match (&self.transfer_encoding, self.content_length) {
            (Some(codings), _) => {
                if version == Version::Http10 {
                    return Err(ErrorKind::TransferEncodingInHttp10);
                }
                if codings.members == 0 {
                    return Err(ErrorKind::InvalidTransferEncoding);
                }
                if codings.chunked > 1 {
                    return Err(ErrorKind::ChunkedRepeated);
                }
                // RFC 9112 §6.3: without chunked last the length cannot be known, which is a
                // 400 even when the codings are unknown too.
                if !codings.last_is_chunked {
                    return Err(ErrorKind::ChunkedNotLast);
                }
                if let Some(coding) = &codings.first_unsupported {
                    return Err(ErrorKind::UnsupportedTransferCoding { coding: coding.clone() });
                }
                BodyLength::Chunked
            }
            (None, Some(0) | None) => BodyLength::Empty,
            (None, Some(n)) => BodyLength::Length(n),
        };
        // RFC 9110 §10.1.1: an HTTP/1.0 server cannot have promised a 100 response, so
        // expectations in HTTP/1.0 requests are ignored.
        let expectations = version == Version::Http11;
        if expectations && self.expect_other {
            return Err(ErrorKind::UnsupportedExpectation);
        }
        if let (BodyLength::Length(n), Some(limit)) = (body, limits.max_body) {
            if n > limit {
                return Err(ErrorKind::BodyTooLarge { limit });
            }
        }
        let keep_alive = !self.connection_close && (version == Version::Http11 || self.connection_keep_alive);
        let expect_continue = expectations && self.expect_continue && body != BodyLength::Empty;
        Ok(Framing { body, keep_alive, expect_continue })
    }
}
