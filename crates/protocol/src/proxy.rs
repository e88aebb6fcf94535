//! The PROXY protocol header (HAProxy's proxy-protocol.txt, versions 1 and 2) that a proxy
//! sends at the start of a connection to say which client it carries.
//!
//! [`decode_proxy_header`] reads what has arrived of a connection so far and says whether it
//! begins with a whole header, needs more bytes, or is refused. It keeps no state: the caller
//! calls it again on the longer buffer. Whatever prefix of a connection it is given, its answer
//! is "more" or the answer it gives the whole connection, so an error is never a guess made on
//! a piece of a header.
//!
//! The header is required, as the specification asks ("the receiver MUST NOT try to guess
//! whether the protocol header is present or not"): a connection that begins with anything
//! else is refused with [`ProxyError::Missing`].

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Version 1's signature: the text line starts with it.
pub const V1_SIGNATURE: &[u8] = b"PROXY ";
/// Version 1's longest line, CRLF included (the specification's 107 bytes).
pub const V1_MAX_LINE: usize = 107;
/// Version 2's signature: the binary header's first 12 bytes.
pub const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
/// Version 2's fixed part: the signature, version and command, family and transport, length.
pub const V2_FIXED_LEN: usize = 16;

/// Which versions a server takes (gunicorn's `--proxy-protocol` modes `v1`, `v2`, `auto`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyVersions {
    V1,
    V2,
    Both,
}

impl ProxyVersions {
    fn v1(self) -> bool {
        self != ProxyVersions::V2
    }

    fn v2(self) -> bool {
        self != ProxyVersions::V1
    }
}

/// What a whole header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyHeader {
    /// The proxy carries this TCP client's connection, made to this address of the proxy's.
    Proxied { client: SocketAddr, server: SocketAddr },
    /// Version 2's LOCAL command: the proxy speaks for itself (a health check, say), and the
    /// connection's own addresses stand.
    Local,
    /// The header names no TCP client: version 1's `UNKNOWN`, or version 2 with the UNSPEC
    /// family, a Unix socket or UDP. The specification asks the receiver to fall back to the
    /// connection's own addresses.
    Unspecified,
}

/// Why a connection's PROXY header is refused. Every kind is answered 400.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyError {
    /// The connection does not begin with a header of a version the server takes.
    Missing { accepted: ProxyVersions },
    /// A version 1 line reached 107 bytes without its CRLF.
    V1TooLong,
    /// A version 1 line that is not `PROXY` and five fields, or `PROXY UNKNOWN`, each field
    /// after one space, ended by CRLF.
    V1Malformed,
    /// A version 1 protocol other than `TCP4`, `TCP6` and `UNKNOWN`.
    V1UnknownProtocol,
    /// A version 1 address that is not one of its protocol's family.
    V1BadAddress,
    /// A version 1 port that is not a decimal from 0 to 65535 without leading zeros.
    V1BadPort,
    /// Version 2's version nibble is not 2.
    V2UnsupportedVersion { version: u8 },
    /// Version 2's command is neither LOCAL (0) nor PROXY (1).
    V2UnknownCommand { command: u8 },
    /// Version 2's family and transport byte is none of the seven the specification defines.
    V2UnknownFamily { byte: u8 },
    /// Version 2's length is too short for the addresses of its family.
    V2AddressesTooShort { byte: u8, length: u16, needed: u16 },
}

impl fmt::Display for ProxyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProxyError::Missing { accepted } => {
                let what = match accepted {
                    ProxyVersions::V1 => "a PROXY protocol version 1 header",
                    ProxyVersions::V2 => "a PROXY protocol version 2 header",
                    ProxyVersions::Both => "a PROXY protocol header",
                };
                write!(f, "the connection does not begin with {what}")
            }
            ProxyError::V1TooLong => write!(f, "PROXY protocol line longer than {V1_MAX_LINE} bytes"),
            ProxyError::V1Malformed => write!(f, "malformed PROXY protocol line"),
            ProxyError::V1UnknownProtocol => {
                write!(f, "PROXY protocol line with a protocol other than TCP4, TCP6, UNKNOWN")
            }
            ProxyError::V1BadAddress => write!(f, "PROXY protocol line with an address not of its protocol's family"),
            ProxyError::V1BadPort => write!(f, "PROXY protocol line with a port that is not 0 to 65535"),
            ProxyError::V2UnsupportedVersion { version } => write!(f, "PROXY protocol header of version {version}"),
            ProxyError::V2UnknownCommand { command } => {
                write!(f, "PROXY protocol header with unknown command {command}")
            }
            ProxyError::V2UnknownFamily { byte } => {
                write!(f, "PROXY protocol header with unknown family and transport 0x{byte:02x}")
            }
            ProxyError::V2AddressesTooShort { byte, length, needed } => write!(
                f,
                "PROXY protocol header of family 0x{byte:02x} with {length} bytes of addresses, fewer than its {needed}"
            ),
        }
    }
}

