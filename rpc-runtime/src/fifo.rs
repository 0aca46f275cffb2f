//! A FIFO of `Copy` entries in a power-of-two ring, for hot-path queues (copyrpc's
//! received-request queue, eRPC's transmit queue): a push or a pop indexes with one mask,
//! where `VecDeque` wraps its physical index with a compare and a conditional move and keeps
//! a head and a length. It doubles when full, so it allocates only while it warms up.

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
        Self::with_capacity_of(cap, T::default())
    }

    /// An empty queue (room for one entry).
    #[cfg(test)]
    pub(crate) fn new() -> Self {
        Self::with_capacity(1)
    }
}

impl<T: Copy> Fifo<T> {
    /// An empty queue with room for at least `cap` entries (at least one) before it grows;
    /// `filler` fills the free slots (never read as an entry), for entry types without a
    /// `Default`.
    pub(crate) fn with_capacity_of(cap: usize, filler: T) -> Self {
        let n = cap.max(1).next_power_of_two();
        Fifo {
            buf: vec![filler; n],
            mask: n - 1,
            head: 0,
            tail: 0,
        }
    }

    /// Entries queued.
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.tail.wrapping_sub(self.head)
    }

    /// Whether nothing is queued.
    #[inline(always)]
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

    /// Makes room for `n` more entries and returns an [`Appender`] that writes up to `n`
    /// entries after the queued ones; they are queued when it commits.
    #[inline(always)]
    pub(crate) fn appender(&mut self, n: usize) -> Appender<'_, T> {
        while self.len() + n > self.mask + 1 {
            self.grow();
        }
        let Fifo {
            buf,
            mask,
            head: _,
            tail,
        } = self;
        Appender {
            start: *tail,
            next: *tail,
            end: tail.wrapping_add(n),
            buf: &mut buf[..],
            mask: *mask,
            tail,
        }
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
        // Any slot's value fills the new ring's free slots (`buf` is never empty).
        let mut buf = vec![self.buf[0]; n];
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

/// Writes entries after those of a [`Fifo`] (in room [`Fifo::appender`] made), with the
/// write position in a local: they are queued only by [`Appender::commit`], so dropping it
/// uncommitted queues nothing.
pub(crate) struct Appender<'a, T> {
    buf: &'a mut [T],
    mask: usize,
    /// The queue's tail when the appender was made.
    start: usize,
    /// Counter of the next slot to write.
    next: usize,
    /// `start` plus the room made.
    end: usize,
    tail: &'a mut usize,
}

impl<T: Copy> Appender<'_, T> {
    /// Writes `v` after the entries written so far. Panics beyond the room made.
    #[inline(always)]
    pub(crate) fn push(&mut self, v: T) {
        assert!(self.next != self.end, "Appender: beyond the room made");
        // SAFETY: `next & mask <= mask` and `buf.len() == mask + 1`.
        unsafe { *self.buf.get_unchecked_mut(self.next & self.mask) = v };
        self.next = self.next.wrapping_add(1);
    }

    /// Queues the entries written; returns how many.
    #[inline(always)]
    pub(crate) fn commit(self) -> usize {
        *self.tail = self.next;
        self.next.wrapping_sub(self.start)
    }
}

#[cfg(test)]
mod tests {
    use super::Fifo;

    #[test]
    fn appender_queues_only_what_it_commits() {
        let mut q = Fifo::<u32>::with_capacity(2);
        q.push_back(1);
        q.pop_front();
        q.push_back(2);
        // Uncommitted: nothing queued.
        {
            let mut a = q.appender(3);
            a.push(3);
            a.push(4);
        }
        assert_eq!(q.iter().copied().collect::<Vec<_>>(), vec![2]);
        // Committed, across the ring's end and a growth.
        let mut a = q.appender(3);
        for v in [3, 4, 5] {
            a.push(v);
        }
        assert_eq!(a.commit(), 3);
        assert_eq!(q.iter().copied().collect::<Vec<_>>(), vec![2, 3, 4, 5]);
        assert_eq!(q.appender(0).commit(), 0);
        for v in 2..=5 {
            assert_eq!(q.pop_front(), Some(v));
        }
        assert!(q.is_empty());
    }

    #[test]
    #[should_panic(expected = "beyond the room made")]
    fn appender_refuses_beyond_its_room() {
        let mut q = Fifo::<u32>::with_capacity(4);
        let mut a = q.appender(1);
        a.push(1);
        a.push(2);
    }

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
