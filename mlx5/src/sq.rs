//! Send queue driver: WQEBB ring accounting, WQE posting, selective signaling, doorbell.
//!
//! Source: `mlx5-prm.md` "Send queue". The send queue is a ring of `wqe_cnt` WQE basic blocks
//! (WQEBBs) of 64 B. The producer counter `pi` counts WQEBBs; a WQE of `ds` 16 B units starts
//! at slot `pi & (wqe_cnt - 1)`, carries `wqe_index = pi & 0xffff` in its control segment and
//! occupies [`wqebbs(ds)`](crate::wqe::wqebbs) WQEBBs.
//!
//! # Ring end: NOP padding
//! The PRM allows a WQE to continue past the ring end at block 0; this driver never does that.
//! A WQE that would cross the ring end is preceded by NOP WQE(s) covering the remaining WQEBBs
//! of the ring (as seeds/001 does), so every WQE is contiguous in memory: it is written with one
//! [`WqeDesc::write`] and can be copied to the BlueFlame register in one piece. Padding NOPs are
//! unsignaled, have `ds = min(4 * k, 63)` for the `k <= 16` WQEBBs each covers (the padding is
//! at most 15 WQEBBs, since a WQE is at most 16, so in practice one NOP), and are retired with
//! the next signaled WQE. A consequence: a WQE of `n` WQEBBs needs up to `2n - 1` free WQEBBs
//! at an unlucky position, so WQEs larger than `(wqe_cnt + 1) / 2` WQEBBs are rejected
//! ([`Error::WqeTooLarge`]) rather than being able to wait forever on an empty ring. With the
//! usual ring sizes (>= 32 WQEBBs) every WQE up to `ds = 63` fits.
//!
//! # Selective signaling
//! Only WQEs with [`CQ_UPDATE`] produce a CQE; the requester CQE's
//! `wqe_counter` names the signaled WQE and retires it together with every earlier WQE
//! (PRM "Requester CQE"). The driver records, for every WQE it writes (padding included), the
//! producer counter after it, in a ring indexed by the WQE's first slot;
//! [`SendQueue::retire`] turns a CQE's 16-bit `wqe_counter` back into the 32-bit counter and
//! frees everything up to the end of that WQE.
//!
//! # Doorbell
//! [`SendQueue::ring_doorbell`]: store barrier, `dbrec[1] = be32(pi & 0xffff)`, then the UAR /
//! BlueFlame write on hardware (see its docs) or a call into the device model.

use crate::error::{Error, Result};
use crate::mem::barrier::{dma_wmb, store_dbrec, wc_flush};
use crate::queue::{BlueFlame, Doorbell, SqMem};
use crate::wqe::{
    CQ_UPDATE, CTRL_BYTES, CtrlSeg, DGRAM_BYTES, DS_BYTES, EncodedAv, INLINE_SEG, MAX_DS, Opcode,
    RADDR_BYTES, RaddrSeg, WQEBB, WqeDesc, inline_seg_bytes, wqebbs, write_inline2,
};

/// Largest WQE in WQEBBs: `wqebbs(63)` = 16.
pub const MAX_WQEBBS: u32 = wqebbs(MAX_DS);

/// Largest ring this driver accepts, in WQEBBs: a CQE's 16-bit `wqe_counter` must name a
/// unique outstanding WQE.
pub const MAX_WQE_CNT: u32 = 1 << 16;

/// The send queue of one QP.
#[derive(Debug)]
pub struct SendQueue {
    mem: SqMem,
    qpn: u32,
    /// Producer counter in WQEBBs.
    pi: u32,
    /// WQEBBs before this counter are retired (free); `pi - retired` are outstanding.
    retired: u32,
    /// `wqe_cnt - 1`.
    mask: u32,
    /// Producer counter up to which WQEs can be written now without padding: `limit - pi`
    /// is at most `min(free, to_end)` (free WQEBBs, WQEBBs up to the ring end) and equal to
    /// it after [`SendQueue::make_room`] and [`SendQueue::retire`], so a WQE of `n <= limit
    /// - pi` WQEBBs fits with no padding (one test on the fast path). A WQE that does not
    /// pass the test takes `make_room`, which decides exactly.
    limit: u32,
    /// Largest WQE accepted, in WQEBBs (see "Ring end: NOP padding").
    max_wqebbs: u32,
    /// Largest payload, in bytes, of an all-inline WRITE+IMM that passes `post`'s size
    /// checks (`<= mem.max_inline`, `ds <= MAX_DS`, `<= max_wqebbs` WQEBBs):
    /// [`write_imm_inline_max`].
    write_imm_inline_max: u32,
    /// For the WQE whose first WQEBB is slot `s`: the producer counter after it.
    pi_after: Box<[u32]>,
    /// `pi` at the last doorbell.
    db_pi: u32,
    /// WQEs (padding included) written since the last doorbell.
    wqes_since_db: u32,
    /// Producer counter of the last WQE written (its first WQEBB).
    last_pi: u32,
    /// `ds` of the last WQE written.
    last_ds: u32,
    /// Padding NOPs written.
    pad_nops: u64,
    /// `retire` calls whose counter named no outstanding WQE.
    bad_retires: u64,
}

impl SendQueue {
    /// Builds the driver on provider memory. Safe: the memory's validity is the contract of
    /// [`SqMem::new`], and `mem` keeps its owner alive as long as the queue.
    ///
    /// # Panics
    /// If `mem.wqe_cnt` is not a power of two or exceeds [`MAX_WQE_CNT`] (a provider bug: the
    /// queue memory contract of [`crate::queue`] requires a power of two, and device send
    /// queues are far smaller than 2^16 WQEBBs).
    pub fn new(mem: SqMem, qpn: u32) -> Self {
        let cnt = mem.wqe_cnt;
        assert!(
            cnt.is_power_of_two() && cnt <= MAX_WQE_CNT,
            "send queue of {cnt} WQEBBs: must be a power of two <= {MAX_WQE_CNT}"
        );
        let max_wqebbs = MAX_WQEBBS.min(cnt.div_ceil(2).max(1));
        SendQueue {
            write_imm_inline_max: write_imm_inline_max(mem.max_inline, max_wqebbs),
            mem,
            qpn,
            pi: 0,
            retired: 0,
            mask: cnt - 1,
            limit: cnt,
            max_wqebbs,
            pi_after: vec![0; cnt as usize].into_boxed_slice(),
            db_pi: 0,
            wqes_since_db: 0,
            last_pi: 0,
            last_ds: 0,
            pad_nops: 0,
            bad_retires: 0,
        }
    }

    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// Producer counter in WQEBBs.
    pub fn pi(&self) -> u32 {
        self.pi
    }

