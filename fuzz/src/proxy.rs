//! `proxy_header`: the PROXY protocol header decoder (crates/protocol/src/proxy.rs), fed any
//! bytes as the start of a connection, under each of the three `--proxy-protocol` modes.
//!
//! The decoder keeps no state: the lobby calls it again on its buffer after each read. So the
//! properties are about prefixes: fed byte by byte (every prefix) or in reads of random sizes,
//! the first answer that is not "more" is the whole input's answer; a header's length is within
//! the input; an error prints on one line; and a header naming a client, written again in its
//! version's canonical form, decodes to the same.

use std::net::SocketAddr;

use maitred_protocol::{decode_proxy_header, ProxyHeader, ProxyVersions, V2_SIGNATURE};

use crate::{pieces, Input};

type Answer = Result<Option<(ProxyHeader, usize)>, maitred_protocol::ProxyError>;

/// The first answer, along growing prefixes ending at `ends`, that is not "more".
fn fed(data: &[u8], versions: ProxyVersions, ends: impl Iterator<Item = usize>) -> Answer {
    ends.map(|end| decode_proxy_header(&data[..end], versions)).find(|answer| *answer != Ok(None)).unwrap_or(Ok(None))
}

/// The fuzz target: a byte choosing the versions taken, two bytes seeding the read sizes, then
/// the connection's first bytes.
pub fn proxy_header(data: &[u8]) {
    let mut input = Input::new(data);
    let versions = match input.byte() % 3 {
        0 => ProxyVersions::Both,
        1 => ProxyVersions::V1,
        _ => ProxyVersions::V2,
    };
    let seed = input.u16();
    let data = input.data();
    let whole = decode_proxy_header(data, versions);
    let shown = data.escape_ascii().to_string();
    assert_eq!(fed(data, versions, 0..=data.len()), whole, "byte by byte vs whole: {shown:?}");
    let reads = pieces(data, seed);
    let ends = reads.iter().scan(0, |end, piece| {
        *end += piece.len();
        Some(*end)
    });
    assert_eq!(fed(data, versions, ends), whole, "in reads vs whole: {shown:?}");
    match whole {
        Ok(Some((header, len))) => {
            assert!(len <= data.len() && len >= 15, "a header of {len} bytes in {} bytes", data.len());
            if let ProxyHeader::Proxied { client, server } = header {
                let again = if data.starts_with(V2_SIGNATURE) { v2(client, server) } else { v1(client, server) };
                assert_eq!(
                    decode_proxy_header(&again, versions),
                    Ok(Some((header, again.len()))),
                    "written again: {:?}",
                    again.escape_ascii().to_string()
                );
            }
        }
        Ok(None) => assert!(data.len() < 16 + usize::from(u16::MAX), "{} bytes and still no header", data.len()),
        Err(error) => assert!(!error.to_string().contains('\n'), "{error:?} prints on more than one line"),
    }
}

fn v1(client: SocketAddr, server: SocketAddr) -> Vec<u8> {
    let protocol = if client.is_ipv4() { "TCP4" } else { "TCP6" };
    format!("PROXY {protocol} {} {} {} {}\r\n", client.ip(), server.ip(), client.port(), server.port()).into_bytes()
}

fn v2(client: SocketAddr, server: SocketAddr) -> Vec<u8> {
    let mut out = V2_SIGNATURE.to_vec();
    let addresses = match (client, server) {
        (SocketAddr::V4(c), SocketAddr::V4(s)) => {
            out.extend_from_slice(&[0x21, 0x11, 0, 12]);
            [c.ip().octets().as_slice(), &s.ip().octets()].concat()
        }
        (SocketAddr::V6(c), SocketAddr::V6(s)) => {
            out.extend_from_slice(&[0x21, 0x21, 0, 36]);
            [c.ip().octets().as_slice(), &s.ip().octets()].concat()
        }
        _ => panic!("a header naming a client and a server of different families: {client} {server}"),
    };
    out.extend_from_slice(&addresses);
    out.extend_from_slice(&client.port().to_be_bytes());
    out.extend_from_slice(&server.port().to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_of_both_versions_pass() {
        proxy_header(b"\x00\x07\x00PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\nGET / HTTP/1.1\r\n");
        proxy_header(&[&[2u8, 1, 0][..], &v2("[::1]:1".parse().unwrap(), "[::2]:2".parse().unwrap()), b"GET"].concat());
        proxy_header(b"\x01\x00\x00GET / HTTP/1.1\r\n\r\n");
    }
}
