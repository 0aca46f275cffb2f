//! Timing wheel for pacing packets of congested sessions (Carousel, Saeed et al.,
//! SIGCOMM 2017; eRPC's `timing_wheel`; seeds/002 §6.3 `rate_limiter`).
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

/// A Carousel-style timing wheel of `T` entries (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct TimingWheel<T: Copy> {
    slot_width_ns: u64,
    /// Entries with their requested tx time, per slot.
    slots: Vec<Vec<(u64, T)>>,
    /// Index of the current slot.
    cur: usize,
    /// Start time of the current slot; a multiple of `slot_width_ns` past the start time.
    base_ns: u64,
    len: usize,
    /// Reused buffer for re-filing entries.
    scratch: Vec<(u64, T)>,
}

impl<T: Copy> TimingWheel<T> {
    /// An empty wheel whose current slot starts at `now_ns`.
    ///
    /// # Panics
    /// If `slot_width_ns` or `num_slots` is zero, or the horizon overflows `u64`.
    pub fn new(slot_width_ns: u64, num_slots: usize, now_ns: u64) -> TimingWheel<T> {
        assert!(
            slot_width_ns > 0 && num_slots > 0,
            "slot width and slot count must be positive"
        );
        assert!(
            slot_width_ns.checked_mul(num_slots as u64).is_some(),
            "horizon overflows"
        );
        TimingWheel {
            slot_width_ns,
            slots: (0..num_slots).map(|_| Vec::new()).collect(),
            cur: 0,
            base_ns: now_ns,
            len: 0,
            scratch: Vec::new(),
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

    /// Files `ent` to leave at `abs_tx_time_ns` (clamped into the horizon as in the module
    /// docs).
    pub fn insert(&mut self, ent: T, abs_tx_time_ns: u64) {
        let off = abs_tx_time_ns.saturating_sub(self.base_ns) / self.slot_width_ns;
        let off = off.min(self.slots.len() as u64 - 1) as usize;
        let idx = (self.cur + off) % self.slots.len();
        self.slots[idx].push((abs_tx_time_ns, ent));
        self.len += 1;
    }

    /// Appends to `out` every entry whose tx time is `<= now_ns`, in tx-time order (ties in
    /// insertion order), and turns the wheel so the current slot contains `now_ns`. A `now_ns`
    /// before the current slot releases nothing.
    pub fn reap(&mut self, now_ns: u64, out: &mut Vec<T>) {
        if now_ns < self.base_ns {
            return;
        }
        let w = self.slot_width_ns;
        if self.len == 0 {
            self.base_ns += (now_ns - self.base_ns) / w * w;
            return;
        }
        if now_ns - self.base_ns >= self.horizon_ns() {
            self.reap_all(now_ns, out);
            return;
        }
        loop {
            let slot_end = self.base_ns + w;
            let mut slot = std::mem::take(&mut self.slots[self.cur]);
            slot.sort_by_key(|&(t, _)| t);
            let due = slot.partition_point(|&(t, _)| t <= now_ns);
            out.extend(slot[..due].iter().map(|&(_, e)| e));
            self.len -= due;
            if slot_end > now_ns {
                // `now` is inside this slot: keep the rest here.
                slot.drain(..due);
                self.slots[self.cur] = slot;
                return;
            }
            // The slot is over; whatever is left was parked from beyond the horizon.
            self.scratch.extend_from_slice(&slot[due..]);
            slot.clear();
            self.slots[self.cur] = slot;
            self.cur = (self.cur + 1) % self.slots.len();
            self.base_ns = slot_end;
            self.refile_scratch();
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
        // Oldest slot first, so the stable sort keeps insertion order among equal times.
        for k in 0..n {
            let idx = (self.cur + k) % n;
            self.scratch.append(&mut self.slots[idx]);
        }
        self.scratch.sort_by_key(|&(t, _)| t);
        let due = self.scratch.partition_point(|&(t, _)| t <= now_ns);
        out.extend(self.scratch.drain(..due).map(|(_, e)| e));
        self.len -= due;
        self.base_ns += (now_ns - self.base_ns) / w * w;
        self.cur = 0;
        self.refile_scratch();
    }

    fn refile_scratch(&mut self) {
        let mut pending = std::mem::take(&mut self.scratch);
        self.len -= pending.len();
        for (t, e) in pending.drain(..) {
            self.insert(e, t);
        }
        self.scratch = pending;
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
    #[should_panic(expected = "positive")]
    fn rejects_zero_width() {
        TimingWheel::<u32>::new(0, 4, 0);
    }
}
