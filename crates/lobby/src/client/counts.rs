//! What the connections count as it happens: each count one atomic add on a family that
//! `observe/metrics.rs` registers and shows, and hands over here already looked up.

use prometheus::{IntCounter, IntCounterVec};

use super::h2::reasons::{GoawayReason, Http2Refusal, StreamStage};

#[derive(Clone)]
pub(crate) struct Counts {
    /// `maitred_requests_total` for 1xx to 5xx.
    pub requests: [IntCounter; 5],
    /// `maitred_http2_requests_total`: those of them that came over HTTP/2.
    pub http2_requests: IntCounter,
    /// `maitred_refusals_total`, by status.
    pub refusals: IntCounterVec,
    /// `maitred_http2_refused_total`, `maitred_http2_goaways_total` and
    /// `maitred_http2_streams_reset_total`, by their reason.
    pub http2_refused: IntCounterVec,
    pub http2_goaways: IntCounterVec,
    pub http2_streams_reset: IntCounterVec,
}

impl Counts {
    /// An answer written to a client, worker's or lobby's.
    pub fn answered(&self, status: u16) {
        let class = (status / 100).clamp(1, 5) as usize - 1;
        self.requests[class].inc();
    }

    /// An answer written to an HTTP/2 stream, counted by `answered` or `refused` besides: HTTP/1.x's
    /// are the difference, so that its answers cost no second count.
    pub fn answered_http2(&self) {
        self.http2_requests.inc();
    }

    /// An HTTP/2 connection ended with GOAWAY for what its client sent.
    pub fn http2_refused(&self, refusal: Http2Refusal) {
        self.http2_refused.with_label_values(&[refusal.label()]).inc();
        self.http2_goaway(refusal.goaway());
    }

    pub fn http2_goaway(&self, reason: GoawayReason) {
        self.http2_goaways.with_label_values(&[reason.label()]).inc();
    }

    /// A stream its client reset.
    pub fn http2_stream_reset(&self, stage: StreamStage) {
        self.http2_streams_reset.with_label_values(&[stage.label()]).inc();
    }

    /// A request the lobby answered itself, with an error.
    pub fn refused(&self, status: u16) {
        self.refusals.with_label_values(&[&status.to_string()]).inc();
        self.answered(status);
    }
}