    /// The memory this queue runs on.
    pub fn mem(&self) -> &SqMem {
        &self.mem
    }

    /// Ring size in WQEBBs.
    #[inline]
    pub fn wqe_cnt(&self) -> u32 {
        self.mem.wqe_cnt
    }

    /// Producer counter (WQEBBs) up to which WQEs are retired: the first outstanding WQEBB.
    #[inline]
    pub fn retired(&self) -> u32 {
        self.retired
    }

    /// WQEBBs written but not yet retired by a completion.
    #[inline]
    pub fn outstanding_wqebbs(&self) -> u32 {
        self.pi.wrapping_sub(self.retired)
    }

    /// WQEBBs free for new WQEs (`wqe_cnt - outstanding`), padding not deducted.
    #[inline]
    pub fn free_wqebbs(&self) -> u32 {
        self.mem.wqe_cnt - self.outstanding_wqebbs()
    }

    /// WQEBBs a WQE of `ds` units would take if posted now: its own plus the NOP padding
    /// needed to reach the ring start.
    #[inline]
    pub fn wqebbs_needed(&self, ds: u32) -> u32 {
        let n = wqebbs(ds);
        let slot = self.pi & self.mask;
        let to_end = self.mem.wqe_cnt - slot;
        if n > to_end { to_end + n } else { n }
    }

    /// Whether a WQE of `ds` units can be posted now without [`Error::SqFull`].
    #[inline]
    pub fn has_room(&self, ds: u32) -> bool {
        self.wqebbs_needed(ds) <= self.free_wqebbs()
    }

    /// Largest WQE accepted, in WQEBBs: `min(16, (wqe_cnt + 1) / 2)` (module docs, "Ring end").
    #[inline]
    pub fn max_wqebbs(&self) -> u32 {
        self.max_wqebbs
    }

    /// WQEs (padding NOPs included) written since the last doorbell.
    #[inline]
    pub fn pending_since_doorbell(&self) -> u32 {
        self.wqes_since_db
    }

    /// WQEBBs written since the last doorbell.
    #[inline]
    pub fn pending_wqebbs(&self) -> u32 {
        self.pi.wrapping_sub(self.db_pi)
    }

    /// Padding NOP WQEs written at the ring end since creation.
    pub fn pad_nops(&self) -> u64 {
        self.pad_nops
    }

    /// [`retire`](Self::retire) calls whose `wqe_counter` named no outstanding WQE (a device
    /// or caller bug; such calls change nothing).
    pub fn bad_retires(&self) -> u64 {
        self.bad_retires
    }

    /// Writes one WQE at the producer counter and returns its `wqe_index` (`pi & 0xffff` of
    /// its first WQEBB, what a requester CQE's `wqe_counter` will name). Pads the ring end with
    /// NOPs first if the WQE would cross it (module docs). Nothing is visible to the device
    /// until [`ring_doorbell`](Self::ring_doorbell).
    ///
    /// # Errors
    /// Nothing is written on error.
    /// - [`Error::InlineTooLarge`]: `desc.inline` is longer than `mem.max_inline` bytes;
    /// - [`Error::WqeTooLarge`]: more than `mem.max_sge` data segments, `ds > 63`, or more
    ///   than [`max_wqebbs`](Self::max_wqebbs);
    /// - [`Error::SqFull`]: padding + WQE need more WQEBBs than are free; retire completions
    ///   and retry;
    /// - [`Error::InvalidArgument`]: an opcode that makes the device write local memory
    ///   (RDMA READ, atomics): post those with [`post_local_write`](Self::post_local_write).
    ///
    /// Safe because every other opcode only reads the memory its gather list names, and
    /// that memory was registered by the `unsafe`
    /// [`Context::reg_mr`](crate::verbs::Context::reg_mr), whose contract keeps it mapped
    /// while registered.
    ///
    /// Always inlined: callers build `desc` as a literal, so the segments a caller never
    /// uses (`ud`, `atomic`, ...) and the opcode tests fold away at compile time (issue 16).
    #[inline(always)]
    pub fn post(&mut self, desc: &WqeDesc<'_>) -> Result<u16> {
        if writes_local(desc.opcode) {
            return Err(local_write_refused(desc.opcode));
        }
        self.post_av(desc, None)
    }

    /// [`post`](Self::post) for any opcode, including those that make the device write the
    /// memory of the scatter list `desc.sges` (RDMA READ: the remote bytes; atomics: the
    /// original 8-byte value; PRM "RDMA Read" and "Atomic" WQE segments).
    ///
    /// # Safety
    /// For RDMA READ and atomics, the memory `desc.sges` names (registered, lkey) must stay
    /// valid, and no Rust reference to it may be live, from this post until its completion
    /// is polled (or the QP is in error and flushed): the device writes it at any time in
    /// between. Other opcodes have no further requirement.
    ///
    /// # Errors
    /// As [`post`](Self::post), without the opcode check.
    #[inline(always)]
    pub unsafe fn post_local_write(&mut self, desc: &WqeDesc<'_>) -> Result<u16> {
        self.post_av(desc, None)
    }

    /// As [`post`](Self::post) for a UD send whose address vector is already encoded
    /// ([`DgramSeg::encode`](crate::wqe::DgramSeg::encode)): `av` is copied into the WQE as
    /// is, in the place of `desc.ud`, which must be `None`. The WQE's bytes are the same as
    /// [`post`](Self::post) writes with `ud: Some(seg)` for `av = seg.encode()`.
    ///
    /// # Errors
    /// As [`post`](Self::post).
    #[inline(always)]
    pub fn post_ud(&mut self, av: &EncodedAv, desc: &WqeDesc<'_>) -> Result<u16> {
        debug_assert!(desc.ud.is_none(), "post_ud with desc.ud set");
        if writes_local(desc.opcode) {
            return Err(local_write_refused(desc.opcode));
        }
        self.post_av(desc, Some(av))
    }

