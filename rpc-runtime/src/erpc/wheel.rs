//! Timing wheel for pacing packets of congested sessions (Carousel, Saeed et al.,
//! SIGCOMM 2017; eRPC's `timing_wheel`; seeds/002 §6.3 `rate_limiter`, seeds/000 §12.7).
//!
//! Time is cut into slots of `slot_width_ns`; the wheel holds `num_slots` of them, so it
//! covers a horizon of `slot_width_ns * num_slots` ns starting at the current slot. A packet
//! that Timely says may leave at absolute time `t` (ns, same clock as `now`) is filed under
//! the slot containing `t`:
//!
//! - `t` before the current slot: the current slot (it is overdue and goes out at the next
//!   [`TimingWheel::reap`]);
//! - `t` beyond the horizon: the last slot of the horizon. The entry keeps its real `t`:
//!   when the wheel turns past that slot it is re-filed, so it is never released early.
//!
//! [`TimingWheel::reap`] releases every entry with `t <= now`, in `t` order (ties in
//! insertion order), and turns the wheel past finished slots. Insertion is O(1); reaping
//! sorts each visited slot. Entries are small `Copy` values (session / slot / packet ids).
//!
//! [`TimingWheel::next_due`] is the earliest requested time (kept up to date on insert, reap
//! and purge, so reading it is O(1)); [`TimingWheel::purge`] removes entries by predicate
//! (the protocol core uses it when go-back-N rolls a slot back, so that no packet of a
//! rolled-back exchange stays queued: invariant I1 of seeds/002 §4).
//!
//! # Memory
//! Like eRPC's wheel, whose slots chain fixed-size buckets taken from a pool (seeds/000
//! §12.7), entries live in one node pool shared by all slots, each slot being a FIFO list
//! through it. The pool only grows when more entries wait at once than ever before, so once
//! warm the wheel allocates nothing, however entries are spread over the slots (per-slot
//! vectors would each grow on first use). Reaping sorts through one reused scratch vector.

/// End of a node list.
const NIL: u32 = u32::MAX;

/// A pooled entry: requested tx time, insertion sequence number (orders ties), the entry,
/// the next node of its list (or of the free list).
#[derive(Debug, Clone, Copy)]
struct Node<T> {
    t: u64,
    seq: u64,
    ent: T,
    next: u32,
}

/// Head and tail node of a slot's FIFO list (`NIL` when empty).
#[derive(Debug, Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
}

const EMPTY: List = List {
    head: NIL,
    tail: NIL,
};

/// A Carousel-style timing wheel of `T` entries (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct TimingWheel<T: Copy> {
    slot_width_ns: u64,
    /// Per slot, its entries in insertion order.
    slots: Vec<List>,
    /// The node pool; `free` heads the list of unused nodes.
    nodes: Vec<Node<T>>,
    free: u32,
    /// Index of the current slot.
    cur: usize,
    /// Start time of the current slot.
    base_ns: u64,
    len: usize,
    /// Earliest requested tx time of any entry (`u64::MAX` when empty).
    due: u64,
    /// Insertions so far (the next entry's sequence number).
    seq: u64,
    /// Reused buffer: (time, sequence, entry) of the slot being reaped (of all slots in
    /// `reap_all`).
    scratch: Vec<(u64, u64, T)>,
}

impl<T: Copy> TimingWheel<T> {
    /// An empty wheel whose current slot starts at `now_ns`.
    ///
    /// # Panics
    /// If `slot_width_ns` or `num_slots` is zero, `num_slots` reaches `u32::MAX`, or the
    /// horizon overflows `u64`.
    pub fn new(slot_width_ns: u64, num_slots: usize, now_ns: u64) -> TimingWheel<T> {
        Self::with_capacity(slot_width_ns, num_slots, now_ns, 0)
    }

    /// Like [`new`](Self::new), with room for `entries` waiting entries preallocated (the
    /// pool grows beyond that on demand and keeps its size).
    ///
    /// # Panics
    /// As [`new`](Self::new).
    pub fn with_capacity(
        slot_width_ns: u64,
        num_slots: usize,
        now_ns: u64,
        entries: usize,
    ) -> TimingWheel<T> {
        assert!(
            slot_width_ns > 0 && num_slots > 0,
            "slot width and slot count must be positive"
        );
        assert!(num_slots < NIL as usize, "too many slots");
        assert!(
            slot_width_ns.checked_mul(num_slots as u64).is_some(),
            "horizon overflows"
        );
        TimingWheel {
            slot_width_ns,
            slots: vec![EMPTY; num_slots],
            nodes: Vec::with_capacity(entries),
            free: NIL,
            cur: 0,
            base_ns: now_ns,
            len: 0,
            due: u64::MAX,
            seq: 0,
            scratch: Vec::with_capacity(entries),
        }
    }

