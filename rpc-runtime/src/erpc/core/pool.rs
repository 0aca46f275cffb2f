//! The free list of message buffers (`Rpc::recycle`; seeds/000 §3).
//!
//! Multi-packet messages are reassembled into, copied messages handed out in, and backlogged
//! requests written into [`MsgBuffer`]s taken from here; the application returns them with
//! `Rpc::recycle`, and slots give theirs back when their session ends. Buffers of one
//! packet (the smallest mapped) are kept apart from larger ones: a single-packet message
//! takes the most recently returned one-packet buffer (LIFO, warm), a larger message the
//! smallest large buffer that fits (best fit), so small messages never take the buffers
//! large ones need and a steady workload maps no new memory per message. Every buffer mapped is counted ([`Stats::msgbufs_allocated`]), which
//! is how the tests check that the steady state allocates none.
//!
//! [`Stats::msgbufs_allocated`]: super::Stats::msgbufs_allocated

use crate::erpc::msgbuf::{MsgBufError, MsgBuffer};

/// Most buffers the free list keeps.
pub const POOL_MAX_BUFS: usize = 256;
/// Most bytes of buffer memory ([`MsgBuffer::buf_len`]) the free list keeps (64 MiB: eight
/// maximal messages).
pub const POOL_MAX_BYTES: usize = 64 << 20;

/// A bounded LIFO free list of message buffers of one packet size.
#[derive(Debug)]
pub(super) struct BufPool {
    /// Buffers of one packet's data (`max_data_size == dpp`), LIFO.
    small: Vec<MsgBuffer>,
    /// Larger buffers.
    large: Vec<MsgBuffer>,
    bytes: usize,
    /// Data bytes per packet of every buffer (the core's `mtu - 16`).
    dpp: usize,
    /// Buffers mapped so far.
    pub allocated: u64,
    /// Times a buffer was passed over because it was [in flight](MsgBuffer::in_flight) (a
    /// transport still sends from it): a free-list buffer not taken, or a slot's buffer
    /// replaced instead of rewritten.
    pub in_flight_skips: u64,
    /// Tests: the next `take` that must map a buffer fails.
    #[cfg(test)]
    pub fail_next_alloc: bool,
}

impl BufPool {
    /// An empty free list for buffers of `dpp` data bytes per packet.
    pub(super) fn new(dpp: usize) -> Self {
        BufPool {
            small: Vec::new(),
            large: Vec::new(),
            bytes: 0,
            dpp,
            allocated: 0,
            in_flight_skips: 0,
            #[cfg(test)]
            fail_next_alloc: false,
        }
    }

    /// A buffer whose data area holds at least `cap` bytes, with data size 0: for
    /// `cap <= dpp` the most recently returned one-packet buffer, else the smallest larger
    /// buffer that fits; if there is none, a newly mapped one of `max(cap, dpp)` bytes.
    ///
    /// # Errors
    /// As [`MsgBuffer::new`] when a buffer must be mapped (`cap` above the 8 MiB limit, or
    /// the mapping failed).
    pub(super) fn take(&mut self, cap: usize) -> Result<MsgBuffer, MsgBufError> {
        let found = if cap <= self.dpp {
            match self.small.last() {
                Some(b) if !b.in_flight() => self.small.pop(),
                Some(_) => self.take_small_idle(),
                None => None,
            }
        } else {
            let best = self
                .large
                .iter()
                .enumerate()
                .filter(|(_, b)| b.max_data_size() >= cap && !b.in_flight())
                .min_by_key(|(_, b)| b.max_data_size())
                .map(|(i, _)| i);
            if best.is_none() && self.large.iter().any(MsgBuffer::in_flight) {
                self.in_flight_skips += 1;
            }
            best.map(|i| self.large.swap_remove(i))
        };
        let mut b = match found {
            Some(b) => {
                self.bytes -= b.buf_len();
                b
            }
            None => self.map(cap)?,
        };
        // Cannot fail: 0 is within every buffer's capacity.
        let _ = b.resize(0);
        Ok(b)
    }

    /// The most recently returned one-packet buffer that is not in flight (the top one is),
    /// taken out of the free list; `None` if all are in flight.
    #[cold]
    fn take_small_idle(&mut self) -> Option<MsgBuffer> {
        self.in_flight_skips += 1;
        let i = self.small.iter().rposition(|b| !b.in_flight())?;
        Some(self.small.remove(i))
    }