    /// A UD SEND with immediate whose payload, `hdr` followed by `data`, travels inline: the
    /// same WQE as [`post_ud`](Self::post_ud) with `desc.opcode = SendImm`, `desc.inline` the
    /// concatenation of `hdr` and `data` and no gather list, but written straight from the
    /// two parts (no staging copy, no descriptor). `flags` are the `fm_ce_se` flags;
    /// [`CQ_UPDATE`] is added when fewer than `signal_below` WQEBBs stay free after this WQE
    /// (padding included; 0: never), so that a sender can retire WQEs before the ring runs
    /// out. Returns the `wqe_index` and whether the WQE is signaled.
    ///
    /// # Errors
    /// As [`post`](Self::post). An empty payload (no inline segment: use
    /// [`post_ud`](Self::post_ud)) is refused with [`Error::WqeTooLarge`] (`ds = 0`).
    #[inline(always)]
    pub fn post_ud_inline(
        &mut self,
        av: &EncodedAv,
        flags: u8,
        imm: u32,
        hdr: &[u8],
        data: &[u8],
        signal_below: u32,
    ) -> Result<(u16, bool)> {
        let len = hdr.len() + data.len();
        if len > self.mem.max_inline as usize {
            return Err(inline_too_large(len, self.mem.max_inline));
        }
        if len == 0 {
            return Err(wqe_too_large(0, self.max_wqebbs));
        }
        let ds = ((CTRL_BYTES + DGRAM_BYTES + inline_seg_bytes(len)) / DS_BYTES) as u32;
        let n = wqebbs(ds);
        if ds > MAX_DS || n > self.max_wqebbs {
            return Err(wqe_too_large(ds, self.max_wqebbs));
        }
        if n > self.limit.wrapping_sub(self.pi) {
            self.make_room(n)?;
        }
        // After any padding: the WQEBBs free once this WQE is written.
        let flags = if self.free_wqebbs() - n < signal_below {
            flags | CQ_UPDATE
        } else {
            flags
        };
        let (pi, qpn) = (self.pi, self.qpn);
        // SAFETY: as in `post_av`: `slot + n <= wqe_cnt` (padding moved `pi` to slot 0
        // otherwise) and the `n` WQEBBs are free, so the device does not read them.
        let b = unsafe { self.wqe_bytes(pi & self.mask, ds) };
        let segs = &mut b.as_chunks_mut::<DS_BYTES>().0[..ds as usize];
        let (ctrl, rest) = segs.split_first_mut().expect("a WQE has a control segment");
        CtrlSeg {
            opmod: 0,
            wqe_index: pi as u16,
            opcode: Opcode::SendImm as u8,
            qpn,
            ds: ds as u8,
            signature: 0,
            fm_ce_se: flags,
            imm,
        }
        .write_seg(ctrl);
        let (avs, inl) = rest.split_at_mut(DGRAM_BYTES / DS_BYTES);
        avs.as_flattened_mut().copy_from_slice(&av.0);
        write_inline2(inl.as_flattened_mut(), hdr, data);
        self.commit(pi, n, ds);
        Ok((pi as u16, flags & CQ_UPDATE != 0))
    }

    /// [`post`](Self::post), with `av` written as the address vector when given.
    #[inline(always)]
    fn post_av(&mut self, desc: &WqeDesc<'_>, av: Option<&EncodedAv>) -> Result<u16> {
        if desc.inline.len() > self.mem.max_inline as usize {
            return Err(inline_too_large(desc.inline.len(), self.mem.max_inline));
        }
        if desc.sges.len() > self.mem.max_sge as usize {
            return Err(too_many_sges(desc.sges.len(), self.mem.max_sge));
        }
        let mut ds = desc.ds();
        if av.is_some() && desc.ud.is_none() {
            ds += (DGRAM_BYTES / DS_BYTES) as u32;
        }
        if ds > MAX_DS || wqebbs(ds) > self.max_wqebbs {
            return Err(wqe_too_large(ds, self.max_wqebbs));
        }
        let n = wqebbs(ds);
        if n > self.limit.wrapping_sub(self.pi) {
            self.make_room(n)?;
        }
        let (pi, qpn) = (self.pi, self.qpn);
        let slot = pi & self.mask;
        // SAFETY: `slot + n <= wqe_cnt` (padding moved `pi` to slot 0 otherwise) and the `n`
        // WQEBBs are free (checked above), so the device does not read them.
        let b = unsafe { self.wqe_bytes(slot, ds) };
        desc.write_ds(b, ds, pi as u16, qpn, av);
        self.commit(pi, n, ds);
        Ok(pi as u16)
    }

    /// [`post`](Self::post) of an RDMA WRITE with immediate whose payload is all inline:
    /// the same WQE bytes as `post` writes for `WqeDesc { opcode: RdmaWriteImm, flags, imm,
    /// remote: Some(RaddrSeg { raddr, rkey }), inline: data, .. }` with no other segment,
    /// built directly (control, remote-address and inline segments) with only the checks
    /// such a WQE needs. An empty `data` takes `post`'s path (no inline segment then).
    ///
    /// # Errors
    /// As [`post`](Self::post): nothing is written on error.
    #[inline(always)]
    pub fn post_write_imm_inline(
        &mut self,
        flags: u8,
        imm: u32,
        raddr: u64,
        rkey: u32,
        data: &[u8],
    ) -> Result<u16> {
        let len = data.len();
        // One test for `post`'s three size checks and the empty payload:
        // `1 <= len <= write_imm_inline_max`.
        if len.wrapping_sub(1) >= self.write_imm_inline_max as usize {
            return self.post_write_imm_inline_rare(flags, imm, raddr, rkey, len);
        }
        let inl = inline_seg_bytes(len);
        // Control + remote address + inline segment.
        let ds = 2 + (inl / DS_BYTES) as u32;
        let n = wqebbs(ds);
        debug_assert!(ds <= MAX_DS && n <= self.max_wqebbs);
        // One test for room and no padding; the rest in `make_room`.
        if n > self.limit.wrapping_sub(self.pi) {
            self.make_room(n)?;
        }
        let (pi, qpn) = (self.pi, self.qpn);
        // SAFETY: as in `post_av`: `slot + n <= wqe_cnt` and the `n` WQEBBs are free.
        let b = unsafe { self.wqe_bytes(pi & self.mask, ds) };
        let (ctrl, rest) = b.split_at_mut(CTRL_BYTES);
        let (raddr_seg, inline) = rest.split_at_mut(RADDR_BYTES);
        CtrlSeg {
            opmod: 0,
            wqe_index: pi as u16,
            opcode: Opcode::RdmaWriteImm as u8,
            qpn,
            ds: ds as u8,
            signature: 0,
            fm_ce_se: flags,
            imm,
        }
        .write_seg(ctrl.try_into().expect("16 B control segment"));
        RaddrSeg { raddr, rkey }
            .write_seg(raddr_seg.try_into().expect("16 B remote-address segment"));
        debug_assert_eq!(inline.len(), inl);
        // `write_inline(&mut inline[..inl], data)` without its three bounds checks.
        // SAFETY: `inline` is the WQE's last `ds * 16 - 32 = inl` bytes (`wqe_bytes`), and
        // `inl = inline_seg_bytes(len) >= 16` covers the 4 B header and the `len` bytes: the
        // header, the data and the last 16 B unit are all inside it; `data` is not ring memory.
        unsafe {
            let p = inline.as_mut_ptr();
            p.add(inl - DS_BYTES)
                .cast::<[u8; DS_BYTES]>()
                .write_unaligned([0; DS_BYTES]);
            p.cast::<[u8; 4]>()
                .write_unaligned((len as u32 | INLINE_SEG).to_be_bytes());
            std::ptr::copy_nonoverlapping(data.as_ptr(), p.add(4), len);
        }
        self.commit(pi, n, ds);
        Ok(pi as u16)
    }

