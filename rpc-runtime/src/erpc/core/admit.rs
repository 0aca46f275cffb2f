//! Admission of session-management traffic per source (issue 14, part 3).
//!
//! A *source* is the address a datagram came from, the core's `A`: the remote IP address
//! and port over UDP, the remote (LID, QPN) over mlx5 UD. Two limits apply per source:
//!
//! - **Sessions.** A server holds at most `Config::max_sessions_per_source` server sessions
//!   of one source (default: half the sessions the server can hold, see
//!   [`Config::source_session_limit`](super::Config::source_session_limit)); a connect
//!   request beyond that is refused (`SessionError::SourceLimit` at the client). The count is
//!   kept in a map with one entry per source *that holds a session*, so it never has more
//!   entries than there are live sessions (`max_sessions`), whatever the sources claim.
//! - **Session-management requests per second** (connect, disconnect, ping): a token
//!   bucket per source, `Config::sm_rate_per_source` packets per second with bursts of
//!   `Config::sm_burst_per_source`. Requests over the budget are dropped before they are
//!   decoded or answered (`Stats::drop_sm_rate_limited`). The buckets live in a table of
//!   `Config::sm_rate_table_entries` entries allocated once ([`SmLimiter`]); a source is
//!   placed by a keyed hash (the key is random per endpoint, so a sender cannot choose
//!   sources that land on another's entry). A source whose entry is held by another
//!   source evicts it if the holder's bucket is full again (it has been quiet long enough
//!   to have earned a full burst back), and otherwise shares the holder's bucket. Memory is
//!   therefore fixed however many (spoofed) sources send; a collision can only slow a
//!   source down to the rate limit, never let anyone exceed it.
//!
//! Each bucket is one timestamp (the generic cell rate algorithm, equivalent to a token
//! bucket): the *theoretical arrival time* `tat` of the next packet if the source sent at
//! exactly the rate. A packet at `now` conforms when `tat <= now + (burst - 1) * interval`
//! (with `interval = 1 s / rate`); it then moves `tat` to `max(tat, now) + interval`.
//!
//! What this does not stop: a sender with many addresses or ports, or one that spoofs
//! source addresses, is many sources. Against that the global limits hold (`max_sessions`,
//! the receive-ring admission control) and sessions that never send a request are reclaimed
//! after `Config::idle_session_timeout` (`Stats::server_sessions_idle_reclaimed`), so an
//! attacker must keep spending packets to hold sessions.

use std::hash::{BuildHasher, Hash, RandomState};

use super::Time;

/// One second in [`Time`] units (ns).
const SEC: Time = 1_000_000_000;

/// A table entry: which source holds it (its keyed hash) and its bucket.
#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    /// Keyed hash of the source holding the entry (0 while the entry was never used).
    tag: u64,
    /// Theoretical arrival time of the holder's next conforming packet (ns).
    tat: Time,
}

/// The fixed-size table of per-source token buckets (module docs).
#[derive(Debug)]
pub(super) struct SmLimiter {
    keys: RandomState,
    table: Box<[Entry]>,
    /// Nanoseconds per packet at the rate.
    interval: Time,
    /// `(burst - 1) * interval`: how far ahead of `now` the bucket may run.
    tolerance: Time,
}

impl SmLimiter {
    /// A table of `entries` buckets admitting `rate` packets per second per source with
    /// bursts of `burst` (all at least 1; `Rpc::new` checks).
    pub(super) fn new(entries: usize, rate: u64, burst: u64) -> SmLimiter {
        let interval = (SEC / rate.max(1)).max(1);
        SmLimiter {
            keys: RandomState::new(),
            table: vec![Entry::default(); entries.max(1)].into_boxed_slice(),
            interval,
            tolerance: burst.max(1).saturating_sub(1).saturating_mul(interval),
        }
    }

    /// Entries in the table (constant).
    #[cfg(test)]
    pub(super) fn entries(&self) -> usize {
        self.table.len()
    }

    /// `src`'s tag (its keyed hash; `| 1`, so never the unused value 0) and table index.
    fn place<A: Hash>(&self, src: &A) -> (u64, usize) {
        let tag = self.keys.hash_one(src) | 1;
        (tag, (tag >> 1) as usize % self.table.len())
    }

    /// Whether a packet from `src` at `now` is within its source's budget; charges it if so.
    pub(super) fn admit<A: Hash>(&mut self, src: &A, now: Time) -> bool {
        let (tag, i) = self.place(src);
        let e = &mut self.table[i];
        if e.tag != tag {
            // A full bucket (`tat <= now`) has nothing to remember: take the entry over.
            if e.tat <= now {
                *e = Entry { tag, tat: now };
            }
            // Otherwise share the holder's bucket.
        }
        if e.tat > now.saturating_add(self.tolerance) {
            return false;
        }
        e.tat = e.tat.max(now).saturating_add(self.interval);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_rate() {
        // 1000 packets/s (1 ms apart), bursts of 4.
        let mut l = SmLimiter::new(64, 1000, 4);
        let t0 = 5 * SEC;
        assert_eq!((0..10).filter(|_| l.admit(&7u32, t0)).count(), 4);
        // Another source on another entry has its own bucket.
        let other = (8u32..).find(|s| l.place(s).1 != l.place(&7u32).1).unwrap();
        assert_eq!((0..10).filter(|_| l.admit(&other, t0)).count(), 4);
        // One more packet per elapsed millisecond.
        assert!(!l.admit(&7u32, t0 + SEC / 2000));
        assert!(l.admit(&7u32, t0 + SEC / 1000));
        assert!(!l.admit(&7u32, t0 + SEC / 1000));
        // After a quiet second the burst is back, no more.
        let t1 = t0 + 2 * SEC;
        assert_eq!((0..10).filter(|_| l.admit(&7u32, t1)).count(), 4);
    }

    #[test]
    fn memory_is_fixed_and_collisions_never_exceed_the_rate() {
        // One entry: every source collides.
        let mut l = SmLimiter::new(1, 10, 2);
        let t = SEC;
        assert!(l.admit(&1u32, t));
        assert!(l.admit(&1u32, t));
        // Source 2 finds the entry busy: it shares source 1's (empty) bucket. (Equal hashes of
        // 1 and 2 are not a concern: the outcome is the same.)
        assert!(!l.admit(&2u32, t));
        // Once source 1's bucket has refilled, source 2 takes the entry over.
        assert!(l.admit(&2u32, t + SEC));
        assert_eq!(l.entries(), 1);
        // A million distinct sources: the table does not grow.
        let mut l = SmLimiter::new(128, 1000, 8);
        for s in 0..1_000_000u32 {
            l.admit(&s, SEC);
        }
        assert_eq!(l.entries(), 128);
    }
}
