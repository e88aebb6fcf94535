//! The ASGI scope of one HTTP request or WebSocket (the ASGI HTTP and WebSocket spec, version
//! 2.5), built from a decoded `REQUEST` frame, as `environ` builds the WSGI environ. Each key is
//! the specification's, with uvicorn's types where it leaves the choice (tuples for `client` and
//! `server`, lists for `headers` and `subprotocols`): tests/test_asgi_conformance.py holds them.
//!
//! The lobby has checked the request strictly; this module only translates. Names and values
//! stay bytes, as ASGI wants them; header names are lowercased.
//!
//! Imports `environ` of this crate, for the request-target's parts.

use maitred_wire::Request;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use crate::environ::{percent_decode, split_target};

/// ASGI's version as every scope says it; `maitred.lifespan` takes it from here.
pub const ASGI_VERSION: &str = "3.0";
/// The HTTP and WebSocket specification's version that maitred implements whole: 2.4's
/// `OSError` from a `send` after the client left, and 2.5's `reason` in `websocket.disconnect`.
const ASGI_SPEC_VERSION: &str = "2.5";

/// The scope's `path` with the mount point (`root_path`) in front: as received when it starts
/// with it, otherwise behind a proxy that stripped it, so it is put back (as uvicorn does with
/// `--root-path`). ASGI's `path` includes `root_path`, unlike WSGI's `PATH_INFO`.
fn full_path(path: &[u8], root_path: &[u8]) -> Vec<u8> {
    let under = path.strip_prefix(root_path).is_some_and(|rest| rest.is_empty() || rest[0] == b'/');
    if root_path.is_empty() || under {
        return path.to_vec();
    }
    [root_path, path].concat()
}

/// A new scope for `request`: an HTTP one, or with `websocket` (the lobby checked the opening
/// handshake) a WebSocket one; `state` is the lifespan's state, shallow-copied into it (an empty
/// one without: a scope always has `state`, as uvicorn's).
pub fn build<'py>(
    py: Python<'py>,
    root_path: &[u8],
    request: &Request<'_>,
    websocket: bool,
    state: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyDict>> {
    let scope = PyDict::new(py);
    let target = split_target(request.target);
    let kind = if websocket { intern!(py, "websocket") } else { intern!(py, "http") };
    scope.set_item(intern!(py, "type"), kind)?;
    let asgi = PyDict::new(py);
    asgi.set_item(intern!(py, "version"), intern!(py, ASGI_VERSION))?;
    asgi.set_item(intern!(py, "spec_version"), intern!(py, ASGI_SPEC_VERSION))?;
    scope.set_item(intern!(py, "asgi"), asgi)?;
    let version = match request.http_version {
        maitred_wire::HTTP_1_0 => intern!(py, "1.0"),
        maitred_wire::HTTP_1_1 => intern!(py, "1.1"),
        _ => intern!(py, "2"),
    };
    scope.set_item(intern!(py, "http_version"), version)?;
    // A WebSocket scope has no method (Litestar refuses a WebSocket whose scope has one).
    if !websocket {
        scope.set_item(intern!(py, "method"), PyString::new(py, &String::from_utf8_lossy(request.method)))?;
    }
    let scheme = match (websocket, request.https) {
        (false, false) => intern!(py, "http"),
        (false, true) => intern!(py, "https"),
        (true, false) => intern!(py, "ws"),
        (true, true) => intern!(py, "wss"),
    };
    scope.set_item(intern!(py, "scheme"), scheme)?;
    let raw_path = full_path(target.path, root_path);
    // ASGI's path is the percent-decoded path as UTF-8 text, as uvicorn and hypercorn give it.
    let path = percent_decode(&raw_path);
    scope.set_item(intern!(py, "path"), PyString::new(py, &String::from_utf8_lossy(&path)))?;
    scope.set_item(intern!(py, "raw_path"), PyBytes::new(py, &raw_path))?;
    scope.set_item(intern!(py, "query_string"), PyBytes::new(py, target.query))?;
    scope.set_item(intern!(py, "root_path"), PyString::new(py, &String::from_utf8_lossy(root_path)))?;
    let headers = PyList::empty(py);
    let subprotocols = PyList::empty(py);
    let mut lowered = Vec::with_capacity(32);
    for &(name, value) in &request.headers {
        if websocket && name.eq_ignore_ascii_case(b"sec-websocket-protocol") {
            for offered in value.split(|&b| b == b',').map(<[u8]>::trim_ascii).filter(|p| !p.is_empty()) {
                subprotocols.append(PyString::new(py, &String::from_utf8_lossy(offered)))?;
            }
        }
        lowered.clear();
        lowered.extend(name.iter().map(u8::to_ascii_lowercase));
        headers.append(PyTuple::new(py, [PyBytes::new(py, &lowered), PyBytes::new(py, value)])?)?;
    }
    if let Some(authority) = target.authority {
        // An absolute-form target's authority takes the place of Host (RFC 9112, 3.2.2).
        headers.append(PyTuple::new(py, [PyBytes::new(py, b"host"), PyBytes::new(py, authority)])?)?;
    }
    scope.set_item(intern!(py, "headers"), headers)?;
    // The extensions maitred implements, each with its empty dict: a WebSocket's denial
    // response (docs/PROTOCOL.md, section 5), and HTTP's Path Send, a file the lobby sends
    // itself (docs/ASGI.md). HTTP's others (trailers, early hints, zero-copy send, tls) it
    // does not.
    let extensions = PyDict::new(py);
    if websocket {
        scope.set_item(intern!(py, "subprotocols"), subprotocols)?;
        extensions.set_item(intern!(py, "websocket.http.response"), PyDict::new(py))?;
    } else {
        extensions.set_item(intern!(py, "http.response.pathsend"), PyDict::new(py))?;
    }
    scope.set_item(intern!(py, "extensions"), extensions)?;
    // A Unix-socket peer has no address: ASGI's client is then None.
    if request.peer_addr.is_empty() {
        scope.set_item(intern!(py, "client"), py.None())?;
    } else {
        let host = PyString::new(py, &String::from_utf8_lossy(request.peer_addr));
        scope.set_item(intern!(py, "client"), (host, request.peer_port))?;
    }
    let server_name = PyString::new(py, &String::from_utf8_lossy(request.server_name));
    // A Unix socket's is its path and no port (port 0 on the wire: no TCP listener has it).
    let server_port = (request.server_port != 0).then_some(request.server_port);
    scope.set_item(intern!(py, "server"), (server_name, server_port))?;
    let state = match state {
        Some(state) => state.copy()?,
        None => PyDict::new(py),
    };
    scope.set_item(intern!(py, "state"), state)?;
    Ok(scope)
}

#[cfg(test)]
mod tests {
    use super::full_path;

    #[test]
    fn the_root_path_is_in_the_path_once() {
        assert_eq!(full_path(b"/app/x", b"/app"), b"/app/x");
        assert_eq!(full_path(b"/app", b"/app"), b"/app");
        assert_eq!(full_path(b"/x", b"/app"), b"/app/x");
        assert_eq!(full_path(b"/application", b"/app"), b"/app/application");
        assert_eq!(full_path(b"/x", b""), b"/x");
    }
}
