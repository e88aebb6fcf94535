//! Who a request comes from when a proxy stands in front (docs/PROXIES.md).
//!
//! The lobby owns this: it knows the connection's peer and has parsed the head, so it decides
//! once what the application sees as REMOTE_ADDR, REMOTE_PORT and `wsgi.url_scheme`, and the
//! access log writes the same address. From a peer outside `--forwarded-allow-ips` the
//! forwarded headers are not read at all: such a request costs one look at the allow list.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use ipnet::IpNet;

/// The peers trusted with something: `--forwarded-allow-ips`, `--proxy-allow-from`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AllowList {
    /// `*`: every peer.
    Any,
    Networks(Vec<IpNet>),
}

/// An entry of an allow list that is neither `*`, an address nor a network.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadAllowEntry(pub String);

impl fmt::Display for BadAllowEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} is neither an IP address, a network (CIDR) nor *", self.0)
    }
}

impl std::error::Error for BadAllowEntry {}

impl AllowList {
    /// Reads entries as the CLI checked them: `*`, addresses, networks (`10.0.0.0/8`).
    pub fn parse(entries: &[String]) -> Result<AllowList, BadAllowEntry> {
        if entries.iter().any(|entry| entry == "*") {
            return Ok(AllowList::Any);
        }
        entries
            .iter()
            .map(|entry| {
                entry
                    .parse::<IpNet>()
                    .or_else(|_| entry.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| BadAllowEntry(entry.clone()))
            })
            .collect::<Result<_, _>>()
            .map(AllowList::Networks)
    }

    pub fn allows(&self, ip: IpAddr) -> bool {
        match self {
            AllowList::Any => true,
            // A dual-stack listener sees an IPv4 client as ::ffff:a.b.c.d.
            AllowList::Networks(networks) => {
                let ip = ip.to_canonical();
                networks.iter().any(|network| network.contains(&ip))
            }
        }
    }
}

/// What the lobby reads from a trusted peer's headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forwarding {
    /// `--forwarded-allow-ips`.
    pub allow: AllowList,
    /// gunicorn's `secure_scheme_headers`: a header, and the value that means https (any
    /// other value means http). Names are compared without case, values exactly.
    pub secure_scheme_headers: Vec<(String, String)>,
}

/// The client as the application sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    /// REMOTE_ADDR; None for a Unix-socket peer that forwarded no address.
    pub ip: Option<IpAddr>,
    /// REMOTE_PORT, when known: forwarded addresses often come without one.
    pub port: Option<u16>,
    /// `wsgi.url_scheme` is https.
    pub https: bool,
    /// When the trusted proxy in front received the request (its `X-Request-Start`), if it said.
    pub upstream_start: Option<SystemTime>,
}

impl Origin {
    fn of(peer: Option<SocketAddr>) -> Origin {
        Origin {
            ip: peer.map(|addr| addr.ip()),
            port: peer.map(|addr| addr.port()),
            https: false,
            upstream_start: None,
        }
    }

    /// How long the request had already waited in front of this server when it arrived at
    /// `now`: zero unless a trusted proxy said when it received it (`X-Request-Start`). A start
    /// in the future (clocks that disagree) counts as none.
    pub fn upstream_wait(&self, now: SystemTime) -> Duration {
        self.upstream_start.and_then(|start| now.duration_since(start).ok()).unwrap_or_default()
    }

    /// REMOTE_ADDR's text: empty for a Unix socket.
    pub fn ip_text(&self) -> String {
        self.ip.map(|ip| ip.to_string()).unwrap_or_default()
    }
}

/// Why a trusted peer's request is refused (400).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContradictoryScheme {
    /// The header that said https, and the one that said http.
    pub https: String,
    pub http: String,
}

impl fmt::Display for ContradictoryScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "contradictory scheme headers: {} says https, {} says http", self.https, self.http)
    }
}

impl std::error::Error for ContradictoryScheme {}

/// One hop of the chain a header lists, right-most last: the address it names (None for
/// `unknown`, an obfuscated name or anything unreadable) and, for `Forwarded`, its `proto`.
struct Hop<'a> {
    node: Option<(IpAddr, Option<u16>)>,
    proto: Option<&'a [u8]>,
}

