//! Receive WQE consumption: RQs (in order) and SRQs (free list through `next_wqe_index`).
//!
//! PRM "Receive queues": an RQ WQE is an array of data segments at `buf + idx*stride`,
//! terminated early by `byte_count = 0, lkey = MLX5_INVALID_LKEY`; software publishes its head
//! (16 bits) in `dbrec[0]`. An SRQ WQE starts with a 16 B next segment (`next_wqe_index` BE16
//! at byte 2); the device keeps its own head, starting at WQE 0, and after consuming a WQE
//! moves to that WQE's `next_wqe_index`; software publishes a 16-bit WQE counter in `dbrec[0]`.
//! A WQE is read only after peeking confirmed, by an Acquire load of the doorbell record,
//! that software published it ("Memory ordering" in `sim/mod.rs`, edge 2).

use std::sync::atomic::{AtomicU32, Ordering};

use crate::sim::alloc;
use crate::wqe::{DATA_BYTES, DataSeg, Sge};

/// Bytes of the SRQ "next" segment.
const SRQ_NEXT_BYTES: usize = 16;

/// A receive WQE as found in the queue: where its scatter list is, read on use (no copy).
///
/// Valid while the lock under which it was peeked is held: it points into the queue's memory,
/// which stays mapped while the object is in the model's tables (or, for a peer's queue, while
/// the model lives).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RecvWqe {
    /// The first data segment.
    segs: *const u8,
    /// Data segments the WQE may hold.
    max_sge: u32,
    /// The CQE `wqe_counter`: RQ counter & 0xffff, or the SRQ WQE index.
    pub(crate) wqe_counter: u16,
}

impl RecvWqe {
    /// Its scatter list: the data segments up to the first terminator (excluded) or
    /// `max_sge`.
    pub(crate) fn sges(&self) -> impl Iterator<Item = Sge> + '_ {
        (0..self.max_sge as usize).map_while(move |i| {
            let mut b = [0u8; DATA_BYTES];
            // SAFETY: the WQE lies inside the queue buffer (index < wqe_cnt, `max_sge`
            // segments fit in the stride); it was published before the Acquire load of the
            // doorbell record in `peek`, and the buffer outlives this view (see the type).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.segs.add(i * DATA_BYTES),
                    b.as_mut_ptr(),
                    DATA_BYTES,
                )
            };
            let d = DataSeg::read(&b);
            (!d.is_terminator()).then_some(d.0)
        })
    }
}

fn load_dbrec(p: *mut u32) -> u32 {
    // SAFETY: doorbell records are model memory, 4-byte aligned, alive while the object is in
    // the model's tables. Acquire pairs with the driver's Release store of the record.
    u32::from_be(unsafe { AtomicU32::from_ptr(p) }.load(Ordering::Acquire))
}

/// The device side of a QP's receive queue.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RqState {
    pub(crate) buf: *mut u8,
    pub(crate) wqe_cnt: u32,
    pub(crate) stride: u32,
    pub(crate) max_sge: u32,
    pub(crate) dbrec: *mut u32,
}

impl RqState {
    /// WQEs consumed (device counter `[0]` of the QP's doorbell block).
    pub(crate) fn consumed(&self) -> u32 {
        alloc::load(alloc::counters(self.dbrec), 0)
    }

    /// WQEs posted and not consumed (`head - consumed` in 16 bits, at most the ring size).
    pub(crate) fn available(&self) -> u32 {
        let head = load_dbrec(self.dbrec) & 0xffff;
        (head.wrapping_sub(self.consumed()) & 0xffff).min(self.wqe_cnt)
    }

    /// The next WQE, if one is posted (not consumed: see [`RqState::commit`]).
    pub(crate) fn peek(&self) -> Option<RecvWqe> {
        if self.available() == 0 {
            return None;
        }
        let consumed = self.consumed();
        let idx = (consumed & (self.wqe_cnt - 1)) as usize;
        // SAFETY: idx < wqe_cnt; the ring holds wqe_cnt * stride bytes.
        let wqe = unsafe { self.buf.add(idx * self.stride as usize) };
        Some(RecvWqe {
            segs: wqe,
            max_sge: self.max_sge,
            wqe_counter: consumed as u16,
        })
    }

    /// Consumes the WQE [`RqState::peek`] returned.
    pub(crate) fn commit(&self) {
        let c = alloc::counters(self.dbrec);
        alloc::store(c, 0, alloc::load(c, 0).wrapping_add(1));
    }
}

/// The device side of a shared receive queue.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SrqState {
    pub(crate) buf: *mut u8,
    pub(crate) wqe_cnt: u32,
    pub(crate) stride: u32,
    pub(crate) max_sge: u32,
    pub(crate) dbrec: *mut u32,
    pub(crate) pd: u32,
}

impl SrqState {
    /// Index of the next WQE the device will use (device counter `[0]` of the SRQ's doorbell
    /// block; 0 for a new SRQ).
    fn head(&self) -> u32 {
        alloc::load(alloc::counters(self.dbrec), 0)
    }

    /// WQEs posted and not consumed (16-bit counter difference, at most the WQE count;
    /// consumed WQEs are device counter `[1]`).
    pub(crate) fn available(&self) -> u32 {
        let counter = load_dbrec(self.dbrec) & 0xffff;
        let consumed = alloc::load(alloc::counters(self.dbrec), 1);
        (counter.wrapping_sub(consumed) & 0xffff).min(self.wqe_cnt)
    }

    fn wqe(&self, idx: u32) -> *const u8 {
        // SAFETY: idx < wqe_cnt (masked by the callers); the buffer holds wqe_cnt * stride.
        unsafe { self.buf.add(idx as usize * self.stride as usize) }
    }

    /// The WQE at the device's head, if one is posted.
    pub(crate) fn peek(&self) -> Option<RecvWqe> {
        if self.available() == 0 {
            return None;
        }
        let head = self.head() & (self.wqe_cnt - 1);
        // SAFETY: the data segments follow the next segment inside the stride.
        let segs = unsafe { self.wqe(head).add(SRQ_NEXT_BYTES) };
        Some(RecvWqe {
            segs,
            max_sge: self.max_sge,
            wqe_counter: head as u16,
        })
    }

    /// Consumes the head WQE: the head moves to its `next_wqe_index`.
    pub(crate) fn commit(&self) {
        let head = self.head() & (self.wqe_cnt - 1);
        let mut b = [0u8; 2];
        // SAFETY: bytes 2..4 of a published WQE (see `peek`).
        unsafe { std::ptr::copy_nonoverlapping(self.wqe(head).add(2), b.as_mut_ptr(), 2) };
        let c = alloc::counters(self.dbrec);
        alloc::store(c, 0, u32::from(u16::from_be_bytes(b)) & (self.wqe_cnt - 1));
        alloc::store(c, 1, alloc::load(c, 1).wrapping_add(1));
    }
}
