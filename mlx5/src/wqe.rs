//! Send-queue WQE formats: segment writers (the driver) and parsers (the device model).
//!
//! Source: `mlx5-prm.md` "Send queue" (checked against rdma-core v44 `mlx5dv.h`). A WQE is a
//! control segment followed by, in this order: a UD address vector (UD only), a remote-address
//! segment (RDMA and atomic opcodes), an atomic segment (atomics), then inline data and/or data
//! (scatter/gather) segments. Its size is `ds` 16-byte units; it occupies `ceil(ds*16/64)`
//! WQE basic blocks (WQEBBs) of 64 B. Multi-byte fields are big-endian.
//!
//! Writers take a `&mut [u8]` of exactly the segment's size; parsers take the bytes of one
//! segment and never read past them.

/// Size of a WQE basic block in bytes (PRM: "WQE basic blocks (WQEBB) of 64 B").
pub const WQEBB: usize = 64;
/// Size of one `ds` unit in bytes.
pub const DS_BYTES: usize = 16;
/// Size of the control segment in bytes.
pub const CTRL_BYTES: usize = 16;
/// Size of the remote-address segment in bytes.
pub const RADDR_BYTES: usize = 16;
/// Size of the atomic segment in bytes.
pub const ATOMIC_BYTES: usize = 16;
/// Size of a data (scatter/gather) segment in bytes.
pub const DATA_BYTES: usize = 16;
/// Size of the UD datagram (address vector) segment in bytes.
pub const DGRAM_BYTES: usize = 48;
/// Bit 31 of an inline segment's first BE32 (`MLX5_INLINE_SEG`).
pub const INLINE_SEG: u32 = 0x8000_0000;
/// Largest `ds` the hardware accepts (6 bits).
pub const MAX_DS: u32 = 63;

/// `fm_ce_se` bit: fence (wait for prior RDMA READ/atomics).
pub const FENCE: u8 = 0x80;
/// `fm_ce_se` bit: small fence.
pub const SMALL_FENCE: u8 = 0x20;
/// `fm_ce_se` bit: CQ update, i.e. "signaled": write a CQE when this WQE completes.
pub const CQ_UPDATE: u8 = 0x08;
/// `fm_ce_se` bit: solicited event.
pub const SOLICITED: u8 = 0x02;

/// `dqp_dct` bit marking an extended address vector (PRM "UD address vector").
pub const EXTENDED_AV: u32 = 0x8000_0000;

/// Send-queue opcodes (PRM "Control segment").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// No operation (used to pad the ring end).
    Nop = 0x00,
    /// RDMA WRITE.
    RdmaWrite = 0x08,
    /// RDMA WRITE with immediate (consumes a receive WQE at the responder).
    RdmaWriteImm = 0x09,
    /// SEND.
    Send = 0x0a,
    /// SEND with immediate.
    SendImm = 0x0b,
    /// RDMA READ.
    RdmaRead = 0x10,
    /// Atomic compare-and-swap (8 B).
    AtomicCs = 0x11,
    /// Atomic fetch-and-add (8 B).
    AtomicFa = 0x12,
}

impl Opcode {
    /// Decodes an opcode byte; `None` for opcodes this crate does not implement.
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0x00 => Opcode::Nop,
            0x08 => Opcode::RdmaWrite,
            0x09 => Opcode::RdmaWriteImm,
            0x0a => Opcode::Send,
            0x0b => Opcode::SendImm,
            0x10 => Opcode::RdmaRead,
            0x11 => Opcode::AtomicCs,
            0x12 => Opcode::AtomicFa,
            _ => return None,
        })
    }

    /// Whether the WQE carries a remote-address segment.
    pub fn has_raddr(self) -> bool {
        matches!(
            self,
            Opcode::RdmaWrite
                | Opcode::RdmaWriteImm
                | Opcode::RdmaRead
                | Opcode::AtomicCs
                | Opcode::AtomicFa
        )
    }

    /// Whether the WQE carries an atomic segment.
    pub fn is_atomic(self) -> bool {
        matches!(self, Opcode::AtomicCs | Opcode::AtomicFa)
    }

    /// Whether the control segment's immediate field is meaningful.
    #[inline]
    pub fn has_imm(self) -> bool {
        matches!(self, Opcode::RdmaWriteImm | Opcode::SendImm)
    }
}

/// The first 16-byte segment of `b`.
///
/// # Panics
/// If `b` is shorter than 16 bytes.
#[inline(always)]
fn seg_mut(b: &mut [u8]) -> &mut [u8; DS_BYTES] {
    b.first_chunk_mut::<DS_BYTES>()
        .expect("a WQE segment needs 16 bytes")
}

