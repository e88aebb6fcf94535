//! The rate limit on lines a client can cause at will (refusals, cut connections, failed
//! accepts): each call site (`Site`) writes the first `RATE_BURST` lines of each `RATE_WINDOW`;
//! when the window ends, one line says how many more there were (`Window::close`). The windows
//! live in the error log's queue (`sink.rs`), whose writer closes them as they end.

use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant, SystemTime};

use super::text::{format_line, grouped, seconds};
use super::Level;

/// A rate-limited call site writes its first `RATE_BURST` lines of each `RATE_WINDOW`.
pub(super) const RATE_WINDOW: Duration = Duration::from_secs(10);

pub(super) const RATE_BURST: u32 = 5;

/// A rate-limited call site: its window's place in the error log's state, once it has one.
pub struct Site {
    pub(super) index: AtomicUsize,
}

impl Site {
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Site {
        Site { index: AtomicUsize::new(usize::MAX) }
    }
}

/// One call site's current window: what it wrote and what it left out.
pub(super) struct Window {
    pub(super) level: Level,
    /// When the window began (both clocks: one to measure, one to print); None between windows.
    pub(super) began: Option<(Instant, SystemTime)>,
    pub(super) written: u32,
    pub(super) suppressed: u64,
    /// The window's first message, which the summary quotes.
    pub(super) example: String,
}

impl Window {
    /// The summary of a window that ends at `now` (at the latest at its full length), if it
    /// left anything out; the window is closed either way.
    pub(super) fn close(&mut self, now: Instant) -> Option<String> {
        let (began, wall) = self.began.take()?;
        let suppressed = std::mem::take(&mut self.suppressed);
        self.written = 0;
        if suppressed == 0 {
            return None;
        }
        let length = now.saturating_duration_since(began).min(RATE_WINDOW);
        let message =
            format!("… and {} more like \"{}\" in the last {} s", grouped(suppressed), self.example, seconds(length));
        Some(format_line(wall + length, self.level, message))
    }

    pub(super) fn due(&self) -> Option<Instant> {
        self.began.filter(|_| self.suppressed > 0).map(|(began, _)| began + RATE_WINDOW)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn a_window_sums_up_what_it_left_out() {
        let start = Instant::now();
        let wall = UNIX_EPOCH + Duration::from_secs(1_795_325_400);
        let mut window = Window {
            level: Level::Info,
            began: Some((start, wall)),
            written: RATE_BURST,
            suppressed: 9_995,
            example: "400 to 127.0.0.1:5000: bare LF".into(),
        };
        assert_eq!(window.due(), Some(start + RATE_WINDOW));
        // Written late, the summary still covers the window's 10 s and is stamped with its end.
        let summary = window.close(start + Duration::from_secs(25)).unwrap();
        assert!(summary.starts_with("[2026-11-22 05:30:10 +0000] ["), "{summary}");
        assert!(
            summary.ends_with("[INFO] … and 9,995 more like \"400 to 127.0.0.1:5000: bare LF\" in the last 10 s\n"),
            "{summary}"
        );
        assert_eq!((window.began, window.written, window.suppressed), (None, 0, 0));
        // A window that left nothing out ends without a line.
        window.began = Some((start, wall));
        window.written = 2;
        assert_eq!(window.due(), None);
        assert_eq!(window.close(start + RATE_WINDOW), None);
    }
}