    /// Slot width in ns.
    #[inline]
    pub fn slot_width_ns(&self) -> u64 {
        self.slot_width_ns
    }

    /// Number of slots.
    #[inline]
    pub fn num_slots(&self) -> usize {
        self.slots.len()
    }

    /// Span the wheel covers from the current slot's start, in ns.
    #[inline]
    pub fn horizon_ns(&self) -> u64 {
        self.slot_width_ns * self.slots.len() as u64
    }

    /// Start time of the current slot in ns.
    #[inline]
    pub fn current_slot_start_ns(&self) -> u64 {
        self.base_ns
    }

    /// Entries waiting.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no entries are waiting.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The earliest requested tx time (ns) of the waiting entries, if any: the time the next
    /// [`reap`](Self::reap) releases something. O(1).
    #[inline]
    pub fn next_due(&self) -> Option<u64> {
        (self.len > 0).then_some(self.due)
    }

    /// Files `ent` to leave at `abs_tx_time_ns` (clamped into the horizon as in the module
    /// docs).
    ///
    /// An entry more than a horizon past the current slot is parked; callers that let an
    /// empty wheel sit unreaped for long should [`reap`](Self::reap) it (which then just
    /// turns it, in O(1)) before inserting.
    ///
    /// # Panics
    /// If more than `u32::MAX - 1` entries would wait at once.
    pub fn insert(&mut self, ent: T, abs_tx_time_ns: u64) {
        self.seq += 1;
        self.file(ent, abs_tx_time_ns, self.seq);
        self.len += 1;
        self.due = self.due.min(abs_tx_time_ns);
    }

    /// Appends an entry to the slot for `t` relative to the current slot (no turning, no
    /// accounting: also used while re-filing).
    fn file(&mut self, ent: T, t: u64, seq: u64) {
        let off = t.saturating_sub(self.base_ns) / self.slot_width_ns;
        let off = off.min(self.slots.len() as u64 - 1) as usize;
        let idx = (self.cur + off) % self.slots.len();
        let node = Node {
            t,
            seq,
            ent,
            next: NIL,
        };
        let i = if self.free != NIL {
            let i = self.free;
            self.free = self.nodes[i as usize].next;
            self.nodes[i as usize] = node;
            i
        } else {
            assert!(self.nodes.len() < NIL as usize, "timing wheel full");
            self.nodes.push(node);
            (self.nodes.len() - 1) as u32
        };
        let list = &mut self.slots[idx];
        if list.tail == NIL {
            list.head = i;
        } else {
            self.nodes[list.tail as usize].next = i;
        }
        list.tail = i;
    }

    /// Moves the entries of slot `idx`, in insertion order, to the end of `scratch` and
    /// frees their nodes.
    fn take_slot(&mut self, idx: usize) {
        let mut i = std::mem::replace(&mut self.slots[idx], EMPTY).head;
        while i != NIL {
            let n = self.nodes[i as usize];
            self.scratch.push((n.t, n.seq, n.ent));
            self.nodes[i as usize].next = self.free;
            self.free = i;
            i = n.next;
        }
    }

    /// Removes every entry for which `pred` returns true and returns how many were removed.
    /// O(slots + entries); meant for rare events (retransmission, session teardown).
    pub fn purge(&mut self, mut pred: impl FnMut(&T) -> bool) -> usize {
        let mut removed = 0;
        for idx in 0..self.slots.len() {
            let mut prev = NIL;
            let mut i = self.slots[idx].head;
            while i != NIL {
                let n = self.nodes[i as usize];
                if pred(&n.ent) {
                    if prev == NIL {
                        self.slots[idx].head = n.next;
                    } else {
                        self.nodes[prev as usize].next = n.next;
                    }
                    if self.slots[idx].tail == i {
                        self.slots[idx].tail = prev;
                    }
                    self.nodes[i as usize].next = self.free;
                    self.free = i;
                    removed += 1;
                } else {
                    prev = i;
                }
                i = n.next;
            }
        }
        self.len -= removed;
        self.recompute_due();
        removed
    }

