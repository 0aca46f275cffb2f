//! A FIFO of `Copy` entries in a power-of-two ring, for the received-request queue: a push
//! or a pop indexes with one mask, where `VecDeque` wraps its physical index with a compare
//! and a conditional move and keeps a head and a length. It doubles when full, so it
//! allocates only while it warms up.

/// A FIFO queue of `Copy` entries in a power-of-two ring.
#[derive(Debug)]
pub(crate) struct Fifo<T> {
    /// Slots; `buf.len() == mask + 1`, a power of two.
    buf: Vec<T>,
    mask: usize,
    /// Counter of the next entry to pop (wrapping).
    head: usize,
    /// Counter of the next slot to push (wrapping); `tail - head` entries are queued.
    tail: usize,
}

impl<T: Copy + Default> Fifo<T> {
    /// An empty queue with room for at least `cap` entries (at least one) before it grows.
    pub(crate) fn with_capacity(cap: usize) -> Self {
        let n = cap.max(1).next_power_of_two();
        Fifo {
            buf: vec![T::default(); n],
            mask: n - 1,
            head: 0,
            tail: 0,
        }
    }

    /// An empty queue (room for one entry).
    #[cfg(test)]
    pub(crate) fn new() -> Self {
        Self::with_capacity(1)
    }

    /// Entries queued.
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.tail.wrapping_sub(self.head)
    }

    /// Whether nothing is queued.
    #[inline(always)]
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.head == self.tail
    }

    /// Appends `v`.
    #[inline(always)]
    pub(crate) fn push_back(&mut self, v: T) {
        if self.len() > self.mask {
            self.grow();
        }
        let i = self.tail & self.mask;
        // SAFETY: `i <= mask` and `buf.len() == mask + 1`.
        unsafe { *self.buf.get_unchecked_mut(i) = v };
        self.tail = self.tail.wrapping_add(1);
    }

    /// Makes room for `n` more entries without growing.
    #[inline(always)]
    pub(crate) fn reserve(&mut self, n: usize) {
        while self.len() + n > self.mask + 1 {
            self.grow();
        }
    }

    /// Appends `v`; [`Fifo::reserve`] made room for it.
    #[inline(always)]
    pub(crate) fn push_reserved(&mut self, v: T) {
        debug_assert!(self.len() <= self.mask, "push_reserved without room");
        let i = self.tail & self.mask;
        // SAFETY: `i <= mask` and `buf.len() == mask + 1`.
        unsafe { *self.buf.get_unchecked_mut(i) = v };
        self.tail = self.tail.wrapping_add(1);
    }

    /// Removes and returns the oldest entry.
    #[inline(always)]
    pub(crate) fn pop_front(&mut self) -> Option<T> {
        if self.head == self.tail {
            return None;
        }
        let i = self.head & self.mask;
        // SAFETY: `i <= mask` and `buf.len() == mask + 1`.
        let v = unsafe { *self.buf.get_unchecked(i) };
        self.head = self.head.wrapping_add(1);
        Some(v)
    }

    /// Drops the entries pushed after the queue held `len` (`len <= self.len()`).
    #[inline(always)]
    pub(crate) fn truncate(&mut self, len: usize) {
        debug_assert!(len <= self.len());
        self.tail = self.head.wrapping_add(len);
    }

    /// The queued entries, oldest first.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        (0..self.len()).map(move |k| &self.buf[self.head.wrapping_add(k) & self.mask])
    }

    /// Doubles the ring, keeping the entries in order (from slot 0 on).
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let n = self.buf.len() * 2;
        let mut buf = vec![T::default(); n];
        let len = self.len();
        for (k, slot) in buf.iter_mut().enumerate().take(len) {
            *slot = self.buf[self.head.wrapping_add(k) & self.mask];
        }
        self.buf = buf;
        self.mask = n - 1;
        self.head = 0;
        self.tail = len;
    }
}

#[cfg(test)]
mod tests {
    use super::Fifo;

    #[test]
    fn fifo_order_across_wraps_and_growth() {
        let mut q = Fifo::<u32>::with_capacity(2);
        let mut next_in = 0u32;
        let mut next_out = 0u32;
        for round in 0..50u32 {
            for _ in 0..(round % 7) + 1 {
                q.push_back(next_in);
                next_in += 1;
            }
            for _ in 0..(round % 5) {
                if let Some(v) = q.pop_front() {
                    assert_eq!(v, next_out);
                    next_out += 1;
                }
            }
            assert_eq!(q.len() as u32, next_in - next_out);
            let seen: Vec<u32> = q.iter().copied().collect();
            assert_eq!(seen, (next_out..next_in).collect::<Vec<_>>());
        }
        while let Some(v) = q.pop_front() {
            assert_eq!(v, next_out);
            next_out += 1;
        }
        assert!(q.is_empty());
        assert_eq!(next_out, next_in);
    }
}
