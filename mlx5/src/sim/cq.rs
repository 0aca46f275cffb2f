//! The CQE producer of one completion queue.
//!
//! PRM "Completion queue": slot `pi & (cqe_cnt-1)`; bytes 0..63 are written first (with
//! [`Cqe::encode`]), then `op_own` is release-stored with the owner bit of the producer
//! counter. Before writing, the producer reads the consumer index from the CQ doorbell record
//! (BE, 24 bits) and refuses to overwrite an entry software has not consumed: that is an
//! overrun. Hardware then raises an asynchronous CQ error event and stops writing to the CQ;
//! the model records the overrun (see [`crate::sim::Fabric::cq_overrun`]), writes no further
//! CQE to it, and moves every QP reporting to it to the error state.

use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};

use crate::cqe::{self, CQE_BYTES, Cqe, CqeOpcode};

/// The producer side of one CQ: a view (cheap to copy) of memory shared by every model that
/// writes the CQ (see [`crate::sim::alloc::COUNTERS_OFF`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct CqState {
    buf: *mut u8,
    cqe_cnt: u32,
    log2: u32,
    dbrec: *mut u32,
    /// Device counters: `[0]` the producer counter (CQEs written), `[1]` nonzero once an
    /// overrun was detected (the CQ is dead).
    ctr: *mut u32,
}

/// What happened to a CQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Push {
    /// Written and published.
    Written,
    /// Not written: this CQE would have overwritten an unconsumed entry (first detection).
    Overrun,
    /// Not written: the CQ overran earlier.
    Dead,
}

impl CqState {
    /// A producer over `cqe_cnt` (power of two) entries at `buf` with doorbell record `dbrec`,
    /// whose device counters follow the record at [`crate::sim::alloc::COUNTERS_OFF`] (zero
    /// for a new CQ).
    pub(crate) fn new(buf: *mut u8, cqe_cnt: u32, dbrec: *mut u32) -> Self {
        debug_assert!(cqe_cnt.is_power_of_two());
        CqState {
            buf,
            cqe_cnt,
            log2: cqe_cnt.trailing_zeros(),
            dbrec,
            ctr: crate::sim::alloc::counters(dbrec),
        }
    }

    fn pi(&self) -> u32 {
        crate::sim::alloc::load(self.ctr, 0)
    }

    /// Whether an overrun was detected.
    pub(crate) fn overrun(&self) -> bool {
        crate::sim::alloc::load(self.ctr, 1) != 0
    }

    /// Consumer index as software last published it (24 bits).
    fn ci(&self) -> u32 {
        // SAFETY: the doorbell record is model memory, alive while this CQ is in the table,
        // 4-byte aligned. Acquire pairs with the consumer's release store of the index, so the
        // consumer has finished reading every entry it released.
        let raw = unsafe { AtomicU32::from_ptr(self.dbrec) }.load(Ordering::Acquire);
        u32::from_be(raw) & 0x00ff_ffff
    }

    /// Writes one CQE (`solicited` sets the SE bit of `op_own`).
    pub(crate) fn push(&self, c: &Cqe, opcode: CqeOpcode, solicited: bool) -> Push {
        if self.overrun() {
            return Push::Dead;
        }
        let pi = self.pi();
        let used = pi.wrapping_sub(self.ci()) & 0x00ff_ffff;
        if used >= self.cqe_cnt {
            crate::sim::alloc::store(self.ctr, 1, 1);
            return Push::Overrun;
        }
        let mut bytes = [0u8; CQE_BYTES];
        c.encode(&mut bytes);
        let slot = (pi & (self.cqe_cnt - 1)) as usize;
        let own = cqe::op_own(opcode, pi, self.log2) | if solicited { 0x02 } else { 0 };
        // SAFETY: the slot is inside the ring (model memory, alive while the CQ is in the
        // table) and software has released it (checked above). Bytes 0..63 are written with
        // plain stores, then `op_own` with a Release store: a consumer that observes the new
        // owner bit with an Acquire load also observes the entry and every data write the model
        // made before it.
        unsafe {
            let p = self.buf.add(slot * CQE_BYTES);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, cqe::off::OP_OWN);
            AtomicU8::from_ptr(p.add(cqe::off::OP_OWN)).store(own, Ordering::Release);
        }
        crate::sim::alloc::store(self.ctr, 0, pi.wrapping_add(1));
        Push::Written
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::alloc::ModelMem;

    fn entry(mem: &ModelMem, i: usize) -> [u8; 64] {
        // SAFETY: test ring of at least `i + 1` entries.
        unsafe { *(mem.ptr().as_ptr().add(i * 64) as *const [u8; 64]) }
    }

    #[test]
    fn owner_bits_and_overrun() {
        let ring = ModelMem::zeroed(4 * 64).unwrap();
        let db = ModelMem::zeroed(64).unwrap();
        let dbrec = db.ptr().as_ptr() as *mut u32;
        let cq = CqState::new(ring.ptr().as_ptr(), 4, dbrec);
        let c = Cqe {
            opcode: 0,
            qpn: 7,
            wqe_opcode: 0x0a,
            wqe_counter: 1,
            byte_cnt: 0,
            imm: 0,
            src_qpn: 0,
            grh: 0,
            srqn: 0,
            syndrome: 0,
            vendor_syndrome: 0,
        };
        for i in 0..4 {
            assert_eq!(cq.push(&c, CqeOpcode::Req, false), Push::Written);
            let e = entry(&ring, i);
            assert!(cqe::sw_owned(e[63], i as u32, 2));
            assert_eq!(Cqe::decode(&e).qpn, 7);
        }
        assert_eq!(cq.push(&c, CqeOpcode::Req, false), Push::Overrun);
        assert_eq!(cq.push(&c, CqeOpcode::Req, false), Push::Dead);

        // A fresh CQ: 4 written, software consumed 3, so 3 more fit (the first with owner 1).
        let db = ModelMem::zeroed(64).unwrap();
        let dbrec = db.ptr().as_ptr() as *mut u32;
        let cq = CqState::new(ring.ptr().as_ptr(), 4, dbrec);
        for _ in 0..4 {
            assert_eq!(cq.push(&c, CqeOpcode::Req, false), Push::Written);
        }
        // SAFETY: the doorbell record is 4-byte aligned model memory.
        unsafe { dbrec.write(3u32.to_be()) };
        for _ in 0..3 {
            assert_eq!(cq.push(&c, CqeOpcode::RespSend, true), Push::Written);
        }
        assert_eq!(entry(&ring, 0)[63], 0x20 | 0x02 | 1);
        assert!(cqe::sw_owned(entry(&ring, 2)[63], 6, 2));
        assert_eq!(cq.push(&c, CqeOpcode::Req, false), Push::Overrun);
    }
}