/// The client a request is answered for. `peer` is the connection's peer (or the client a
/// PROXY protocol header named). Only a peer in the allow list, or a Unix-socket peer (as
/// under gunicorn: only local processes can reach it), is trusted with its headers:
///
/// - the address is the right-most one of `X-Forwarded-For` (or, when the request has none,
///   of `Forwarded`'s `for=`) that is not itself in the allow list: each trusted proxy appends
///   the address it took the request from, so the walk from the right passes the trusted
///   proxies and stops at the first address that none of them is. An entry that is no address
///   (`unknown`, a hidden name) stops the walk at the last address before it. With `*`, the
///   left-most.
/// - the scheme is https when a `secure_scheme_headers` header has its https value (or the
///   `Forwarded` element the walk stopped at says `proto=https`), and http when one has any
///   other value; headers that disagree are refused.
pub fn origin(
    peer: Option<SocketAddr>,
    headers: &[(Bytes, Bytes)],
    forwarding: &Forwarding,
) -> Result<Origin, ContradictoryScheme> {
    let mut origin = Origin::of(peer);
    if !peer.is_none_or(|addr| forwarding.allow.allows(addr.ip())) {
        return Ok(origin);
    }
    let mut scheme = SchemeVotes::default();
    let mut forwarded_for = Vec::new();
    let mut forwarded = Vec::new();
    for (name, value) in headers {
        if name.eq_ignore_ascii_case(b"x-forwarded-for") {
            forwarded_for.push(value);
        } else if name.eq_ignore_ascii_case(b"forwarded") {
            forwarded.push(value);
        } else if name.eq_ignore_ascii_case(b"x-request-start") {
            origin.upstream_start = request_start(value);
        }
        let secure =
            forwarding.secure_scheme_headers.iter().find(|(secure, _)| name.eq_ignore_ascii_case(secure.as_bytes()));
        if let Some((_, https_value)) = secure {
            scheme.vote(name, value.as_ref() == https_value.as_bytes())?;
        }
    }
    let hops: Vec<Hop> = if !forwarded_for.is_empty() {
        forwarded_for
            .iter()
            .flat_map(|value| value.split(|&b| b == b','))
            .map(|entry| Hop { node: node(entry), proto: None })
            .collect()
    } else {
        forwarded.iter().flat_map(|value| value.split(|&b| b == b',')).map(forwarded_element).collect()
    };
    let mut proto = None;
    for hop in hops.iter().rev() {
        proto = hop.proto;
        let Some((ip, port)) = hop.node else { break };
        origin.ip = Some(ip);
        origin.port = port;
        if !forwarding.allow.allows(ip) {
            break;
        }
    }
    if let Some(proto) = proto {
        if proto.eq_ignore_ascii_case(b"https") {
            scheme.vote(b"Forwarded", true)?;
        } else if proto.eq_ignore_ascii_case(b"http") {
            scheme.vote(b"Forwarded", false)?;
        }
    }
    origin.https = scheme.first.is_some_and(|(_, https)| https);
    Ok(origin)
}

/// When the proxy in front received the request, from its `X-Request-Start`: a time since the
/// epoch, with or without `t=`, in seconds (nginx's `$msec`, `t=1732560000.123`), milliseconds
/// (Heroku's router), microseconds (Apache's `%t`) or nanoseconds, told apart by size. Anything
/// else, or a time before 2001, is no time at all.
fn request_start(value: &[u8]) -> Option<SystemTime> {
    let text = std::str::from_utf8(value).ok()?.trim();
    let number: f64 = text.strip_prefix("t=").unwrap_or(text).parse().ok()?;
    let seconds = match number {
        n if !n.is_finite() || n < 1e9 => return None,
        n if n < 1e11 => n,
        n if n < 1e14 => n / 1e3,
        n if n < 1e17 => n / 1e6,
        n => n / 1e9,
    };
    SystemTime::UNIX_EPOCH.checked_add(Duration::try_from_secs_f64(seconds).ok()?)
}

/// The headers that spoke on the scheme must agree.
#[derive(Default)]
struct SchemeVotes<'a> {
    /// The first header that spoke: its name and whether it said https.
    first: Option<(&'a [u8], bool)>,
}

