//! Completion queue driver: polling by owner bit, CQE decoding, consumer doorbell record.
//!
//! Source: `mlx5-prm.md` "Completion queue". The CQ is a ring of `cqe_cnt` 64 B CQEs. The
//! consumer counter `ci` reads slot `ci & (cqe_cnt - 1)`; that entry belongs to software iff
//! its opcode is not INVALID and its owner bit equals `(ci >> log2(cqe_cnt)) & 1`
//! ([`cqe::sw_owned`]). The producer (hardware or the device model) writes bytes 0-62 first
//! and then release-stores `op_own`, so the driver loads `op_own` with Acquire, checks
//! ownership, issues a read barrier and only then reads the rest. After consuming, the driver
//! publishes `ci & 0xffffff` in the CQ doorbell record (word 0, big-endian) so the producer
//! knows which entries are free again.
//!
//! [`CompletionQueue::poll`] is the monomorphized poller of seeds/001 ("MonoCq"): the callback
//! is a generic parameter, so it inlines into the polling loop, and the doorbell record is
//! written once per batch. [`CompletionQueue::poll_one`] takes one CQE without touching the
//! doorbell record; call [`CompletionQueue::update_dbrec`] after a run of them.
//!
//! Compressed CQEs (format 3) and inline-scatter CQEs (formats 1-2) are never enabled at CQ
//! creation by this crate. A CQE with a non-zero format is treated as corrupt: it is consumed,
//! not delivered, counted ([`CompletionQueue::corrupt_cqes`]) and logged. It is never a
//! panic, in debug builds either: on the device model a CQ ring can be a shared segment that
//! another process's model writes (`sim::node`), so its bytes are input from another process
//! (issue 14).

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::cqe::{self, CQE_BYTES, Cqe};
use crate::mem::barrier::{dma_wmb, read_barrier, store_dbrec};
use crate::queue::CqMem;

/// `op_own` bits 3:2: CQE format (0 none, 1 inline-32, 2 inline-64, 3 compressed).
const FORMAT_MASK: u8 = 0x0c;

/// A completion queue.
#[derive(Debug)]
pub struct CompletionQueue {
    mem: CqMem,
    /// Consumer counter (CQEs consumed, wrapping at 2^32).
    ci: u32,
    /// `cqe_cnt - 1`.
    mask: u32,
    /// `log2(cqe_cnt)`.
    log2_cqe_cnt: u32,
    /// The slot of `ci` ([`CompletionQueue::slot`]), kept with `ci` so that a poll that
    /// finds nothing reads one pointer and one byte.
    next: NonNull<u8>,
    /// The owner bit a software-owned entry at `ci` carries: `(ci >> log2_cqe_cnt) & 1`.
    owner: u8,
    /// CQEs delivered to the caller.
    polled: u64,
    /// CQEs consumed but not delivered because their format was not 0.
    corrupt: u64,
}

// SAFETY: `next` points into `mem`'s ring, which is `Send` (queue memory contract); the
// queue owns no thread-bound state, and `&mut self` guards every access through `next`.
unsafe impl Send for CompletionQueue {}

impl CompletionQueue {
    /// Builds the driver on provider memory. Safe: the memory's validity is the contract of
    /// [`CqMem::new`], and `mem` keeps its owner alive as long as the queue.
    ///
    /// # Panics
    /// If `mem.cqe_cnt` is not a power of two (a provider bug: the memory contract of
    /// [`crate::queue`] requires one).
    pub fn new(mem: CqMem) -> Self {
        assert!(
            mem.cqe_cnt.is_power_of_two(),
            "CQ size {} is not a power of two",
            mem.cqe_cnt
        );
        CompletionQueue {
            mask: mem.cqe_cnt - 1,
            log2_cqe_cnt: mem.cqe_cnt.trailing_zeros(),
            next: mem.buf,
            owner: 0,
            mem,
            ci: 0,
            polled: 0,
            corrupt: 0,
        }
    }

    /// CQ number.
    pub fn cqn(&self) -> u32 {
        self.mem.cqn
    }

    /// Consumer counter (CQEs consumed since creation, wrapping at 2^32).
    pub fn ci(&self) -> u32 {
        self.ci
    }

    /// The memory this queue runs on.
    pub fn mem(&self) -> &CqMem {
        &self.mem
    }

    /// Number of CQEs (`cqe_cnt`).
    #[inline]
    pub fn cqe_cnt(&self) -> u32 {
        self.mem.cqe_cnt
    }

