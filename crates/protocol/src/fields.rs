//! Field lines (RFC 9112 §5): the header section after the request line, and the trailer
//! section after the last chunk. Both follow the same rules and limits.
//!
//! A section stays in the caller's buffer until its blank line has arrived, so that the
//! fields can be handed out as slices of one frozen buffer. The scanner remembers how far
//! it has looked, so feeding a section one byte at a time costs no more than feeding it
//! whole, and it reports an error as soon as the bytes seen so far prove one.

use std::ops::Range;

use crate::error::{ErrorKind, Section};
use crate::syntax::{is_field_value_byte, is_ows, is_tchar, trim_ows_range};
use crate::{Limits, MAX_HEAD_SIZE};

/// One field line, as ranges of the buffer holding the section.
#[derive(Clone, Debug)]
pub(crate) struct FieldSpan {
    pub name: Range<usize>,
    pub value: Range<usize>,
}

pub(crate) enum FieldLine {
    Field(FieldSpan),
    /// The blank line: the section ends before `end` (an offset in the buffer).
    End {
        end: usize,
    },
}

/// Splits a section into field lines and checks each one.
///
/// Errors depend only on the bytes, never on how they were split into reads: a limit is
/// broken at a fixed offset (the first byte beyond it), and every check looks at bytes in
/// the order they arrive, so a prefix that proves an error proves the same error however
/// it was delivered.
pub(crate) struct FieldScanner {
    section: Section,
    /// Where the section starts in the buffer; the size ceiling counts from here.
    section_start: usize,
    /// Where the current line starts.
    line_start: usize,
    /// How far the current line has been searched for CR or LF.
    scanned: usize,
    count: usize,
    max_field_size: usize,
    max_fields: usize,
}

impl FieldScanner {
    /// A scanner for the section that starts at `section_start` in the buffer and whose
    /// field lines start at `lines_start` (after the request line, for a head).
    pub fn new(section: Section, section_start: usize, lines_start: usize, limits: &Limits) -> FieldScanner {
        FieldScanner {
            section,
            section_start,
            line_start: lines_start,
            scanned: lines_start,
            count: 0,
            max_field_size: limits.max_header_size,
            max_fields: limits.max_headers,
        }
    }

    /// The next complete field line or the end of the section; `Ok(None)` if `buf` does not
    /// hold the whole line yet.
    pub fn next_line(&mut self, buf: &[u8]) -> Result<Option<FieldLine>, ErrorKind> {
        let line_start = self.line_start;
        if buf.len() <= line_start {
            return Ok(None);
        }
        if self.scanned == line_start && is_ows(buf[line_start]) {
            return Err(if self.section == Section::Head && self.count == 0 {
                ErrorKind::WhitespaceAfterRequestLine
            } else {
                ErrorKind::ObsoleteLineFolding
            });
        }
        let Some(found) = memchr::memchr2(b'\r', b'\n', &buf[self.scanned..]) else {
            self.check_size(buf.len())?;
            self.scanned = buf.len();
            return Ok(None);
        };
        let end = self.scanned + found;
        self.check_size(end)?;
        if buf[end] == b'\n' {
            return Err(ErrorKind::BareLf);
        }
        match buf.get(end + 1) {
            None => {
                // A CR at the very end: whether it ends the line depends on the next byte.
                self.scanned = end;
                return Ok(None);
            }
            Some(b'\n') => {}
            Some(_) => return Err(ErrorKind::BareCr),
        }
        self.line_start = end + 2;
        self.scanned = end + 2;
        if end == line_start {
            return Ok(Some(FieldLine::End { end: end + 2 }));
        }
        self.count += 1;
        if self.max_fields != 0 && self.count > self.max_fields {
            return Err(ErrorKind::TooManyFields { section: self.section, limit: self.max_fields });
        }
        let span = parse_field_line(buf, line_start, end)?;
        Ok(Some(FieldLine::Field(span)))
    }

    /// Checks the limits against the current line's content up to `content_end` (exclusive):
    /// a line or a section is too large as soon as one content byte lies beyond its limit,
    /// and the limit that byte crosses first is the one reported.
    fn check_size(&self, content_end: usize) -> Result<(), ErrorKind> {
        if content_end <= self.line_start {
            return Ok(());
        }
        // The limit counts the line's CRLF, as gunicorn's does.
        let line_limit = match self.max_field_size {
            0 => usize::MAX,
            max => self.line_start + max.saturating_sub(2),
        };
        let section_limit = self.section_start + MAX_HEAD_SIZE;
        if content_end <= line_limit.min(section_limit) {
            return Ok(());
        }
        Err(if line_limit <= section_limit {
            ErrorKind::FieldTooLong { section: self.section, limit: self.max_field_size }
        } else {
            ErrorKind::SectionTooLarge { section: self.section, limit: MAX_HEAD_SIZE }
        })
    }
}

/// Checks one field line (`buf[start..end]`, followed by CRLF) and splits it into name and
/// value. httparse does the checking: the line, CRLF included, must leave it wanting more
/// (a lone field line is a valid but unfinished header block). Its allowances do not
/// matter here: the scanner has already refused bare CR, bare LF and folded lines, and
/// httparse refuses whitespace before the colon in requests by default.
fn parse_field_line(buf: &[u8], start: usize, end: usize) -> Result<FieldSpan, ErrorKind> {
    let mut one = [httparse::EMPTY_HEADER; 1];
    let line = &buf[start..end];
    match httparse::parse_headers(&buf[start..end + 2], &mut one) {
        Ok(_) => {}
        Err(httparse::Error::HeaderValue) => return Err(value_error(line)),
        Err(_) => return Err(name_error(line)),
    }
    let colon = start + memchr::memchr(b':', line).ok_or(ErrorKind::MissingColon)?;
    Ok(FieldSpan { name: start..colon, value: trim_ows_range(buf, colon + 1..end) })
}

/// Says precisely what is wrong with the name part of a line httparse refused.
fn name_error(line: &[u8]) -> ErrorKind {
    let name_len = line.iter().position(|&b| !is_tchar(b)).unwrap_or(line.len());
    let Some(colon) = memchr::memchr(b':', line) else {
        return ErrorKind::MissingColon;
    };
    let stop = line[name_len];
    if name_len > 0 && is_ows(stop) && line[name_len..colon].iter().all(|&b| is_ows(b)) {
        return ErrorKind::WhitespaceBeforeColon;
    }
    ErrorKind::InvalidFieldName { byte: stop }
}

fn value_error(line: &[u8]) -> ErrorKind {
    let colon = memchr::memchr(b':', line).unwrap_or(0);
    let byte = line[colon + 1..].iter().copied().find(|&b| !is_field_value_byte(b)).unwrap_or(0);
    ErrorKind::InvalidFieldValue { byte }
}
