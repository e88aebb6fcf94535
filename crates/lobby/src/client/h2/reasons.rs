//! Why HTTP/2 connections and streams end, as the metrics label them (docs/METRICS.md): a
//! leaf, so that `observe/metrics.rs` counts them without reaching into the connection's code.

/// Why the lobby ended an HTTP/2 connection for what its client sent, as
/// `maitred_http2_refused_total` labels it (docs/HTTP2.md, "Floods").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Http2Refusal {
    /// Streams opened and reset before the lobby took them, past the h2 crate's bound
    /// (CVE-2023-44487).
    RapidReset,
    /// A header block in more CONTINUATION frames than the largest head allowed needs.
    ContinuationFlood,
    /// A header block that decodes past four times the head's limit (an HPACK bomb).
    HeaderListTooLarge,
    /// Empty DATA frames, past the h2 crate's bound.
    EmptyDataFlood,
    /// Streams the lobby reset for the client's protocol errors, past its bound.
    MalformedStreams,
    /// SETTINGS frames past their budget a second (`client/h2/flood.rs`).
    SettingsFlood,
    /// PING frames past their budget a second (`client/h2/flood.rs`).
    PingFlood,
    /// No window for an answer (or nothing read) for `--send-timeout`.
    ZeroWindow,
    /// A window past 2^31-1, or data past the window granted (FLOW_CONTROL_ERROR).
    FlowControl,
    /// A plain connection, where only HTTP/2 is spoken, that opened with neither the preface
    /// nor an HTTP/1.x request.
    InvalidPreface,
    /// Any other broken rule of HTTP/2 the h2 crate ended the connection for.
    ProtocolError,
}

impl Http2Refusal {
    pub const ALL: [Http2Refusal; 11] = [
        Http2Refusal::RapidReset,
        Http2Refusal::ContinuationFlood,
        Http2Refusal::HeaderListTooLarge,
        Http2Refusal::EmptyDataFlood,
        Http2Refusal::MalformedStreams,
        Http2Refusal::SettingsFlood,
        Http2Refusal::PingFlood,
        Http2Refusal::ZeroWindow,
        Http2Refusal::FlowControl,
        Http2Refusal::InvalidPreface,
        Http2Refusal::ProtocolError,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Http2Refusal::RapidReset => "rapid_reset",
            Http2Refusal::ContinuationFlood => "continuation_flood",
            Http2Refusal::HeaderListTooLarge => "header_list_too_large",
            Http2Refusal::EmptyDataFlood => "empty_data_flood",
            Http2Refusal::MalformedStreams => "malformed_streams",
            Http2Refusal::SettingsFlood => "settings_flood",
            Http2Refusal::PingFlood => "ping_flood",
            Http2Refusal::ZeroWindow => "zero_window",
            Http2Refusal::FlowControl => "flow_control",
            Http2Refusal::InvalidPreface => "invalid_preface",
            Http2Refusal::ProtocolError => "protocol_error",
        }
    }

    /// The GOAWAY it ends in: the floods and the stalled reader are told ENHANCE_YOUR_CALM,
    /// the broken rules their error.
    pub fn goaway(self) -> GoawayReason {
        match self {
            Http2Refusal::FlowControl | Http2Refusal::InvalidPreface | Http2Refusal::ProtocolError => {
                GoawayReason::ProtocolError
            }
            _ => GoawayReason::Flood,
        }
    }
}

/// Why the lobby sent an HTTP/2 connection GOAWAY, as `maitred_http2_goaways_total` labels it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GoawayReason {
    /// A shutdown (SIGTERM, SIGINT) or a binary upgrade (SIGUSR2).
    Shutdown,
    /// No stream for `--keep-alive` (`--header-timeout` before the first).
    Idle,
    /// The client broke a rule of HTTP/2.
    ProtocolError,
    /// ENHANCE_YOUR_CALM: a flood, or a client that took no answer for `--send-timeout`.
    Flood,
}

impl GoawayReason {
    pub const ALL: [GoawayReason; 4] =
        [GoawayReason::Shutdown, GoawayReason::Idle, GoawayReason::ProtocolError, GoawayReason::Flood];

    pub fn label(self) -> &'static str {
        match self {
            GoawayReason::Shutdown => "shutdown",
            GoawayReason::Idle => "idle",
            GoawayReason::ProtocolError => "protocol_error",
            GoawayReason::Flood => "flood",
        }
    }
}

/// Where an HTTP/2 stream's request was when its client reset it, as
/// `maitred_http2_streams_reset_total` labels it (named as `maitred_connections` names states).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamStage {
    /// Its head or body still coming.
    Reading,
    /// Whole, waiting for a worker: dropped without running (`abandoned` too).
    Queued,
    /// With a worker, which is told.
    InService,
    /// Its answer being sent.
    Writing,
}

impl StreamStage {
    pub const ALL: [StreamStage; 4] =
        [StreamStage::Reading, StreamStage::Queued, StreamStage::InService, StreamStage::Writing];

    pub fn label(self) -> &'static str {
        match self {
            StreamStage::Reading => "reading",
            StreamStage::Queued => "queued",
            StreamStage::InService => "in_service",
            StreamStage::Writing => "writing",
        }
    }
}