    /// Makes `slot` hold a buffer with room for `cap` data bytes: keeps the one it has if
    /// large enough and not [in flight](MsgBuffer::in_flight), else swaps in one from
    /// [`take`](Self::take) and returns the old one to the free list (where it is not taken
    /// again while in flight). The data size is left as it was when the buffer is kept, 0
    /// otherwise.
    ///
    /// # Errors
    /// As [`take`](Self::take); `slot` is unchanged then.
    pub(super) fn ensure<'a>(
        &mut self,
        slot: &'a mut Option<MsgBuffer>,
        cap: usize,
    ) -> Result<&'a mut MsgBuffer, MsgBufError> {
        if slot
            .as_ref()
            .is_none_or(|b| b.max_data_size() < cap || self.note_in_flight(b))
        {
            let new = self.take(cap)?;
            if let Some(old) = slot.replace(new) {
                self.put(old);
            }
        }
        // Just filled when empty.
        slot.as_mut().ok_or(MsgBufError::ZeroPacketCapacity)
    }

    /// Whether `b` is in flight, counting it in `in_flight_skips` if so.
    #[inline]
    fn note_in_flight(&mut self, b: &MsgBuffer) -> bool {
        let busy = b.in_flight();
        if busy {
            self.in_flight_skips += 1;
        }
        busy
    }

    /// Makes sure a one-packet buffer not in flight is on top of the free list (mapping one
    /// if not), so that the next `take(cap)` with `cap <= dpp` succeeds without mapping.
    ///
    /// # Errors
    /// As [`take`](Self::take) when the mapping fails.
    #[inline]
    pub(super) fn reserve_small(&mut self) -> Result<(), MsgBufError> {
        if self.small.last().is_none_or(MsgBuffer::in_flight) {
            let b = self.map(self.dpp)?;
            if self.small.capacity() == 0 {
                self.small.reserve_exact(POOL_MAX_BUFS);
            }
            self.bytes += b.buf_len();
            self.small.push(b);
        }
        Ok(())
    }

    /// Tests: drops every one-packet buffer of the free list.
    #[cfg(test)]
    pub(super) fn clear_small(&mut self) {
        for b in self.small.drain(..) {
            self.bytes -= b.buf_len();
        }
    }

    #[cold]
    fn map(&mut self, cap: usize) -> Result<MsgBuffer, MsgBufError> {
        #[cfg(test)]
        if std::mem::take(&mut self.fail_next_alloc) {
            return Err(MsgBufError::TooLarge { size: cap, max: 0 });
        }
        let b = MsgBuffer::new(cap.max(self.dpp), self.dpp)?;
        self.allocated += 1;
        Ok(b)
    }

    /// Keeps `buf` for reuse if within the bounds (and of this pool's packet size); drops
    /// (unmaps) it otherwise.
    pub(super) fn put(&mut self, buf: MsgBuffer) {
        let len = buf.buf_len();
        if buf.data_per_pkt() != self.dpp
            || self.small.len() + self.large.len() >= POOL_MAX_BUFS
            || self.bytes + len > POOL_MAX_BYTES
        {
            return;
        }
        let list = if buf.max_data_size() <= self.dpp {
            &mut self.small
        } else {
            &mut self.large
        };
        if list.capacity() == 0 {
            // One allocation for each list, on first use.
            list.reserve_exact(POOL_MAX_BUFS);
        }
        self.bytes += len;
        list.push(buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifo_reuse_and_bounds() {
        let mut p = BufPool::new(100);
        let a = p.take(50).unwrap();
        assert_eq!(a.max_data_size(), 100, "one packet at least");
        assert_eq!(a.data_size(), 0);
        assert_eq!(p.allocated, 1);
        let ptr = a.as_ptr();
        p.put(a);
        let b = p.take(100).unwrap();
        assert_eq!(b.as_ptr(), ptr, "reused");
        assert_eq!(p.allocated, 1);
        p.put(b);
        // Too small buffers are skipped, not grown.
        let c = p.take(5000).unwrap();
        assert_ne!(c.as_ptr(), ptr);
        assert_eq!(p.allocated, 2);
        // A one-packet message does not take a large buffer.
        let c_ptr = c.as_ptr();
        p.put(c);
        let d = p.take(50).unwrap();
        assert_eq!(
            d.as_ptr(),
            ptr,
            "the one-packet buffer, not the newer large one"
        );
        assert_eq!(p.allocated, 2);
        p.put(d);
        // Best fit among the large ones.
        p.put(MsgBuffer::new(3000, 100).unwrap());
        assert_eq!(p.take(2500).unwrap().max_data_size(), 3000);
        assert_eq!(p.take(2500).unwrap().as_ptr(), c_ptr);
        // Another packet size is not kept.
        p.put(MsgBuffer::new(10, 99).unwrap());
        assert_eq!(p.small.len() + p.large.len(), 1);
        for _ in 0..POOL_MAX_BUFS + 10 {
            p.put(MsgBuffer::new(8, 100).unwrap());
        }
        assert_eq!(p.small.len() + p.large.len(), POOL_MAX_BUFS);
        let mut p = BufPool::new(4080);
        p.put(MsgBuffer::new(8 << 20, 4080).unwrap());
        p.put(MsgBuffer::new(8 << 20, 4080).unwrap());
        p.put(MsgBuffer::new(8 << 20, 4080).unwrap());
        for _ in 0..6 {
            p.put(MsgBuffer::new(8 << 20, 4080).unwrap());
        }
        assert_eq!(p.large.len(), 7, "byte bound");
    }

    #[test]
    fn ensure_keeps_or_swaps() {
        let mut p = BufPool::new(100);
        let mut slot = None;
        let ptr = p.ensure(&mut slot, 10).unwrap().as_ptr();
        assert_eq!(p.ensure(&mut slot, 100).unwrap().as_ptr(), ptr);
        let big = p.ensure(&mut slot, 101).unwrap().as_ptr();
        assert_ne!(big, ptr);
        // The small one went back to the free list.
        assert_eq!(p.take(1).unwrap().as_ptr(), ptr);
        p.fail_next_alloc = true;
        assert!(p.ensure(&mut slot, 1000).is_err());
        assert_eq!(slot.as_ref().unwrap().as_ptr(), big, "unchanged on failure");
    }

    /// Buffers in flight (a transport holds their handle) are neither taken from the free
    /// list nor kept in a slot to be rewritten; each pass-over is counted.
    #[test]
    fn buffers_in_flight_are_passed_over() {
        let mut p = BufPool::new(100);
        let a = p.take(50).unwrap();
        let b = p.take(50).unwrap();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        p.put(a);
        p.put(b);
        // `b` is on top (LIFO) but in flight: `a` is taken.
        let pin_b = std::sync::Arc::clone(p.small.last().unwrap().dma_handle());
        let got = p.take(10).unwrap();
        assert_eq!(got.as_ptr(), pa);
        assert_eq!(p.in_flight_skips, 1);
        // Only `b` left, in flight: a new buffer is mapped.
        let before = p.allocated;
        let fresh = p.take(10).unwrap();
        assert_eq!(p.allocated, before + 1);
        assert_ne!(fresh.as_ptr(), pb);
        drop(pin_b);
        assert_eq!(p.take(10).unwrap().as_ptr(), pb);

        // A slot's buffer in flight is replaced, not rewritten.
        let mut slot = Some(got);
        let pin = std::sync::Arc::clone(slot.as_ref().unwrap().dma_handle());
        let skips = p.in_flight_skips;
        p.ensure(&mut slot, 10).unwrap();
        assert_ne!(slot.as_ref().unwrap().as_ptr(), pa);
        assert_eq!(p.in_flight_skips, skips + 1);
        drop(pin);
        let kept = slot.as_ref().unwrap().as_ptr();
        p.ensure(&mut slot, 10).unwrap();
        assert_eq!(slot.as_ref().unwrap().as_ptr(), kept, "idle: kept");

        // Large buffers: best fit among those not in flight.
        let l1 = p.take(1000).unwrap();
        let l2 = p.take(2000).unwrap();
        let p1 = l1.as_ptr();
        let pin1 = std::sync::Arc::clone(l1.dma_handle());
        p.put(l1);
        p.put(l2);
        let got = p.take(900).unwrap();
        assert_eq!(
            got.max_data_size(),
            2000,
            "the 1000-byte buffer is in flight"
        );
        drop(pin1);
        assert_eq!(p.take(900).unwrap().as_ptr(), p1);
    }
}
