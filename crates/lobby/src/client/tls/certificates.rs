//! The TLS listeners' certificate and rules (docs/TLS.md): `--certfile` and `--keyfile` read
//! into a rustls configuration, TLS 1.2 and 1.3 only, ALPN `h2` and `http/1.1`, session tickets on,
//! `--ciphers` and client certificates (`--ca-certs`, `--cert-reqs`). A SIGHUP reads the
//! files again; new handshakes use what it read, open connections keep theirs. A leaf: it
//! imports nothing of the lobby's.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::{ring, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ProducesTickets, StoresServerSessions, WebPkiClientVerifier};
use rustls::{RootCertStore, ServerConfig};

/// Sessions remembered for TLS 1.2 clients that resume by session id (tickets need none).
const SESSION_CACHE: usize = 4096;

/// TLS on the listeners (docs/TLS.md): the certificate and key every TLS listener presents,
/// and what it asks of clients.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsSettings {
    /// PEM: the server's certificate first, then its chain.
    pub certfile: PathBuf,
    /// PEM: the private key of the certificate (PKCS#8, PKCS#1 or SEC1).
    pub keyfile: PathBuf,
    /// PEM: the certificates of the authorities that sign client certificates.
    pub ca_certs: Option<PathBuf>,
    pub cert_reqs: CertReqs,
    /// The cipher suites allowed, by their IANA names as rustls spells them (the CLI maps
    /// OpenSSL's names onto these); empty: every suite rustls offers.
    pub ciphers: Vec<String>,
}

/// `--cert-reqs`: whether a client must present a certificate, as Python's ssl names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CertReqs {
    /// No certificate is asked for.
    None,
    /// One is asked for; a client without one is served, one with a bad one is refused.
    Optional,
    /// A client without a valid certificate is refused at the handshake.
    Required,
}

/// The configuration every new handshake uses, replaced whole by a reload.
pub struct Certificates {
    settings: TlsSettings,
    /// The protocols offered by ALPN, in the server's order of preference.
    alpn: Vec<Vec<u8>>,
    current: RefCell<Arc<ServerConfig>>,
    /// Kept across reloads, so that a client resumes with a ticket or a session id issued
    /// before the certificate was renewed.
    ticketer: Arc<dyn ProducesTickets>,
    sessions: Arc<dyn StoresServerSessions + Send + Sync>,
}

impl Certificates {
    /// Reads the files; Err is one line naming the file and what is wrong with it. The
    /// handshake offers h2 and http/1.1 by ALPN, as `--http-protocols` allows (docs/HTTP2.md).
    pub fn load(settings: &TlsSettings, http1: bool, http2: bool) -> Result<Certificates, String> {
        let ticketer = ring::Ticketer::new().map_err(|e| format!("cannot make a session ticket key: {e}"))?;
        let sessions: Arc<dyn StoresServerSessions + Send + Sync> =
            rustls::server::ServerSessionMemoryCache::new(SESSION_CACHE);
        // h2 first: a client that speaks both gets HTTP/2 (RFC 7301 leaves the choice to the
        // server, and rustls takes the server's order).
        let mut alpn = Vec::new();
        if http2 {
            alpn.push(b"h2".to_vec());
        }
        if http1 {
            alpn.push(b"http/1.1".to_vec());
        }
        let config = server_config(settings, &alpn, &ticketer, &sessions)?;
        Ok(Certificates { settings: settings.clone(), alpn, current: RefCell::new(config), ticketer, sessions })
    }

    /// The configuration for a handshake starting now.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.current.borrow().clone()
    }

    /// Reads the files again. On Err (one line: why) the configuration in force stays.
    pub fn reload(&self) -> Result<(), String> {
        let config = server_config(&self.settings, &self.alpn, &self.ticketer, &self.sessions)?;
        *self.current.borrow_mut() = config;
        Ok(())
    }

    pub fn certfile(&self) -> &Path {
        &self.settings.certfile
    }
}

