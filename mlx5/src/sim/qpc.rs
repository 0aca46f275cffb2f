//! The QP-context cache of one simulated device: an LRU set of QPNs (see "QPC cache" in the
//! module docs of `sim`).

use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use lru::LruCache;

use crate::sim::{QpcCacheConfig, QpcStats};

/// One device's QPC cache and its counters.
pub(crate) struct QpcCache {
    /// `None`: the cache model is disabled (nothing is counted).
    lru: Option<LruCache<u32, ()>>,
    /// The most recently used QPN (the head of `lru`), or [`NO_QPN`]: a repeated lookup of
    /// it is a hit that leaves the LRU order unchanged, so it skips the hash lookup.
    mru: u32,
    pub(crate) stats: QpcStats,
}

/// Not a QPN (they are 24-bit).
const NO_QPN: u32 = u32::MAX;

impl QpcCache {
    pub(crate) fn new(cfg: Option<QpcCacheConfig>) -> Self {
        QpcCache {
            lru: cfg.map(|c| {
                LruCache::new(NonZeroUsize::new(c.entries).expect("checked by Fabric::new"))
            }),
            mru: NO_QPN,
            stats: QpcStats::default(),
        }
    }

    /// The fast path of [`QpcCache::touch`]: a hit on the most recently used context (never
    /// true when disabled).
    #[inline(always)]
    pub(crate) fn touch_mru(&mut self, qpn: u32) -> bool {
        let hit = qpn == self.mru;
        self.stats.hits += u64::from(hit);
        hit
    }

    /// Looks up `qpn`'s context, loading it (evicting the least recently used entry if the
    /// cache is full) on a miss. `None` when disabled, else whether it hit.
    pub(crate) fn touch(&mut self, qpn: u32) -> Option<bool> {
        let lru = self.lru.as_mut()?;
        if qpn == self.mru {
            self.stats.hits += 1;
            return Some(true);
        }
        self.mru = qpn;
        if lru.promote(&qpn) {
            self.stats.hits += 1;
            return Some(true);
        }
        self.stats.misses += 1;
        if lru.push(qpn, ()).is_some() {
            // A different key: `qpn` was not cached.
            self.stats.evictions += 1;
        }
        Some(false)
    }

    /// Drops `qpn`'s context (QP destroyed).
    pub(crate) fn remove(&mut self, qpn: u32) {
        if let Some(lru) = self.lru.as_mut() {
            lru.pop(&qpn);
        }
        if self.mru == qpn {
            self.mru = NO_QPN;
        }
    }

    /// The counters, with the current occupancy.
    pub(crate) fn snapshot(&self) -> QpcStats {
        QpcStats {
            resident: self.lru.as_ref().map_or(0, |l| l.len() as u64),
            ..self.stats
        }
    }
}

/// Busy-waits for `d` (a NIC stalled on a context fetch; the caller holds the fabric lock).
pub(crate) fn spin_for(d: Duration) {
    if d.is_zero() {
        return;
    }
    let start = Instant::now();
    while start.elapsed() < d {
        std::hint::spin_loop();
    }
}
