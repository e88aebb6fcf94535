//! gunicorn's request corpus (tests/requests/{valid,invalid}): every valid request must
//! decode to what its `.py` file says, every invalid one must be refused.
//!
//! Where maitred deliberately differs, the case is in an allowlist below with the reason,
//! and in docs/CONFORMANCE.md. An allowlisted case that starts to pass fails the test too,
//! so the list cannot go stale.
//!
//! gunicorn does not require Host in HTTP/1.1 requests; RFC 9112 §3.2 does, and so does
//! maitred. A case refused only for that is decoded again with a Host field added to each
//! HTTP/1.1 request that lacks one: a valid case must then decode exactly (the added field
//! aside), an invalid one must still be refused, for its real defect. Those are counted
//! as one documented class, not allowlisted one by one.

#[path = "support/pyval.rs"]
mod pyval;
mod support;

use std::fs;
use std::path::Path;

use maitred_protocol::{Limits, RequestError, Version};
use pyval::{parse_module, Value};
use support::{corpus, decode_adding_hosts, is_added_host, run, show, Decoding, Run};

/// Valid gunicorn cases that maitred refuses or reads differently, and why.
const VALID_DIFFERENCES: &[(&str, &str)] = &[
    ("009", "Content-Length with Transfer-Encoding (identity) is refused: RFC 9112 §6.1 allows it, and it is the classic smuggling vector"),
    ("025", "transfer codings other than chunked (gzip) are not supported: 501"),
    ("025_line", "transfer codings other than chunked (gzip) are not supported: 501"),
    ("027", "raw non-ASCII bytes in the request target are refused (RFC 9112 §3.2, RFC 3986: percent-encode them)"),
    ("028", "whitespace before a field's colon is refused (RFC 9112 §5.1 MUST); gunicorn accepts it only with strip_header_spaces"),
    ("029", "'identity' is not a transfer coding since RFC 7230: 501"),
    ("030", "'identity' is not a transfer coding since RFC 7230: 501"),
    ("031compat", "methods are case-sensitive (RFC 9110 §9.1); gunicorn upper-cases them only with casefold_http_method"),
    ("040", "field names with '_' are passed on as received (valid tokens); gunicorn's default header_map drops them, which is the WSGI environ builder's job"),
    ("099", "the file holds 8599 body bytes for Content-Length: 17914; a body cut short by the end of input is an incomplete request"),
    ("compat_obs_fold", "obsolete line folding is refused (RFC 9112 §5.2 allows a server to); gunicorn accepts it only with permit_obsolete_folding"),
    ("compat_obs_fold_huge", "obsolete line folding is refused (RFC 9112 §5.2 allows a server to); gunicorn accepts it only with permit_obsolete_folding"),
    ("pp_01", "the PROXY protocol is not supported (gunicorn's proxy_protocol setting)"),
    ("pp_02", "the PROXY protocol is not supported (gunicorn's proxy_protocol setting)"),
    ("pp_04", "the PROXY protocol is not supported (gunicorn's proxy_protocol setting)"),
    ("pp_05", "the PROXY protocol is not supported (gunicorn's proxy_protocol setting)"),
    ("rfc9112_smuggle_gzip_chunked_01", "transfer codings other than chunked (gzip) are not supported: 501"),
    ("rfc9112_smuggle_te_identity_chunked_01", "'identity' is not a transfer coding since RFC 7230: 501"),
    ("rfc9112_target_authority_connect_01", "CONNECT (tunnels) is not supported: 501"),
    ("rfc9112_target_authority_ipv6_01", "CONNECT (tunnels) is not supported: 501"),
];

/// Invalid gunicorn cases that maitred accepts, and why.
const INVALID_DIFFERENCES: &[(&str, &str)] = &[
    ("003c", "any token is a method (RFC 9110 §9.1), '-bl' included; gunicorn insists on upper case"),
    ("006", "its 4112-byte request line is within maitred's default limit of 8190 bytes (RFC 9112 §3 recommends at least 8000); gunicorn's default is 4094"),
    ("019", "X-Forwarded-Proto/X-Forwarded-Ssl disagreeing is a forwarded_allow_ips policy, not a parsing matter"),
    ("040", "field names with '_' are valid tokens, passed on as received; gunicorn refuses them only with header_map=refuse"),
    ("chunked_07", "field names with '_' are valid tokens, passed on as received; gunicorn refuses them only with header_map=refuse"),
    ("limit_header_default_01", "a limit of 0 means no limit (bounded by the 64 KiB head ceiling), as gunicorn documented it; gunicorn now reads 0 as 8190 for this setting"),
];

struct Case {
    name: String,
    input: Vec<u8>,
    module: pyval::Module,
    limits: Limits,
}

/// The corpus's cases of one kind.
fn cases(kind: &str) -> Vec<Case> {
    let dir = corpus("gunicorn").join("tests/requests").join(kind);
    let mut names: Vec<String> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").file_name().to_string_lossy().into_owned())
        .filter_map(|name| name.strip_suffix(".http").map(str::to_owned))
        .collect();
    names.sort();
    assert!(!names.is_empty(), "no .http files in {}", dir.display());
    names.into_iter().map(|name| load(&dir, name)).collect()
}

