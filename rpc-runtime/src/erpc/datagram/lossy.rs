//! A test aid: a [`DatagramTransport`] wrapper that drops, duplicates and reorders datagrams
//! in both directions, driven by a seeded RNG (so a failing run can be replayed).
//!
//! - **Transmit**: each packet is dropped with probability `drop`, otherwise sent twice with
//!   probability `dup`, and otherwise held back with probability `delay` and sent after 1 to
//!   `max_delay_calls` later calls of `tx_burst`/`rx_burst` (so later packets overtake it).
//! - **Receive**: each datagram of a burst is dropped with probability `drop`, delivered twice
//!   with probability `dup`, and the delivered order is shuffled with probability `shuffle`
//!   per burst.
//!
//! Held-back packets are copied into owned buffers (this wrapper allocates; it is for tests,
//! not for the allocation-free fast path). Statistics are those of the inner transport.

use std::io;

use super::{DatagramTransport, TransportStats, TxPkt};

/// Fault probabilities (each in `0.0..=1.0`) and the RNG seed of a [`LossyTransport`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossConfig {
    /// Probability that a packet is dropped (applied separately on transmit and on receive).
    pub drop: f64,
    /// Probability that a packet that was not dropped is duplicated.
    pub dup: f64,
    /// Transmit: probability that a packet is held back (reordered behind later ones).
    pub delay: f64,
    /// Largest hold-back, in subsequent `tx_burst`/`rx_burst` calls (at least 1).
    pub max_delay_calls: u32,
    /// Receive: probability that a burst is delivered in shuffled order.
    pub shuffle: f64,
    /// RNG seed.
    pub seed: u64,
}

impl Default for LossConfig {
    /// 30% drop each way, 5% duplication, 10% delay of up to 8 calls, 20% shuffled bursts.
    fn default() -> Self {
        LossConfig {
            drop: 0.3,
            dup: 0.05,
            delay: 0.1,
            max_delay_calls: 8,
            shuffle: 0.2,
            seed: 1,
        }
    }
}

/// Counters of the faults a [`LossyTransport`] injected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LossStats {
    /// Packets dropped on transmit.
    pub tx_dropped: u64,
    /// Packets duplicated on transmit.
    pub tx_duplicated: u64,
    /// Packets held back on transmit.
    pub tx_delayed: u64,
    /// Datagrams dropped on receive.
    pub rx_dropped: u64,
    /// Datagrams delivered twice on receive.
    pub rx_duplicated: u64,
    /// Receive bursts delivered shuffled.
    pub rx_shuffled: u64,
}

/// A held-back datagram.
#[derive(Debug)]
struct Held<A> {
    dest: A,
    bytes: Vec<u8>,
    /// Remaining `tx_burst`/`rx_burst` calls before it is sent.
    calls_left: u32,
}

/// A fault-injecting wrapper around a transport; see the [module docs](self).
#[derive(Debug)]
pub struct LossyTransport<T: DatagramTransport> {
    inner: T,
    cfg: LossConfig,
    rng: u64,
    held: Vec<Held<T::Addr>>,
    /// Indices into the inner burst, in delivery order.
    rx_map: Vec<usize>,
    /// Scratch: descriptors and, per descriptor, the index of the caller's packet.
    tx_scratch: Vec<usize>,
    stats: LossStats,
}

impl<T: DatagramTransport> LossyTransport<T> {
    /// Wraps `inner`.
    pub fn new(inner: T, cfg: LossConfig) -> Self {
        let cap = 2 * inner.rx_batch();
        LossyTransport {
            inner,
            rng: cfg.seed ^ 0x9e37_79b9_7f4a_7c15,
            cfg,
            held: Vec::new(),
            rx_map: Vec::with_capacity(cap),
            tx_scratch: Vec::new(),
            stats: LossStats::default(),
        }
    }

    /// The wrapped transport.
    pub fn inner(&self) -> &T {
        &self.inner
    }

    /// The faults injected so far.
    pub fn loss_stats(&self) -> LossStats {
        self.stats
    }

