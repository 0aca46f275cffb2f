//! Connection grouping and virtualized mapping (seeds/003 §3, §4), as a sans-I/O state
//! machine: connections join groups of at most `G`; the server serves one group at a time
//! for a time slice; the groups share a message pool of two *banks* of `G × K` slots, so
//! the slots the server scans (and the NIC's QP-context working set) stay bounded by two
//! groups however many connections there are.
//!
//! # Mapping
//! Connection `c` is member `m` of group `g` (`c = g·G + m`). While `g` owns bank `b`, the
//! client's slot `j` (`0 ≤ j < K`) is pool slot `b·G·K + m·K + j` ([`Scheduler::pool_slot`]);
//! the client learns its base `b·G·K + m·K` from the activation notice.
//!
//! Connection ids are reused: a connection that left ([`Scheduler::release`]: disconnected,
//! failed, or evicted and closed) frees its id, and the next [`Scheduler::join`] takes the
//! lowest free id, so churn never exhausts the table and groups stay filled. A group with no
//! connection is skipped by the rotation.
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
//!    acknowledged, failed, or was evicted *and closed*. Only then can it be given to the next
//!    warm-up, so no request is lost or served twice across a switch: every request a client
//!    wrote into the bank was served before it acknowledged, and an evicted client's QP is
//!    gone before its slots change hands.
//!
//! If the other bank is still draining when warm-up is due, warm-up waits and the active
//! group's slice is extended ([`SchedStats::warmup_delays`]).
//!
//! With a single group (grouping off, or fewer connections than `G`) there is no switch: the
//! group owns bank 0 for ever.
//!
//! # Acknowledgement deadline and eviction (this implementation's liveness rule)
//! seeds/003 has no rule for a client that never acknowledges; without one a stopped client
//! that hangs holds its bank, and with it the rotation, for ever. Here:
//! - A stopping client that has not acknowledged after `ack_timeout` is *evicted*:
//!   [`Notice::Evict`] (the server tells the client, which fails its calls, then destroys the
//!   QP and calls [`Scheduler::on_closed`]). The bank stays held until the close, and at most
//!   `ack_timeout` more ([`Notice::Close`]: close now, whether the client was told or not).
//! - The deadline runs on a *served clock*: a gap between two [`Scheduler::tick`]s counts as
//!   at most `ack_timeout / 4`. Time the server's own loop did not run (descheduled, stopped,
//!   a long handler) is not charged to its clients: a client whose acknowledgement could not
//!   be read, or whose calls could not be answered, while the server was paused gets a fresh
//!   share of the deadline once it runs again. A server loop that ticks at least every
//!   `ack_timeout / 4` evicts after `ack_timeout` of wall time; one that ticks more rarely,
//!   after 4 ticks.
//! - Only [`Scheduler::tick`] evicts. The server reads every acknowledgement already in its
//!   CQ *before* it ticks, so a client that acknowledged in time is never evicted because the
//!   server was late to read it; and an acknowledgement ([`Scheduler::on_ack`]) never evicts
//!   its group's other members (their acknowledgements may be next in the same batch).

/// Reserved epoch values: epochs skip them, so an epoch is never mistaken for a hello or a
/// goodbye in the acknowledgement word ([`super::ACK_HELLO`], [`super::ACK_BYE`]).
const EPOCH_LIMIT: u32 = super::ACK_BYE;

/// What the server must do for one client.
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
    /// The client missed the acknowledgement deadline: tell it it is evicted, then close the
    /// connection (destroy its QP) and report [`Scheduler::on_closed`]. Its group's bank is
    /// held until then (module docs).
    Evict {
        /// Connection.
        conn: u32,
    },
    /// An evicted connection was not closed within `ack_timeout` (its eviction notice never
    /// completed): close it now. The scheduler already counts it as closed.
    Close {
        /// Connection.
        conn: u32,
    },
}

/// Per-connection scheduling state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnState {
    /// No connection has this id (never joined, or released): free for the next join.
    Free,
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
        /// Served-clock time (ns, module docs) of the stop notice.
        since: u64,
    },
    /// Evicted ([`Notice::Evict`]), not closed yet: still holds its bank.
    Evicting {
        /// Served-clock time (ns) of the eviction.
        since: u64,
    },
    /// Failed, or evicted and closed: counts as drained, never activated again; its id is
    /// reused after [`Scheduler::release`].
    Dead,
}