    /// `log2(cqe_cnt)`: the shift that turns `ci` into the expected owner bit.
    #[inline]
    pub fn log2_cqe_cnt(&self) -> u32 {
        self.log2_cqe_cnt
    }

    /// CQEs delivered by [`poll`](Self::poll)/[`poll_one`](Self::poll_one) since creation.
    #[inline]
    pub fn polled(&self) -> u64 {
        self.polled
    }

    /// CQEs consumed but dropped because their format was not 0 (compressed or inline-scatter
    /// CQEs, which this crate never enables: a device bug or memory corruption).
    #[inline]
    pub fn corrupt_cqes(&self) -> u64 {
        self.corrupt
    }

    /// Whether the entry at the consumer counter is software-owned, i.e. a poll now would
    /// return a CQE (or skip a corrupt one): the owner bit and opcode test of
    /// [`poll`](Self::poll) (PRM "Completion Queue": ownership), without consuming anything.
    /// `false` means the device has written nothing new yet; an event loop can skip its
    /// receive step on it.
    #[inline(always)]
    pub fn has_cqe(&self) -> bool {
        let p = self.next.as_ptr().cast_const();
        // SAFETY: as in `next_slot`: `p` is the 64 B aligned CQE at `ci`, valid for the CQ's
        // lifetime; byte 63 is `op_own`, which the producer release-stores.
        let op_own = unsafe { load_op_own(p) };
        op_own < (cqe::CqeOpcode::Invalid as u8) << 4 && (op_own ^ self.owner) & 1 == 0
    }

    /// Pointer to slot `ci & mask`.
    #[inline(always)]
    fn slot(&self, ci: u32) -> *const u8 {
        // SAFETY: `(ci & mask) * 64 < cqe_cnt * 64`, the buffer's size (queue memory contract).
        unsafe {
            self.mem
                .buf
                .as_ptr()
                .add((ci & self.mask) as usize * CQE_BYTES)
        }
    }

    /// Takes the CQE at `ci` if software owns it; consumed-but-corrupt CQEs are skipped.
    #[inline(always)]
    fn next(&mut self) -> Option<Cqe> {
        let (p, _) = self.next_slot()?;
        // SAFETY: a software-owned entry (`next_slot`); the producer does not write it until
        // the doorbell record moves past it.
        let bytes = unsafe { read_cqe(p) };
        Some(Cqe::decode(&bytes))
    }

    /// Advances past the CQE at `ci` if software owns it (corrupt ones are skipped and
    /// counted) and returns its slot and `op_own`, read after the barrier.
    #[inline(always)]
    fn next_slot(&mut self) -> Option<(*const u8, u8)> {
        loop {
            let p = self.next.as_ptr().cast_const();
            debug_assert_eq!(p, self.slot(self.ci));
            // SAFETY: `p` is a 64 B aligned CQE inside the buffer, valid for the CQ's lifetime
            // (queue memory contract); byte 63 is `op_own`, which the producer release-stores.
            let op_own = unsafe { load_op_own(p) };
            // `cqe::sw_owned(op_own, ci, log2_cqe_cnt)` with the owner bit precomputed: the
            // opcode nibble is not INVALID (0xf) and the owner bit matches.
            let owned =
                op_own < (cqe::CqeOpcode::Invalid as u8) << 4 && (op_own ^ self.owner) & 1 == 0;
            debug_assert_eq!(owned, cqe::sw_owned(op_own, self.ci, self.log2_cqe_cnt));
            if !owned {
                return None;
            }
            read_barrier();
            self.advance();
            if op_own & FORMAT_MASK != 0 {
                self.corrupt_cqe(op_own);
                continue;
            }
            self.polled += 1;
            return Some((p, op_own));
        }
    }

    /// Moves `ci` to the next entry, with its slot and expected owner bit: the next slot, or
    /// slot 0 with the owner bit flipped when `ci` wraps around the ring (the bit is
    /// `(ci >> log2_cqe_cnt) & 1`, which changes exactly there, also at `ci`'s own wrap).
    #[inline(always)]
    fn advance(&mut self) {
        self.ci = self.ci.wrapping_add(1);
        if self.ci & self.mask == 0 {
            self.next = self.mem.buf;
            self.owner ^= 1;
        } else {
            // SAFETY: `ci & mask != 0`, so the previous slot was not the last one: the next
            // one is inside the buffer, never null.
            self.next = unsafe { self.next.add(CQE_BYTES) };
        }
        debug_assert_eq!(self.next.as_ptr().cast_const(), self.slot(self.ci));
        debug_assert_eq!(self.owner, ((self.ci >> self.log2_cqe_cnt) & 1) as u8);
    }

