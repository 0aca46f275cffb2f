//! Connection grouping and virtualized mapping (seeds/003 §3, §4), as a sans-I/O state
//! machine: connections join groups of at most `G`; the server serves one group at a time
//! for a time slice; the groups share a message pool of two *banks* of `G × K` slots, so
//! the slots the server scans (and the NIC's QP-context working set) stay bounded by two
//! groups however many connections there are.
//!
//! # Mapping
//! Connection `c` is member `m` of group `g` (`c = g·G + m` in join order). While `g` owns
//! bank `b`, the client's slot `j` (`0 ≤ j < K`) is pool slot `b·G·K + m·K + j`
//! ([`Scheduler::pool_slot`]); the client learns its base `b·G·K + m·K` from the activation
//! notice.
//!
//! # Slices and switches (seeds/003 §3; the paper's time-sliced group scheduling)
//! 1. *Warm-up.* `warmup` before the active group's slice ends, the next group gets the other
//!    bank and an [`Notice::Activate`]: its clients start writing requests there (prefetch),
//!    which the server does not serve yet.
//! 2. *Switch.* When the slice ends (and the next group is warmed up), the active group's
//!    clients get [`Notice::Stop`] and the warmed group becomes active; its requests are
//!    already waiting. The old bank keeps being served ("draining").
//! 3. *Drain.* A stopped client stops issuing and acknowledges once it has no call
//!    outstanding ([`Scheduler::on_ack`]); the bank is free again once every member
//!    acknowledged (or failed, or missed the ack deadline and was evicted). Only then can
//!    it be given to the next warm-up, so no request is lost or served twice across a
//!    switch: every request a client wrote into the bank was served before it acknowledged.
//!
//! If the other bank is still draining when warm-up is due, warm-up waits and the active
//! group's slice is extended ([`SchedStats::warmup_delays`]).
//!
//! With a single group (grouping off, or fewer connections than `G`) there is no switch: the
//! group owns bank 0 for ever.

/// What the server must tell one client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Notice {
    /// Start issuing: your slot `j` is pool slot `base + j` (seeds/003 §4 mapping), epoch
    /// `epoch`.
    Activate {
        /// Connection.
        conn: u32,
        /// Pool slot of the client's slot 0.
        base: u32,
        /// Activation epoch (echoed in the client's acknowledgement).
        epoch: u32,
    },
    /// Stop issuing; acknowledge with `epoch` once nothing is outstanding.
    Stop {
        /// Connection.
        conn: u32,
        /// Epoch of the activation being ended.
        epoch: u32,
    },
}

/// Per-connection scheduling state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnState {
    /// Its group is neither active nor warming up.
    Idle,
    /// Activated (warming up or active) in `epoch`, base `base`.
    Active {
        /// Epoch.
        epoch: u32,
        /// Pool slot of slot 0.
        base: u32,
    },
    /// Told to stop in `epoch`; waiting for its acknowledgement.
    Stopping {
        /// Epoch.
        epoch: u32,
        /// Time (ns, scheduler clock) of the stop notice.
        since: u64,
    },
    /// Failed or evicted: counts as drained, never activated again.
    Dead,
}

/// Counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedStats {
    /// Group switches.
    pub switches: u64,
    /// Warm-ups started.
    pub warmups: u64,
    /// Warm-ups that had to wait for the other bank to drain.
    pub warmup_delays: u64,
    /// Acknowledgements accepted.
    pub acks: u64,
    /// Acknowledgements ignored (wrong epoch, not stopping, unknown connection).
    pub bad_acks: u64,
    /// Connections evicted for missing the acknowledgement deadline.
    pub evictions: u64,
}

/// The scheduler. Times are nanoseconds on any monotonic clock the caller uses.
#[derive(Debug)]
pub struct Scheduler {
    group_size: u32,
    k: u32,
    slice_ns: u64,
    warmup_ns: u64,
    ack_timeout_ns: u64,
    conns: Vec<ConnState>,
    /// Bank owned by each group, if any.
    bank_of: Vec<Option<u8>>,
    /// Group owning each bank.
    owner: [Option<u32>; 2],
    /// Bank is draining (its group was stopped).
    draining: [bool; 2],
    active: Option<u32>,
    warming: Option<u32>,
    slice_start: u64,
    epoch: u32,
    stats: SchedStats,
}