impl ConnState {
    /// Whether a connection holds this id (anything but [`ConnState::Free`]).
    fn joined(self) -> bool {
        self != ConnState::Free
    }

    /// Whether the connection takes part in the rotation (joined, not dead or evicted).
    fn live(self) -> bool {
        !matches!(
            self,
            ConnState::Free | ConnState::Dead | ConnState::Evicting { .. }
        )
    }
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
    /// Of those, closed by the close deadline ([`Notice::Close`]) rather than
    /// [`Scheduler::on_closed`].
    pub forced_closes: u64,
    /// Connection ids released for reuse ([`Scheduler::release`]).
    pub released: u64,
}

/// The scheduler. Times are nanoseconds on any monotonic clock the caller uses.
#[derive(Debug)]
pub struct Scheduler {
    group_size: u32,
    k: u32,
    slice_ns: u64,
    warmup_ns: u64,
    ack_timeout_ns: u64,
    /// Longest gap between two ticks the served clock charges (module docs).
    stall_ns: u64,
    conns: Vec<ConnState>,
    /// Free ids below `conns.len()`.
    free: Vec<u32>,
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
    /// Served clock (ns) and the caller's time of the last tick.
    served: u64,
    last_tick: Option<u64>,
    stats: SchedStats,
}

impl Scheduler {
    /// A scheduler for groups of `group_size` connections with `k` slots each, slices of
    /// `slice_ns`, warm-up `warmup_ns` before a slice ends, evicting a stopped client that
    /// has not acknowledged after `ack_timeout_ns` of served time (module docs).
    ///
    /// # Panics
    /// If `group_size` or `k` is 0 or `group_size * k * 2` does not fit below
    /// [`super::CTRL_EVICT`] (pool slot numbers must not collide with the control words).
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
                .is_some_and(|x| x < super::CTRL_EVICT),
            "pool too large"
        );
        Scheduler {
            group_size,
            k,
            slice_ns,
            warmup_ns: warmup_ns.min(slice_ns),
            ack_timeout_ns,
            stall_ns: ack_timeout_ns / 4,
            conns: Vec::new(),
            free: Vec::new(),
            bank_of: Vec::new(),
            owner: [None, None],
            draining: [false, false],
            active: None,
            warming: None,
            slice_start: 0,
            epoch: 0,
            served: 0,
            last_tick: None,
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

    /// Connections joined and not released.
    pub fn num_conns(&self) -> u32 {
        (self.conns.len() - self.free.len()) as u32
    }

    /// Connection ids in use or free for reuse: ids are below this.
    pub fn id_bound(&self) -> u32 {
        self.conns.len() as u32
    }

    /// Groups (the last may be partial; a group may be empty after releases).
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

    /// The served clock (ns): the caller's time with long gaps between ticks shortened to
    /// `ack_timeout / 4` (module docs).
    pub fn served_ns(&self) -> u64 {
        self.served
    }

    /// Group of connection `c` and its member index.
    #[inline]
    pub fn group_of(&self, c: u32) -> (u32, u32) {
        (c / self.group_size, c % self.group_size)
    }

    /// Connection ids of group `g` (some may be free).
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

    /// Adds a connection at time `now`, taking the lowest free id (a released one, else the
    /// next new one); if its group owns a bank that is not draining, the client is activated
    /// at once (`notify`). Returns its id.
    pub fn join(&mut self, now: u64, notify: &mut impl FnMut(Notice)) -> u32 {
        let c = match self.free.iter().enumerate().min_by_key(|&(_, &c)| c) {
            Some((i, _)) => self.free.swap_remove(i),
            None => {
                self.conns.push(ConnState::Free);
                self.conns.len() as u32 - 1
            }
        };
        self.conns[c as usize] = ConnState::Idle;
        let (g, _) = self.group_of(c);
        while self.bank_of.len() <= g as usize {
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

    /// Frees id `c` of a connection that is gone for good (the caller destroyed its QP and
    /// cleared its slots): a later [`Scheduler::join`] may reuse it. A connection still in
    /// the rotation is first treated as failed ([`Scheduler::on_failed`]); an evicted one
    /// as closed. Returns whether `c` was joined.
    pub fn release(&mut self, c: u32) -> bool {
        let Some(&s) = self.conns.get(c as usize) else {
            return false;
        };
        if !s.joined() {
            return false;
        }
        self.conns[c as usize] = ConnState::Free;
        self.free.push(c);
        self.stats.released += 1;
        self.check_group(c);
        true
    }

    fn assign(&mut self, g: u32, b: usize) {
        self.owner[b] = Some(g);
        self.draining[b] = false;
        self.bank_of[g as usize] = Some(b as u8);
    }

    fn activate(&mut self, c: u32, b: u32, notify: &mut impl FnMut(Notice)) {
        if self.conns[c as usize] != ConnState::Idle {
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

    /// The group after `g` in the rotation that has a live member, if any other than `g`.
    fn next_group(&self, g: u32) -> Option<u32> {
        let groups = self.num_groups();
        (1..groups)
            .map(|i| (g + i) % groups)
            .find(|&h| self.members(h).any(|c| self.conns[c as usize].live()))
    }

    /// Advances time to `now`: evicts clients past the acknowledgement deadline and closes
    /// evicted ones past the close deadline, frees drained banks, starts a warm-up, switches
    /// groups. Notices go to `notify`. Read the acknowledgements already received
    /// ([`Scheduler::on_ack`]) before calling this (module docs).
    pub fn tick(&mut self, now: u64, notify: &mut impl FnMut(Notice)) {
        let gap = self.last_tick.map_or(0, |t| now.saturating_sub(t));
        self.served += gap.min(self.stall_ns);
        self.last_tick = Some(now);
        for b in 0..2 {
            if self.draining[b] {
                self.evict_overdue(b, notify);
                self.check_drained(b);
            }
        }
        let Some(active) = self.active else { return };
        let elapsed = now.saturating_sub(self.slice_start);
        if self.warming.is_none() && elapsed + self.warmup_ns >= self.slice_ns {
            let Some(next) = self.next_group(active) else {
                return;
            };
            let b = 1 - self.bank_of[active as usize].expect("active group owns a bank") as usize;
            if self.owner[b].is_some() && self.draining[b] {
                self.stats.warmup_delays += 1;
            } else {
                self.epoch = (self.epoch + 1) % EPOCH_LIMIT;
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
                    self.conns[c as usize] = ConnState::Stopping {
                        epoch,
                        since: self.served,
                    };
                    notify(Notice::Stop { conn: c, epoch });
                }
            }
            self.active = Some(next);
            self.warming = None;
            self.slice_start = now;
            self.stats.switches += 1;
            self.check_drained(b);
        }
    }

    /// Evicts the members of bank `b`'s group past the acknowledgement deadline; closes
    /// evicted ones past the close deadline.
    #[cold]
    fn evict_overdue(&mut self, b: usize, notify: &mut impl FnMut(Notice)) {
        let Some(g) = self.owner[b] else { return };
        for c in self.members(g) {
            match self.conns[c as usize] {
                ConnState::Stopping { since, .. }
                    if self.served.saturating_sub(since) >= self.ack_timeout_ns =>
                {
                    self.conns[c as usize] = ConnState::Evicting { since: self.served };
                    self.stats.evictions += 1;
                    notify(Notice::Evict { conn: c });
                }
                ConnState::Evicting { since }
                    if self.served.saturating_sub(since) >= self.ack_timeout_ns =>
                {
                    self.conns[c as usize] = ConnState::Dead;
                    self.stats.forced_closes += 1;
                    notify(Notice::Close { conn: c });
                }
                _ => {}
            }
        }
    }

    /// Frees bank `b` if every member of its group is drained (idle, dead or free). Never
    /// evicts.
    fn check_drained(&mut self, b: usize) {
        if !self.draining[b] {
            return;
        }
        let Some(g) = self.owner[b] else { return };
        let done = self.members(g).all(|c| {
            matches!(
                self.conns[c as usize],
                ConnState::Idle | ConnState::Dead | ConnState::Free
            )
        });
        if done {
            self.owner[b] = None;
            self.draining[b] = false;
            self.bank_of[g as usize] = None;
        }
    }

    /// Re-checks the bank of `c`'s group, if it is draining.
    fn check_group(&mut self, c: u32) {
        let (g, _) = self.group_of(c);
        if let Some(b) = self.bank_of.get(g as usize).copied().flatten() {
            self.check_drained(b as usize);
        }
    }

    /// Client `c` acknowledged stop `epoch` with nothing outstanding. Returns whether the
    /// acknowledgement was accepted (else counted in [`SchedStats::bad_acks`]). Frees the
    /// bank if this was the last member it waited for; never evicts (module docs).
    pub fn on_ack(&mut self, c: u32, epoch: u32) -> bool {
        match self.conns.get(c as usize) {
            Some(ConnState::Stopping { epoch: e, .. }) if *e == epoch => {
                self.conns[c as usize] = ConnState::Idle;
                self.stats.acks += 1;
                self.check_group(c);
                true
            }
            _ => {
                self.stats.bad_acks += 1;
                false
            }
        }
    }

    /// Connection `c` failed (its QP is in error): it counts as drained from now on.
    pub fn on_failed(&mut self, c: u32) {
        if let Some(s) = self.conns.get_mut(c as usize)
            && s.joined()
        {
            *s = ConnState::Dead;
            self.check_group(c);
        }
    }

    /// Evicted connection `c` was closed (its QP destroyed after the eviction notice
    /// completed): its bank may change hands. Returns whether `c` was being evicted.
    pub fn on_closed(&mut self, c: u32) -> bool {
        match self.conns.get(c as usize) {
            Some(ConnState::Evicting { .. }) => {
                self.conns[c as usize] = ConnState::Dead;
                self.check_group(c);
                true
            }
            _ => false,
        }
    }

    /// Whether a request found while scanning connection `c`'s slots may be served: `c` is
    /// active or stopping (draining).
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
        assert!(!s.on_ack(0, 7), "wrong epoch");
        assert!(s.on_ack(0, 0));
        assert!(s.on_ack(1, 0));
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
        s.on_failed(1); // the warmed client died: still switchable later
        for t in (105..150).step_by(5) {
            assert!(!collect(&mut s, t).contains(&Notice::Evict { conn: 0 }));
        }
        assert!(matches!(
            s.conn_state(0),
            Some(ConnState::Stopping { epoch: 0, .. })
        ));
        assert!(collect(&mut s, 150).contains(&Notice::Evict { conn: 0 }));
        assert!(matches!(s.conn_state(0), Some(ConnState::Evicting { .. })));
        assert_eq!(s.stats().evictions, 1);
        assert!(s.on_closed(0));
        assert_eq!(s.conn_state(0), Some(ConnState::Dead));
        // Dead connections are never activated again.
        for t in (200..2000).step_by(10) {
            for n in collect(&mut s, t) {
                if let Notice::Activate { conn, .. } = n {
                    assert_eq!(conn, 2);
                }
            }
        }
    }

    /// The server read the group's acknowledgements late (its loop was paused past the
    /// deadline, no tick in between): the first acknowledgement must not evict the
    /// sibling whose acknowledgement is next in the same batch.
    #[test]
    fn an_acknowledgement_never_evicts_its_siblings() {
        let mut s = Scheduler::new(2, 1, 100, 20, 50);
        for _ in 0..4 {
            s.join(0, &mut |_| {});
        }
        collect(&mut s, 80);
        collect(&mut s, 100); // conns 0 and 1 stopping
        // Paused: the next thing the server does, far past the deadline, is read the acks.
        assert!(s.on_ack(0, 0));
        assert!(matches!(s.conn_state(1), Some(ConnState::Stopping { .. })));
        assert!(s.on_ack(1, 0), "the sibling's acknowledgement is accepted");
        assert_eq!(s.stats().evictions, 0);
        assert_eq!(s.serving().collect::<Vec<_>>(), vec![1], "bank 0 drained");
        assert!(
            collect(&mut s, 10_000)
                .iter()
                .all(|n| !matches!(n, Notice::Evict { .. }))
        );
    }

    /// A long gap between ticks (the server loop did not run) counts as `ack_timeout / 4`:
    /// a stopped client is evicted only after `ack_timeout` of time the server ran.
    #[test]
    fn a_server_pause_is_not_charged_to_its_clients() {
        let mut s = Scheduler::new(1, 1, 100, 10, 40);
        for _ in 0..2 {
            s.join(0, &mut |_| {});
        }
        collect(&mut s, 90);
        collect(&mut s, 100); // conn 0 stopping, served 0 + ...
        let stopped_at = s.served_ns();
        assert!(collect(&mut s, 100_000).is_empty(), "a pause evicts nobody");
        assert_eq!(s.served_ns(), stopped_at + 10);
        assert!(matches!(s.conn_state(0), Some(ConnState::Stopping { .. })));
        // The server runs again: 30 more ns of served time reach the deadline.
        let mut t = 100_000;
        let mut evicted_at = None;
        while evicted_at.is_none() {
            t += 5;
            if collect(&mut s, t).contains(&Notice::Evict { conn: 0 }) {
                evicted_at = Some(t);
            }
        }
        assert_eq!(evicted_at, Some(100_030));
        // An acknowledgement that arrives late (after eviction) is refused.
        assert!(!s.on_ack(0, 0));
    }

    /// An evicted connection holds its bank until it is closed: by `on_closed`, else by the
    /// close deadline (`Notice::Close`, `ack_timeout` later).
    #[test]
    fn an_evicted_connection_holds_the_bank_until_closed() {
        let mut s = Scheduler::new(1, 1, 100, 10, 200);
        for _ in 0..3 {
            s.join(0, &mut |_| {});
        }
        collect(&mut s, 90);
        collect(&mut s, 100); // conn 0 stopping (bank 0), conn 1 active on bank 1
        let mut t = 100;
        let mut notices = Vec::new();
        while !notices.contains(&Notice::Evict { conn: 0 }) {
            t += 5;
            notices = collect(&mut s, t);
        }
        // Warm-up of group 2 waits for bank 0 while conn 0 is being evicted.
        let delays = s.stats().warmup_delays;
        let mut closed = false;
        let mut warmed = false;
        while !warmed {
            t += 5;
            for n in collect(&mut s, t) {
                closed |= n == Notice::Close { conn: 0 };
                if let Notice::Activate { conn: 2, base, .. } = n {
                    assert!(closed, "bank 0 given away before conn 0 was closed");
                    assert_eq!(base, 0);
                    warmed = true;
                }
            }
            assert!(t < 10_000);
        }
        assert!(s.stats().warmup_delays > delays);
        assert_eq!(s.stats().forced_closes, 1);
        assert_eq!(s.conn_state(0), Some(ConnState::Dead));
        assert!(!s.on_closed(0), "already closed by the deadline");
        assert!(warmed);
    }

    /// Released ids are reused (lowest first), and a group without connections is skipped.
    #[test]
    fn released_ids_are_reused_and_empty_groups_skipped() {
        let mut s = Scheduler::new(2, 1, 100, 20, 1000);
        for _ in 0..4 {
            s.join(0, &mut |_| {});
        }
        assert!(s.release(1));
        assert!(!s.release(1), "released twice");
        assert_eq!(s.num_conns(), 3);
        let mut v = Vec::new();
        assert_eq!(s.join(1, &mut |n| v.push(n)), 1, "the free id is reused");
        assert_eq!(
            v,
            vec![Notice::Activate {
                conn: 1,
                base: 1,
                epoch: 0
            }],
            "its group is active: activated at once, on the same slots"
        );
        assert!(s.release(2) && s.release(3));
        // Group 1 is empty: no warm-up, no switch, however long.
        for t in (0..2000).step_by(10) {
            assert!(collect(&mut s, t).is_empty());
        }
        assert_eq!((s.stats().switches, s.stats().warmups), (0, 0));
        assert_eq!(s.join(2000, &mut |_| {}), 2);
        for t in (2000..2400).step_by(10) {
            collect(&mut s, t);
        }
        assert!(
            s.stats().switches > 0,
            "rotation resumes once group 1 has a member"
        );
        assert_eq!(s.stats().released, 3);
    }

    /// Epochs skip the values reserved for hello and goodbye.
    #[test]
    fn epochs_skip_the_reserved_words() {
        let mut s = Scheduler::new(1, 1, 100, 10, 1000);
        for _ in 0..2 {
            s.join(0, &mut |_| {});
        }
        s.epoch = EPOCH_LIMIT - 1;
        let mut seen = Vec::new();
        let mut t = 0;
        while seen.len() < 3 {
            t += 10;
            for n in collect(&mut s, t) {
                match n {
                    Notice::Activate { epoch, .. } => seen.push(epoch),
                    Notice::Stop { conn, epoch } => {
                        assert!(s.on_ack(conn, epoch));
                    }
                    _ => {}
                }
            }
        }
        assert_eq!(seen[0], 0, "wrapped before {}", super::super::ACK_BYE);
        assert!(seen.iter().all(|&e| e < EPOCH_LIMIT));
    }
}