#[inline(always)]
fn put_be32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_be_bytes());
}

#[inline(always)]
fn get_be32(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes(b[off..off + 4].try_into().unwrap())
}

#[inline(always)]
fn get_be64(b: &[u8], off: usize) -> u64 {
    u64::from_be_bytes(b[off..off + 8].try_into().unwrap())
}

/// The control segment (16 B), first in every WQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtrlSeg {
    /// Opcode modifier (bits 31:24 of `opmod_idx_opcode`).
    pub opmod: u8,
    /// `pi & 0xffff` of the WQE's first WQEBB.
    pub wqe_index: u16,
    /// Raw opcode byte (see [`Opcode`]).
    pub opcode: u8,
    /// QP number (24 bits).
    pub qpn: u32,
    /// Size of the WQE in 16 B units, including this segment.
    pub ds: u8,
    /// Signature byte (0).
    pub signature: u8,
    /// `fm_ce_se` flags: [`FENCE`], [`SMALL_FENCE`], [`CQ_UPDATE`], [`SOLICITED`].
    pub fm_ce_se: u8,
    /// Immediate, host order; stored big-endian on the wire (so the responder's CQE, which
    /// carries it unswapped, decodes back to the same value with `from_be_bytes`).
    pub imm: u32,
}

impl CtrlSeg {
    /// Writes the segment (same bytes as `mlx5dv_set_ctrl_seg(seg, wqe_index, opcode, opmod,
    /// qpn, fm_ce_se, ds, signature, htobe32(imm))`).
    #[inline(always)]
    pub fn write(&self, b: &mut [u8]) {
        self.write_seg(seg_mut(b));
    }

    /// As [`write`](Self::write), into one 16-byte segment (no bounds checks).
    #[inline(always)]
    pub fn write_seg(&self, b: &mut [u8; DS_BYTES]) {
        let w0 = (u32::from(self.opmod) << 24)
            | (u32::from(self.wqe_index) << 8)
            | u32::from(self.opcode);
        let w1 = ((self.qpn & 0x00ff_ffff) << 8) | u32::from(self.ds);
        let w2 = u32::from_be_bytes([self.signature, 0, 0, self.fm_ce_se]);
        b[0..4].copy_from_slice(&w0.to_be_bytes());
        b[4..8].copy_from_slice(&w1.to_be_bytes());
        b[8..12].copy_from_slice(&w2.to_be_bytes());
        b[12..16].copy_from_slice(&self.imm.to_be_bytes());
    }

    /// Parses a control segment.
    #[inline]
    pub fn read(b: &[u8]) -> Self {
        let w0 = get_be32(b, 0);
        let w1 = get_be32(b, 4);
        CtrlSeg {
            opmod: (w0 >> 24) as u8,
            wqe_index: (w0 >> 8) as u16,
            opcode: w0 as u8,
            qpn: w1 >> 8,
            ds: w1 as u8,
            signature: b[8],
            fm_ce_se: b[11],
            imm: get_be32(b, 12),
        }
    }
}

/// Remote-address segment (16 B): where an RDMA or atomic operation acts at the responder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RaddrSeg {
    /// Remote virtual address.
    pub raddr: u64,
    /// Remote key of the responder's memory region.
    pub rkey: u32,
}

impl RaddrSeg {
    /// Writes the segment.
    #[inline(always)]
    pub fn write(&self, b: &mut [u8]) {
        self.write_seg(seg_mut(b));
    }

    /// As [`write`](Self::write), into one 16-byte segment (no bounds checks).
    #[inline(always)]
    pub fn write_seg(&self, b: &mut [u8; DS_BYTES]) {
        b[0..8].copy_from_slice(&self.raddr.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..16].fill(0);
    }
    /// Parses the segment.
    #[inline]
    pub fn read(b: &[u8]) -> Self {
        RaddrSeg {
            raddr: get_be64(b, 0),
            rkey: get_be32(b, 8),
        }
    }
}

/// Atomic segment (16 B).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AtomicSeg {
    /// Swap value (CS) or addend (FA).
    pub swap_add: u64,
    /// Compare value (CS; 0 for FA).
    pub compare: u64,
}

impl AtomicSeg {
    /// Writes the segment.
    #[inline(always)]
    pub fn write(&self, b: &mut [u8]) {
        self.write_seg(seg_mut(b));
    }

    /// As [`write`](Self::write), into one 16-byte segment (no bounds checks).
    #[inline(always)]
    pub fn write_seg(&self, b: &mut [u8; DS_BYTES]) {
        b[0..8].copy_from_slice(&self.swap_add.to_be_bytes());
        b[8..16].copy_from_slice(&self.compare.to_be_bytes());
    }
    /// Parses the segment.
    #[inline]
    pub fn read(b: &[u8]) -> Self {
        AtomicSeg {
            swap_add: get_be64(b, 0),
            compare: get_be64(b, 8),
        }
    }
}