impl Scheduler {
    /// A scheduler for groups of `group_size` connections with `k` slots each, slices of
    /// `slice_ns`, warm-up `warmup_ns` before a slice ends, evicting a stopped client that
    /// has not acknowledged after `ack_timeout_ns`.
    ///
    /// # Panics
    /// If `group_size` or `k` is 0 or `group_size * k * 2` overflows `u32`.
    pub fn new(
        group_size: u32,
        k: u32,
        slice_ns: u64,
        warmup_ns: u64,
        ack_timeout_ns: u64,
    ) -> Self {
        assert!(
            group_size > 0 && k > 0,
            "group size and slots per connection must be > 0"
        );
        assert!(
            group_size
                .checked_mul(k)
                .and_then(|x| x.checked_mul(2))
                .is_some(),
            "pool too large"
        );
        Scheduler {
            group_size,
            k,
            slice_ns,
            warmup_ns: warmup_ns.min(slice_ns),
            ack_timeout_ns,
            conns: Vec::new(),
            bank_of: Vec::new(),
            owner: [None, None],
            draining: [false, false],
            active: None,
            warming: None,
            slice_start: 0,
            epoch: 0,
            stats: SchedStats::default(),
        }
    }

    /// Pool slots the mapping uses: two banks of `G × K` (one when there can be only one group).
    pub fn pool_slots(group_size: u32, k: u32, max_conns: u32) -> u32 {
        let banks = if max_conns > group_size { 2 } else { 1 };
        banks * group_size * k
    }

    /// Counters.
    pub fn stats(&self) -> &SchedStats {
        &self.stats
    }

    /// Connections joined.
    pub fn num_conns(&self) -> u32 {
        self.conns.len() as u32
    }

    /// Groups (the last may be partial).
    pub fn num_groups(&self) -> u32 {
        self.conns.len().div_ceil(self.group_size as usize) as u32
    }

    /// State of connection `c`.
    pub fn conn_state(&self, c: u32) -> Option<ConnState> {
        self.conns.get(c as usize).copied()
    }

    /// The active group.
    pub fn active_group(&self) -> Option<u32> {
        self.active
    }

    /// The group warming up.
    pub fn warming_group(&self) -> Option<u32> {
        self.warming
    }

    /// Group of connection `c` and its member index.
    #[inline]
    pub fn group_of(&self, c: u32) -> (u32, u32) {
        (c / self.group_size, c % self.group_size)
    }

    /// Connections of group `g`.
    pub fn members(&self, g: u32) -> std::ops::Range<u32> {
        let start = g * self.group_size;
        start..(start + self.group_size).min(self.conns.len() as u32)
    }

    /// The pool slot of client slot `j` of connection `c`, if `c`'s group owns a bank.
    #[inline]
    pub fn pool_slot(&self, c: u32, j: u32) -> Option<u32> {
        let (g, m) = self.group_of(c);
        let b = (*self.bank_of.get(g as usize)?)? as u32;
        Some(b * self.group_size * self.k + m * self.k + j)
    }