    #[cold]
    #[inline(never)]
    fn corrupt_cqe(&mut self, op_own: u8) {
        self.corrupt += 1;
        tracing::warn!(
            "CQ {:#x}: CQE with format {} (op_own {op_own:#04x}) at ci {}: compressed/inline CQEs \
             are never enabled; dropped",
            self.mem.cqn,
            (op_own & FORMAT_MASK) >> 2,
            self.ci.wrapping_sub(1)
        );
    }

    /// Takes one CQE if software owns the next entry (PRM "Ownership"), advancing `ci`.
    /// Does not write the doorbell record: call [`update_dbrec`](Self::update_dbrec) after a
    /// run of `poll_one` calls (before the producer can run out of free entries).
    #[inline]
    pub fn poll_one(&mut self) -> Option<Cqe> {
        self.next()
    }

    /// Polls up to `max` CQEs, calling `f` for each (seeds/001 "MonoCq": `f` is a generic
    /// parameter and inlines). Writes the doorbell record once, after the batch, if any entry
    /// was consumed. Returns the number of CQEs delivered to `f`.
    #[inline]
    pub fn poll<F: FnMut(&Cqe)>(&mut self, max: usize, mut f: F) -> usize {
        self.poll_ref(max, |c| f(&c.decode()))
    }

    /// [`poll`](Self::poll) without the copy and the full decode: `f` gets each CQE in
    /// place as a [`CqeRef`] and reads only the fields it needs (a completion handler's fast
    /// path uses four of [`Cqe`]'s eleven; [`CqeRef::decode`] gives all of them, e.g. for an
    /// error CQE). Same ownership rule, corrupt-entry handling, counters and doorbell record
    /// as `poll`. Returns the number of CQEs delivered to `f`.
    #[inline]
    pub fn poll_ref<F: FnMut(CqeRef<'_>)>(&mut self, max: usize, mut f: F) -> usize {
        let start = self.ci;
        let mut n = 0;
        while n < max {
            let Some((p, op_own)) = self.next_slot() else {
                break;
            };
            f(CqeRef {
                p,
                op_own,
                _entry: PhantomData,
            });
            n += 1;
        }
        if self.ci != start {
            self.update_dbrec();
        }
        n
    }

    /// Publishes the consumer counter: Release fence, then `dbrec[0] = be32(ci & 0xffffff)`
    /// (PRM "After polling"). The producer may reuse every entry before `ci` afterwards.
    #[inline]
    pub fn update_dbrec(&mut self) {
        dma_wmb();
        // SAFETY: `dbrec` is 4-byte aligned and valid for the CQ's lifetime (queue memory
        // contract); the device only reads it.
        unsafe { store_dbrec(self.mem.dbrec.as_ptr(), (self.ci & 0x00ff_ffff).to_be()) };
    }
}

/// A software-owned CQE read in place, field by field ([`CompletionQueue::poll_ref`]). It
/// lives only during the callback: the entry goes back to the producer with the doorbell
/// record, written after the callback returned. Each accessor decodes its field exactly as
/// [`Cqe::decode`] does.
#[derive(Clone, Copy, Debug)]
pub struct CqeRef<'a> {
    /// The 64 B, 64 B-aligned entry.
    p: *const u8,
    /// Byte 63, loaded with Acquire before the read barrier.
    op_own: u8,
    _entry: PhantomData<&'a [u8; CQE_BYTES]>,
}