/// A scatter/gather element: a local buffer inside a registered memory region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    /// Local virtual address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Local key of the memory region holding it.
    pub lkey: u32,
}

/// Data segment (16 B): one [`Sge`] (same bytes as `mlx5dv_set_data_seg`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataSeg(pub Sge);

/// `lkey` of the data segment that terminates a receive WQE with fewer than `max_sge`
/// entries (`MLX5_INVALID_LKEY`), with `byte_count` 0.
pub const INVALID_LKEY: u32 = 0x100;

impl DataSeg {
    /// Writes the segment.
    #[inline(always)]
    pub fn write(&self, b: &mut [u8]) {
        self.write_seg(seg_mut(b));
    }

    /// As [`write`](Self::write), into one 16-byte segment (no bounds checks).
    #[inline(always)]
    pub fn write_seg(&self, b: &mut [u8; DS_BYTES]) {
        b[0..4].copy_from_slice(&self.0.len.to_be_bytes());
        b[4..8].copy_from_slice(&self.0.lkey.to_be_bytes());
        b[8..16].copy_from_slice(&self.0.addr.to_be_bytes());
    }
    /// Parses the segment.
    #[inline]
    pub fn read(b: &[u8]) -> Self {
        DataSeg(Sge {
            len: get_be32(b, 0),
            lkey: get_be32(b, 4),
            addr: get_be64(b, 8),
        })
    }
    /// Whether this is the terminator of a short receive scatter list.
    pub fn is_terminator(&self) -> bool {
        self.0.len == 0 && self.0.lkey == INVALID_LKEY
    }
}

/// Bytes an inline segment carrying `len` data bytes occupies: `align_up(4 + len, 16)`.
#[inline]
pub const fn inline_seg_bytes(len: usize) -> usize {
    (4 + len).div_ceil(DS_BYTES) * DS_BYTES
}

/// Writes an inline segment: BE32 `len | INLINE_SEG`, then the bytes, then zero padding to
/// [`inline_seg_bytes`]. `b` must be at least that long.
#[inline(always)]
pub fn write_inline(b: &mut [u8], data: &[u8]) {
    let end = inline_seg_bytes(data.len());
    // Zero the last 16 B unit with one store, then write over its front: the padding after
    // the data ends up zero without a byte loop.
    b[end - DS_BYTES..end].copy_from_slice(&[0; DS_BYTES]);
    put_be32(b, 0, data.len() as u32 | INLINE_SEG);
    b[4..4 + data.len()].copy_from_slice(data);
}

/// Writes an inline segment carrying `hdr` followed by `data`: the same bytes as
/// [`write_inline`] of their concatenation, without building it first (a sender writes a
/// packet header and its payload straight from where they are). `b` must be at least
/// [`inline_seg_bytes`]`(hdr.len() + data.len())` long.
#[inline(always)]
pub fn write_inline2(b: &mut [u8], hdr: &[u8], data: &[u8]) {
    let len = hdr.len() + data.len();
    let end = inline_seg_bytes(len);
    b[end - DS_BYTES..end].copy_from_slice(&[0; DS_BYTES]);
    put_be32(b, 0, len as u32 | INLINE_SEG);
    let body = &mut b[4..4 + len];
    let (h, d) = body.split_at_mut(hdr.len());
    // A 16-byte header (the eRPC packet header) is one fixed-size copy, no `memcpy` call.
    if let (Ok(h16), Ok(hdr16)) = (
        <&mut [u8; DS_BYTES]>::try_from(&mut *h),
        <&[u8; DS_BYTES]>::try_from(hdr),
    ) {
        *h16 = *hdr16;
    } else {
        h.copy_from_slice(hdr);
    }
    if !data.is_empty() {
        d.copy_from_slice(data);
    }
}

/// Whether the segment starting at `b` is an inline segment (bit 31 of its first BE32).
#[inline]
pub fn is_inline(b: &[u8]) -> bool {
    get_be32(b, 0) & INLINE_SEG != 0
}

/// Length of the inline data of the inline segment starting at `b`.
#[inline]
pub fn inline_len(b: &[u8]) -> usize {
    (get_be32(b, 0) & !INLINE_SEG) as usize
}

