//! Shared receive queue driver: free list through `next_wqe_index`.
//!
//! Source: `mlx5-prm.md` "Receive queues" (SRQ WQE); the algorithm is rdma-core's mlx5 SRQ
//! (`mlx5_alloc_srq_buf`, `mlx5_post_srq_recv`, `mlx5_free_srq_wqe`).
//!
//! An SRQ WQE is a 16 B *next segment* (`next_wqe_index` BE16 at byte 2) followed by up to
//! `max_sge` 16 B data segments (terminated by `byte_count = 0, lkey = 0x100` when fewer are
//! used), `stride` bytes apart. Several QPs take receive WQEs from one SRQ, so WQEs complete
//! in any order; free WQEs therefore form a linked list through `next_wqe_index`, in the
//! buffer, where the device follows it.
//!
//! # The list, the sentinel and the device
//! At creation WQE `i` links to `i + 1` (the last links back to 0), the driver's `head` (next
//! WQE to post) is 0 and its `tail` (last WQE of the list) is `wqe_cnt - 1`.
//! - [`SharedRecvQueue::post`] fills the WQE at `head` and moves `head` to its
//!   `next_wqe_index`; [`SharedRecvQueue::ring_doorbell`] publishes the number of WQEs posted.
//! - The device keeps its own head, which **starts at WQE 0** and, each time it consumes the
//!   WQE there, moves to that WQE's `next_wqe_index`; it consumes only as many WQEs as the
//!   doorbell record says were posted. Hardware does this; the device model does exactly the
//!   same. The device reports the WQE it used in the responder CQE's `wqe_counter`.
//! - [`SharedRecvQueue::release`] re-links such a WQE at the tail: `tail.next_wqe_index = i`,
//!   `tail = i`.
//! - Sentinel: the tail WQE is never posted, so at most `wqe_cnt - 1` WQEs are posted at once
//!   (`head == tail` means full). The tail's `next_wqe_index` is not final until the next
//!   release writes it; never posting the tail guarantees the device never consumes a WQE
//!   whose link is still to be written (it reads a WQE's link when it consumes it).

use crate::error::{Error, Result};
use crate::mem::barrier::{dma_wmb, store_dbrec};
use crate::queue::SrqMem;
use crate::wqe::{DATA_BYTES, DataSeg, INVALID_LKEY, Sge};

/// Size of the SRQ next segment in bytes.
pub const NEXT_SEG_BYTES: usize = 16;
/// Byte offset of `next_wqe_index` (BE16) in the next segment.
pub const NEXT_WQE_INDEX_OFF: usize = 2;

/// A shared receive queue.
#[derive(Debug)]
pub struct SharedRecvQueue {
    mem: SrqMem,
    /// `wqe_cnt - 1`.
    mask: u32,
    /// Next WQE to post (free-list head).
    head: u32,
    /// Last WQE of the free list (the sentinel, never posted).
    tail: u32,
    /// WQEs posted since creation (wrapping).
    counter: u32,
    /// WQEs released since creation (wrapping).
    released: u32,
    /// `counter` at the last doorbell.
    db_counter: u32,
    /// One bit per WQE: posted and not yet released. Sized for the largest SRQ (2^16 WQEs,
    /// 8 KiB), so that a 16-bit WQE index needs no bounds check. Bits at and above `wqe_cnt`
    /// are always 0 (only WQEs on the free list, all below `wqe_cnt`, are posted).
    posted_bits: Box<[u64; POSTED_WORDS]>,
    /// Every WQE's first data segment holds the terminator: written into all of them at
    /// creation (`max_sge > 0`), false from the first post of a non-empty scatter list on.
    /// While it holds, posting an empty list writes nothing into the WQE (the device only
    /// reads receive WQEs, so the bytes stay as written).
    terminated: bool,
}

