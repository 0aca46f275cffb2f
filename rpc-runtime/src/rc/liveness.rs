//! The clock of an RC client's liveness probe (copyrpc: an RDMA READ of the server's
//! consumer word; ScaleRPC: a probe call in the connection's reserved slot). A server that
//! died or stopped answers nothing, and an RC QP with nothing to send never notices; so a
//! client with calls outstanding that hears nothing for the probe interval sends a probe,
//! whose failure (retries exhausted) fails the connection and with it every pending call.
//!
//! Reading the clock costs a system call, so the hot poll only counts empty polls and
//! reads it every [`PROBE_CHECK_POLLS`] of them ([`ProbeClock::empty_poll`]), or when the
//! runtime's idle tick asks; [`ProbeClock::due`] then decides.

use std::time::{Duration, Instant};

use super::PROBE_CHECK_POLLS;

/// When a client's next liveness probe is due.
#[derive(Clone, Debug)]
pub(crate) struct ProbeClock {
    interval: Duration,
    empty_polls: u32,
    /// Last time a response arrived (or a probe was sent).
    last: Instant,
    /// Responses counted at `last`.
    seen: u64,
}

impl ProbeClock {
    /// A clock probing every `interval` of silence, starting at `now` with `responses`
    /// responses received so far.
    pub(crate) fn new(interval: Duration, now: Instant, responses: u64) -> Self {
        ProbeClock {
            interval,
            empty_polls: 0,
            last: now,
            seen: responses,
        }
    }

    /// Counts one poll that delivered nothing while calls are outstanding; `true` once
    /// [`PROBE_CHECK_POLLS`] have accumulated, i.e. time to read the clock and ask
    /// [`ProbeClock::due`].
    #[inline(always)]
    pub(crate) fn empty_poll(&mut self) -> bool {
        self.empty_polls += 1;
        self.empty_polls >= PROBE_CHECK_POLLS
    }

    /// With `responses` the client's count of responses so far: `true` if none arrived for
    /// the interval since the last response or probe (the caller sends a probe if it can;
    /// the interval restarts either way). Restarts the empty-poll count.
    pub(crate) fn due(&mut self, now: Instant, responses: u64) -> bool {
        self.empty_polls = 0;
        if responses != self.seen {
            self.seen = responses;
            self.last = now;
            return false;
        }
        if now.duration_since(self.last) < self.interval {
            return false;
        }
        self.last = now;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_after_an_interval_of_silence_only() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut c = ProbeClock::new(ms(100), t0, 5);
        for _ in 1..PROBE_CHECK_POLLS {
            assert!(!c.empty_poll());
        }
        assert!(
            c.empty_poll(),
            "the clock is read every PROBE_CHECK_POLLS empty polls"
        );
        assert!(!c.due(t0 + ms(99), 5), "silence shorter than the interval");
        assert!(!c.empty_poll(), "due restarted the count");
        assert!(
            !c.due(t0 + ms(150), 6),
            "a response arrived: the interval restarts"
        );
        assert!(!c.due(t0 + ms(249), 6));
        assert!(
            c.due(t0 + ms(250), 6),
            "100 ms of silence since the last response"
        );
        assert!(!c.due(t0 + ms(300), 6), "the probe restarted the interval");
        assert!(c.due(t0 + ms(350), 6));
    }
}