    /// splitmix64.
    fn next_u64(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// `true` with probability `p`.
    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    /// Counts down held packets and sends those that are due (if the inner transport is full
    /// they are lost, which is just more loss).
    fn release_held(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let mut i = 0;
        while i < self.held.len() {
            self.held[i].calls_left = self.held[i].calls_left.saturating_sub(1);
            if self.held[i].calls_left == 0 {
                let h = self.held.swap_remove(i);
                let _ = self.inner.tx_burst(&[TxPkt::single(h.dest, &h.bytes)]);
            } else {
                i += 1;
            }
        }
    }
}

impl<T: DatagramTransport> DatagramTransport for LossyTransport<T> {
    type Addr = T::Addr;

    fn mtu(&self) -> usize {
        self.inner.mtu()
    }

    fn local_addr(&self) -> Self::Addr {
        self.inner.local_addr()
    }

    fn rx_batch(&self) -> usize {
        self.inner.rx_batch()
    }

    fn rx_ring_entries(&self) -> usize {
        self.inner.rx_ring_entries()
    }

    fn tx_burst(&mut self, pkts: &[TxPkt<'_, Self::Addr>]) -> io::Result<usize> {
        let mtu = self.inner.mtu();
        if pkts.iter().any(|p| p.len() > mtu) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "packet longer than the mtu",
            ));
        }
        self.release_held();
        let mut out: Vec<TxPkt<'_, Self::Addr>> = Vec::with_capacity(2 * pkts.len());
        self.tx_scratch.clear();
        for (i, p) in pkts.iter().enumerate() {
            if self.chance(self.cfg.drop) {
                self.stats.tx_dropped += 1;
                continue;
            }
            if self.chance(self.cfg.delay) {
                self.stats.tx_delayed += 1;
                let calls = 1 + (self.next_u64() % u64::from(self.cfg.max_delay_calls.max(1)));
                let mut bytes = Vec::with_capacity(p.len());
                bytes.extend_from_slice(p.hdr);
                bytes.extend_from_slice(p.data);
                self.held.push(Held {
                    dest: p.dest,
                    bytes,
                    calls_left: calls as u32,
                });
                continue;
            }
            out.push(*p);
            self.tx_scratch.push(i);
            if self.chance(self.cfg.dup) {
                self.stats.tx_duplicated += 1;
                out.push(*p);
                self.tx_scratch.push(i);
            }
        }
        if out.is_empty() {
            return Ok(pkts.len());
        }
        let k = self.inner.tx_burst(&out)?;
        if k >= out.len() {
            Ok(pkts.len())
        } else {
            // Caller packets before the first unconsumed descriptor are done.
            Ok(self.tx_scratch[k])
        }
    }

    fn rx_burst(&mut self, max: usize) -> usize {
        self.release_held();
        let n = self.inner.rx_burst(max);
        self.rx_map.clear();
        for i in 0..n {
            if self.chance(self.cfg.drop) {
                self.stats.rx_dropped += 1;
                continue;
            }
            self.rx_map.push(i);
            if self.chance(self.cfg.dup) {
                self.stats.rx_duplicated += 1;
                self.rx_map.push(i);
            }
        }
        if self.rx_map.len() > 1 && self.chance(self.cfg.shuffle) {
            self.stats.rx_shuffled += 1;
            for i in (1..self.rx_map.len()).rev() {
                let j = (self.next_u64() % (i as u64 + 1)) as usize;
                self.rx_map.swap(i, j);
            }
        }
        self.rx_map.truncate(max.min(self.inner.rx_batch()));
        self.rx_map.len()
    }

    fn rx_pkt(&self, i: usize) -> (Self::Addr, &[u8]) {
        self.inner.rx_pkt(self.rx_map[i])
    }

    fn rx_release(&mut self) {
        self.rx_map.clear();
        self.inner.rx_release();
    }

    fn stats(&self) -> TransportStats {
        self.inner.stats()
    }
}