    /// [`post_write_imm_inline`](Self::post_write_imm_inline) of `len` bytes outside
    /// `1..=write_imm_inline_max`: `post`'s refusals in `post`'s order (inline too large,
    /// then WQE too large), or the WQE without an inline segment for `len == 0`.
    #[cold]
    #[inline(never)]
    fn post_write_imm_inline_rare(
        &mut self,
        flags: u8,
        imm: u32,
        raddr: u64,
        rkey: u32,
        len: usize,
    ) -> Result<u16> {
        if len > self.mem.max_inline as usize {
            return Err(inline_too_large(len, self.mem.max_inline));
        }
        if len == 0 {
            return self.post_write_imm_empty(flags, imm, raddr, rkey);
        }
        let ds = 2 + (inline_seg_bytes(len) / DS_BYTES) as u32;
        debug_assert!(ds > MAX_DS || wqebbs(ds) > self.max_wqebbs);
        Err(wqe_too_large(ds, self.max_wqebbs))
    }

    /// [`post_write_imm_inline`](Self::post_write_imm_inline) of no bytes: `post`'s WQE
    /// without an inline segment.
    #[cold]
    #[inline(never)]
    fn post_write_imm_empty(&mut self, flags: u8, imm: u32, raddr: u64, rkey: u32) -> Result<u16> {
        self.post(&WqeDesc {
            opcode: Opcode::RdmaWriteImm,
            flags,
            imm,
            ud: None,
            remote: Some(RaddrSeg { raddr, rkey }),
            atomic: None,
            inline: &[],
            sges: &[],
        })
    }

    /// Posts a one-WQEBB NOP (`ds = 1`), signaled (a CQE names it) or not, and returns its
    /// `wqe_index`. A signaled NOP is a way to retire earlier unsignaled WQEs.
    ///
    /// # Errors
    /// [`Error::SqFull`] if no WQEBB is free.
    pub fn post_nop(&mut self, signaled: bool) -> Result<u16> {
        self.post(&WqeDesc {
            opcode: Opcode::Nop,
            flags: if signaled { CQ_UPDATE } else { 0 },
            imm: 0,
            ud: None,
            remote: None,
            atomic: None,
            inline: &[],
            sges: &[],
        })
    }

    /// The slow path of the room test (`n > limit - pi`): refuses a WQE of `n` WQEBBs
    /// that does not fit with its padding ([`Error::SqFull`], nothing written), else pads
    /// the ring end if the WQE would cross it, and makes `limit` exact. Afterwards the WQE
    /// fits at `pi` without padding.
    #[cold]
    #[inline(never)]
    fn make_room(&mut self, n: u32) -> Result<()> {
        let slot = self.pi & self.mask;
        let to_end = self.mem.wqe_cnt - slot;
        let pad = if n > to_end { to_end } else { 0 };
        let free = self.free_wqebbs();
        if pad + n > free {
            return Err(sq_full(pad + n, free));
        }
        if pad != 0 {
            self.pad_ring_end(pad);
        }
        self.refresh_limit();
        debug_assert!(n <= self.limit.wrapping_sub(self.pi));
        Ok(())
    }

    /// `limit = pi + min(free, to_end)`.
    #[inline(always)]
    fn refresh_limit(&mut self) {
        let to_end = self.mem.wqe_cnt - (self.pi & self.mask);
        self.limit = self.pi.wrapping_add(self.free_wqebbs().min(to_end));
    }

    /// Records a written WQE of `n` WQEBBs and `ds` units at `pi`.
    #[inline(always)]
    fn commit(&mut self, pi: u32, n: u32, ds: u32) {
        // SAFETY: `pi_after` has `wqe_cnt = mask + 1` entries.
        unsafe { *self.pi_after.get_unchecked_mut((pi & self.mask) as usize) = pi.wrapping_add(n) };
        self.last_pi = pi;
        self.last_ds = ds;
        self.wqes_since_db += 1;
        self.pi = pi.wrapping_add(n);
    }

    /// Fills the `pad` WQEBBs up to the ring end with unsignaled NOPs, each covering at most
    /// 16 WQEBBs (`ds = min(4k, 63)`). The caller checked that `pad` WQEBBs are free.
    #[inline(never)]
    fn pad_ring_end(&mut self, pad: u32) {
        debug_assert_eq!((self.pi & self.mask) + pad, self.mem.wqe_cnt);
        let mut left = pad;
        while left > 0 {
            let k = left.min(MAX_WQEBBS);
            let ds = (4 * k).min(MAX_DS);
            let (pi, qpn) = (self.pi, self.qpn);
            // SAFETY: the `k` WQEBBs at `pi` end at or before the ring end and are free.
            let b = unsafe { self.wqe_bytes(pi & self.mask, ds) };
            CtrlSeg {
                opmod: 0,
                wqe_index: pi as u16,
                opcode: Opcode::Nop as u8,
                qpn,
                ds: ds as u8,
                signature: 0,
                fm_ce_se: 0,
                imm: 0,
            }
            .write(b);
            self.commit(pi, k, ds);
            self.pad_nops += 1;
            left -= k;
        }
    }