impl CqeRef<'_> {
    /// Big-endian `u32` at byte `o` of the entry.
    #[inline(always)]
    fn be32(&self, o: usize) -> u32 {
        debug_assert!(o.is_multiple_of(4) && o + 4 <= CQE_BYTES);
        // SAFETY: `o` is 4-aligned and `o + 4 <= 64` (callers pass `cqe::off` constants); the
        // entry is software-owned and valid while `self` lives (type invariant).
        u32::from_be(unsafe { self.p.add(o).cast::<u32>().read_volatile() })
    }

    /// Opcode nibble (raw, see [`cqe::CqeOpcode::from_nibble`]): [`Cqe::opcode`].
    #[inline(always)]
    pub fn opcode(&self) -> u8 {
        self.op_own >> 4
    }

    /// Whether this is an error CQE: [`Cqe::is_error`].
    #[inline(always)]
    pub fn is_error(&self) -> bool {
        let op = self.opcode();
        op == cqe::CqeOpcode::ReqErr as u8 || op == cqe::CqeOpcode::RespErr as u8
    }

    /// QP number: [`Cqe::qpn`].
    #[inline(always)]
    pub fn qpn(&self) -> u32 {
        self.be32(cqe::off::SOP_DROP_QPN) & 0x00ff_ffff
    }

    /// WQE counter: [`Cqe::wqe_counter`].
    #[inline(always)]
    pub fn wqe_counter(&self) -> u16 {
        // The big-endian word at 60 holds `wqe_counter` (60..62) then `signature`, `op_own`.
        (self.be32(cqe::off::WQE_COUNTER) >> 16) as u16
    }

    /// Immediate (host order): [`Cqe::imm`].
    #[inline(always)]
    pub fn imm(&self) -> u32 {
        self.be32(cqe::off::IMM)
    }

    /// Bytes received or read: [`Cqe::byte_cnt`].
    #[inline(always)]
    pub fn byte_cnt(&self) -> u32 {
        self.be32(cqe::off::BYTE_CNT)
    }

    /// Source QPN of a UD receive: [`Cqe::src_qpn`].
    #[inline(always)]
    pub fn src_qpn(&self) -> u32 {
        self.be32(cqe::off::FLAGS_RQPN) & 0x00ff_ffff
    }

    /// Every field, as [`Cqe::decode`] gives them (the op_own byte is the one loaded before
    /// the barrier).
    #[inline]
    pub fn decode(&self) -> Cqe {
        // SAFETY: the entry is software-owned and valid while `self` lives (type invariant).
        let mut b = unsafe { read_cqe(self.p) };
        b[cqe::off::OP_OWN] = self.op_own;
        Cqe::decode(&b)
    }
}

/// Loads a CQE's `op_own` byte with Acquire.
///
/// # Safety
/// `cqe` points to a 64 B CQE valid for reads; byte 63 is only written with single-byte
/// stores (by the device or the model).
#[inline(always)]
unsafe fn load_op_own(cqe: *const u8) -> u8 {
    // SAFETY: caller's contract; `AtomicU8` has alignment 1 and the byte stays valid while the
    // returned reference is used (this call only).
    unsafe { AtomicU8::from_ptr(cqe.add(cqe::off::OP_OWN).cast_mut()) }.load(Ordering::Acquire)
}

