//! What a hibernating HTTP/2 connection keeps, as data alone: a leaf, so that a `Sleeper`
//! (`client/asleep.rs`) holds it without reaching the connection's code; `sleep.rs` makes it
//! and reads it.

/// What a hibernating HTTP/2 connection keeps (`asleep::Sleeper::http2`; `sleep.rs` makes
/// and reads it), in the sleeper itself: an allocation of its own, however small, would keep a
/// page of the freed h2 connection's memory from going back to the system (4 KB per
/// connection, measured).
pub struct Http2Sleep {
    /// The client's settings, each as it last said it.
    pub(crate) settings: Http2Settings,
    /// Bytes of answers the client's connection window still takes, and of bodies the client
    /// knows the lobby's takes.
    pub(crate) send_window: u32,
    pub(crate) receive_window: u32,
    /// The last stream the client opened.
    pub(crate) last_stream: u32,
}

/// Setting identifiers kept, 1 to 9.
pub(crate) const HTTP2_SETTINGS: usize = 9;

/// The settings an HTTP/2 client said, by identifier: RFC 9113's and RFC 8441's, 1 to 8, and RFC
/// 9218's 9 (a client's other identifiers are ignored, RFC 9113 6.5.2).
#[derive(Clone, Copy, Default)]
pub struct Http2Settings {
    pub(crate) values: [u32; HTTP2_SETTINGS],
    /// Bit `id - 1` for each identifier said.
    pub(crate) said: u16,
}