impl SharedRecvQueue {
    /// Builds the driver on provider memory and links every WQE into the free list
    /// (`i → i + 1 mod wqe_cnt`, head 0, tail `wqe_cnt - 1`), writing each next segment.
    /// Safe: the memory's validity is the contract of [`SrqMem::new`], and `mem` keeps its
    /// owner alive as long as the queue.
    ///
    /// # Panics
    /// If `mem.ring.wqe_cnt` is not a power of two in `2..=65536` (WQE indices are 16-bit) or
    /// `mem.ring.stride < 16 + 16 * max_sge` (a provider bug: queue memory contract of
    /// [`crate::queue`]).
    pub fn new(mem: SrqMem) -> Self {
        let cnt = mem.ring.wqe_cnt;
        assert!(
            cnt.is_power_of_two()
                && (2..=1 << 16).contains(&cnt)
                && mem.ring.stride as u64
                    >= (NEXT_SEG_BYTES + DATA_BYTES * mem.ring.max_sge as usize) as u64,
            "SRQ of {cnt} WQEs, stride {} B, {} SGEs: bad geometry",
            mem.ring.stride,
            mem.ring.max_sge
        );
        let mut q = SharedRecvQueue {
            mask: cnt - 1,
            head: 0,
            tail: cnt - 1,
            counter: 0,
            released: 0,
            db_counter: 0,
            posted_bits: Box::new([0; POSTED_WORDS]),
            terminated: mem.ring.max_sge > 0,
            mem,
        };
        for i in 0..cnt {
            // SAFETY: `i < wqe_cnt`; nothing is posted yet, so the device reads no WQE.
            let seg = unsafe { q.wqe_bytes(i, NEXT_SEG_BYTES) };
            seg.fill(0);
            seg[NEXT_WQE_INDEX_OFF..NEXT_WQE_INDEX_OFF + 2]
                .copy_from_slice(&(((i + 1) & (cnt - 1)) as u16).to_be_bytes());
            if q.terminated {
                // SAFETY: as above; `16 + 16 <= stride` (geometry asserted, max_sge > 0).
                let b = unsafe { q.wqe_bytes(i, NEXT_SEG_BYTES + DATA_BYTES) };
                DataSeg(TERMINATOR).write(&mut b[NEXT_SEG_BYTES..]);
            }
        }
        q
    }

    /// SRQ number.
    pub fn srqn(&self) -> u32 {
        self.mem.srqn
    }

    /// The memory this queue runs on.
    pub fn mem(&self) -> &SrqMem {
        &self.mem
    }

    /// Number of WQEs in the buffer (`wqe_cnt`).
    #[inline]
    pub fn wqe_cnt(&self) -> u32 {
        self.mem.ring.wqe_cnt
    }

    /// Most WQEs posted at once: `wqe_cnt - 1` (the tail is the list's sentinel).
    #[inline]
    pub fn capacity(&self) -> u32 {
        self.mem.ring.wqe_cnt - 1
    }

    /// WQEs posted and not yet released.
    #[inline]
    pub fn posted(&self) -> u32 {
        self.counter.wrapping_sub(self.released)
    }

    /// WQEs that can be posted now (`capacity - posted`).
    #[inline]
    pub fn available(&self) -> u32 {
        self.capacity() - self.posted()
    }

    /// WQEs posted since creation (wrapping at 2^32); the doorbell carries its low 16 bits.
    #[inline]
    pub fn counter(&self) -> u32 {
        self.counter
    }

    /// WQEs posted since the last doorbell.
    #[inline]
    pub fn pending_since_doorbell(&self) -> u32 {
        self.counter.wrapping_sub(self.db_counter)
    }

    /// Free-list head: the WQE the next [`post`](Self::post) fills.
    #[inline]
    pub fn head(&self) -> u16 {
        self.head as u16
    }

    /// Free-list tail: the sentinel WQE.
    #[inline]
    pub fn tail(&self) -> u16 {
        self.tail as u16
    }

    /// Whether WQE `wqe_index` is posted and not yet released. One bitmap test: only WQEs
    /// below `wqe_cnt` are ever posted, so the bits of larger indices stay 0 (the bitmap
    /// covers every 16-bit index) and such an index reads as not posted.
    #[inline]
    pub fn is_posted(&self, wqe_index: u16) -> bool {
        self.posted_bits[usize::from(wqe_index / 64)] & (1 << (wqe_index % 64)) != 0
    }