fn load(dir: &Path, name: String) -> Case {
    let raw = fs::read(dir.join(format!("{name}.http"))).expect("read .http");
    let input = decode_http(&raw).unwrap_or_else(|e| panic!("{name}.http: {e}"));
    let source = fs::read_to_string(dir.join(format!("{name}.py"))).expect("read .py");
    let module = parse_module(&source).unwrap_or_else(|e| panic!("{name}.py: {e}"));
    let mut limits = Limits::default();
    for (target, args) in &module.calls {
        let [Value::Str(setting), value] = args.as_slice() else { continue };
        if !target.ends_with(".set") {
            continue;
        }
        let number = || match value {
            Value::Int(n) => usize::try_from(*n).expect("a size"),
            other => panic!("{name}.py: {setting} = {other:?}"),
        };
        match setting.as_str() {
            "limit_request_line" => limits.max_request_line = number(),
            "limit_request_field_size" => limits.max_header_size = number(),
            "limit_request_fields" => limits.max_headers = number(),
            // Other settings turn on leniencies maitred does not have; the allowlists say so
            // where it changes the outcome.
            _ => {}
        }
    }
    Case { name, input, module, limits }
}

/// The `.http` encoding of gunicorn's test harness: literal newlines are dropped, then the
/// escapes `\r`, `\n`, `\t`, `\0` and `\xHH` stand for their bytes.
fn decode_http(raw: &[u8]) -> Result<Vec<u8>, String> {
    let text: Vec<u8> = raw.iter().copied().filter(|&b| b != b'\n').collect();
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text[i] != b'\\' {
            out.push(text[i]);
            i += 1;
            continue;
        }
        let (byte, len) = match text.get(i + 1) {
            Some(b'r') => (b'\r', 2),
            Some(b'n') => (b'\n', 2),
            Some(b't') => (b'\t', 2),
            Some(b'0') => (0, 2),
            Some(b'x') => {
                let hex = text.get(i + 2..i + 4).ok_or("short \\x escape")?;
                let hex = std::str::from_utf8(hex).map_err(|e| e.to_string())?;
                (u8::from_str_radix(hex, 16).map_err(|e| format!("bad \\x{hex}: {e}"))?, 4)
            }
            other => return Err(format!("unknown escape \\{:?}", other.map(|&b| b as char))),
        };
        out.push(byte);
        i += len;
    }
    Ok(out)
}

fn expected_requests(case: &Case) -> Vec<&Value> {
    match &case.module.vars["request"] {
        Value::List(items) => items.iter().collect(),
        single @ Value::Dict(_) => vec![single],
        other => panic!("{}: request = {other:?}", case.name),
    }
}

fn decode(case: &Case) -> Result<Decoding, String> {
    decode_adding_hosts(&case.limits, &case.input)
}

fn check_valid(case: &Case) -> Result<String, String> {
    let decoding = decode(case)?;
    compare(case, &decoding.run, &decoding.finish)?;
    Ok(match decoding.hosts_added {
        0 => "ok".into(),
        _ => "ok once given the Host field RFC 9112 requires".into(),
    })
}

fn compare(case: &Case, run: &Run, finish: &Result<(), RequestError>) -> Result<(), String> {
    if let Some(error) = run.error_at_eof(finish) {
        return Err(format!("refused with {} {error}", error.status()));
    }
    let expected = expected_requests(case);
    if run.requests.len() != expected.len() {
        return Err(format!("decoded {} requests, expected {}", run.requests.len(), expected.len()));
    }
    for (i, (ours, theirs)) in run.requests.iter().zip(expected).enumerate() {
        let what = |field: &str| format!("request {i}: {field}");
        let bytes = |key: &str| theirs.get(key).unwrap_or_else(|| panic!("{}: no {key}", case.name)).as_bytes();
        if !ours.complete {
            return Err(what("incomplete"));
        }
        if ours.head.method != bytes("method")? {
            return Err(what(&format!("method {}", show(&ours.head.method))));
        }
        if ours.head.target != bytes("uri")? {
            return Err(what(&format!("target {}", show(&ours.head.target))));
        }
        let version = match theirs.get("version") {
            Some(Value::Tuple(v)) if v == &[Value::Int(1), Value::Int(0)] => Version::Http10,
            Some(Value::Tuple(v)) if v == &[Value::Int(1), Value::Int(1)] => Version::Http11,
            other => panic!("{}: version {other:?}", case.name),
        };
        if ours.head.version != version {
            return Err(what(&format!("version {:?}", ours.head.version)));
        }
        let our_headers: Fields = ours
            .head
            .headers
            .iter()
            .filter(|(name, value)| !is_added_host(name, value))
            .map(|(name, value)| (name.to_ascii_uppercase(), value.to_vec()))
            .collect();
        if our_headers != fields(theirs.get("headers"))? {
            return Err(what(&format!("headers {our_headers:?}")));
        }
        if ours.body != bytes("body")? {
            return Err(what(&format!("body {}", show(&ours.body))));
        }
        let our_trailers: Fields =
            ours.trailers.iter().map(|(name, value)| (name.to_ascii_uppercase(), value.to_vec())).collect();
        if our_trailers != fields(theirs.get("trailers"))? {
            return Err(what(&format!("trailers {our_trailers:?}")));
        }
    }
    Ok(())
}