/// UD address vector (48 B): where a UD SEND goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DgramSeg {
    /// Destination Q_Key.
    pub qkey: u32,
    /// Destination QP number (24 bits).
    pub dqpn: u32,
    /// Destination LID (InfiniBand).
    pub rlid: u16,
    /// `stat_rate_sl` byte (service level in bits 3:0).
    pub stat_rate_sl: u8,
    /// Whether a GRH is present (`grh_gid_fl` bit 30).
    pub grh: bool,
    /// Remote GID (with a GRH).
    pub rgid: [u8; 16],
}

impl DgramSeg {
    /// Writes the segment (same bytes as `mlx5dv_set_dgram_seg` with an extended AV whose
    /// `key.qkey.qkey` is `qkey`).
    #[inline(always)]
    pub fn write(&self, b: &mut [u8]) {
        let b = &mut b[..DGRAM_BYTES];
        b.fill(0);
        put_be32(b, 0, self.qkey);
        put_be32(b, 8, (self.dqpn & 0x00ff_ffff) | EXTENDED_AV);
        b[12] = self.stat_rate_sl;
        b[14..16].copy_from_slice(&self.rlid.to_be_bytes());
        if self.grh {
            put_be32(b, 28, 1 << 30);
            b[32..48].copy_from_slice(&self.rgid);
        }
    }
    /// The segment's 48 bytes as [`write`](Self::write) lays them out, for a sender that
    /// posts many WQEs to one destination ([`SendQueue::post_ud`](crate::sq::SendQueue::post_ud)).
    #[inline]
    pub fn encode(&self) -> EncodedAv {
        let mut b = [0u8; DGRAM_BYTES];
        self.write(&mut b);
        EncodedAv(b)
    }

    /// Parses the segment.
    #[inline]
    pub fn read(b: &[u8]) -> Self {
        let mut rgid = [0; 16];
        rgid.copy_from_slice(&b[32..48]);
        DgramSeg {
            qkey: get_be32(b, 0),
            dqpn: get_be32(b, 8) & 0x00ff_ffff,
            rlid: u16::from_be_bytes([b[14], b[15]]),
            stat_rate_sl: b[12],
            grh: get_be32(b, 28) & (1 << 30) != 0,
            rgid,
        }
    }
}

/// A UD address vector already in its wire form ([`DgramSeg::encode`]): posting with it
/// ([`SendQueue::post_ud`](crate::sq::SendQueue::post_ud)) is one 48 B copy instead of
/// encoding the segment field by field for every WQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncodedAv(pub [u8; DGRAM_BYTES]);

impl From<&DgramSeg> for EncodedAv {
    #[inline]
    fn from(seg: &DgramSeg) -> Self {
        seg.encode()
    }
}

/// Everything one send WQE says, as the driver's post call takes it.
///
/// Segment order written: ctrl, `ud` (UD QPs), `remote` (RDMA/atomic opcodes), `atomic`,
/// one inline segment with `inline` (if non-empty), then one data segment per `sges` entry.
#[derive(Clone, Copy, Debug)]
pub struct WqeDesc<'a> {
    /// Operation.
    pub opcode: Opcode,
    /// `fm_ce_se` flags ([`CQ_UPDATE`] = signaled).
    pub flags: u8,
    /// Immediate for `*Imm` opcodes (host order).
    pub imm: u32,
    /// UD destination (UD QPs only).
    pub ud: Option<DgramSeg>,
    /// Remote address (RDMA and atomic opcodes).
    pub remote: Option<RaddrSeg>,
    /// Atomic operands (atomic opcodes).
    pub atomic: Option<AtomicSeg>,
    /// Bytes copied into the WQE as an inline segment (empty: none).
    pub inline: &'a [u8],
    /// Gather list (RDMA READ/atomics: scatter list for the result).
    pub sges: &'a [Sge],
}

impl<'a> WqeDesc<'a> {
    /// A signaled RDMA READ of `remote` into the scatter list `sges` (ctrl, remote-address
    /// and data segments; PRM "RDMA Read"). Post it with
    /// [`SendQueue::post_local_write`](crate::sq::SendQueue::post_local_write): the device
    /// writes `sges`.
    #[inline(always)]
    pub const fn rdma_read(remote: RaddrSeg, sges: &'a [Sge]) -> Self {
        Self::rdma(Opcode::RdmaRead, remote, sges)
    }

    /// A signaled one-sided operation `opcode` (RDMA READ or WRITE) between `remote` and the
    /// local list `sges` (ctrl, remote-address and data segments; PRM "RDMA Write", "RDMA
    /// Read"). A READ is posted with
    /// [`SendQueue::post_local_write`](crate::sq::SendQueue::post_local_write).
    #[inline(always)]
    pub const fn rdma(opcode: Opcode, remote: RaddrSeg, sges: &'a [Sge]) -> Self {
        WqeDesc {
            opcode,
            flags: CQ_UPDATE,
            imm: 0,
            ud: None,
            remote: Some(remote),
            atomic: None,
            inline: &[],
            sges,
        }
    }
}