    /// Groups whose banks the server must scan: the active one (first) and a draining one.
    pub fn serving(&self) -> impl Iterator<Item = u32> + '_ {
        let draining = (0..2).filter_map(|b| {
            if self.draining[b] {
                self.owner[b]
            } else {
                None
            }
        });
        self.active.into_iter().chain(draining)
    }

    /// Adds a connection (the next id) at time `now`; if its group owns a bank, the client is
    /// activated at once (`notify`).
    pub fn join(&mut self, now: u64, notify: &mut impl FnMut(Notice)) -> u32 {
        let c = self.conns.len() as u32;
        self.conns.push(ConnState::Idle);
        let (g, _) = self.group_of(c);
        if self.bank_of.len() <= g as usize {
            self.bank_of.push(None);
        }
        if self.active.is_none() {
            self.active = Some(g);
            self.slice_start = now;
            self.assign(g, 0);
        }
        if let Some(b) = self.bank_of[g as usize]
            && !self.draining[b as usize]
        {
            self.activate(c, b as u32, notify);
        }
        c
    }

    fn assign(&mut self, g: u32, b: usize) {
        self.owner[b] = Some(g);
        self.draining[b] = false;
        self.bank_of[g as usize] = Some(b as u8);
    }

    fn activate(&mut self, c: u32, b: u32, notify: &mut impl FnMut(Notice)) {
        if self.conns[c as usize] == ConnState::Dead {
            return;
        }
        let (_, m) = self.group_of(c);
        let base = b * self.group_size * self.k + m * self.k;
        self.conns[c as usize] = ConnState::Active {
            epoch: self.epoch,
            base,
        };
        notify(Notice::Activate {
            conn: c,
            base,
            epoch: self.epoch,
        });
    }

    /// Advances time: starts a warm-up, switches groups, evicts clients past the ack
    /// deadline, frees drained banks. Notices go to `notify`.
    pub fn tick(&mut self, now: u64, notify: &mut impl FnMut(Notice)) {
        let groups = self.num_groups();
        for b in 0..2 {
            if self.draining[b] {
                self.check_drained(b, now);
            }
        }
        let Some(active) = self.active else { return };
        if groups <= 1 {
            return;
        }
        let elapsed = now.saturating_sub(self.slice_start);
        if self.warming.is_none() && elapsed + self.warmup_ns >= self.slice_ns {
            let b = 1 - self.bank_of[active as usize].expect("active group owns a bank") as usize;
            if self.owner[b].is_some() && self.draining[b] {
                self.stats.warmup_delays += 1;
            } else {
                let next = (active + 1) % groups;
                self.epoch = self.epoch.wrapping_add(1);
                self.assign(next, b);
                self.warming = Some(next);
                self.stats.warmups += 1;
                for c in self.members(next) {
                    self.activate(c, b as u32, notify);
                }
            }
        }
        if elapsed >= self.slice_ns
            && let Some(next) = self.warming
        {
            let b = self.bank_of[active as usize].expect("active group owns a bank") as usize;
            self.draining[b] = true;
            for c in self.members(active) {
                if let ConnState::Active { epoch, .. } = self.conns[c as usize] {
                    self.conns[c as usize] = ConnState::Stopping { epoch, since: now };
                    notify(Notice::Stop { conn: c, epoch });
                }
            }
            self.active = Some(next);
            self.warming = None;
            self.slice_start = now;
            self.stats.switches += 1;
            self.check_drained(b, now);
        }
    }

    /// Frees bank `b` if every member of its group is drained; evicts members past the
    /// deadline.
    fn check_drained(&mut self, b: usize, now: u64) {
        if !self.draining[b] {
            return;
        }
        let Some(g) = self.owner[b] else { return };
        let mut done = true;
        for c in self.members(g) {
            match self.conns[c as usize] {
                ConnState::Stopping { since, .. } => {
                    if now.saturating_sub(since) >= self.ack_timeout_ns {
                        self.conns[c as usize] = ConnState::Dead;
                        self.stats.evictions += 1;
                    } else {
                        done = false;
                    }
                }
                ConnState::Active { .. } => done = false,
                ConnState::Idle | ConnState::Dead => {}
            }
        }
        if done {
            self.owner[b] = None;
            self.draining[b] = false;
            self.bank_of[g as usize] = None;
        }
    }

    /// Client `c` acknowledged stop `epoch` with nothing outstanding. Returns whether the
    /// acknowledgement was accepted (else counted in [`SchedStats::bad_acks`]).
    pub fn on_ack(&mut self, c: u32, epoch: u32, now: u64) -> bool {
        match self.conns.get(c as usize) {
            Some(ConnState::Stopping { epoch: e, .. }) if *e == epoch => {
                self.conns[c as usize] = ConnState::Idle;
                self.stats.acks += 1;
                let (g, _) = self.group_of(c);
                if let Some(b) = self.bank_of[g as usize] {
                    self.check_drained(b as usize, now);
                }
                true
            }
            _ => {
                self.stats.bad_acks += 1;
                false
            }
        }
    }

    /// Connection `c` failed (its QP is in error): it counts as drained from now on.
    pub fn on_failed(&mut self, c: u32, now: u64) {
        if let Some(s) = self.conns.get_mut(c as usize) {
            *s = ConnState::Dead;
            let (g, _) = self.group_of(c);
            if let Some(b) = self.bank_of[g as usize] {
                self.check_drained(b as usize, now);
            }
        }
    }

    /// Whether a request found in pool slot `p` while scanning connection `c`'s slots may
    /// be served: `c` is active or stopping (draining) and `p` is within its mapping.
    #[inline]
    pub fn may_serve(&self, c: u32) -> bool {
        matches!(
            self.conns.get(c as usize),
            Some(ConnState::Active { .. } | ConnState::Stopping { .. })
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(s: &mut Scheduler, now: u64) -> Vec<Notice> {
        let mut v = Vec::new();
        s.tick(now, &mut |n| v.push(n));
        v
    }

    #[test]
    fn one_group_never_switches() {
        let mut s = Scheduler::new(4, 2, 100, 20, 1000);
        let mut v = Vec::new();
        for _ in 0..3 {
            s.join(0, &mut |n| v.push(n));
        }
        assert_eq!(v.len(), 3);
        assert!(collect(&mut s, 10_000).is_empty());
        assert_eq!(s.pool_slot(2, 1), Some(2 * 2 + 1));
        assert_eq!(s.stats().switches, 0);
    }

    #[test]
    fn warmup_switch_drain_cycle() {
        let mut s = Scheduler::new(2, 2, 100, 20, 10_000);
        let mut v = Vec::new();
        for _ in 0..4 {
            s.join(0, &mut |n| v.push(n));
        }
        // Group 0 (conns 0, 1) active on bank 0; group 1 idle.
        assert_eq!(v.len(), 2);
        assert_eq!(s.pool_slot(1, 0), Some(2));
        assert_eq!(s.pool_slot(2, 0), None);
        // Warm-up at 80: group 1 gets bank 1 (slots 4..8).
        let n = collect(&mut s, 80);
        assert_eq!(n.len(), 2);
        assert!(matches!(
            n[0],
            Notice::Activate {
                conn: 2,
                base: 4,
                epoch: 1
            }
        ));
        assert_eq!(s.pool_slot(3, 1), Some(7));
        // Switch at 100: group 0 stopped, group 1 active; bank 0 draining.
        let n = collect(&mut s, 100);
        assert_eq!(
            n,
            vec![
                Notice::Stop { conn: 0, epoch: 0 },
                Notice::Stop { conn: 1, epoch: 0 }
            ]
        );
        assert_eq!(s.active_group(), Some(1));
        assert_eq!(s.serving().collect::<Vec<_>>(), vec![1, 0]);
        // Next warm-up (group 0 again) must wait for the drain.
        assert!(collect(&mut s, 180).is_empty());
        assert_eq!(s.stats().warmup_delays, 1);
        assert!(!s.on_ack(0, 7, 181), "wrong epoch");
        assert!(s.on_ack(0, 0, 181));
        assert!(s.on_ack(1, 0, 182));
        assert_eq!(s.serving().collect::<Vec<_>>(), vec![1]);
        let n = collect(&mut s, 183);
        assert!(matches!(
            n[0],
            Notice::Activate {
                conn: 0,
                base: 0,
                epoch: 2
            }
        ));
    }

    #[test]
    fn silent_client_is_evicted_and_failed_client_counts_as_drained() {
        let mut s = Scheduler::new(1, 1, 100, 10, 50);
        let mut v = Vec::new();
        for _ in 0..3 {
            s.join(0, &mut |n| v.push(n));
        }
        collect(&mut s, 95);
        collect(&mut s, 100); // conn 0 stopping
        s.on_failed(1, 101); // the warmed client died: still switchable later
        collect(&mut s, 149);
        assert_eq!(
            s.conn_state(0),
            Some(ConnState::Stopping {
                epoch: 0,
                since: 100
            })
        );
        collect(&mut s, 150);
        assert_eq!(s.conn_state(0), Some(ConnState::Dead));
        assert_eq!(s.stats().evictions, 1);
        // Dead connections are never activated again.
        for t in (200..2000).step_by(10) {
            for n in collect(&mut s, t) {
                if let Notice::Activate { conn, .. } = n {
                    assert_eq!(conn, 2);
                }
            }
        }
    }
}