impl<'a> SchemeVotes<'a> {
    fn vote(&mut self, name: &'a [u8], https: bool) -> Result<(), ContradictoryScheme> {
        match self.first {
            None => self.first = Some((name, https)),
            Some((first, said)) if said != https => {
                let text = |name: &[u8]| String::from_utf8_lossy(name).into_owned();
                let (https_header, http_header) = if said { (first, name) } else { (name, first) };
                return Err(ContradictoryScheme { https: text(https_header), http: text(http_header) });
            }
            Some(_) => {}
        }
        Ok(())
    }
}

/// One element of `Forwarded` (RFC 7239): `pair *( ";" pair )`, `pair = token "=" value`.
/// An element that does not read is a hop with no address. Elements are split at every comma
/// and pairs at every semicolon, quoted or not: `for` and `proto` never hold either, and a
/// client's unterminated quote then cannot swallow the elements the proxies appended after it.
fn forwarded_element(element: &[u8]) -> Hop<'_> {
    let mut hop = Hop { node: None, proto: None };
    let mut for_node = None;
    for pair in element.split(|&b| b == b';') {
        let pair = pair.trim_ascii();
        let Some(equals) = pair.iter().position(|&b| b == b'=') else { return Hop { node: None, proto: None } };
        let (name, value) = (&pair[..equals], &pair[equals + 1..]);
        let value = match value {
            [b'"', inner @ .., b'"'] => inner,
            _ => value,
        };
        if name.eq_ignore_ascii_case(b"for") {
            for_node = Some(node(value));
        } else if name.eq_ignore_ascii_case(b"proto") {
            hop.proto = Some(value);
        }
    }
    hop.node = for_node.flatten();
    hop
}