impl WqeDesc<'_> {
    /// The WQE's size in 16 B units (`ds`).
    #[inline(always)]
    pub fn ds(&self) -> u32 {
        let mut bytes = CTRL_BYTES;
        if self.ud.is_some() {
            bytes += DGRAM_BYTES;
        }
        if self.remote.is_some() {
            bytes += RADDR_BYTES;
        }
        if self.atomic.is_some() {
            bytes += ATOMIC_BYTES;
        }
        if !self.inline.is_empty() {
            bytes += inline_seg_bytes(self.inline.len());
        }
        bytes += DATA_BYTES * self.sges.len();
        (bytes / DS_BYTES) as u32
    }

    /// Writes the WQE into `b` (exactly `ds * 16` bytes, contiguous) with the given WQE index
    /// and QPN. Returns `ds`.
    #[inline]
    pub fn write(&self, b: &mut [u8], wqe_index: u16, qpn: u32) -> u32 {
        let ds = self.ds();
        self.write_ds(b, ds, wqe_index, qpn, None);
        ds
    }

    /// As [`write`](Self::write) with `ds` already computed ([`ds`](Self::ds)), and `av`
    /// copied as the address vector when `self.ud` is `None` (then `ds` counts its 3 units).
    /// The WQE is written segment by segment into the 16-byte units of `b`, so that each
    /// segment's stores need no bounds check of their own.
    ///
    /// # Panics
    /// If `b` is shorter than `ds * 16` bytes. `ds` must be `self.ds()`, plus 3 with `av`
    /// (checked in debug builds; the callers, [`SendQueue::post`](crate::sq::SendQueue::post)
    /// and [`SendQueue::post_ud`](crate::sq::SendQueue::post_ud), compute it so).
    #[inline(always)]
    pub(crate) fn write_ds(
        &self,
        b: &mut [u8],
        ds: u32,
        wqe_index: u16,
        qpn: u32,
        av: Option<&EncodedAv>,
    ) {
        let segs = &mut b.as_chunks_mut::<DS_BYTES>().0[..ds as usize];
        let (ctrl, rest) = segs.split_first_mut().expect("a WQE has a control segment");
        CtrlSeg {
            opmod: 0,
            wqe_index,
            opcode: self.opcode as u8,
            qpn,
            ds: ds as u8,
            signature: 0,
            fm_ce_se: self.flags,
            imm: if self.opcode.has_imm() { self.imm } else { 0 },
        }
        .write_seg(ctrl);
        let mut k = 0;
        if let Some(ud) = &self.ud {
            let n = DGRAM_BYTES / DS_BYTES;
            ud.write(rest[k..k + n].as_flattened_mut());
            k += n;
        } else if let Some(av) = av {
            let n = DGRAM_BYTES / DS_BYTES;
            rest[k..k + n].as_flattened_mut().copy_from_slice(&av.0);
            k += n;
        }
        if let Some(r) = &self.remote {
            r.write_seg(&mut rest[k]);
            k += 1;
        }
        if let Some(a) = &self.atomic {
            a.write_seg(&mut rest[k]);
            k += 1;
        }
        if !self.inline.is_empty() {
            let n = inline_seg_bytes(self.inline.len()) / DS_BYTES;
            write_inline(rest[k..k + n].as_flattened_mut(), self.inline);
            k += n;
        }
        for (seg, s) in rest[k..].iter_mut().zip(self.sges) {
            DataSeg(*s).write_seg(seg);
            k += 1;
        }
        debug_assert_eq!(k + 1, ds as usize);
    }
}

/// WQEBBs a WQE of `ds` units occupies: `ceil(ds * 16 / 64)`, computed as
/// `ceil(ds / (64 / 16))` (no multiplication that could overflow).
#[inline]
pub const fn wqebbs(ds: u32) -> u32 {
    ds.div_ceil((WQEBB / DS_BYTES) as u32)
}

/// A WQE as the device model reads it, segment by segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedWqe {
    /// The control segment.
    pub ctrl: CtrlSeg,
    /// Address vector, for a UD QP.
    pub ud: Option<DgramSeg>,
    /// Remote address.
    pub remote: Option<RaddrSeg>,
    /// Atomic operands.
    pub atomic: Option<AtomicSeg>,
    /// Inline data (copied out).
    pub inline: Vec<u8>,
    /// Data segments.
    pub sges: Vec<Sge>,
}