impl std::error::Error for ProxyError {}

/// Reads the PROXY header at the start of `buf`, the bytes a connection has sent so far.
/// `Ok(Some((header, len)))`: the header takes the first `len` bytes, the rest is HTTP.
/// `Ok(None)`: the header is not complete yet.
pub fn decode_proxy_header(buf: &[u8], accepted: ProxyVersions) -> Result<Option<(ProxyHeader, usize)>, ProxyError> {
    let starts_with =
        |signature: &[u8]| buf[..buf.len().min(signature.len())] == signature[..buf.len().min(signature.len())];
    if accepted.v2() && starts_with(V2_SIGNATURE) {
        return decode_v2(buf);
    }
    if accepted.v1() && starts_with(V1_SIGNATURE) {
        return decode_v1(buf);
    }
    Err(ProxyError::Missing { accepted })
}

fn decode_v1(buf: &[u8]) -> Result<Option<(ProxyHeader, usize)>, ProxyError> {
    let window = &buf[..buf.len().min(V1_MAX_LINE)];
    let Some(end) = window.iter().position(|&b| b == b'\r' || b == b'\n') else {
        return if buf.len() >= V1_MAX_LINE { Err(ProxyError::V1TooLong) } else { Ok(None) };
    };
    if window[end] == b'\n' {
        return Err(ProxyError::V1Malformed);
    }
    if end + 2 > V1_MAX_LINE {
        return Err(ProxyError::V1TooLong);
    }
    match buf.get(end + 1) {
        None => return Ok(None),
        Some(b'\n') => {}
        _ => return Err(ProxyError::V1Malformed),
    }
    let line = &buf[V1_SIGNATURE.len()..end];
    let header = parse_v1_fields(line)?;
    Ok(Some((header, end + 2)))
}

/// The fields after `PROXY `: the protocol, then (unless `UNKNOWN`) two addresses and two ports.
fn parse_v1_fields(line: &[u8]) -> Result<ProxyHeader, ProxyError> {
    let mut fields = line.split(|&b| b == b' ');
    let protocol = fields.next().ok_or(ProxyError::V1Malformed)?;
    let v4 = match protocol {
        // The rest of an UNKNOWN line is to be ignored, whatever it holds.
        b"UNKNOWN" => return Ok(ProxyHeader::Unspecified),
        b"TCP4" => true,
        b"TCP6" => false,
        _ => return Err(ProxyError::V1UnknownProtocol),
    };
    let fields: Vec<&[u8]> = fields.collect();
    let [source, destination, source_port, destination_port] = fields[..] else {
        return Err(ProxyError::V1Malformed);
    };
    let address = |text: &[u8]| -> Result<IpAddr, ProxyError> {
        let text = std::str::from_utf8(text).map_err(|_| ProxyError::V1BadAddress)?;
        if v4 {
            text.parse::<Ipv4Addr>().map(IpAddr::V4).map_err(|_| ProxyError::V1BadAddress)
        } else {
            text.parse::<Ipv6Addr>().map(IpAddr::V6).map_err(|_| ProxyError::V1BadAddress)
        }
    };
    let (client_ip, server_ip) = (address(source)?, address(destination)?);
    let (client_port, server_port) = (v1_port(source_port)?, v1_port(destination_port)?);
    Ok(ProxyHeader::Proxied {
        client: SocketAddr::new(client_ip, client_port),
        server: SocketAddr::new(server_ip, server_port),
    })
}

fn v1_port(text: &[u8]) -> Result<u16, ProxyError> {
    let digits = !text.is_empty() && text.len() <= 5 && text.iter().all(u8::is_ascii_digit);
    if !digits || (text.len() > 1 && text[0] == b'0') {
        return Err(ProxyError::V1BadPort);
    }
    let value = text.iter().fold(0u32, |n, &d| n * 10 + u32::from(d - b'0'));
    u16::try_from(value).map_err(|_| ProxyError::V1BadPort)
}

