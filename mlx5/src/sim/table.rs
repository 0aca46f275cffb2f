//! A direct table of model objects keyed by their number (QPN, CQN, SRQN, MR index).
//!
//! The entry of number `n` lives at slot `n & (capacity - 1)` and records `n`: a lookup is one
//! index and one compare, with no hashing. A number that is not in the table (never allocated,
//! already destroyed, another process's, or forged) finds either an empty slot or an entry
//! whose recorded number differs, and gets `None`, as a map lookup would.
//!
//! Numbers are handed out by [`NumTable::alloc`] in the order the model always used (the next
//! number after the last one handed out, in the caller's range, skipping numbers in use), with
//! one addition: a number whose slot holds another live object is skipped too. The table keeps
//! at most half of its slots full (it doubles before an insertion would pass that), so at least
//! half of any `capacity` consecutive candidates have a free slot, and a range of numbers
//! smaller than the capacity maps to distinct slots: allocation fails only when every number of
//! the range is in use, as before.

use crate::error::{Error, Result};

/// Slots of a new table.
const INITIAL: usize = 16;

/// Objects of type `T` keyed by a 32-bit number, stored at `number & mask`.
#[derive(Debug)]
pub(crate) struct NumTable<T> {
    slots: Vec<Option<(u32, T)>>,
    /// `slots.len() - 1` (a power of two minus one).
    mask: u32,
    len: usize,
}

impl<T> Default for NumTable<T> {
    fn default() -> Self {
        let mut slots = Vec::with_capacity(INITIAL);
        slots.resize_with(INITIAL, || None);
        NumTable {
            slots,
            mask: INITIAL as u32 - 1,
            len: 0,
        }
    }
}

impl<T> NumTable<T> {
    /// The object numbered `n`.
    #[inline]
    pub(crate) fn get(&self, n: u32) -> Option<&T> {
        match self.slots.get((n & self.mask) as usize) {
            Some(Some((k, v))) if *k == n => Some(v),
            _ => None,
        }
    }

    /// The object numbered `n`, mutably.
    #[inline]
    pub(crate) fn get_mut(&mut self, n: u32) -> Option<&mut T> {
        match self.slots.get_mut((n & self.mask) as usize) {
            Some(Some((k, v))) if *k == n => Some(v),
            _ => None,
        }
    }

    /// Objects in the table.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Removes and returns the object numbered `n`.
    pub(crate) fn remove(&mut self, n: u32) -> Option<T> {
        let slot = self.slots.get_mut((n & self.mask) as usize)?;
        if !matches!(slot, Some((k, _)) if *k == n) {
            return None;
        }
        self.len -= 1;
        slot.take().map(|(_, v)| v)
    }

    /// Every `(number, object)`, in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.slots
            .iter()
            .filter_map(|s| s.as_ref().map(|(k, v)| (*k, v)))
    }

    /// Doubles the table when one more object would fill more than half of it.
    fn reserve_one(&mut self) {
        if (self.len + 1) * 2 <= self.slots.len() {
            return;
        }
        let cap = self.slots.len() * 2;
        let mut slots = Vec::with_capacity(cap);
        slots.resize_with(cap, || None);
        let mask = cap as u32 - 1;
        for (k, v) in self.slots.drain(..).flatten() {
            // Distinct numbers had distinct slots under the old mask, so under the new one too.
            slots[(k & mask) as usize] = Some((k, v));
        }
        self.slots = slots;
        self.mask = mask;
    }

    /// Allocates the next free number after `*next` and inserts `v` under it.
    ///
    /// Numbers are `next` in `1..=mask` (24 bits, skipping 0 and 1, the reserved QPNs on
    /// InfiniBand), or, on a joined node (`slot`), `(slot + 1) << bits | i` with `i >= 1`
    /// (`sim/node.rs` "Numbers"); `min` is the lowest number allowed (2 for QPs, CQs and SRQs,
    /// 1 for memory region indices).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when every number of the range is in use.
    pub(crate) fn alloc(
        &mut self,
        next: &mut u32,
        slot: Option<u32>,
        bits: u32,
        min: u32,
        v: T,
    ) -> Result<u32> {
        let (base, mask) = match slot {
            Some(s) => ((s + 1) << bits, (1u32 << bits) - 1),
            None => (0, 0x00ff_ffff),
        };
        self.reserve_one();
        for _ in 0..=mask {
            *next = (*next + 1) & mask;
            let n = base | *next;
            if *next != 0 && n >= min {
                let i = (n & self.mask) as usize;
                if self.slots[i].is_none() {
                    self.slots[i] = Some((n, v));
                    self.len += 1;
                    return Ok(n);
                }
            }
        }
        Err(Error::InvalidArgument("no free object number".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_numbers_as_before_and_lookups_check_the_whole_number() {
        let mut t = NumTable::default();
        let mut next = 0xff;
        let nums: Vec<u32> = (0..100)
            .map(|i| t.alloc(&mut next, None, 0, 2, i).unwrap())
            .collect();
        assert_eq!(nums, (0x100..0x100 + 100).collect::<Vec<_>>());
        for (i, &n) in nums.iter().enumerate() {
            assert_eq!(t.get(n), Some(&i));
        }
        // Same slot, other number: a stale or forged number is not found.
        let cap = t.slots.len() as u32;
        for &n in &nums {
            assert_eq!(t.get(n + cap), None);
            assert_eq!(t.get(n | 0x8000_0000), None);
            assert!(t.get_mut(n ^ (cap << 3)).is_none());
            assert_eq!(t.remove(n + cap), None);
        }
        assert_eq!(t.get(0), None);
        assert_eq!(t.get(u32::MAX), None);
        assert_eq!(t.remove(0x100), Some(0));
        assert_eq!(t.get(0x100), None, "destroyed: stale");
        assert_eq!(t.remove(0x100), None);
        assert_eq!(t.len(), 99);
    }

    #[test]
    fn a_colliding_slot_is_skipped_and_a_full_range_is_an_error() {
        let mut t = NumTable::default();
        let mut next = 0;
        // Joined-node range of 3 bits: numbers (2 << 3) | 1..=7.
        let a = t.alloc(&mut next, Some(1), 3, 2, 'a').unwrap();
        assert_eq!(a, 0x11);
        let mut all = vec![a];
        for _ in 0..6 {
            all.push(t.alloc(&mut next, Some(1), 3, 2, 'x').unwrap());
        }
        all.sort_unstable();
        assert_eq!(all, (0x11..=0x17).collect::<Vec<_>>());
        assert!(matches!(
            t.alloc(&mut next, Some(1), 3, 2, 'y'),
            Err(Error::InvalidArgument(_))
        ));
        // Free one: it is found again.
        assert_eq!(t.remove(0x13), Some('x'));
        assert_eq!(t.alloc(&mut next, Some(1), 3, 2, 'z').unwrap(), 0x13);
        // In the 24-bit range, a live number keeps its slot: a later number that would share
        // it is skipped, never overwriting it.
        let mut t = NumTable::default();
        let mut next = 0xff;
        let first = t.alloc(&mut next, None, 0, 2, 0u32).unwrap();
        let cap = t.slots.len() as u32;
        let mut seen = vec![first];
        for i in 1..(3 * cap) {
            let n = t.alloc(&mut next, None, 0, 2, i).unwrap();
            assert_ne!(n & t.mask, first & t.mask);
            t.remove(n);
            seen.push(n);
        }
        assert_eq!(t.get(first), Some(&0));
        assert_eq!(t.len(), 1);
    }
}