/// Why the device model could not parse a WQE (it answers with an error CQE, syndrome
/// LOCAL_QP_OP or LOCAL_LENGTH).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Unknown or unsupported opcode byte.
    #[error("unsupported opcode {0:#04x}")]
    Opcode(u8),
    /// `ds` is 0, above [`MAX_DS`], larger than the WQE bytes given, or the segments do not
    /// fit in it.
    #[error("bad ds {0}")]
    Ds(u8),
    /// An inline segment claims more bytes than the WQE holds.
    #[error("inline length {0} exceeds the WQE")]
    InlineLength(usize),
    /// Fewer bytes than a control segment ([`CTRL_BYTES`]) were given.
    #[error("{0} bytes do not hold a control segment")]
    Truncated(usize),
}

/// Parses one WQE from `b` (which must hold at least the WQE's `ds * 16` bytes; the caller
/// copies a wrapped WQE out of the ring first). `ud` says whether the QP is UD.
///
/// # Errors
/// [`ParseError::Truncated`] if `b` is shorter than a control segment (issue 14: any byte
/// string is refused with an error, never a panic), [`ParseError::Opcode`] for an unknown
/// opcode, [`ParseError::Ds`] for a `ds` that does not cover the mandatory segments, or
/// [`ParseError::InlineLength`] for an inline length past the WQE end.
pub fn parse(b: &[u8], ud: bool) -> Result<ParsedWqe, ParseError> {
    let mut w = ParsedWqe::empty();
    parse_into(b, ud, &mut w)?;
    Ok(w)
}

impl ParsedWqe {
    /// A NOP-shaped WQE with no segments (a buffer for [`parse_into`]).
    pub fn empty() -> ParsedWqe {
        ParsedWqe {
            ctrl: CtrlSeg::read(&[0u8; CTRL_BYTES]),
            ud: None,
            remote: None,
            atomic: None,
            inline: Vec::new(),
            sges: Vec::new(),
        }
    }
}