    /// Takes the free-list head, writes the scatter list `sges` into it (terminated by
    /// `byte_count = 0, lkey = 0x100` when shorter than `max_sge`; empty: a zero-length
    /// receive), advances the head and returns the WQE index (what the responder CQE's
    /// `wqe_counter` will name). Not visible to the device until
    /// [`ring_doorbell`](Self::ring_doorbell).
    ///
    /// # Errors
    /// Nothing is written on error.
    /// - [`Error::WqeTooLarge`]: more than `max_sge` entries;
    /// - [`Error::RqFull`]: `wqe_cnt - 1` WQEs are posted (see the module docs, "sentinel").
    ///
    /// # Safety
    /// The device writes a received message into the memory `sges` names (registered,
    /// lkey): it must stay valid, and no Rust reference to it may be live, from this post
    /// until the WQE's completion is polled (or the queue is destroyed, or flushed in
    /// error). An empty list (a zero-length receive) has no requirement.
    #[inline]
    pub unsafe fn post(&mut self, sges: &[Sge]) -> Result<u16> {
        let max = self.mem.ring.max_sge as usize;
        if sges.len() > max {
            return Err(too_many_sges(sges.len(), max));
        }
        if self.head == self.tail {
            return Err(srq_full());
        }
        let idx = self.head;
        if !sges.is_empty() {
            // This WQE's first data segment is overwritten below.
            self.terminated = false;
        }
        let used = (sges.len() + 1).min(max);
        // SAFETY: `idx < wqe_cnt` (masked below / set at creation); the WQE is on the free
        // list, not posted, so the device does not read it; `16 + used * 16 <= stride`.
        let b = unsafe { self.wqe_bytes(idx, NEXT_SEG_BYTES + used * DATA_BYTES) };
        let next = u16::from_be_bytes([b[NEXT_WQE_INDEX_OFF], b[NEXT_WQE_INDEX_OFF + 1]]);
        let data = &mut b[NEXT_SEG_BYTES..];
        for (i, s) in sges.iter().enumerate() {
            DataSeg(*s).write(&mut data[i * DATA_BYTES..]);
        }
        if sges.len() < max {
            DataSeg(TERMINATOR).write(&mut data[sges.len() * DATA_BYTES..]);
        }
        debug_assert!(
            !self.is_posted(idx as u16),
            "SRQ free list reached posted WQE {idx}"
        );
        self.posted_bits[bit_word(idx)] |= 1 << (idx % 64);
        self.head = u32::from(next) & self.mask;
        self.counter = self.counter.wrapping_add(1);
        Ok(idx as u16)
    }

    /// Posts one zero-length receive WQE (terminator only), as copyrpc does for RDMA WRITE
    /// with immediate, whose data lands in a ring and not in the receive buffer.
    ///
    /// # Errors
    /// [`Error::RqFull`] when `wqe_cnt - 1` WQEs are posted.
    #[inline]
    pub fn post_empty(&mut self) -> Result<u16> {
        // SAFETY: an empty scatter list: the device writes no memory for this WQE.
        unsafe { self.post(&[]) }
    }

    /// Posts up to `n` zero-length receive WQEs (as many as are available) and returns how
    /// many were posted. Ring the doorbell afterwards.
    ///
    /// The loop is [`post`](Self::post) of an empty list with the checks that cannot fail
    /// hoisted (`k <= available`, so the head never reaches the sentinel; an empty list fits
    /// every geometry) and the head and counter kept in registers.
    pub fn post_empty_n(&mut self, n: u32) -> u32 {
        let k = n.min(self.available());
        // The terminator is written when `max_sge > 0`, as `post` does for a short list,
        // unless every WQE still holds it (`terminated`).
        let data_segs = usize::from(self.mem.ring.max_sge > 0 && !self.terminated);
        let mut head = self.head;
        for _ in 0..k {
            debug_assert!(head != self.tail, "SRQ free list reached the sentinel");
            let idx = head;
            // SAFETY: `idx < wqe_cnt` (masked / set at creation); the WQE is on the free
            // list, not posted, so the device does not read it; `16 + 16 * data_segs <=
            // stride` (geometry checked at creation).
            let b = unsafe { self.wqe_bytes(idx, NEXT_SEG_BYTES + data_segs * DATA_BYTES) };
            let next = u16::from_be_bytes([b[NEXT_WQE_INDEX_OFF], b[NEXT_WQE_INDEX_OFF + 1]]);
            if data_segs != 0 {
                DataSeg(TERMINATOR).write(&mut b[NEXT_SEG_BYTES..]);
            }
            debug_assert!(
                !self.is_posted(idx as u16),
                "SRQ free list reached posted WQE {idx}"
            );
            self.posted_bits[bit_word(idx)] |= 1 << (idx % 64);
            head = u32::from(next) & self.mask;
        }
        self.head = head;
        self.counter = self.counter.wrapping_add(k);
        k
    }