    /// The `ds * 16` bytes of ring memory starting at `slot`.
    ///
    /// # Safety
    /// `slot * 64 + ds * 16 <= wqe_cnt * 64`, and the WQEBBs are free (retired or never
    /// posted), so the device does not read them while the slice lives. The ring buffer is
    /// valid for `wqe_cnt * 64` bytes (queue memory contract, [`crate::queue`]); `&mut self`
    /// excludes any other driver access.
    #[inline(always)]
    unsafe fn wqe_bytes(&mut self, slot: u32, ds: u32) -> &mut [u8] {
        debug_assert!(slot as usize * WQEBB + ds as usize * DS_BYTES <= self.ring_bytes());
        // SAFETY: caller's contract.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.mem.buf.as_ptr().add(slot as usize * WQEBB),
                ds as usize * DS_BYTES,
            )
        }
    }

    fn ring_bytes(&self) -> usize {
        self.mem.wqe_cnt as usize * WQEBB
    }

    /// Retires the WQE named by a requester CQE's `wqe_counter` (a signaled WQE, or any WQE
    /// named by an error/flush CQE) together with every earlier WQE, padding NOPs included:
    /// [`retired`](Self::retired) becomes the producer counter after that WQE. Returns the
    /// number of WQEBBs freed.
    ///
    /// The 16-bit counter is widened to the unique producer counter `p` in
    /// `[retired, retired + 2^16)` with `p & 0xffff == wqe_counter`; it must name the first
    /// WQEBB of an outstanding WQE. A counter that does not (a stale or corrupt CQE) changes
    /// nothing, returns 0 and is counted in [`bad_retires`](Self::bad_retires).
    #[inline]
    pub fn retire(&mut self, wqe_counter: u16) -> u32 {
        let retired = self.retired;
        let outstanding = self.pi.wrapping_sub(retired);
        let p = retired.wrapping_add(u32::from(wqe_counter.wrapping_sub(retired as u16)));
        // SAFETY: `pi_after` has `wqe_cnt = mask + 1` entries.
        let after = unsafe { *self.pi_after.get_unchecked((p & self.mask) as usize) };
        let len = after.wrapping_sub(p);
        let freed = after.wrapping_sub(retired);
        // Valid iff `p` is outstanding, the entry at its slot describes a WQE starting at `p`
        // (1..=16 WQEBBs long) and that WQE ends within the outstanding range. This is exact:
        // the entry of a live WQE's first slot is not overwritten while it is live, and an
        // entry left by an earlier pass ends at or before `retired` (WQEs never exceed half
        // the ring), so it fails the length check.
        if p.wrapping_sub(retired) >= outstanding
            || len.wrapping_sub(1) >= MAX_WQEBBS
            || freed > outstanding
        {
            return self.bad_retire();
        }
        self.retired = after;
        self.refresh_limit();
        freed
    }

    #[cold]
    #[inline(never)]
    fn bad_retire(&mut self) -> u32 {
        self.bad_retires += 1;
        0
    }

    /// Tells the device about the WQEs written since the last doorbell; returns at once if
    /// there are none.
    ///
    /// Sequence (PRM "Doorbell", rdma-core `mlx5_post_send`): store barrier (WQEs before the
    /// doorbell record), `dbrec[1] = be32(pi & 0xffff)`, then
    /// - [`Doorbell::Mmio`]: write-combining barrier; if exactly one WQE was written since the
    ///   last doorbell and it fits (`wqebbs(ds) * 64 <= bf.size`: 256 B on ConnectX, so up to
    ///   4 WQEBBs), BlueFlame: copy the whole WQE in 64 B chunks to `bf.reg + bf.offset` with
    ///   64-bit stores; otherwise
    ///   write the first 8 bytes of the last WQE's control segment there (one 64-bit store;
    ///   the device fetches the other WQEs by DMA). Then flush the write-combining buffer and
    ///   toggle `bf.offset ^= bf.size`. BlueFlame only for a single WQE is rdma-core's rule:
    ///   the BlueFlame buffer carries one WQE.
    /// - [`Doorbell::Sim`]: `device.ring_sq(qpn)`, which executes the new WQEs before returning.
    #[inline]
    pub fn ring_doorbell(&mut self) {
        if self.pi == self.db_pi {
            return;
        }
        dma_wmb();
        // SAFETY: `dbrec` is 4-byte aligned and valid for 2 words (queue memory contract);
        // word 1 is the send queue producer.
        unsafe {
            store_dbrec(self.mem.dbrec.as_ptr().add(1), (self.pi & 0xffff).to_be());
        }
        let single = self.wqes_since_db == 1;
        self.db_pi = self.pi;
        self.wqes_since_db = 0;
        // SAFETY: `last_pi`'s WQE lies inside the ring (WQEs never wrap).
        let last = unsafe {
            self.mem
                .buf
                .as_ptr()
                .add((self.last_pi & self.mask) as usize * WQEBB)
        };
        let last_ds = self.last_ds;
        match &mut self.mem.doorbell {
            Doorbell::Mmio(bf) => {
                // SAFETY: `last` is the 64 B aligned start of the last WQE, which is
                // `wqebbs(last_ds) * 64` contiguous bytes inside the ring; `bf.reg` is the
                // QP's BlueFlame register (queue memory contract).
                unsafe { ring_mmio(bf, last, last_ds, single) };
            }
            Doorbell::Sim { device, qpn } => device.ring_sq(*qpn),
        }
    }
}

/// The hardware doorbell write after the doorbell record (see
/// [`SendQueue::ring_doorbell`]).
///
/// # Safety
/// `wqe` is 8-byte aligned and valid for reads of `wqebbs(ds) * 64` bytes; `bf.reg + bf.offset`
/// is valid for 64-bit writes of `bf.size` bytes (a BlueFlame buffer, or any memory standing in
/// for it) and of at least 8 bytes when `bf.size` is 0, 8-byte aligned.
#[inline]
unsafe fn ring_mmio(bf: &mut BlueFlame, wqe: *const u8, ds: u32, single: bool) {
    let dst = bf.reg.as_ptr().wrapping_add(bf.offset as usize);
    let chunks = wqebbs(ds) * WQEBB as u32;
    let bytes = if single && chunks <= bf.size {
        chunks as usize
    } else {
        8
    };
    wc_flush();
    // SAFETY: caller's contract; with BlueFlame `bytes <= bf.size`.
    unsafe { mmio_copy(dst, wqe, bytes) };
    wc_flush();
    bf.offset ^= bf.size;
}