/// [`parse`] into `w`, reusing its `inline` and `sges` buffers (the device model parses every
/// WQE into one kept buffer, so that executing a WQE allocates nothing). On success `w` holds
/// exactly what [`parse`] returns; on error its contents are unspecified.
///
/// # Errors
/// As [`parse`].
pub fn parse_into(b: &[u8], ud: bool, w: &mut ParsedWqe) -> Result<(), ParseError> {
    if b.len() < CTRL_BYTES {
        return Err(ParseError::Truncated(b.len()));
    }
    let ctrl = CtrlSeg::read(b);
    let op = Opcode::from_u8(ctrl.opcode).ok_or(ParseError::Opcode(ctrl.opcode))?;
    let end = ctrl.ds as usize * DS_BYTES;
    if ctrl.ds == 0 || u32::from(ctrl.ds) > MAX_DS || end > b.len() {
        return Err(ParseError::Ds(ctrl.ds));
    }
    w.ctrl = ctrl;
    w.ud = None;
    w.remote = None;
    w.atomic = None;
    w.inline.clear();
    w.sges.clear();
    if op == Opcode::Nop {
        return Ok(());
    }
    let mut off = CTRL_BYTES;
    let need = |off: usize, n: usize| {
        if off + n > end {
            Err(ParseError::Ds(ctrl.ds))
        } else {
            Ok(())
        }
    };
    if ud {
        need(off, DGRAM_BYTES)?;
        w.ud = Some(DgramSeg::read(&b[off..]));
        off += DGRAM_BYTES;
    }
    if op.has_raddr() {
        need(off, RADDR_BYTES)?;
        w.remote = Some(RaddrSeg::read(&b[off..]));
        off += RADDR_BYTES;
    }
    if op.is_atomic() {
        need(off, ATOMIC_BYTES)?;
        w.atomic = Some(AtomicSeg::read(&b[off..]));
        off += ATOMIC_BYTES;
    }
    while off < end {
        if is_inline(&b[off..]) {
            let len = inline_len(&b[off..]);
            let seg = inline_seg_bytes(len);
            if off + seg > end {
                return Err(ParseError::InlineLength(len));
            }
            w.inline.extend_from_slice(&b[off + 4..off + 4 + len]);
            off += seg;
        } else {
            need(off, DATA_BYTES)?;
            w.sges.push(DataSeg::read(&b[off..]).0);
            off += DATA_BYTES;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_then_parse_every_shape() {
        let sges = [
            Sge {
                addr: 0x1122_3344_5566_7788,
                len: 100,
                lkey: 7,
            },
            Sge {
                addr: 0x10,
                len: 4,
                lkey: 8,
            },
        ];
        let descs = [
            WqeDesc {
                opcode: Opcode::RdmaWriteImm,
                flags: CQ_UPDATE,
                imm: 0xdead_beef,
                ud: None,
                remote: Some(RaddrSeg {
                    raddr: 0xabcd,
                    rkey: 0x42,
                }),
                atomic: None,
                inline: b"hello inline",
                sges: &sges[..1],
            },
            WqeDesc {
                opcode: Opcode::AtomicFa,
                flags: 0,
                imm: 0,
                ud: None,
                remote: Some(RaddrSeg { raddr: 8, rkey: 1 }),
                atomic: Some(AtomicSeg {
                    swap_add: 5,
                    compare: 0,
                }),
                inline: &[],
                sges: &sges[1..],
            },
            WqeDesc {
                opcode: Opcode::Send,
                flags: CQ_UPDATE | SOLICITED,
                imm: 0,
                ud: Some(DgramSeg {
                    qkey: 0x1111_2222,
                    dqpn: 0x123456,
                    rlid: 9,
                    stat_rate_sl: 0,
                    grh: false,
                    rgid: [0; 16],
                }),
                remote: None,
                atomic: None,
                inline: &[],
                sges: &sges,
            },
        ];
        for d in descs {
            let ds = d.ds();
            let mut b = vec![0xAAu8; ds as usize * DS_BYTES];
            assert_eq!(d.write(&mut b, 0x1234, 0xabcdef), ds);
            let p = parse(&b, d.ud.is_some()).unwrap();
            assert_eq!(p.ctrl.opcode, d.opcode as u8);
            assert_eq!(p.ctrl.wqe_index, 0x1234);
            assert_eq!(p.ctrl.qpn, 0xabcdef);
            assert_eq!(p.ctrl.ds as u32, ds);
            assert_eq!(p.ctrl.fm_ce_se, d.flags);
            assert_eq!(p.ud, d.ud);
            assert_eq!(p.remote, d.remote);
            assert_eq!(p.atomic, d.atomic);
            assert_eq!(p.inline, d.inline);
            assert_eq!(p.sges, d.sges);
            if d.opcode.has_imm() {
                assert_eq!(p.ctrl.imm, d.imm);
            }
        }
    }

    #[test]
    fn sizes_and_rejections() {
        assert_eq!(inline_seg_bytes(0), 16);
        assert_eq!(inline_seg_bytes(12), 16);
        assert_eq!(inline_seg_bytes(13), 32);
        assert_eq!(wqebbs(3), 1);
        assert_eq!(wqebbs(4), 1);
        assert_eq!(wqebbs(5), 2);
        let mut b = [0u8; 64];
        CtrlSeg {
            opmod: 0,
            wqe_index: 0,
            opcode: 0x77,
            qpn: 1,
            ds: 1,
            signature: 0,
            fm_ce_se: 0,
            imm: 0,
        }
        .write(&mut b);
        assert_eq!(parse(&b, false), Err(ParseError::Opcode(0x77)));
        b[0..4].copy_from_slice(&(Opcode::RdmaWrite as u32).to_be_bytes());
        assert_eq!(parse(&b, false), Err(ParseError::Ds(1)));
        b[4..8].copy_from_slice(&((1u32 << 8) | 9).to_be_bytes());
        assert_eq!(parse(&b, false), Err(ParseError::Ds(9)));
        // Above the 6-bit hardware limit, even with enough bytes.
        let mut big = vec![0u8; 64 * DS_BYTES];
        big[..16].copy_from_slice(&b[..16]);
        big[4..8].copy_from_slice(&((1u32 << 8) | 64).to_be_bytes());
        assert_eq!(parse(&big, false), Err(ParseError::Ds(64)));
        // Inline length past the end.
        b[4..8].copy_from_slice(&((1u32 << 8) | 3).to_be_bytes());
        b[32..36].copy_from_slice(&(INLINE_SEG | 40).to_be_bytes());
        assert_eq!(parse(&b, false), Err(ParseError::InlineLength(40)));
    }

    /// Property tests over arbitrary WQE bytes (issue 14 §4): the device model parses WQEs
    /// from send rings that a driver, possibly in another process, wrote. 256 cases by
    /// default; `PROPTEST_CASES=<n>` runs more (proptest reads the variable itself).
    mod props {
        use proptest::prelude::*;

        use super::*;

        /// Bytes with a plausible control segment (a known opcode, a `ds` that fits or is just
        /// off) ahead of arbitrary segment bytes, so the segment walk is exercised and not
        /// only the opcode check.
        fn plausible() -> impl Strategy<Value = Vec<u8>> {
            (
                prop_oneof![
                    Just(Opcode::Nop),
                    Just(Opcode::RdmaWrite),
                    Just(Opcode::RdmaWriteImm),
                    Just(Opcode::Send),
                    Just(Opcode::SendImm),
                    Just(Opcode::RdmaRead),
                    Just(Opcode::AtomicCs),
                    Just(Opcode::AtomicFa),
                ],
                0u8..70,
                proptest::collection::vec(any::<u8>(), 0..1100),
                proptest::collection::vec((0usize..1100, any::<u32>()), 0..6),
            )
                .prop_map(|(op, ds, mut b, words)| {
                    if b.len() >= 8 {
                        b[0..4].copy_from_slice(&(op as u32).to_be_bytes());
                        b[7] = ds;
                    }
                    // Inline-segment headers (bit 31) with arbitrary lengths at arbitrary
                    // 16-byte boundaries.
                    for (at, w) in words {
                        let at = at / DS_BYTES * DS_BYTES;
                        if at + 4 <= b.len() {
                            b[at..at + 4].copy_from_slice(&(w | INLINE_SEG).to_be_bytes());
                        }
                    }
                    b
                })
        }

        /// What any outcome of `parse(b, ud)` must satisfy: no panic (the call returned); an
        /// accepted WQE lies inside `b` and inside its own `ds`; a refusal is the typed error
        /// that names the first fault.
        fn check(b: &[u8], ud: bool) -> Result<(), TestCaseError> {
            // `parse_into` a buffer left over from another WQE (every field set) agrees with
            // `parse`: same error, or exactly the same WQE.
            let mut reused = ParsedWqe::empty();
            reused.ud = Some(DgramSeg::read(&[0xa5; DGRAM_BYTES]));
            reused.remote = Some(RaddrSeg { raddr: 1, rkey: 2 });
            reused.atomic = Some(AtomicSeg {
                swap_add: 3,
                compare: 4,
            });
            reused.inline.extend_from_slice(b"stale inline");
            reused.sges.push(Sge {
                addr: 5,
                len: 6,
                lkey: 7,
            });
            match (parse(b, ud), parse_into(b, ud, &mut reused)) {
                (Ok(w), Ok(())) => prop_assert_eq!(&w, &reused),
                (Err(e), Err(f)) => prop_assert_eq!(e, f),
                (a, b) => prop_assert!(false, "parse {:?} vs parse_into {:?}", a, b),
            }
            match parse(b, ud) {
                Ok(w) => {
                    let ds = w.ctrl.ds as usize;
                    prop_assert!(ds >= 1 && ds as u32 <= MAX_DS && ds * DS_BYTES <= b.len());
                    prop_assert_eq!(w.ctrl, CtrlSeg::read(b));
                    let op = Opcode::from_u8(w.ctrl.opcode);
                    prop_assert!(op.is_some());
                    let used = CTRL_BYTES
                        + if w.ud.is_some() { DGRAM_BYTES } else { 0 }
                        + if w.remote.is_some() { RADDR_BYTES } else { 0 }
                        + if w.atomic.is_some() { ATOMIC_BYTES } else { 0 }
                        + w.sges.len() * DATA_BYTES;
                    prop_assert!(used + w.inline.len() <= ds * DS_BYTES);
                    prop_assert_eq!(w.ud.is_some(), ud && op != Some(Opcode::Nop));
                }
                Err(ParseError::Truncated(len)) => {
                    prop_assert_eq!(len, b.len());
                    prop_assert!(len < CTRL_BYTES);
                }
                Err(ParseError::Opcode(o)) => {
                    prop_assert!(b.len() >= CTRL_BYTES);
                    prop_assert_eq!(o, b[3]);
                    prop_assert!(Opcode::from_u8(o).is_none());
                }
                Err(ParseError::Ds(d)) => prop_assert_eq!(d, b[7]),
                Err(ParseError::InlineLength(_)) => prop_assert!(!ud || b.len() > CTRL_BYTES),
            }
            Ok(())
        }

        proptest! {
            /// Arbitrary bytes of any length, as either QP type.
            #[test]
            fn parse_arbitrary_bytes(b in proptest::collection::vec(any::<u8>(), 0..300), ud in any::<bool>()) {
                check(&b, ud)?;
            }

            /// A known opcode and a near-valid `ds` ahead of arbitrary segments.
            #[test]
            fn parse_plausible_control_segments(b in plausible(), ud in any::<bool>()) {
                check(&b, ud)?;
            }
        }

        /// Regression (found by `parse_arbitrary_bytes`): fewer than 16 bytes used to panic
        /// in `CtrlSeg::read`; now a typed error.
        #[test]
        fn short_input_is_a_typed_error() {
            for n in 0..CTRL_BYTES {
                assert_eq!(parse(&vec![0u8; n], false), Err(ParseError::Truncated(n)));
            }
        }
    }
}