/// An address as proxies write it: `192.0.2.1`, `2001:db8::1`, `[2001:db8::1]`, with or
/// without a port (`192.0.2.1:4711`, `[2001:db8::1]:4711`).
fn node(text: &[u8]) -> Option<(IpAddr, Option<u16>)> {
    let text = std::str::from_utf8(text.trim_ascii()).ok()?;
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some((ip, None));
    }
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Some((addr.ip(), Some(addr.port())));
    }
    let ip = text.strip_prefix('[')?.strip_suffix(']')?.parse::<std::net::Ipv6Addr>().ok()?;
    Some((IpAddr::V6(ip), None))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forwarding(allow: &[&str]) -> Forwarding {
        Forwarding {
            allow: AllowList::parse(&allow.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap(),
            secure_scheme_headers: vec![
                ("X-FORWARDED-PROTOCOL".into(), "ssl".into()),
                ("X-FORWARDED-PROTO".into(), "https".into()),
                ("X-FORWARDED-SSL".into(), "on".into()),
            ],
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> Vec<(Bytes, Bytes)> {
        pairs
            .iter()
            .map(|(n, v)| (Bytes::copy_from_slice(n.as_bytes()), Bytes::copy_from_slice(v.as_bytes())))
            .collect()
    }

    fn from(peer: &str, pairs: &[(&str, &str)], allow: &[&str]) -> Result<Origin, ContradictoryScheme> {
        origin(Some(peer.parse().unwrap()), &headers(pairs), &forwarding(allow))
    }

    fn client(ip: &str, port: Option<u16>, https: bool) -> Result<Origin, ContradictoryScheme> {
        Ok(Origin { ip: Some(ip.parse().unwrap()), port, https, upstream_start: None })
    }

    const LOCAL: &[&str] = &["127.0.0.1", "::1"];

    #[test]
    fn allow_lists_take_addresses_networks_and_star() {
        let list = AllowList::parse(&["10.0.0.0/8".into(), "::1".into(), "192.0.2.7".into()]).unwrap();
        for yes in ["10.1.2.3", "::1", "192.0.2.7", "::ffff:10.0.0.1"] {
            assert!(list.allows(yes.parse().unwrap()), "{yes}");
        }
        for no in ["11.0.0.1", "192.0.2.8", "::2"] {
            assert!(!list.allows(no.parse().unwrap()), "{no}");
        }
        assert!(AllowList::parse(&["192.0.2.1".into(), "*".into()]).unwrap().allows("203.0.113.9".parse().unwrap()));
        assert_eq!(AllowList::parse(&["10.0.0.0/33".into()]), Err(BadAllowEntry("10.0.0.0/33".into())));
        assert_eq!(AllowList::parse(&[]), Ok(AllowList::Networks(vec![])));
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_says() {
        let said = [("X-Forwarded-For", "203.0.113.5"), ("X-Forwarded-Proto", "https"), ("Forwarded", "for=1.2.3.4")];
        assert_eq!(from("192.0.2.9:5000", &said, LOCAL), client("192.0.2.9", Some(5000), false));
        // Not even contradictions are looked at.
        let contradicting = [("X-Forwarded-Proto", "https"), ("X-Forwarded-Ssl", "off")];
        assert_eq!(from("192.0.2.9:5000", &contradicting, LOCAL), client("192.0.2.9", Some(5000), false));
    }

    #[test]
    fn x_forwarded_for_gives_the_right_most_untrusted_address() {
        let chain = [("X-Forwarded-For", "198.51.100.1, 203.0.113.5, 10.0.0.2"), ("X-Forwarded-For", "10.0.0.3")];
        let allow = &["127.0.0.1", "10.0.0.0/8"];
        assert_eq!(from("127.0.0.1:40000", &chain, allow), client("203.0.113.5", None, false));
        assert_eq!(from("127.0.0.1:40000", &chain, &["*"]), client("198.51.100.1", None, false));
        // Every address trusted: the left-most.
        assert_eq!(
            from("127.0.0.1:1", &[("X-Forwarded-For", "10.9.9.9,10.0.0.1")], allow),
            client("10.9.9.9", None, false)
        );
        // Ports and brackets, as some proxies write them.
        assert_eq!(
            from("127.0.0.1:1", &[("X-Forwarded-For", "203.0.113.5:4711")], LOCAL),
            client("203.0.113.5", Some(4711), false)
        );
        assert_eq!(
            from("127.0.0.1:1", &[("X-Forwarded-For", "[2001:db8::5]:80")], LOCAL),
            client("2001:db8::5", Some(80), false)
        );
        assert_eq!(
            from("127.0.0.1:1", &[("X-Forwarded-For", " 2001:db8::5 ")], LOCAL),
            client("2001:db8::5", None, false)
        );
    }

    #[test]
    fn an_entry_that_is_no_address_ends_the_walk_at_the_last_address() {
        let allow = &["127.0.0.1", "10.0.0.0/8"];
        assert_eq!(
            from("127.0.0.1:1", &[("X-Forwarded-For", "unknown, 10.0.0.2")], allow),
            client("10.0.0.2", None, false)
        );
        assert_eq!(from("127.0.0.1:9", &[("X-Forwarded-For", "garbage")], allow), client("127.0.0.1", Some(9), false));
        assert_eq!(from("127.0.0.1:9", &[("X-Forwarded-For", "")], allow), client("127.0.0.1", Some(9), false));
    }

    #[test]
    fn forwarded_gives_the_address_and_proto_when_there_is_no_x_forwarded_for() {
        let chain = [(
            "Forwarded",
            "for=198.51.100.1;proto=http, for=\"[2001:db8::7]:4711\";proto=https;by=10.0.0.1, for=10.0.0.2",
        )];
        let allow = &["127.0.0.1", "10.0.0.0/8"];
        assert_eq!(from("127.0.0.1:1", &chain, allow), client("2001:db8::7", Some(4711), true));
        assert_eq!(
            from("127.0.0.1:1", &[("Forwarded", "For=\"203.0.113.5\";Proto=HTTP")], allow),
            client("203.0.113.5", None, false)
        );
        // An obfuscated node ends the walk; its element's proto still counts.
        assert_eq!(
            from("127.0.0.1:1", &[("Forwarded", "for=_hidden;proto=https, for=10.0.0.2")], allow),
            client("10.0.0.2", None, true)
        );
        // A client's unterminated quote does not swallow what the proxy appended.
        assert_eq!(
            from("127.0.0.1:1", &[("Forwarded", "for=\"1.2.3.4, for=203.0.113.5")], allow),
            client("203.0.113.5", None, false)
        );
        // With X-Forwarded-For there too, Forwarded is not read at all.
        let both = [("Forwarded", "for=198.51.100.1;proto=https"), ("X-Forwarded-For", "203.0.113.5")];
        assert_eq!(from("127.0.0.1:1", &both, allow), client("203.0.113.5", None, false));
    }

    #[test]
    fn secure_scheme_headers_set_the_scheme_and_must_agree() {
        assert_eq!(from("127.0.0.1:7", &[("X-Forwarded-Proto", "https")], LOCAL), client("127.0.0.1", Some(7), true));
        assert_eq!(
            from("127.0.0.1:7", &[("x-forwarded-ssl", "on"), ("X-Forwarded-Protocol", "ssl")], LOCAL),
            client("127.0.0.1", Some(7), true)
        );
        // Values are compared exactly, as gunicorn does.
        assert_eq!(from("127.0.0.1:7", &[("X-Forwarded-Proto", "HTTPS")], LOCAL), client("127.0.0.1", Some(7), false));
        let refused = |pairs: &[(&str, &str)]| from("127.0.0.1:7", pairs, LOCAL).unwrap_err().to_string();
        assert_eq!(
            refused(&[("X-Forwarded-Proto", "http"), ("X-Forwarded-Ssl", "on")]),
            "contradictory scheme headers: X-Forwarded-Ssl says https, X-Forwarded-Proto says http"
        );
        assert_eq!(
            refused(&[("X-Forwarded-Proto", "https"), ("X-Forwarded-Proto", "http")]),
            "contradictory scheme headers: X-Forwarded-Proto says https, X-Forwarded-Proto says http"
        );
        assert_eq!(
            refused(&[("X-Forwarded-Proto", "http"), ("Forwarded", "for=203.0.113.5;proto=https")]),
            "contradictory scheme headers: Forwarded says https, X-Forwarded-Proto says http"
        );
        // No secure_scheme_headers: those headers say nothing.
        let none = Forwarding { secure_scheme_headers: vec![], ..forwarding(LOCAL) };
        let plain = origin(Some("127.0.0.1:7".parse().unwrap()), &headers(&[("X-Forwarded-Proto", "https")]), &none);
        assert_eq!(plain, client("127.0.0.1", Some(7), false));
    }

    #[test]
    fn a_unix_socket_peer_is_trusted_as_under_gunicorn() {
        let said = headers(&[("X-Forwarded-For", "203.0.113.5"), ("X-Forwarded-Proto", "https")]);
        assert_eq!(origin(None, &said, &forwarding(&[])), client("203.0.113.5", None, true));
        assert_eq!(
            origin(None, &[], &forwarding(&[])),
            Ok(Origin { ip: None, port: None, https: false, upstream_start: None })
        );
    }

    #[test]
    fn x_request_start_is_read_in_any_unit_and_only_from_a_trusted_peer() {
        let at = |seconds: f64| Some(SystemTime::UNIX_EPOCH + Duration::from_secs_f64(seconds));
        for (value, seconds) in [
            ("t=1732560000.123", 1_732_560_000.123),
            ("1732560000123", 1_732_560_000.123),
            ("t=1732560000123456", 1_732_560_000.123_456),
            ("t=1732560000123456789", 1_732_560_000.123_456),
        ] {
            let start = request_start(value.as_bytes()).unwrap();
            let expected = at(seconds).unwrap();
            let gap = start.duration_since(expected).unwrap_or_else(|e| e.duration());
            assert!(gap < Duration::from_micros(1), "{value}: {start:?} against {expected:?}");
        }
        for bad in ["", "t=", "soon", "t=-5", "t=12", "t=NaN", "t=inf"] {
            assert_eq!(request_start(bad.as_bytes()), None, "{bad}");
        }
        let start = [("X-Request-Start", "t=1732560000.5")];
        let trusted = from("127.0.0.1:1", &start, LOCAL).unwrap();
        assert_eq!(trusted.upstream_start, at(1_732_560_000.5));
        assert_eq!(trusted.upstream_wait(at(1_732_560_001.75).unwrap()), Duration::from_millis(1250));
        assert_eq!(trusted.upstream_wait(at(1_732_559_999.0).unwrap()), Duration::ZERO);
        let stranger = from("203.0.113.9:1", &start, LOCAL).unwrap();
        assert_eq!(stranger.upstream_start, None);
    }
}
