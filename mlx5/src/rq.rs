//! Receive queue driver (RQ): in-order receive WQEs.
//!
//! Source: `mlx5-prm.md` "Receive queues" (RQ WQE). The RQ is a ring of `wqe_cnt` WQEs of
//! `stride` bytes; WQE `head` lives at `buf + (head & (wqe_cnt - 1)) * stride` and is an array
//! of up to `max_sge` 16 B data segments, terminated, when fewer are used, by one segment with
//! `byte_count = 0, lkey = INVALID_LKEY (0x100)`. The device consumes WQEs strictly in order;
//! each responder CQE for the QP consumes the oldest one ([`RecvQueue::complete`]). Doorbell:
//! `dbrec[0] = be32(head & 0xffff)` (the producer, in WQEs).

use crate::error::{Error, Result};
use crate::mem::barrier::{dma_wmb, store_dbrec};
use crate::queue::RqMem;
use crate::wqe::{DATA_BYTES, DataSeg, INVALID_LKEY, Sge};

/// The receive queue of one QP (without SRQ).
#[derive(Debug)]
pub struct RecvQueue {
    mem: RqMem,
    /// WQEs posted (head).
    head: u32,
    /// WQEs completed (tail): `head - tail` are posted and not yet consumed.
    tail: u32,
    /// `wqe_cnt - 1`.
    mask: u32,
    /// `head` at the last doorbell.
    db_head: u32,
    /// WQEs written by [`post`](Self::post), saturating at `wqe_cnt`: once it reaches
    /// `wqe_cnt`, every slot holds a WQE (slots are written in order from 0).
    written: u32,
}

impl RecvQueue {
    /// Builds the driver on provider memory. Safe: the memory's validity is the contract of
    /// [`RqMem::new`], and `mem` keeps its owner alive as long as the queue.
    ///
    /// # Panics
    /// If `mem.wqe_cnt` is not a power of two, or `mem.stride < 16 * max_sge` (a provider bug:
    /// the queue memory contract of [`crate::queue`]).
    pub fn new(mem: RqMem) -> Self {
        assert!(
            mem.wqe_cnt.is_power_of_two()
                && mem.stride as u64 >= DATA_BYTES as u64 * mem.max_sge as u64,
            "receive queue of {} WQEs, stride {} B, {} SGEs: bad geometry",
            mem.wqe_cnt,
            mem.stride,
            mem.max_sge
        );
        RecvQueue {
            mask: mem.wqe_cnt - 1,
            mem,
            head: 0,
            tail: 0,
            db_head: 0,
            written: 0,
        }
    }

    /// WQEs posted so far.
    pub fn head(&self) -> u32 {
        self.head
    }

    /// The memory this queue runs on.
    pub fn mem(&self) -> &RqMem {
        &self.mem
    }

    /// WQEs completed so far (the next responder CQE consumes WQE `tail`).
    #[inline]
    pub fn tail(&self) -> u32 {
        self.tail
    }

    /// Ring size in WQEs.
    #[inline]
    pub fn wqe_cnt(&self) -> u32 {
        self.mem.wqe_cnt
    }

    /// Posted WQEs not yet consumed (`head - tail`).
    #[inline]
    pub fn posted(&self) -> u32 {
        self.head.wrapping_sub(self.tail)
    }

    /// WQEs that can be posted now (`wqe_cnt - posted`).
    #[inline]
    pub fn free(&self) -> u32 {
        self.mem.wqe_cnt - self.posted()
    }

    /// WQEs posted since the last doorbell.
    #[inline]
    pub fn pending_since_doorbell(&self) -> u32 {
        self.head.wrapping_sub(self.db_head)
    }

    /// Writes one receive WQE with the scatter list `sges` at slot `head & (wqe_cnt - 1)`
    /// (terminated by `byte_count = 0, lkey = 0x100` when shorter than `max_sge`; an empty
    /// list is a zero-length receive) and advances `head`. Not visible to the device until
    /// [`ring_doorbell`](Self::ring_doorbell).
    ///
    /// # Errors
    /// Nothing is written on error.
    /// - [`Error::WqeTooLarge`]: more than `max_sge` entries;
    /// - [`Error::RqFull`]: `wqe_cnt` WQEs are posted and not completed.
    ///
    /// # Safety
    /// The device writes a received message into the memory `sges` names (registered,
    /// lkey): it must stay valid, and no Rust reference to it may be live, from this post
    /// until the WQE's completion is polled (or the queue is destroyed, or flushed in
    /// error). An empty list has no requirement.
    #[inline]
    pub unsafe fn post(&mut self, sges: &[Sge]) -> Result<()> {
        let max = self.mem.max_sge as usize;
        if sges.len() > max {
            return Err(too_many_sges(sges.len(), max));
        }
        if self.posted() == self.mem.wqe_cnt {
            return Err(rq_full());
        }
        let used = (sges.len() + 1).min(max);
        // SAFETY: the slot is inside the ring and free (posted < wqe_cnt), so the device does
        // not read it; `used * 16 <= max_sge * 16 <= stride`.
        let b = unsafe { self.slot_bytes(self.head & self.mask, used) };
        for (i, s) in sges.iter().enumerate() {
            DataSeg(*s).write(&mut b[i * DATA_BYTES..]);
        }
        if sges.len() < max {
            DataSeg(TERMINATOR).write(&mut b[sges.len() * DATA_BYTES..]);
        }
        self.head = self.head.wrapping_add(1);
        if self.written < self.mem.wqe_cnt {
            self.written += 1;
        }
        Ok(())
    }

