//! One HTTP/1.1 response read as it arrives: its head, then Content-Length bytes of body, or
//! everything until the server closes when the head has no Content-Length (the request said
//! "Connection: close", so the close ends such a body, chunked ones included).

/// A head longer than this is not an HTTP server's answer: the request is counted as reset.
pub const MAX_HEAD: usize = 16384;

const HEAD_END: &[u8] = b"\r\n\r\n";

/// The response could not be read as HTTP: a head over MAX_HEAD bytes or an unreadable
/// Content-Length.
#[derive(Debug, PartialEq, Eq)]
pub struct Malformed;

#[derive(Default)]
pub struct Response {
    /// The bytes received until the end of the head has been seen.
    head: Vec<u8>,
    /// Known once the whole head is in.
    parsed: Option<Head>,
}

struct Head {
    /// The status code as the status line has it ("" when it has none).
    status: String,
    /// Body bytes still to come; None: the body runs until the server closes.
    body_left: Option<u64>,
}

impl Response {
    /// Takes the next bytes from the connection; returns the status code once the whole response
    /// is in.
    pub fn received(&mut self, data: &[u8]) -> Result<Option<String>, Malformed> {
        let body_bytes = if self.parsed.is_some() {
            data.len()
        } else {
            // The end of the head may straddle two reads: look from 3 bytes before this one.
            let search_from = self.head.len().saturating_sub(HEAD_END.len() - 1);
            self.head.extend_from_slice(data);
            let Some(end) = find(&self.head[search_from..], HEAD_END).map(|at| search_from + at) else {
                return if self.head.len() > MAX_HEAD { Err(Malformed) } else { Ok(None) };
            };
            self.parsed = Some(parse_head(&self.head[..end])?);
            let body_bytes = self.head.len() - end - HEAD_END.len();
            self.head = Vec::new();
            body_bytes
        };
        let head = self.parsed.as_mut().expect("the head is parsed by now");
        if let Some(left) = &mut head.body_left {
            *left = left.saturating_sub(body_bytes as u64);
        }
        Ok(head.complete())
    }

    /// The server closed the connection: the status code if that completes the response (a
    /// head without Content-Length), None if it cut the response short.
    pub fn closed(&self) -> Option<String> {
        self.parsed.as_ref().filter(|head| head.body_left.is_none()).map(|head| head.status.clone())
    }
}

impl Head {
    fn complete(&self) -> Option<String> {
        (self.body_left == Some(0)).then(|| self.status.clone())
    }
}

fn parse_head(head: &[u8]) -> Result<Head, Malformed> {
    let mut lines = head.split(|&byte| byte == b'\n').map(|line| line.strip_suffix(b"\r").unwrap_or(line));
    let status_line = lines.next().unwrap_or_default();
    let status = status_line.splitn(3, |&byte| byte == b' ').nth(1).unwrap_or_default();
    let mut body_left = None;
    for line in lines {
        let Some(colon) = line.iter().position(|&byte| byte == b':') else { continue };
        if line[..colon].trim_ascii().eq_ignore_ascii_case(b"content-length") {
            let value = std::str::from_utf8(line[colon + 1..].trim_ascii()).map_err(|_| Malformed)?;
            body_left = Some(value.parse().map_err(|_| Malformed)?);
        }
    }
    Ok(Head { status: String::from_utf8_lossy(status).into_owned(), body_left })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_in_pieces(response: &[u8], piece: usize) -> Result<Option<String>, Malformed> {
        let mut reader = Response::default();
        for chunk in response.chunks(piece) {
            if let Some(status) = reader.received(chunk)? {
                return Ok(Some(status));
            }
        }
        Ok(None)
    }

    #[test]
    fn complete_once_content_length_bytes_of_body_are_in() {
        let response = b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nHello world\n";
        for piece in 1..response.len() {
            let mut reader = Response::default();
            let chunks: Vec<_> = response.chunks(piece).collect();
            for (index, chunk) in chunks.iter().enumerate() {
                let status = reader.received(chunk).unwrap();
                assert_eq!(status.is_some(), index == chunks.len() - 1, "piece {piece}, chunk {index}");
            }
        }
    }

    #[test]
    fn header_names_in_any_case_and_spacing() {
        let response = b"HTTP/1.1 503 Service Unavailable\r\ncontent-LENGTH :  3 \r\n\r\nab";
        let mut reader = Response::default();
        assert_eq!(reader.received(response), Ok(None));
        assert_eq!(reader.received(b"c"), Ok(Some("503".to_owned())));
    }

    #[test]
    fn without_content_length_the_body_ends_at_the_close() {
        let mut reader = Response::default();
        assert_eq!(reader.received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n"), Ok(None));
        assert_eq!(reader.closed(), Some("200".to_owned()));
    }

    #[test]
    fn a_close_before_the_end_is_no_answer() {
        let mut reader = Response::default();
        assert_eq!(reader.closed(), None);
        assert_eq!(reader.received(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab"), Ok(None));
        assert_eq!(reader.closed(), None);
        let mut reader = Response::default();
        assert_eq!(reader.received(b"HTTP/1.1 200 OK\r\n"), Ok(None));
        assert_eq!(reader.closed(), None);
    }

    #[test]
    fn a_status_line_without_a_code_gives_an_empty_status() {
        assert_eq!(read_in_pieces(b"HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 4), Ok(Some(String::new())));
    }

    #[test]
    fn malformed_heads() {
        assert_eq!(read_in_pieces(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", 7), Err(Malformed));
        let endless = [b'a'; MAX_HEAD + 1];
        assert_eq!(read_in_pieces(&endless, 1000), Err(Malformed));
    }
}