fn decode_v2(buf: &[u8]) -> Result<Option<(ProxyHeader, usize)>, ProxyError> {
    // Each byte of the fixed part is checked as soon as it is there.
    if let Some(&version_command) = buf.get(12) {
        let (version, command) = (version_command >> 4, version_command & 0x0f);
        if version != 2 {
            return Err(ProxyError::V2UnsupportedVersion { version });
        }
        if command > 1 {
            return Err(ProxyError::V2UnknownCommand { command });
        }
    }
    let family = buf.get(13).copied();
    // The addresses each valid family and transport carries: UNSPEC none, TCP4 and UDP4 12
    // bytes, TCP6 and UDP6 36, Unix stream and datagram 216.
    let needed: u16 = match family {
        None => 0,
        Some(0x00) => 0,
        Some(0x11 | 0x12) => 12,
        Some(0x21 | 0x22) => 36,
        Some(0x31 | 0x32) => 216,
        Some(byte) => return Err(ProxyError::V2UnknownFamily { byte }),
    };
    let (Some(family), Some(&high), Some(&low)) = (family, buf.get(14), buf.get(15)) else {
        return Ok(None);
    };
    let length = u16::from_be_bytes([high, low]);
    let local = buf[12] & 0x0f == 0;
    // A LOCAL header's addresses are to be ignored, and so is their length.
    if !local && length < needed {
        return Err(ProxyError::V2AddressesTooShort { byte: family, length, needed });
    }
    let total = V2_FIXED_LEN + usize::from(length);
    if buf.len() < total {
        return Ok(None);
    }
    let addresses = &buf[V2_FIXED_LEN..total];
    let port = |at: usize| u16::from_be_bytes([addresses[at], addresses[at + 1]]);
    let header = match family {
        _ if local => ProxyHeader::Local,
        0x11 => {
            let ip = |at: usize| {
                IpAddr::V4(Ipv4Addr::new(addresses[at], addresses[at + 1], addresses[at + 2], addresses[at + 3]))
            };
            ProxyHeader::Proxied { client: SocketAddr::new(ip(0), port(8)), server: SocketAddr::new(ip(4), port(10)) }
        }
        0x21 => {
            let ip = |at: usize| {
                let octets: [u8; 16] = addresses[at..at + 16].try_into().expect("16 bytes");
                IpAddr::V6(Ipv6Addr::from(octets))
            };
            ProxyHeader::Proxied { client: SocketAddr::new(ip(0), port(32)), server: SocketAddr::new(ip(16), port(34)) }
        }
        // UNSPEC, UDP and Unix sockets: no TCP client to name.
        _ => ProxyHeader::Unspecified,
    };
    Ok(Some((header, total)))
}

#[cfg(test)]
mod tests {
    use super::*;

    type Outcome = Result<Option<(ProxyHeader, usize)>, ProxyError>;

    /// Decodes `input` whole, byte by byte and split in two at every offset. The decoder keeps
    /// no state, so each way is a sequence of calls on prefixes of `input`, the caller stopping
    /// at the first answer that is not "more": fed byte by byte it sees every prefix, split at
    /// `at` it sees `input[..at]` and then `input`. Each must end in the whole input's answer.
    fn decode_every_way(input: &[u8], accepted: ProxyVersions) -> Outcome {
        let whole = decode_proxy_header(input, accepted);
        let fed = |prefixes: &mut dyn Iterator<Item = usize>| {
            prefixes.map(|at| decode_proxy_header(&input[..at], accepted)).find(|answer| *answer != Ok(None))
        };
        let shown = input.escape_ascii().to_string();
        let bytewise = fed(&mut (0..=input.len())).unwrap_or(Ok(None));
        assert_eq!(bytewise, whole, "fed byte by byte vs whole: {shown:?}");
        for at in 1..input.len() {
            let split = fed(&mut [at, input.len()].into_iter()).unwrap_or(Ok(None));
            assert_eq!(split, whole, "split at {at} vs whole: {shown:?}");
        }
        whole
    }

    fn decode(input: &[u8]) -> Outcome {
        decode_every_way(input, ProxyVersions::Both)
    }

    fn proxied(client: &str, server: &str) -> ProxyHeader {
        ProxyHeader::Proxied { client: client.parse().unwrap(), server: server.parse().unwrap() }
    }

