//! Counters of one copyrpc [`super::Context`]: traffic, back-pressure, batching, and every
//! kind of bad input or failure.

/// Buckets of [`Stats::batch_sizes`]: bucket `i` counts batches of `2^(i-1) < n <= 2^i`
/// messages (bucket 0: one message), the last bucket everything above 512.
pub const BATCH_BUCKETS: usize = 11;

/// Counters (monotonic since the context was created).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests written.
    pub calls: u64,
    /// Responses written.
    pub replies: u64,
    /// Requests parsed from receive rings.
    pub requests: u64,
    /// Responses delivered to callers.
    pub responses: u64,
    /// Batches closed (one RDMA WRITE+IMM each, wrap markers excluded).
    pub batches_sent: u64,
    /// Batches parsed (wrap markers included).
    pub batches_received: u64,
    /// Wrap markers written.
    pub wrap_markers: u64,
    /// Flow updates (empty batches carrying only a credit return and grant) written.
    pub flow_updates: u64,
    /// RDMA WRITE+IMM WQEs posted.
    pub writes_posted: u64,
    /// Of those, fully inline.
    pub writes_inline: u64,
    /// Doorbells rung.
    pub doorbells: u64,
    /// Calls refused with `InsufficientCredit`.
    pub insufficient_credit: u64,
    /// Calls refused with `RingFull`.
    pub ring_full: u64,
    /// RDMA READs of a peer's consumer position.
    pub consumer_reads: u64,
    /// Replies that did not fit and were sent later (only a protocol-breaking peer causes these).
    pub backlogged_replies: u64,
    /// Raw RDMA READ/WRITE operations posted (seeds/004 §3.9).
    pub raw_posted: u64,
    /// Raw RDMA operations completed (successfully or not).
    pub raw_done: u64,
    /// Malformed batches from peers (each failed its endpoint).
    pub corrupt_batches: u64,
    /// Consumer positions read by RDMA READ that were beyond the bytes sent (ignored).
    pub bad_consumer_reads: u64,
    /// Error completions (send or receive side).
    pub error_cqes: u64,
    /// Receive completions naming no endpoint of this context (dropped).
    pub unknown_qpn: u64,
    /// Send completions that matched no signaled WQE (ignored).
    pub stray_send_cqes: u64,
    /// Endpoints that failed.
    pub failed_endpoints: u64,
    /// Replies refused because their handle was already answered.
    pub stale_replies: u64,
    /// Send attempts deferred because the send queue was full.
    pub sq_full: u64,
    /// Large messages sent by rendezvous (descriptor written; issue 15).
    pub rendezvous_sent: u64,
    /// Rendezvous messages received and read completely by RDMA READ.
    pub rendezvous_read: u64,
    /// Bytes those READs moved.
    pub rendezvous_bytes: u64,
    /// Rendezvous descriptors refused (bad length or flags; each failed its endpoint and is
    /// also counted in `corrupt_batches`).
    pub bad_descriptors: u64,
    /// Rendezvous READs that completed with an error (bad rkey or address, peer gone): each
    /// failed its endpoint.
    pub rendezvous_read_errors: u64,
    /// Large-message buffers registered (each once, then reused).
    pub large_buffers: u64,
    /// Large calls refused with `RingFull` and replies refused with `NoLargeBuffer` because
    /// every large-message buffer was busy; READs waiting for a landing buffer are not counted.
    pub large_buffers_busy: u64,
    /// Messages per closed batch (see [`BATCH_BUCKETS`]).
    pub batch_sizes: [u64; BATCH_BUCKETS],
}

impl Stats {
    /// Records a closed batch of `n >= 1` messages.
    #[inline(always)]
    pub(crate) fn record_batch(&mut self, n: u32) {
        self.batches_sent += 1;
        if n <= 1 {
            // Bucket 0 without the bit scan: a batch of one, the common case at low depth.
            self.batch_sizes[0] += 1;
            return;
        }
        // ceil(log2 n) as floor(log2(2n - 1)): one bit scan of a value known non-zero (the
        // `| 1`; 2n - 1 is odd anyway, and n = 0 gives bucket 0 as before).
        let b = ((n as u64 * 2).saturating_sub(1) | 1).ilog2() as usize;
        self.batch_sizes[b.min(BATCH_BUCKETS - 1)] += 1;
    }

    /// Mean messages per batch sent.
    pub fn mean_batch(&self) -> f64 {
        if self.batches_sent == 0 {
            0.0
        } else {
            (self.calls + self.replies) as f64 / self.batches_sent as f64
        }
    }

    /// Upper bound (messages) of batch-size bucket `i`.
    pub fn bucket_limit(i: usize) -> u32 {
        1 << i
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets() {
        let mut s = Stats::default();
        for n in [1, 2, 3, 4, 5, 8, 9, 64, 65, 512, 513, 100_000] {
            s.record_batch(n);
        }
        assert_eq!(s.batch_sizes[0], 1); // 1
        assert_eq!(s.batch_sizes[1], 1); // 2
        assert_eq!(s.batch_sizes[2], 2); // 3, 4
        assert_eq!(s.batch_sizes[3], 2); // 5, 8
        assert_eq!(s.batch_sizes[4], 1); // 9
        assert_eq!(s.batch_sizes[6], 1); // 64
        assert_eq!(s.batch_sizes[7], 1); // 65
        assert_eq!(s.batch_sizes[9], 1); // 512
        assert_eq!(s.batch_sizes[10], 2); // 513, 100000
    }

    /// The bucket is the bit length of `n - 1` (the former formula) for every size.
    #[test]
    fn buckets_match_bit_length() {
        let sizes = (0..5000u32).chain([u32::MAX / 2, u32::MAX / 2 + 1, u32::MAX - 1, u32::MAX]);
        for n in sizes {
            let mut s = Stats::default();
            s.record_batch(n);
            let b = (32 - n.saturating_sub(1).leading_zeros()) as usize;
            assert_eq!(s.batch_sizes[b.min(BATCH_BUCKETS - 1)], 1, "n = {n}");
        }
    }
}