/// Field lines as (upper-cased name, value) pairs, the way gunicorn's cases list them.
type Fields = Vec<(Vec<u8>, Vec<u8>)>;

fn fields(value: Option<&Value>) -> Result<Fields, String> {
    let Some(Value::List(items)) = value else {
        return match value {
            None => Ok(Vec::new()),
            Some(other) => Err(format!("fields: {other:?}")),
        };
    };
    items
        .iter()
        .map(|item| match item {
            Value::Tuple(pair) if pair.len() == 2 => Ok((pair[0].as_bytes()?, pair[1].as_bytes()?)),
            other => Err(format!("field {other:?}")),
        })
        .collect()
}

fn check_invalid(case: &Case) -> Result<String, String> {
    let decoding = decode(case)?;
    let exception = match &case.module.vars["request"] {
        Value::Name(name) => name.clone(),
        other => panic!("{}: request = {other:?}", case.name),
    };
    let given_host = if decoding.hosts_added > 0 { " (once given a Host)" } else { "" };
    match decoding.run.error_at_eof(&decoding.finish) {
        Some(error) if (400..600).contains(&error.status()) => {
            Ok(format!("{exception} -> {} {error}{given_host}", error.status()))
        }
        Some(error) => Err(format!("{exception}: refused with status {}", error.status())),
        None => Err(format!("{exception}: accepted {} requests{given_host}", decoding.run.requests.len())),
    }
}

/// Checks every case against the allowlist; panics with every problem at once.
fn judge(kind: &str, results: Vec<(String, Result<String, String>)>, allowlist: &[(&str, &str)], verdict: &str) {
    let mut problems = Vec::new();
    let mut passed = 0;
    let mut documented = 0;
    for (name, result) in &results {
        let listed = allowlist.iter().find(|(case, _)| case == name);
        match (result, listed) {
            (Ok(_), None) => passed += 1,
            (Err(_), Some(_)) => documented += 1,
            (Ok(note), Some((_, reason))) => {
                problems.push(format!("{name}: passes now ({note}) but is allowlisted: {reason}"))
            }
            (Err(e), None) => problems.push(format!("{name}: {e}")),
        }
    }
    for (case, _) in allowlist {
        if !results.iter().any(|(name, _)| name == case) {
            problems.push(format!("{case}: allowlisted but not in the corpus"));
        }
    }
    println!("gunicorn {kind}: {passed}/{} {verdict}, {documented} documented differences", results.len());
    for (name, result) in &results {
        match result {
            Ok(note) => println!("  {name}: {note}"),
            Err(e) => println!("  {name}: differs: {}", e.lines().next().unwrap_or("")),
        }
    }
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
}

#[test]
fn gunicorn_corpus_valid_requests_decode_as_expected() {
    let cases = cases("valid");
    let results: Vec<(String, Result<String, String>)> =
        cases.iter().map(|case| (case.name.clone(), check_valid(case))).collect();
    let with_host = results.iter().filter(|(_, r)| r.as_ref().is_ok_and(|note| note.contains("once given"))).count();
    let extra = format!("decoded as expected ({with_host} of them once given the Host field RFC 9112 requires)");
    judge("valid", results, VALID_DIFFERENCES, &extra);
}

#[test]
fn gunicorn_corpus_invalid_requests_are_refused() {
    let cases = cases("invalid");
    let results: Vec<(String, Result<String, String>)> =
        cases.iter().map(|case| (case.name.clone(), check_invalid(case))).collect();
    let with_host = results.iter().filter(|(_, r)| r.as_ref().is_ok_and(|note| note.contains("once given"))).count();
    let extra = format!("refused as expected ({with_host} of them once given the Host field RFC 9112 requires)");
    judge("invalid", results, INVALID_DIFFERENCES, &extra);
}

#[test]
fn http_encoding() {
    assert_eq!(
        decode_http(b"GET / HTTP/1.1\\r\\n\nA: \\x41\\t\\0\n\\r\\n\n").unwrap(),
        b"GET / HTTP/1.1\r\nA: A\t\0\r\n"
    );
    assert!(decode_http(b"\\q").is_err());
    // run() is also what the unit tests use; make sure the corpus runner agrees with it.
    let (run, finish) = run(&Limits::default(), [&b"GET / HTTP/1.0\r\n\r\n"[..]]);
    assert_eq!(run.complete_requests(), 1);
    assert!(finish.is_ok());
}