/// Copies a 64 B CQE out of the ring with eight volatile 64-bit loads.
///
/// # Safety
/// `cqe` is 8-byte aligned (CQEs are 64 B aligned) and valid for 64 B of reads, and the
/// producer does not write the entry concurrently (software owns it).
#[inline(always)]
unsafe fn read_cqe(cqe: *const u8) -> [u8; CQE_BYTES] {
    let mut w = [0u64; CQE_BYTES / 8];
    let src = cqe.cast::<u64>();
    for (i, x) in w.iter_mut().enumerate() {
        // SAFETY: caller's contract; `i < 8`.
        *x = unsafe { src.add(i).read_volatile() };
    }
    // SAFETY: `[u64; 8]` and `[u8; 64]` have the same size and every bit pattern is valid;
    // the loads kept memory byte order.
    unsafe { std::mem::transmute::<[u64; CQE_BYTES / 8], [u8; CQE_BYTES]>(w) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cqe::{CqeOpcode, OP_OWN_INVALID, op_own};
    use crate::mem::DmaBuf;

    struct Ring {
        buf: DmaBuf,
        db: DmaBuf,
        cnt: u32,
        pi: u32,
    }

    impl Ring {
        fn new(cnt: u32) -> (Ring, CompletionQueue) {
            let buf = DmaBuf::with_normal_pages(cnt as usize * 64).unwrap();
            let db = DmaBuf::with_normal_pages(64).unwrap();
            for i in 0..cnt as usize {
                // SAFETY: inside the buffer.
                unsafe { buf.as_mut_ptr().add(i * 64 + 63).write(OP_OWN_INVALID) };
            }
            // SAFETY: `cnt` CQEs initialised invalid above and a 64-byte doorbell record, in
            // test buffers that the returned `Ring` keeps alive beside the queue (the tests
            // drop the queue first or never use it after the ring) and that only the queue and
            // the test's stand-in device use.
            let cq = CompletionQueue::new(unsafe {
                CqMem::new(buf.as_non_null(), cnt, db.as_non_null().cast(), 3)
            });
            (
                Ring {
                    buf,
                    db,
                    cnt,
                    pi: 0,
                },
                cq,
            )
        }

        fn push_raw(&mut self, c: &Cqe, op: u8) {
            let mut b = [0u8; 64];
            c.encode(&mut b);
            let slot = (self.pi & (self.cnt - 1)) as usize * 64;
            // SAFETY: inside the buffer; nothing else accesses it concurrently.
            unsafe {
                std::ptr::copy_nonoverlapping(b.as_ptr(), self.buf.as_mut_ptr().add(slot), 63);
                self.buf.as_mut_ptr().add(slot + 63).write(op);
            }
            self.pi += 1;
        }

        fn push(&mut self, c: &Cqe) {
            let op = op_own(
                CqeOpcode::from_nibble(c.opcode).unwrap(),
                self.pi,
                self.cnt.trailing_zeros(),
            );
            self.push_raw(c, op);
        }

        fn dbrec(&self) -> u32 {
            // SAFETY: inside the buffer.
            u32::from_be(unsafe { self.db.as_ptr().cast::<u32>().read_volatile() })
        }
    }

    fn cqe(n: u16) -> Cqe {
        Cqe {
            opcode: CqeOpcode::Req as u8,
            qpn: 0x42,
            wqe_opcode: 0x0a,
            wqe_counter: n,
            byte_cnt: 0,
            imm: 0,
            src_qpn: 0,
            grh: 0,
            srqn: 0,
            syndrome: 0,
            vendor_syndrome: 0,
        }
    }

    #[test]
    fn empty_ring_yields_nothing_and_leaves_dbrec() {
        let (r, mut cq) = Ring::new(4);
        assert_eq!(cq.poll_one(), None);
        assert_eq!(cq.poll(8, |_| panic!()), 0);
        assert_eq!(r.dbrec(), 0);
        assert_eq!(cq.log2_cqe_cnt(), 2);
    }

    /// Also in debug builds: no assertion fires (issue 14; this test used to expect a panic
    /// there).
    #[test]
    fn non_zero_format_is_counted_and_skipped() {
        let (mut r, mut cq) = Ring::new(4);
        let op = op_own(CqeOpcode::Req, 0, 2) | (3 << 2);
        r.push_raw(&cqe(0), op);
        r.push(&cqe(1));
        let mut got = vec![];
        assert_eq!(cq.poll(8, |c| got.push(c.wqe_counter)), 1);
        assert_eq!(got, [1]);
        assert_eq!(cq.corrupt_cqes(), 1);
        assert_eq!(cq.ci(), 2);
        assert_eq!(r.dbrec(), 2);
    }

    /// Property tests over arbitrary CQ ring bytes (issue 14 §4): on the device model a CQ
    /// ring may be a shared segment another process's model writes. 256 cases by default;
    /// `PROPTEST_CASES=<n>` runs more (proptest reads the variable itself).
    mod props {
        use proptest::prelude::*;

        use super::*;

        /// Writes `cnt` CQEs of 64 B, each from two 32 B halves of `raw`, into `r`'s buffer;
        /// returns them.
        fn fill(r: &Ring, cnt: u32, raw: &[[u8; 32]]) -> Vec<[u8; 64]> {
            (0..cnt as usize)
                .map(|i| {
                    let mut b = [0u8; 64];
                    b[..32].copy_from_slice(&raw[2 * i]);
                    b[32..].copy_from_slice(&raw[2 * i + 1]);
                    // SAFETY: inside the buffer; nothing else accesses it.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            b.as_ptr(),
                            r.buf.as_mut_ptr().add(i * 64),
                            64,
                        )
                    };
                    b
                })
                .collect()
        }

        proptest! {
            /// Polling a ring of arbitrary CQEs (any opcode, owner bit and format) never panics
            /// (in debug builds either), delivers exactly the software-owned format-0 entries in
            /// order, decoded as `Cqe::decode` decodes them, counts every consumed entry with
            /// another format in `corrupt_cqes`, and stops at the first entry it does not own.
            #[test]
            fn poll_over_arbitrary_ring_bytes(
                log2 in 0u32..4,
                raw in proptest::collection::vec(any::<[u8; 32]>(), 16),
                max in 1usize..20,
            ) {
                let cnt = 1u32 << log2;
                let (r, mut cq) = Ring::new(cnt);
                let ring = fill(&r, cnt, &raw);
                // The oracle: ownership rule, format check, decode.
                let (mut ci, mut want, mut corrupt) = (0u32, Vec::new(), 0u64);
                while want.len() < max {
                    let b = &ring[(ci & (cnt - 1)) as usize];
                    if !cqe::sw_owned(b[cqe::off::OP_OWN], ci, log2) {
                        break;
                    }
                    ci += 1;
                    if b[cqe::off::OP_OWN] & FORMAT_MASK != 0 {
                        corrupt += 1;
                    } else {
                        want.push(Cqe::decode(b));
                    }
                }
                let mut got = Vec::new();
                let n = cq.poll(max, |c| got.push(*c));
                prop_assert_eq!(n, got.len());
                prop_assert_eq!(&got, &want);
                prop_assert_eq!(cq.corrupt_cqes(), corrupt);
                prop_assert_eq!(cq.ci(), ci);
                if ci != 0 {
                    prop_assert_eq!(r.dbrec(), ci);
                }
            }

            /// `poll_ref` over the same arbitrary rings: the same entries, counters and
            /// doorbell record as `poll`, and each accessor equals the field `Cqe::decode`
            /// gives, as does `CqeRef::decode`.
            #[test]
            fn poll_ref_matches_poll(
                log2 in 0u32..4,
                raw in proptest::collection::vec(any::<[u8; 32]>(), 16),
                max in 1usize..20,
            ) {
                let cnt = 1u32 << log2;
                let (r1, mut cq1) = Ring::new(cnt);
                fill(&r1, cnt, &raw);
                let (r2, mut cq2) = Ring::new(cnt);
                fill(&r2, cnt, &raw);
                let mut want = Vec::new();
                let n1 = cq1.poll(max, |c| want.push(*c));
                let mut got = Vec::new();
                let n2 = cq2.poll_ref(max, |c| {
                    let d = c.decode();
                    got.push((d, c.opcode(), c.is_error(), c.qpn(), c.wqe_counter(), c.imm(), c.byte_cnt()));
                });
                prop_assert_eq!(n1, n2);
                prop_assert_eq!(want.len(), got.len());
                for (w, (d, opcode, is_error, qpn, wqe_counter, imm, byte_cnt)) in want.iter().zip(&got) {
                    prop_assert_eq!(w, d);
                    prop_assert_eq!(w.opcode, *opcode);
                    prop_assert_eq!(w.is_error(), *is_error);
                    prop_assert_eq!(w.qpn, *qpn);
                    prop_assert_eq!(w.wqe_counter, *wqe_counter);
                    prop_assert_eq!(w.imm, *imm);
                    prop_assert_eq!(w.byte_cnt, *byte_cnt);
                }
                prop_assert_eq!(cq1.corrupt_cqes(), cq2.corrupt_cqes());
                prop_assert_eq!(cq1.polled(), cq2.polled());
                prop_assert_eq!(cq1.ci(), cq2.ci());
                prop_assert_eq!(r1.dbrec(), r2.dbrec());
            }

            /// `has_cqe` over the same arbitrary rings, before every single-entry poll: true
            /// exactly when that poll consumes the entry at `ci` (delivered or skipped as
            /// corrupt), and it consumes nothing itself.
            #[test]
            fn has_cqe_is_true_exactly_when_a_poll_consumes(
                log2 in 0u32..4,
                raw in proptest::collection::vec(any::<[u8; 32]>(), 16),
            ) {
                let cnt = 1u32 << log2;
                let (r, mut cq) = Ring::new(cnt);
                let ring = fill(&r, cnt, &raw);
                for _ in 0..cnt {
                    let ci = cq.ci();
                    let owned = cqe::sw_owned(ring[(ci & (cnt - 1)) as usize][cqe::off::OP_OWN], ci, log2);
                    prop_assert_eq!(cq.has_cqe(), owned);
                    prop_assert_eq!(cq.ci(), ci);
                    // One entry at a time: a corrupt one is skipped and the next examined.
                    let corrupt = cq.corrupt_cqes();
                    let got = cq.poll_ref(1, |_| ());
                    let consumed = cq.ci() - ci;
                    prop_assert_eq!(consumed >= 1, owned);
                    if !owned {
                        prop_assert_eq!(got, 0);
                        break;
                    }
                    // `poll_ref` skips corrupt entries until it delivers one or stops.
                    prop_assert_eq!(u64::from(consumed), cq.corrupt_cqes() - corrupt + got as u64);
                    if got == 0 {
                        break;
                    }
                }
            }
        }
    }
}