/// Copies `bytes` (a multiple of 8) from `src` to the device register `dst` as 64-bit volatile
/// stores in address order, 64 B chunk after 64 B chunk (the write-combining unit).
///
/// # Safety
/// `dst` is valid for writes and `src` for reads of `bytes` bytes, both 8-byte aligned.
#[inline(always)]
unsafe fn mmio_copy(dst: *mut u8, src: *const u8, bytes: usize) {
    debug_assert_eq!(bytes % 8, 0);
    let d = dst.cast::<u64>();
    let s = src.cast::<u64>();
    for i in 0..bytes / 8 {
        // SAFETY: caller's contract; `i * 8 < bytes`.
        unsafe { d.add(i).write_volatile(s.add(i).read()) };
    }
}

/// Whether `op` makes the device write the memory of the WQE's scatter list (PRM: RDMA READ
/// and the atomics return data into the local buffers).
#[inline(always)]
fn writes_local(op: Opcode) -> bool {
    matches!(op, Opcode::RdmaRead | Opcode::AtomicCs | Opcode::AtomicFa)
}

#[cold]
#[inline(never)]
fn local_write_refused(op: Opcode) -> Error {
    Error::InvalidArgument(format!(
        "{op:?} writes local memory: post it with the unsafe SendQueue::post_local_write"
    ))
}

#[cold]
#[inline(never)]
fn too_many_sges(n: usize, max: u32) -> Error {
    Error::WqeTooLarge(format!(
        "{n} data segments, the QP allows {max} (max_send_sge)"
    ))
}

#[cold]
#[inline(never)]
fn inline_too_large(len: usize, max: u32) -> Error {
    Error::InlineTooLarge { len, max }
}

#[cold]
#[inline(never)]
/// Largest payload in bytes of an all-inline WRITE+IMM (control, remote-address and inline
/// segments) that `post` accepts on a queue with `max_inline` bytes of inline data and WQEs
/// of at most `max_wqebbs` WQEBBs: `ds = 2 + ceil((4 + len) / 16)` must be at most
/// `min(MAX_DS, 4 * max_wqebbs)`, i.e. `len <= 16 * (that - 2) - 4`.
fn write_imm_inline_max(max_inline: u32, max_wqebbs: u32) -> u32 {
    let max_ds = MAX_DS.min(4 * max_wqebbs);
    max_inline.min((16 * max_ds).saturating_sub(36))
}

fn wqe_too_large(ds: u32, max_wqebbs: u32) -> Error {
    Error::WqeTooLarge(format!(
        "send WQE of ds {ds} ({} WQEBBs); the limit is ds {MAX_DS} and {max_wqebbs} WQEBBs for \
         this ring",
        ds.div_ceil(4)
    ))
}

