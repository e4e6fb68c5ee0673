//! [`Limits`]: every bound of the kubernetes source (counts, bytes, times), defined once here.
//!
//! Invariant: the idle-read timeout of a watch is longer than the `timeoutSeconds` the API
//! server is asked to end it after, so a healthy but quiet watch ends cleanly, never by timeout.

use std::time::Duration;

/// The kubernetes source's bounds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// TCP + TLS connect to the API server.
    pub connect_timeout: Duration,
    /// One LIST page, request to last byte.
    pub list_timeout: Duration,
    /// Request to response headers, for every request (a WATCH's body then streams).
    pub response_timeout: Duration,
    /// A watch that stayed open this long was healthy: when it ends, even with no event, the
    /// next one starts at once rather than after a backoff.
    pub healthy_watch: Duration,
    /// Objects per LIST page (`limit`); the rest follow with `continue`.
    pub list_page: u32,
    /// Bytes of one LIST page's body.
    pub max_list_bytes: usize,
    /// `timeoutSeconds` of a WATCH: the server ends it cleanly after this.
    pub watch_timeout: Duration,
    /// Silence on a watch stream longer than this ends it (then it resumes from the last
    /// version). Longer than `watch_timeout` (see the module invariant).
    pub idle_timeout: Duration,
    /// Bytes of one watch event line.
    pub max_event_bytes: usize,
    /// Objects one watch tracks.
    pub max_objects: usize,
    /// First retry delay after a failure.
    pub backoff_initial: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// Bytes of the token file.
    pub max_token_bytes: u64,
}

impl Limits {
    /// Margin of the idle-read timeout over the server-side watch timeout.
    pub const IDLE_MARGIN: Duration = Duration::from_secs(30);
}

impl Default for Limits {
    fn default() -> Self {
        let watch_timeout = Duration::from_secs(290);
        Self {
            connect_timeout: Duration::from_secs(5),
            list_timeout: Duration::from_secs(30),
            response_timeout: Duration::from_secs(30),
            healthy_watch: Duration::from_secs(5),
            list_page: 500,
            max_list_bytes: 64 << 20,
            watch_timeout,
            idle_timeout: watch_timeout + Self::IDLE_MARGIN,
            max_event_bytes: 4 << 20,
            max_objects: 10_000,
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            max_token_bytes: 64 << 10,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quiet_watch_ends_by_the_server_before_the_idle_timeout() {
        let l = Limits::default();
        assert!(l.idle_timeout > l.watch_timeout);
    }
}