    fn v2(version_command: u8, family: u8, addresses: &[u8]) -> Vec<u8> {
        let mut out = V2_SIGNATURE.to_vec();
        out.extend_from_slice(&[version_command, family]);
        out.extend_from_slice(&(addresses.len() as u16).to_be_bytes());
        out.extend_from_slice(addresses);
        out
    }

    #[test]
    fn version_1_tcp4_and_tcp6() {
        let line = b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\nGET / HTTP/1.1\r\n";
        assert_eq!(decode(line), Ok(Some((proxied("192.0.2.1:56324", "198.51.100.2:443"), 45))));
        let line = b"PROXY TCP6 2001:db8::1 ::1 65535 0\r\n";
        assert_eq!(decode(line), Ok(Some((proxied("[2001:db8::1]:65535", "[::1]:0"), line.len()))));
    }

    #[test]
    fn version_1_unknown_keeps_the_connections_addresses() {
        assert_eq!(decode(b"PROXY UNKNOWN\r\n"), Ok(Some((ProxyHeader::Unspecified, 15))));
        let line = b"PROXY UNKNOWN ffff:f...f:ffff ffff:f...f:ffff 65535 65535\r\n";
        assert_eq!(decode(line), Ok(Some((ProxyHeader::Unspecified, line.len()))));
    }