fn server_config(
    settings: &TlsSettings,
    alpn: &[Vec<u8>],
    ticketer: &Arc<dyn ProducesTickets>,
    sessions: &Arc<dyn StoresServerSessions + Send + Sync>,
) -> Result<Arc<ServerConfig>, String> {
    let certfile = settings.certfile.display();
    let chain = CertificateDer::pem_file_iter(&settings.certfile)
        .and_then(|certificates| certificates.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot read the certificates in {certfile} (--certfile): {e}"))?;
    if chain.is_empty() {
        return Err(format!("{certfile} (--certfile) holds no PEM certificate"));
    }
    let keyfile = settings.keyfile.display();
    let key = PrivateKeyDer::from_pem_file(&settings.keyfile)
        .map_err(|e| format!("cannot read a private key in {keyfile} (--keyfile): {e}"))?;
    let provider = Arc::new(provider(&settings.ciphers)?);
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| format!("--ciphers leaves no suite for TLS 1.2 or 1.3: {e}"))?;
    let builder = match (settings.cert_reqs, &settings.ca_certs) {
        (CertReqs::None, _) => builder.with_no_client_auth(),
        (_, None) => return Err("--cert-reqs optional or required needs --ca-certs".into()),
        (reqs, Some(ca_certs)) => {
            let mut roots = RootCertStore::empty();
            let authorities = CertificateDer::pem_file_iter(ca_certs)
                .and_then(|certificates| certificates.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("cannot read the certificates in {} (--ca-certs): {e}", ca_certs.display()))?;
            let (added, _) = roots.add_parsable_certificates(authorities);
            if added == 0 {
                return Err(format!("{} (--ca-certs) holds no usable CA certificate", ca_certs.display()));
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if reqs == CertReqs::Optional { verifier.allow_unauthenticated() } else { verifier };
            let verifier = verifier.build().map_err(|e| format!("--ca-certs {}: {e}", ca_certs.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("the key in {keyfile} (--keyfile) does not go with the certificate in {certfile}: {e}"))?;
    // A client that offers only protocols left out of --http-protocols is refused at the
    // handshake (no_application_protocol); one that offers none gets what is on.
    config.alpn_protocols = alpn.to_vec();
    // The server's order (rustls's: AES-256-GCM, AES-128-GCM, then ChaCha20): every suite
    // offered is strong, but scanners (testssl.sh) count a server without an order as a finding.
    config.ignore_client_order = true;
    config.ticketer = ticketer.clone();
    config.session_storage = sessions.clone();
    Ok(Arc::new(config))
}

/// ring's provider with the suites `--ciphers` allows (all when empty). The CLI has checked
/// the names; an unknown one here is still refused, naming it.
fn provider(ciphers: &[String]) -> Result<CryptoProvider, String> {
    let mut provider = ring::default_provider();
    if ciphers.is_empty() {
        return Ok(provider);
    }
    let mut suites = Vec::with_capacity(ciphers.len());
    for name in ciphers {
        let suite = provider
            .cipher_suites
            .iter()
            .find(|suite| suite.suite().as_str() == Some(name.as_str()))
            .ok_or_else(|| format!("--ciphers: rustls does not support {name}"))?;
        suites.push(*suite);
    }
    provider.cipher_suites = suites;
    Ok(provider)
}

/// The subject of a certificate as RFC 4514 writes a distinguished name (`CN=alice,O=Example`,
/// the last RDN first), as Apache's and nginx's SSL_CLIENT_S_DN; None if it does not parse.
pub fn subject_of(certificate: &[u8]) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(certificate).ok()?;
    let registry = x509_parser::objects::oid_registry();
    let mut text = String::new();
    let rdns: Vec<_> = parsed.subject().iter_rdn().collect();
    for rdn in rdns.into_iter().rev() {
        if !text.is_empty() {
            text.push(',');
        }
        for (n, attribute) in rdn.iter().enumerate() {
            if n > 0 {
                text.push('+');
            }
            match x509_parser::objects::oid2abbrev(attribute.attr_type(), registry) {
                Ok(name) => text.push_str(name),
                Err(_) => text.push_str(&attribute.attr_type().to_id_string()),
            }
            text.push('=');
            escape_value(&mut text, attribute.as_str().ok()?);
        }
    }
    Some(text)
}

/// RFC 4514, 2.4: the characters a value escapes with a backslash.
fn escape_value(out: &mut String, value: &str) {
    for (n, c) in value.chars().enumerate() {
        let edge = (n == 0 && (c == ' ' || c == '#')) || (n + 1 == value.chars().count() && c == ' ');
        if edge || matches!(c, '"' | '+' | ',' | ';' | '<' | '>' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_escape_what_rfc_4514_says() {
        let mut out = String::new();
        escape_value(&mut out, " a,b+c\\ ");
        assert_eq!(out, "\\ a\\,b\\+c\\\\\\ ");
    }
}