    /// Posts one zero-length receive WQE (terminator only), as copyrpc does for RDMA WRITE
    /// with immediate, whose data lands in a ring and not in the receive buffer.
    ///
    /// # Errors
    /// [`Error::RqFull`]: `wqe_cnt` WQEs are posted and not completed.
    #[inline]
    pub fn post_empty(&mut self) -> Result<()> {
        // SAFETY: an empty scatter list: the device writes no memory for this WQE.
        unsafe { self.post(&[]) }
    }

    /// Re-posts the next `n` WQEs unchanged: advances `head` by `n` without writing, so each
    /// of those slots is posted again with the scatter list it was last posted with (the
    /// device never writes receive WQEs). For a consumer that always posts the same buffer
    /// at the same slot (a ring of `wqe_cnt` fixed receive buffers) this is the whole
    /// re-post: no WQE is rewritten, only the doorbell record moves
    /// ([`ring_doorbell`](Self::ring_doorbell)).
    ///
    /// Returns `false`, changing nothing, unless every slot has been written by
    /// [`post`](Self::post) at least once and `n` WQEs are free.
    ///
    /// # Safety
    /// As [`post`](Self::post), for the scatter lists of the re-posted slots.
    #[inline]
    pub unsafe fn repost(&mut self, n: u32) -> bool {
        if self.written < self.mem.wqe_cnt || n > self.free() {
            return false;
        }
        self.head = self.head.wrapping_add(n);
        true
    }

    /// The first `segs * 16` bytes of WQE `slot`.
    ///
    /// # Safety
    /// `slot < wqe_cnt`, `segs * 16 <= stride`, and the WQE is not posted (the device does not
    /// read it). The ring is valid for `wqe_cnt * stride` bytes (queue memory contract,
    /// [`crate::queue`]); `&mut self` excludes any other driver access.
    #[inline(always)]
    unsafe fn slot_bytes(&mut self, slot: u32, segs: usize) -> &mut [u8] {
        debug_assert!(slot < self.mem.wqe_cnt && segs * DATA_BYTES <= self.mem.stride as usize);
        // SAFETY: caller's contract.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.mem
                    .buf
                    .as_ptr()
                    .add(slot as usize * self.mem.stride as usize),
                segs * DATA_BYTES,
            )
        }
    }

    /// Publishes the WQEs posted so far: store barrier, then `dbrec[0] = be32(head & 0xffff)`.
    /// Returns at once if nothing was posted since the last doorbell.
    #[inline]
    pub fn ring_doorbell(&mut self) {
        if self.head == self.db_head {
            return;
        }
        dma_wmb();
        // SAFETY: `dbrec` is 4-byte aligned and valid (queue memory contract); word 0 is the
        // receive queue producer.
        unsafe { store_dbrec(self.mem.dbrec.as_ptr(), (self.head & 0xffff).to_be()) };
        self.db_head = self.head;
    }

    /// Consumes the oldest posted WQE: call once per responder CQE (success or error/flush) of
    /// this QP. A call with nothing posted is ignored (and asserts in debug builds).
    #[inline]
    pub fn complete(&mut self) {
        if self.tail == self.head {
            spurious_completion();
            return;
        }
        self.tail = self.tail.wrapping_add(1);
    }
}

/// Terminator data segment of a short scatter list.
const TERMINATOR: Sge = Sge {
    addr: 0,
    len: 0,
    lkey: INVALID_LKEY,
};

#[cold]
#[inline(never)]
fn spurious_completion() {
    debug_assert!(false, "RQ completion with no receive WQE posted");
}

#[cold]
#[inline(never)]
fn too_many_sges(n: usize, max: usize) -> Error {
    Error::WqeTooLarge(format!("receive WQE with {n} SGEs; the queue allows {max}"))
}

#[cold]
#[inline(never)]
fn rq_full() -> Error {
    Error::RqFull
}