    /// The waiting entries, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().flat_map(move |l| {
            let mut i = l.head;
            std::iter::from_fn(move || {
                (i != NIL).then(|| {
                    let n = &self.nodes[i as usize];
                    i = n.next;
                    &n.ent
                })
            })
        })
    }

    /// Recomputes `due`. Slot `k` (counted from the current one) holds entries due in
    /// `[base + k*w, base + (k+1)*w)`, except that the current slot may also hold overdue
    /// entries and any slot may hold entries parked from beyond the horizon (due later than
    /// its range). So once the minimum seen so far is below the end of the slot being
    /// scanned, no later slot can hold anything earlier.
    fn recompute_due(&mut self) {
        self.due = u64::MAX;
        if self.len == 0 {
            return;
        }
        let n = self.slots.len();
        for k in 0..n {
            let mut i = self.slots[(self.cur + k) % n].head;
            while i != NIL {
                let node = &self.nodes[i as usize];
                self.due = self.due.min(node.t);
                i = node.next;
            }
            let slot_end = self
                .base_ns
                .saturating_add((k as u64 + 1) * self.slot_width_ns);
            if self.due < slot_end {
                return;
            }
        }
    }

    /// Appends to `out` every entry whose tx time is `<= now_ns`, in tx-time order (ties in
    /// insertion order), and turns the wheel so the current slot contains `now_ns`. A `now_ns`
    /// before the current slot releases nothing (no entry is due before it) and never turns
    /// the wheel backwards.
    pub fn reap(&mut self, now_ns: u64, out: &mut Vec<T>) {
        let had = self.len;
        self.reap_inner(now_ns, out);
        if self.len != had {
            self.recompute_due();
        }
    }

    fn reap_inner(&mut self, now_ns: u64, out: &mut Vec<T>) {
        let w = self.slot_width_ns;
        if self.len == 0 {
            if now_ns > self.base_ns {
                self.base_ns += (now_ns - self.base_ns) / w * w;
            }
            return;
        }
        if now_ns >= self.base_ns && now_ns - self.base_ns >= self.horizon_ns() {
            self.reap_all(now_ns, out);
            return;
        }
        loop {
            let slot_end = self.base_ns + w;
            self.scratch.clear();
            self.take_slot(self.cur);
            self.scratch.sort_unstable_by_key(|&(t, seq, _)| (t, seq));
            // Entries parked here from beyond the horizon may be due too, but later slots
            // can hold earlier ones: release only this slot's range, re-file the rest.
            let limit = now_ns.min(slot_end - 1);
            let due = self.scratch.partition_point(|&(t, _, _)| t <= limit);
            out.extend(self.scratch[..due].iter().map(|&(_, _, e)| e));
            self.len -= due;
            if slot_end > now_ns {
                // `now` is inside (or before) this slot: keep the rest, in time order.
                for k in due..self.scratch.len() {
                    let (t, seq, e) = self.scratch[k];
                    self.file(e, t, seq);
                }
                return;
            }
            // The slot is over; whatever is left was parked from beyond the horizon.
            self.cur = (self.cur + 1) % self.slots.len();
            self.base_ns = slot_end;
            for k in due..self.scratch.len() {
                let (t, seq, e) = self.scratch[k];
                self.file(e, t, seq);
            }
            if self.len == 0 {
                self.base_ns += (now_ns - self.base_ns) / w * w;
                return;
            }
        }
    }

    /// Reap when `now` is a whole horizon or more past the current slot: every slot is due,
    /// so collect all entries, release the due ones sorted, and re-file the rest.
    fn reap_all(&mut self, now_ns: u64, out: &mut Vec<T>) {
        let w = self.slot_width_ns;
        let n = self.slots.len();
        self.scratch.clear();
        for k in 0..n {
            self.take_slot((self.cur + k) % n);
        }
        self.scratch.sort_unstable_by_key(|&(t, seq, _)| (t, seq));
        let due = self.scratch.partition_point(|&(t, _, _)| t <= now_ns);
        out.extend(self.scratch[..due].iter().map(|&(_, _, e)| e));
        self.len -= due;
        self.base_ns += (now_ns - self.base_ns) / w * w;
        self.cur = 0;
        for k in due..self.scratch.len() {
            let (t, seq, e) = self.scratch[k];
            self.file(e, t, seq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reap(w: &mut TimingWheel<u32>, now: u64) -> Vec<u32> {
        let mut out = Vec::new();
        w.reap(now, &mut out);
        out
    }

    #[test]
    fn releases_in_time_order_only_when_due() {
        let mut w = TimingWheel::new(100, 8, 1000);
        w.insert(3, 1350);
        w.insert(1, 1120);
        w.insert(2, 1150);
        w.insert(0, 1010);
        assert_eq!(w.len(), 4);
        assert_eq!(reap(&mut w, 999), Vec::<u32>::new());
        assert_eq!(reap(&mut w, 1009), Vec::<u32>::new());
        assert_eq!(reap(&mut w, 1010), vec![0]);
        // Inside slot [1100, 1200): only the entry at 1120 is due.
        assert_eq!(reap(&mut w, 1130), vec![1]);
        assert_eq!(w.current_slot_start_ns(), 1100);
        assert_eq!(reap(&mut w, 1400), vec![2, 3]);
        assert!(w.is_empty());
        assert_eq!(w.current_slot_start_ns(), 1400);
    }

    #[test]
    fn overdue_entries_go_to_current_slot() {
        let mut w = TimingWheel::new(100, 4, 0);
        reap(&mut w, 250);
        assert_eq!(w.current_slot_start_ns(), 200);
        w.insert(7, 210);
        w.insert(5, 10);
        w.insert(6, 150);
        assert_eq!(reap(&mut w, 250), vec![5, 6, 7]);
    }

    #[test]
    fn wraps_around_the_wheel() {
        let mut w = TimingWheel::new(10, 4, 0);
        let mut released = Vec::new();
        // Walk three full turns, always inserting two slots ahead.
        for step in 0..12u32 {
            let now = u64::from(step) * 10;
            w.insert(step, now + 25);
            w.reap(now, &mut released);
        }
        w.reap(1000, &mut released);
        assert_eq!(released, (0..12).collect::<Vec<_>>());
        assert!(w.is_empty());
    }

    #[test]
    fn entries_beyond_horizon_are_not_released_early() {
        let mut w = TimingWheel::new(10, 4, 0); // horizon 40 ns
        w.insert(1, 95);
        w.insert(0, 35);
        w.insert(2, 1_000_000);
        assert_eq!(reap(&mut w, 40), vec![0]);
        assert_eq!(reap(&mut w, 80), Vec::<u32>::new());
        assert_eq!(w.len(), 2);
        assert_eq!(reap(&mut w, 95), vec![1]);
        // A jump over several horizons.
        assert_eq!(reap(&mut w, 999_999), Vec::<u32>::new());
        assert_eq!(reap(&mut w, 1_000_000), vec![2]);
        assert!(w.is_empty());
    }

    #[test]
    fn many_entries_per_slot() {
        let mut w = TimingWheel::new(1000, 16, 0);
        // 1000 entries in one slot, inserted in reverse time order, with ties.
        for i in (0..1000u32).rev() {
            w.insert(i, 5000 + u64::from(i / 2));
        }
        let out = reap(&mut w, 5999);
        let expect: Vec<u32> = (0..500).flat_map(|k| [2 * k + 1, 2 * k]).collect();
        assert_eq!(out, expect);
        assert!(w.is_empty());
    }

    #[test]
    fn long_jump_keeps_global_order() {
        let mut w = TimingWheel::new(10, 4, 0);
        w.insert(2, 30);
        w.insert(0, 5);
        w.insert(1, 12);
        w.insert(3, 500); // parked in the last slot
        assert_eq!(reap(&mut w, 100), vec![0, 1, 2]);
        assert_eq!(w.current_slot_start_ns(), 100);
        assert_eq!(reap(&mut w, 500), vec![3]);
    }

    #[test]
    fn next_due_tracks_inserts_reaps_and_purges() {
        let mut w = TimingWheel::new(10, 4, 0); // horizon 40 ns
        assert_eq!(w.next_due(), None);
        w.insert(1, 500); // parked in slot 3 (the last)
        assert_eq!(w.next_due(), Some(500));
        w.insert(2, 5);
        assert_eq!(w.next_due(), Some(5));
        assert_eq!(reap(&mut w, 15), vec![2]);
        assert_eq!(w.current_slot_start_ns(), 10);
        // Now slot 3 covers [30, 40) but holds the parked 500; entry 4 lands in the later
        // slot covering [40, 50): the earliest entry is not in the first non-empty slot.
        w.insert(4, 45);
        assert_eq!(w.next_due(), Some(45));
        assert_eq!(w.purge(|&e| e == 4), 1);
        assert_eq!(w.next_due(), Some(500));
        w.insert(4, 45);
        assert_eq!(reap(&mut w, 44), Vec::<u32>::new());
        assert_eq!(w.next_due(), Some(45));
        assert_eq!(reap(&mut w, 45), vec![4]);
        assert_eq!(w.next_due(), Some(500), "recomputed after the reap");
        assert_eq!(w.purge(|&e| e == 4), 0);
        assert_eq!(w.iter().copied().collect::<Vec<_>>(), vec![1]);
        assert_eq!(reap(&mut w, 499), Vec::<u32>::new());
        assert_eq!(w.next_due(), Some(500));
        assert_eq!(reap(&mut w, 500), vec![1]);
        assert_eq!(w.next_due(), None);
        assert!(w.is_empty());
    }

    #[test]
    fn purge_keeps_order_of_the_rest() {
        let mut w = TimingWheel::new(100, 8, 0);
        for i in 0..20u32 {
            w.insert(i, u64::from(i) * 37);
        }
        assert_eq!(w.purge(|&e| e % 3 == 0), 7);
        assert_eq!(w.len(), 13);
        assert_eq!(w.next_due(), Some(37));
        let out = reap(&mut w, 10_000);
        assert_eq!(out, (0..20).filter(|e| e % 3 != 0).collect::<Vec<_>>());
    }

    /// Random inserts (overdue, within and beyond the horizon), reaps (small steps and long
    /// jumps) and purges against a plain sorted-list model: same releases in the same order,
    /// same `next_due` and `len`, nothing released early.
    #[test]
    fn matches_a_reference_model() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        for round in 0..20 {
            let width = 1 + next(20);
            let slots = 1 + next(16) as usize;
            let horizon = width * slots as u64;
            let mut now = next(1000);
            let mut w = TimingWheel::new(width, slots, now);
            // (t, insertion sequence, id)
            let mut model: Vec<(u64, u64, u32)> = Vec::new();
            let mut seq = 0u64;
            let mut out = Vec::new();
            for _ in 0..2000 {
                match next(10) {
                    0..=4 => {
                        let t = match next(4) {
                            0 => now.saturating_sub(next(2 * horizon)),
                            1 | 2 => now + next(horizon),
                            _ => now + next(5 * horizon),
                        };
                        seq += 1;
                        w.insert(seq as u32, t);
                        model.push((t, seq, seq as u32));
                    }
                    5..=8 => {
                        now += match next(6) {
                            0 => 0,
                            1..=3 => next(width + 1),
                            4 => next(horizon),
                            _ => next(4 * horizon),
                        };
                        out.clear();
                        w.reap(now, &mut out);
                        model.sort_by_key(|&(t, s, _)| (t, s));
                        let k = model.partition_point(|&(t, _, _)| t <= now);
                        let want: Vec<u32> = model.drain(..k).map(|(_, _, e)| e).collect();
                        assert_eq!(out, want, "round {round}: reap at {now}");
                    }
                    _ => {
                        let m = 2 + next(5) as u32;
                        let removed = w.purge(|&e| e % m == 0);
                        let before = model.len();
                        model.retain(|&(_, _, e)| e % m != 0);
                        assert_eq!(removed, before - model.len());
                    }
                }
                assert_eq!(w.len(), model.len());
                assert_eq!(w.next_due(), model.iter().map(|&(t, _, _)| t).min());
                let mut ids: Vec<u32> = w.iter().copied().collect();
                ids.sort_unstable();
                let mut want: Vec<u32> = model.iter().map(|&(_, _, e)| e).collect();
                want.sort_unstable();
                assert_eq!(ids, want);
            }
        }
    }

    #[test]
    #[should_panic(expected = "positive")]
    fn rejects_zero_width() {
        TimingWheel::<u32>::new(0, 4, 0);
    }
}