#[cold]
#[inline(never)]
fn sq_full(need: u32, free: u32) -> Error {
    Error::SqFull { need, free }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::DmaBuf;
    use crate::wqe::{RaddrSeg, Sge, parse};

    fn sq(cnt: u32, bf_size: u32) -> (DmaBuf, DmaBuf, DmaBuf, SendQueue) {
        sq_with_inline(cnt, bf_size, 256)
    }

    /// [`sq`] with `max_inline` bytes of inline data.
    fn sq_with_inline(
        cnt: u32,
        bf_size: u32,
        max_inline: u32,
    ) -> (DmaBuf, DmaBuf, DmaBuf, SendQueue) {
        let ring = DmaBuf::with_normal_pages(cnt as usize * 64).unwrap();
        let db = DmaBuf::with_normal_pages(8).unwrap();
        let reg = DmaBuf::with_normal_pages(4096).unwrap();
        // SAFETY: a ring of `cnt` WQEBBs, an 8-byte doorbell record and a 4 KiB page standing
        // in for the register (`2 * bf_size <= 4096` in these tests), all page aligned, in
        // test buffers returned beside the queue and used only by it and the test.
        let mem = unsafe {
            SqMem::new(
                ring.as_non_null(),
                cnt,
                db.as_non_null().cast(),
                max_inline,
                32,
                Doorbell::Mmio(BlueFlame::new(reg.as_non_null(), bf_size)),
            )
        };
        let q = SendQueue::new(mem, 0x1234);
        (ring, db, reg, q)
    }

    fn write(inline: &[u8]) -> WqeDesc<'_> {
        WqeDesc {
            opcode: Opcode::RdmaWrite,
            flags: 0,
            imm: 0,
            ud: None,
            remote: Some(RaddrSeg { raddr: 1, rkey: 2 }),
            atomic: None,
            inline,
            sges: &[],
        }
    }

    fn reg_bytes(reg: &DmaBuf, off: usize, len: usize) -> Vec<u8> {
        // SAFETY: test memory, no concurrent access.
        unsafe { reg.as_slice()[off..off + len].to_vec() }
    }

    /// The BlueFlame path against a plain buffer standing in for the register.
    #[test]
    fn blueflame_copies_a_single_small_wqe_and_toggles_offset() {
        let (ring, db, reg, mut q) = sq(16, 256);
        let idx = q.post(&write(&[7u8; 100])).unwrap(); // ds 2 + 7 = 9: 3 WQEBBs
        q.ring_doorbell();
        // SAFETY: test memory.
        let wqe = unsafe { ring.as_slice()[..192].to_vec() };
        assert_eq!(reg_bytes(&reg, 0, 192), wqe);
        assert_eq!(
            parse(&reg_bytes(&reg, 0, 192), false)
                .unwrap()
                .ctrl
                .wqe_index,
            idx
        );
        assert!(reg_bytes(&reg, 192, 64).iter().all(|&b| b == 0));
        // SAFETY: test memory.
        let dbrec = unsafe { db.as_ptr().cast::<u32>().add(1).read() };
        assert_eq!(u32::from_be(dbrec), 3);
        let Doorbell::Mmio(bf) = &q.mem().doorbell else {
            unreachable!()
        };
        assert_eq!(bf.offset, 256);

        // Nothing new: no write, no toggle.
        q.ring_doorbell();
        let Doorbell::Mmio(bf) = &q.mem().doorbell else {
            unreachable!()
        };
        assert_eq!(bf.offset, 256);

        // Two WQEs since the last doorbell: only the last ctrl's first 8 bytes, at offset 256.
        q.post(&write(&[])).unwrap();
        let last = q.post(&write(&[])).unwrap();
        q.ring_doorbell();
        let ctrl = reg_bytes(&reg, 256, 16);
        assert_eq!(
            CtrlSeg::read(&[&ctrl[..8], &[0u8; 8]].concat()).wqe_index,
            last
        );
        assert!(ctrl[8..].iter().all(|&b| b == 0));
        let Doorbell::Mmio(bf) = &q.mem().doorbell else {
            unreachable!()
        };
        assert_eq!(bf.offset, 0);
    }

    /// `post_ud` with an encoded address vector writes the same WQE bytes as `post` with the
    /// segment, with and without a GRH, inline and gathered.
    #[test]
    fn post_ud_matches_post_with_the_segment() {
        use crate::wqe::DgramSeg;
        let segs = [
            DgramSeg {
                qkey: 0x1111_2222,
                dqpn: 0x00ab_cdef,
                rlid: 0x0102,
                stat_rate_sl: 3,
                grh: false,
                rgid: [0; 16],
            },
            DgramSeg {
                qkey: 7,
                dqpn: 0x0012_3456,
                rlid: 9,
                stat_rate_sl: 0,
                grh: true,
                rgid: [0x5a; 16],
            },
        ];
        let sge = [Sge {
            addr: 0x1000,
            len: 64,
            lkey: 5,
        }];
        for seg in &segs {
            for (inline, sges) in [(&[1u8; 20][..], &[][..]), (&[][..], &sge[..])] {
                let desc = WqeDesc {
                    opcode: Opcode::SendImm,
                    flags: CQ_UPDATE,
                    imm: 0xfeed,
                    ud: Some(*seg),
                    remote: None,
                    atomic: None,
                    inline,
                    sges,
                };
                let (ring_a, _db_a, _reg_a, mut a) = sq(16, 256);
                let (ring_b, _db_b, _reg_b, mut b) = sq(16, 256);
                let ia = a.post(&desc).unwrap();
                let ib = b
                    .post_ud(&seg.encode(), &WqeDesc { ud: None, ..desc })
                    .unwrap();
                assert_eq!(ia, ib);
                assert_eq!(a.pi(), b.pi());
                // SAFETY: test memory, no concurrent access.
                let (wa, wb) = unsafe { (ring_a.as_slice().to_vec(), ring_b.as_slice().to_vec()) };
                assert_eq!(wa, wb);
                assert_eq!(parse(&wb, true).unwrap().ud, Some(*seg));
            }
        }
    }

    /// `post_ud_inline(hdr, data)` writes the same WQE as `post_ud` with the concatenation
    /// inline, for every split of the payload, every length up to 60 B (16-byte header or
    /// not) and ring positions that need padding; empty and oversized payloads are refused.
    #[test]
    fn post_ud_inline_matches_post_ud() {
        let seg = crate::wqe::DgramSeg {
            qkey: 0x1111_2222,
            dqpn: 0x00ab_cdef,
            rlid: 0x0102,
            stat_rate_sl: 3,
            grh: false,
            rgid: [0; 16],
        };
        let av = seg.encode();
        let payload: Vec<u8> = (0..60u8).map(|i| i.wrapping_mul(7) ^ 0x5a).collect();
        for len in 1..=60usize {
            for split in [0, 1, len / 2, 16.min(len), len] {
                let (hdr, data) = payload[..len].split_at(split);
                let (ring_a, _db_a, _reg_a, mut a) = sq(8, 256);
                let (ring_b, _db_b, _reg_b, mut b) = sq(8, 256);
                // Dirty the rings so that padding and zeroing are checked too.
                // SAFETY: test memory, no concurrent access.
                unsafe {
                    ring_a.as_mut_slice().fill(0xee);
                    ring_b.as_mut_slice().fill(0xee);
                }
                for _ in 0..(len % 7) {
                    for q in [&mut a, &mut b] {
                        let i = q.post_nop(true).unwrap();
                        q.retire(i);
                    }
                }
                let desc = WqeDesc {
                    opcode: Opcode::SendImm,
                    flags: CQ_UPDATE,
                    imm: 0xfeed,
                    ud: None,
                    remote: None,
                    atomic: None,
                    inline: &payload[..len],
                    sges: &[],
                };
                let ia = a.post_ud(&av, &desc).unwrap();
                let (ib, sig) = b
                    .post_ud_inline(&av, CQ_UPDATE, 0xfeed, hdr, data, 0)
                    .unwrap();
                assert!(sig);
                assert_eq!((ia, a.pi(), a.pad_nops()), (ib, b.pi(), b.pad_nops()));
                // SAFETY: test memory, no concurrent access.
                let (wa, wb) = unsafe { (ring_a.as_slice().to_vec(), ring_b.as_slice().to_vec()) };
                assert_eq!(wa, wb, "len {len} split {split}");
            }
        }
        let (_ring, _db, _reg, mut q) = sq(8, 256);
        assert!(q.post_ud_inline(&av, 0, 0, &[], &[], 0).is_err());
        assert!(q.post_ud_inline(&av, 0, 0, &[0; 200], &[0; 57], 0).is_err());
        assert_eq!(q.pi(), 0);
        // Signaled only when fewer than `signal_below` WQEBBs stay free: 8 - 2 = 6 after the
        // first WQE, 4 after the second, 2 after the third; full after the fourth.
        let mut sig = vec![];
        for _ in 0..4 {
            sig.push(q.post_ud_inline(&av, 0, 0, &[1; 16], &[2; 8], 5).unwrap().1);
        }
        assert_eq!(sig, [false, true, true, true]);
        assert!(matches!(
            q.post_ud_inline(&av, 0, 0, &[1; 16], &[], 5),
            Err(Error::SqFull { .. })
        ));
    }

    /// `post_write_imm_inline` writes `post`'s bytes, pads the ring end the same way and
    /// refuses what `post` refuses, for every inline length, at every ring position.
    #[test]
    fn post_write_imm_inline_matches_post() {
        let data: Vec<u8> = (0..300u32).map(|i| (i * 7 + 1) as u8).collect();
        // (ring WQEBBs, max_inline): inline-limited, WQE-size limited (2 WQEBBs: 92 B) and
        // a one-WQEBB ring (28 B).
        for (cnt, max_inline, len) in [(16, 256), (4, 256), (1, 256), (16, 100)]
            .into_iter()
            .flat_map(|(c, m)| (0..=257usize).map(move |l| (c, m, l)))
        {
            let (ring_a, _db_a, _reg_a, mut a) = sq_with_inline(cnt, 256, max_inline);
            let (ring_b, _db_b, _reg_b, mut b) = sq_with_inline(cnt, 256, max_inline);
            // Dirty rings, so that padding zeros are checked too.
            // SAFETY: test memory, no concurrent access.
            unsafe {
                ring_a.as_mut_slice().fill(0xee);
                ring_b.as_mut_slice().fill(0xee);
            }
            for round in 0..24u32 {
                let flags = if round % 3 == 0 { CQ_UPDATE } else { 0 };
                let desc = WqeDesc {
                    opcode: Opcode::RdmaWriteImm,
                    flags,
                    imm: 0xfeed_0000 + round,
                    ud: None,
                    remote: Some(RaddrSeg {
                        raddr: 0x1122_3344_5566_7788 + u64::from(round),
                        rkey: 0xabcd,
                    }),
                    atomic: None,
                    inline: &data[..len],
                    sges: &[],
                };
                let ra = a.post(&desc);
                let rb = b.post_write_imm_inline(
                    flags,
                    desc.imm,
                    0x1122_3344_5566_7788 + u64::from(round),
                    0xabcd,
                    &data[..len],
                );
                assert_eq!(
                    format!("{ra:?}"),
                    format!("{rb:?}"),
                    "cnt {cnt} max_inline {max_inline} len {len} round {round}"
                );
                assert_eq!(a.pi(), b.pi());
                // SAFETY: test memory, no concurrent access.
                let (wa, wb) = unsafe { (ring_a.as_slice().to_vec(), ring_b.as_slice().to_vec()) };
                assert_eq!(
                    wa, wb,
                    "cnt {cnt} max_inline {max_inline} len {len} round {round}"
                );
                if ra.is_err() {
                    break;
                }
                // Retire everything now and then, so that the ring wraps.
                if round % 2 == 1 {
                    let (ia, ib) = (a.last_pi as u16, b.last_pi as u16);
                    assert_eq!(a.retire(ia), b.retire(ib));
                }
            }
        }
    }

    /// `post_ud_inline` refuses exactly what `post_ud` refuses, with the same error, and
    /// otherwise writes its bytes, for every payload length on inline-limited and WQE-size
    /// limited rings.
    #[test]
    fn post_ud_inline_refuses_what_post_ud_refuses() {
        let av = crate::wqe::DgramSeg {
            qkey: 7,
            dqpn: 0x42,
            rlid: 1,
            stat_rate_sl: 0,
            grh: false,
            rgid: [0; 16],
        }
        .encode();
        let data: Vec<u8> = (0..300u32).map(|i| (i * 5 + 3) as u8).collect();
        for (cnt, max_inline, len) in [(16, 256), (4, 256), (2, 256), (1, 256), (16, 100)]
            .into_iter()
            .flat_map(|(c, m)| (1..=257usize).map(move |l| (c, m, l)))
        {
            let (ring_a, _db_a, _reg_a, mut a) = sq_with_inline(cnt, 256, max_inline);
            let (ring_b, _db_b, _reg_b, mut b) = sq_with_inline(cnt, 256, max_inline);
            let desc = WqeDesc {
                opcode: Opcode::SendImm,
                flags: 0,
                imm: 9,
                ud: None,
                remote: None,
                atomic: None,
                inline: &data[..len],
                sges: &[],
            };
            let ra = a.post_ud(&av, &desc);
            let rb = b
                .post_ud_inline(&av, 0, 9, &data[..len.min(16)], &data[len.min(16)..len], 0)
                .map(|(i, _)| i);
            let what = format!("cnt {cnt} max_inline {max_inline} len {len}");
            assert_eq!(format!("{ra:?}"), format!("{rb:?}"), "{what}");
            assert_eq!(a.pi(), b.pi(), "{what}");
            // SAFETY: test memory, no concurrent access.
            let (wa, wb) = unsafe { (ring_a.as_slice().to_vec(), ring_b.as_slice().to_vec()) };
            assert_eq!(wa, wb, "{what}");
        }
    }

    #[test]
    fn blueflame_skips_wqes_larger_than_the_buffer() {
        let (_ring, _db, reg, mut q) = sq(32, 256);
        let sges = [Sge {
            addr: 0,
            len: 1,
            lkey: 1,
        }; 20];
        let d = WqeDesc {
            sges: &sges,
            ..write(&[])
        }; // ds 22 = 352 B > 256
        q.post(&d).unwrap();
        q.ring_doorbell();
        assert_ne!(reg_bytes(&reg, 0, 8), [0u8; 8]);
        assert!(reg_bytes(&reg, 8, 504).iter().all(|&b| b == 0));
    }

    #[test]
    fn bf_size_zero_writes_ctrl_only() {
        let (_ring, _db, reg, mut q) = sq(16, 0);
        q.post(&write(&[1; 8])).unwrap();
        q.ring_doorbell();
        assert_ne!(reg_bytes(&reg, 0, 8), [0u8; 8]);
        assert!(reg_bytes(&reg, 8, 64).iter().all(|&b| b == 0));
    }

    /// Padding longer than one NOP can cover (never needed with WQEs of at most 16 WQEBBs,
    /// but the loop is general): NOPs of 16, 16 and 2 WQEBBs.
    #[test]
    fn long_padding_uses_several_nops() {
        let (ring, _db, _reg, mut q) = sq(64, 0);
        for _ in 0..30 {
            let i = q.post_nop(true).unwrap();
            q.retire(i);
        }
        q.pad_ring_end(34);
        assert_eq!((q.pi(), q.pad_nops(), q.outstanding_wqebbs()), (64, 3, 34));
        // SAFETY: test memory.
        let b = unsafe { ring.as_slice() };
        let mut pi = 30u32;
        for (ds, n) in [(63u8, 16u32), (63, 16), (8, 2)] {
            let w = parse(&b[pi as usize * 64..], false).unwrap();
            assert_eq!(
                (w.ctrl.opcode, w.ctrl.ds, w.ctrl.wqe_index),
                (0, ds, pi as u16)
            );
            assert_eq!(w.ctrl.fm_ce_se, 0);
            assert_eq!(wqebbs(u32::from(ds)), n);
            pi += n;
        }
        // The last padding NOP can be named by a (flush) CQE: everything retires.
        assert_eq!(q.retire(62), 34);
    }

    #[test]
    fn max_wqebbs_follows_ring_size() {
        for (cnt, max) in [
            (1, 1),
            (2, 1),
            (4, 2),
            (8, 4),
            (16, 8),
            (32, 16),
            (1024, 16),
        ] {
            assert_eq!(sq(cnt, 0).3.max_wqebbs(), max, "wqe_cnt {cnt}");
        }
        let (_r, _d, _g, mut q) = sq(4, 0);
        // 3 WQEBBs in a 4-WQEBB ring: rejected as too large, not as full.
        assert!(matches!(
            q.post(&write(&[0; 100])),
            Err(Error::WqeTooLarge(_))
        ));
    }
}