    /// Posts a zero-length receive WQE into every free entry and rings the doorbell once;
    /// returns how many were posted (the SRQ of a transport whose data arrives by RDMA WRITE
    /// and whose receives only carry immediates, seeds/001 "SRQ共有").
    pub fn fill_empty(&mut self) -> u32 {
        let n = self.post_empty_n(self.available());
        self.ring_doorbell();
        n
    }

    /// Publishes the WQEs posted so far: store barrier, then
    /// `dbrec[0] = be32(counter & 0xffff)`. The SRQ doorbell record's WQE counter is 16 bits
    /// wide (rdma-core keeps `uint16_t counter`), like the RQ's; the device extends it against
    /// its own count. Returns at once if nothing was posted since the last doorbell.
    #[inline]
    pub fn ring_doorbell(&mut self) {
        if self.counter == self.db_counter {
            return;
        }
        dma_wmb();
        // SAFETY: `dbrec` is 4-byte aligned and valid (queue memory contract).
        unsafe {
            store_dbrec(
                self.mem.ring.dbrec.as_ptr(),
                (self.counter & 0xffff).to_be(),
            )
        };
        self.db_counter = self.counter;
    }

    /// Returns WQE `wqe_index` (a responder CQE's `wqe_counter` for this SRQ, in any order) to
    /// the free list: the current tail links to it and it becomes the new tail.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] (nothing changes) if `wqe_index >= wqe_cnt` or the WQE is
    /// not posted (never posted, or already released): a corrupt or duplicated CQE must not
    /// corrupt the list.
    #[inline]
    pub fn release(&mut self, wqe_index: u16) -> Result<()> {
        let i = u32::from(wqe_index);
        if !self.is_posted(wqe_index) {
            return Err(bad_release(i, self.mem.ring.wqe_cnt));
        }
        self.posted_bits[usize::from(wqe_index / 64)] &= !(1 << (i % 64));
        let tail = self.tail;
        // SAFETY: `tail < wqe_cnt`; the tail is never posted, so the device does not read it.
        let seg = unsafe { self.wqe_bytes(tail, NEXT_SEG_BYTES) };
        seg[NEXT_WQE_INDEX_OFF..NEXT_WQE_INDEX_OFF + 2].copy_from_slice(&wqe_index.to_be_bytes());
        self.tail = i;
        self.released = self.released.wrapping_add(1);
        Ok(())
    }

    /// The first `len` bytes of WQE `idx`.
    ///
    /// # Safety
    /// `idx < wqe_cnt`, `len <= stride`, and the WQE is not posted (the device does not read
    /// it while the slice lives). The buffer is valid for `wqe_cnt * stride` bytes (queue
    /// memory contract, [`crate::queue`]); `&mut self` excludes any other driver access.
    #[inline(always)]
    unsafe fn wqe_bytes(&mut self, idx: u32, len: usize) -> &mut [u8] {
        debug_assert!(idx < self.mem.ring.wqe_cnt && len <= self.mem.ring.stride as usize);
        // SAFETY: caller's contract.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.mem
                    .ring
                    .buf
                    .as_ptr()
                    .add(idx as usize * self.mem.ring.stride as usize),
                len,
            )
        }
    }
}

/// Words of [`SharedRecvQueue`]'s posted bitmap: one bit per WQE of the largest SRQ.
const POSTED_WORDS: usize = (1 << 16) / 64;

/// Word of the posted bitmap holding WQE `idx`'s bit (`idx < wqe_cnt <= 2^16`, so the
/// truncation to 16 bits keeps it, and the word index is below [`POSTED_WORDS`]).
#[inline(always)]
fn bit_word(idx: u32) -> usize {
    debug_assert!(idx < 1 << 16);
    usize::from(idx as u16 / 64)
}

/// Terminator data segment of a short scatter list.
const TERMINATOR: Sge = Sge {
    addr: 0,
    len: 0,
    lkey: INVALID_LKEY,
};

#[cold]
#[inline(never)]
fn too_many_sges(n: usize, max: usize) -> Error {
    Error::WqeTooLarge(format!(
        "SRQ receive WQE with {n} SGEs; the SRQ allows {max}"
    ))
}

#[cold]
#[inline(never)]
fn srq_full() -> Error {
    Error::RqFull
}

#[cold]
#[inline(never)]
fn bad_release(i: u32, cnt: u32) -> Error {
    Error::InvalidArgument(if i >= cnt {
        format!("SRQ WQE index {i} out of range ({cnt} WQEs)")
    } else {
        format!("SRQ WQE {i} released but not posted")
    })
}