    #[test]
    fn version_1_refusals() {
        for (line, error) in [
            (&b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n"[..], ProxyError::V1Malformed),
            (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\rX", ProxyError::V1Malformed),
            (b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n", ProxyError::V1Malformed),
            (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n", ProxyError::V1Malformed),
            (b"PROXY TCP4  1.2.3.4 5.6.7.8 1 2\r\n", ProxyError::V1Malformed),
            (b"PROXY \r\n", ProxyError::V1UnknownProtocol),
            (b"PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n", ProxyError::V1UnknownProtocol),
            (b"PROXY TCP4 ::1 5.6.7.8 1 2\r\n", ProxyError::V1BadAddress),
            (b"PROXY TCP6 1.2.3.4 ::1 1 2\r\n", ProxyError::V1BadAddress),
            (b"PROXY TCP4 01.2.3.4 5.6.7.8 1 2\r\n", ProxyError::V1BadAddress),
            (b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n", ProxyError::V1BadPort),
            (b"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n", ProxyError::V1BadPort),
            (b"PROXY TCP4 1.2.3.4 5.6.7.8 +1 2\r\n", ProxyError::V1BadPort),
            (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 \r\n", ProxyError::V1BadPort),
        ] {
            assert_eq!(decode(line), Err(error), "{:?}", line.escape_ascii().to_string());
        }
        let long = [&b"PROXY UNKNOWN "[..], &[b'x'; 100]].concat();
        assert_eq!(decode(&long), Err(ProxyError::V1TooLong));
        // 105 bytes and CRLF is the longest line; 106 and CR leaves no room for the LF.
        let longest = [&b"PROXY UNKNOWN "[..], &[b'x'; 91], b"\r\n"].concat();
        assert_eq!(decode(&longest), Ok(Some((ProxyHeader::Unspecified, V1_MAX_LINE))));
        let over = [&b"PROXY UNKNOWN "[..], &[b'x'; 92], b"\r\n"].concat();
        assert_eq!(decode(&over), Err(ProxyError::V1TooLong));
    }

    #[test]
    fn version_2_tcp4_and_tcp6_skip_their_tlvs() {
        let mut addresses = vec![192, 0, 2, 1, 198, 51, 100, 2, 0xdc, 0x04, 0x01, 0xbb];
        let header = v2(0x21, 0x11, &addresses);
        assert_eq!(decode(&header), Ok(Some((proxied("192.0.2.1:56324", "198.51.100.2:443"), 28))));
        // A TLV after the addresses (here PP2_TYPE_ALPN) is part of the header, and ignored.
        addresses.extend_from_slice(&[0x01, 0x00, 0x02, b'h', b'2']);
        let mut with_tlv = v2(0x21, 0x11, &addresses);
        with_tlv.extend_from_slice(b"GET");
        assert_eq!(decode(&with_tlv), Ok(Some((proxied("192.0.2.1:56324", "198.51.100.2:443"), 33))));
        let mut six = Ipv6Addr::LOCALHOST.octets().to_vec();
        six.extend_from_slice(&"2001:db8::2".parse::<Ipv6Addr>().unwrap().octets());
        six.extend_from_slice(&[0x12, 0x34, 0x00, 0x50]);
        assert_eq!(decode(&v2(0x21, 0x21, &six)), Ok(Some((proxied("[::1]:4660", "[2001:db8::2]:80"), 52))));
    }

    #[test]
    fn version_2_local_unspec_unix_and_udp_keep_the_connections_addresses() {
        // LOCAL, whatever its family says and however long its block (here none at all).
        assert_eq!(decode(&v2(0x20, 0x00, b"")), Ok(Some((ProxyHeader::Local, 16))));
        assert_eq!(decode(&v2(0x20, 0x11, b"")), Ok(Some((ProxyHeader::Local, 16))));
        assert_eq!(decode(&v2(0x20, 0x21, &[7; 40])), Ok(Some((ProxyHeader::Local, 56))));
        assert_eq!(decode(&v2(0x21, 0x00, b"")), Ok(Some((ProxyHeader::Unspecified, 16))));
        assert_eq!(decode(&v2(0x21, 0x00, &[1, 2, 3])), Ok(Some((ProxyHeader::Unspecified, 19))));
        assert_eq!(decode(&v2(0x21, 0x31, &[0; 216])), Ok(Some((ProxyHeader::Unspecified, 232))));
        assert_eq!(decode(&v2(0x21, 0x32, &[0; 216])), Ok(Some((ProxyHeader::Unspecified, 232))));
        assert_eq!(decode(&v2(0x21, 0x12, &[1; 12])), Ok(Some((ProxyHeader::Unspecified, 28))));
        assert_eq!(decode(&v2(0x21, 0x22, &[1; 36])), Ok(Some((ProxyHeader::Unspecified, 52))));
    }

    #[test]
    fn version_2_refusals() {
        assert_eq!(decode(&v2(0x11, 0x11, &[0; 12])), Err(ProxyError::V2UnsupportedVersion { version: 1 }));
        assert_eq!(decode(&v2(0x22, 0x11, &[0; 12])), Err(ProxyError::V2UnknownCommand { command: 2 }));
        for byte in [0x01, 0x10, 0x13, 0x30, 0x41] {
            assert_eq!(decode(&v2(0x21, byte, &[0; 12])), Err(ProxyError::V2UnknownFamily { byte }));
        }
        let short = v2(0x21, 0x21, &[0; 12]);
        assert_eq!(decode(&short), Err(ProxyError::V2AddressesTooShort { byte: 0x21, length: 12, needed: 36 }));
        assert_eq!(
            decode(&v2(0x21, 0x31, &[0; 215])[..40]),
            Err(ProxyError::V2AddressesTooShort { byte: 0x31, length: 215, needed: 216 })
        );
    }

    #[test]
    fn anything_else_is_missing_its_header() {
        let both = ProxyVersions::Both;
        assert_eq!(decode(b"GET / HTTP/1.1\r\n\r\n"), Err(ProxyError::Missing { accepted: both }));
        assert_eq!(decode(b"PROXX"), Err(ProxyError::Missing { accepted: both }));
        assert_eq!(decode(b"\r\n\r\n\0\r\nQUIT!"), Err(ProxyError::Missing { accepted: both }));
        assert_eq!(decode(b""), Ok(None));
        // A server that takes one version only refuses the other as it would any other bytes.
        let v1 = ProxyVersions::V1;
        let v2_only = ProxyVersions::V2;
        assert_eq!(decode_every_way(&v2(0x21, 0x00, b""), v1), Err(ProxyError::Missing { accepted: v1 }));
        assert_eq!(decode_every_way(b"PROXY UNKNOWN\r\n", v2_only), Err(ProxyError::Missing { accepted: v2_only }));
        assert_eq!(decode_every_way(b"PROXY UNKNOWN\r\n", v1), Ok(Some((ProxyHeader::Unspecified, 15))));
        assert_eq!(decode_every_way(&v2(0x20, 0x00, b""), v2_only), Ok(Some((ProxyHeader::Local, 16))));
    }

    #[test]
    fn errors_read_as_one_line() {
        let error = ProxyError::V2AddressesTooShort { byte: 0x21, length: 12, needed: 36 };
        assert_eq!(
            error.to_string(),
            "PROXY protocol header of family 0x21 with 12 bytes of addresses, fewer than its 36"
        );
        let missing = ProxyError::Missing { accepted: ProxyVersions::Both };
        assert_eq!(missing.to_string(), "the connection does not begin with a PROXY protocol header");
    }
}
