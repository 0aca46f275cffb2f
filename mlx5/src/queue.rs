//! The memory a driver reads and writes for each queue, as a provider hands it over.
//!
//! One code path for hardware and simulation (DESIGN.md "Layers"): both providers create the
//! objects and give the driver the same things — the WQE/CQE buffers, the doorbell records and
//! a [`Doorbell`] — and the driver ([`crate::sq`], [`crate::rq`], [`crate::srq`],
//! [`crate::cq`]) does everything else identically. Only the doorbell differs: MMIO to the
//! UAR/BlueFlame register on hardware, a call into the device model in simulation.
//!
//! # Safety contract
//! The memory descriptions here ([`SqMem`], [`RqMem`], [`SrqMem`], [`CqMem`]) hold raw
//! pointers that the driver writes through and the device DMAs into, with no borrow the
//! compiler can check. Their fields are private and their constructors are `unsafe fn`s: the
//! constructor's caller states that every pointer is valid for the stated size, suitably
//! aligned (buffers to 64 B, doorbell records to 4 B), used by nothing but the device and the
//! one driver queue built on the description, and that it stays so until that description,
//! and the queue it is handed to, are dropped. A provider meets the last point by attaching
//! the object that owns the memory ([`SqMem::owned_by`] and its siblings): the description,
//! then the driver queue, keeps it alive, so a queue moved out of its [`crate::verbs::Qp`]
//! (the queue fields are public) still runs on live memory. The driver constructors
//! ([`crate::sq::SendQueue::new`] and its siblings) are then safe.

use std::any::Any;
use std::ptr::NonNull;
use std::sync::Arc;

/// The object that owns a queue's memory (a provider's QP, CQ or SRQ object, or the buffers
/// themselves), kept alive by the memory description and then by the driver queue built on it.
pub type MemOwner = Arc<dyn Any + Send + Sync>;

/// Send queue memory (PRM "Send queue").
pub struct SqMem {
    /// WQE ring: `wqe_cnt * 64` bytes.
    pub(crate) buf: NonNull<u8>,
    /// Ring size in WQEBBs (power of two).
    pub(crate) wqe_cnt: u32,
    /// The QP's doorbell record (2 BE32 words); the SQ producer goes to word 1.
    pub(crate) dbrec: NonNull<u32>,
    /// Largest inline payload accepted, in bytes.
    pub(crate) max_inline: u32,
    /// Most data (gather) segments per send WQE (the QP's `max_send_sge`).
    pub(crate) max_sge: u32,
    /// How to tell the device about new WQEs.
    pub(crate) doorbell: Doorbell,
    /// Keeps the memory alive (see the module's safety contract).
    owner: Option<MemOwner>,
}

impl SqMem {
    /// Describes a send queue: a ring of `wqe_cnt` WQEBBs at `buf`, the QP's doorbell record
    /// at `dbrec`, the QP's inline and gather limits and its doorbell.
    ///
    /// # Safety
    /// Until this value and the [`SendQueue`](crate::sq::SendQueue) built on it are dropped
    /// (attach the memory's owner with [`SqMem::owned_by`] to tie the two):
    /// - `buf` is valid for reads and writes of `wqe_cnt * 64` bytes and 64 B aligned, and
    ///   `dbrec` for reads and writes of two `u32` words, 4 B aligned;
    /// - nothing but that queue and the device reads or writes them (no second description of
    ///   the same memory);
    /// - with [`Doorbell::Mmio`], the register is valid for 64-bit writes of `2 * size` bytes
    ///   (at least 8 bytes when `size` is 0), 8 B aligned (see [`BlueFlame::new`]);
    /// - the device executes at most `max_sge` gather entries and `max_inline` inline bytes
    ///   per WQE as the QP was created with (the driver checks WQEs against these limits only).
    pub unsafe fn new(
        buf: NonNull<u8>,
        wqe_cnt: u32,
        dbrec: NonNull<u32>,
        max_inline: u32,
        max_sge: u32,
        doorbell: Doorbell,
    ) -> Self {
        SqMem {
            buf,
            wqe_cnt,
            dbrec,
            max_inline,
            max_sge,
            doorbell,
            owner: None,
        }
    }

    /// Keeps `owner` (the object whose destruction frees the memory) alive as long as this
    /// description and the queue built on it.
    #[must_use]
    pub fn owned_by(mut self, owner: MemOwner) -> Self {
        self.owner = Some(owner);
        self
    }

    /// Start of the WQE ring (`wqe_cnt * 64` bytes).
    pub fn buf(&self) -> NonNull<u8> {
        self.buf
    }

    /// Ring size in WQEBBs (power of two).
    pub fn wqe_cnt(&self) -> u32 {
        self.wqe_cnt
    }

    /// The QP's doorbell record (2 BE32 words; word 1: SQ producer counter).
    pub fn dbrec(&self) -> NonNull<u32> {
        self.dbrec
    }

    /// Largest inline payload accepted, in bytes.
    pub fn max_inline(&self) -> u32 {
        self.max_inline
    }

    /// Most data (gather) segments per send WQE.
    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }

    /// How the driver tells the device about new WQEs.
    pub fn doorbell(&self) -> &Doorbell {
        &self.doorbell
    }
}

/// Receive queue memory (PRM "Receive queues", RQ).
pub struct RqMem {
    /// WQE ring: `wqe_cnt * stride` bytes.
    pub(crate) buf: NonNull<u8>,
    /// Ring size in WQEs (power of two).
    pub(crate) wqe_cnt: u32,
    /// Bytes per WQE (power of two, `>= 16 * max_sge`; an SRQ's also holds a 16 B next
    /// segment first).
    pub(crate) stride: u32,
    /// Data segments per WQE.
    pub(crate) max_sge: u32,
    /// The QP's doorbell record; the RQ head goes to word 0 (an SRQ's: its WQE counter).
    pub(crate) dbrec: NonNull<u32>,
    /// Keeps the memory alive (see the module's safety contract).
    owner: Option<MemOwner>,
}

impl RqMem {
    /// Describes a receive queue: `wqe_cnt` WQEs of `stride` bytes at `buf`, each with room
    /// for `max_sge` 16 B data segments, and the QP's doorbell record at `dbrec`.
    ///
    /// # Safety
    /// Until this value and the [`RecvQueue`](crate::rq::RecvQueue) built on it are dropped
    /// (attach the memory's owner with [`RqMem::owned_by`] to tie the two):
    /// - `buf` is valid for reads and writes of `wqe_cnt * stride` bytes and 64 B aligned
    ///   (16 B suffices), and `dbrec` for reads and writes of one `u32` word, 4 B aligned;
    /// - nothing but that queue and the device reads or writes them (no second description of
    ///   the same memory);
    /// - the device reads WQEs with this layout (the QP's receive queue).
    pub unsafe fn new(
        buf: NonNull<u8>,
        wqe_cnt: u32,
        stride: u32,
        max_sge: u32,
        dbrec: NonNull<u32>,
    ) -> Self {
        RqMem {
            buf,
            wqe_cnt,
            stride,
            max_sge,
            dbrec,
            owner: None,
        }
    }

    /// Keeps `owner` (the object whose destruction frees the memory) alive as long as this
    /// description and the queue built on it.
    #[must_use]
    pub fn owned_by(mut self, owner: MemOwner) -> Self {
        self.owner = Some(owner);
        self
    }

    /// Start of the WQE ring (`wqe_cnt * stride` bytes).
    pub fn buf(&self) -> NonNull<u8> {
        self.buf
    }

    /// Ring size in WQEs (power of two).
    pub fn wqe_cnt(&self) -> u32 {
        self.wqe_cnt
    }

    /// Bytes per WQE.
    pub fn stride(&self) -> u32 {
        self.stride
    }

    /// Data segments per WQE.
    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }

    /// The QP's doorbell record (word 0: RQ head).
    pub fn dbrec(&self) -> NonNull<u32> {
        self.dbrec
    }
}

/// Shared receive queue memory (PRM "Receive queues", SRQ): a receive ring laid out as an
/// [`RqMem`] (each WQE a 16 B next segment, then room for `max_sge` 16 B data segments; the
/// doorbell record's word 0 is the WQE counter), and the SRQ number.
pub struct SrqMem {
    /// The WQE array, its geometry and doorbell record, and the memory's owner.
    pub(crate) ring: RqMem,
    /// SRQ number.
    pub(crate) srqn: u32,
}

impl SrqMem {
    /// Describes shared receive queue `srqn`: `wqe_cnt` WQEs of `stride` bytes at `buf` (a
    /// 16 B next segment, then room for `max_sge` 16 B data segments), and its doorbell record
    /// at `dbrec`.
    ///
    /// # Safety
    /// Until this value and the [`SharedRecvQueue`](crate::srq::SharedRecvQueue) built on it
    /// are dropped (attach the memory's owner with [`SrqMem::owned_by`] to tie the two):
    /// - `buf` is valid for reads and writes of `wqe_cnt * stride` bytes and 64 B aligned
    ///   (16 B suffices), and `dbrec` for reads and writes of one `u32` word, 4 B aligned;
    /// - nothing but that queue and the device reads or writes them (no second description of
    ///   the same memory);
    /// - the device reads WQEs with this layout (SRQ `srqn`).
    pub unsafe fn new(
        buf: NonNull<u8>,
        wqe_cnt: u32,
        stride: u32,
        max_sge: u32,
        dbrec: NonNull<u32>,
        srqn: u32,
    ) -> Self {
        SrqMem {
            // SAFETY: the caller's contract above is `RqMem::new`'s, for the SRQ's ring.
            ring: unsafe { RqMem::new(buf, wqe_cnt, stride, max_sge, dbrec) },
            srqn,
        }
    }

    /// Keeps `owner` (the object whose destruction frees the memory) alive as long as this
    /// description and the queue built on it.
    #[must_use]
    pub fn owned_by(mut self, owner: MemOwner) -> Self {
        self.ring = self.ring.owned_by(owner);
        self
    }

    /// The WQE array: start, WQE count (power of two), bytes per WQE, data segments per WQE
    /// and the doorbell record (word 0: the SRQ's WQE counter).
    pub fn ring(&self) -> &RqMem {
        &self.ring
    }

    /// SRQ number.
    pub fn srqn(&self) -> u32 {
        self.srqn
    }
}

/// Completion queue memory (PRM "Completion queue").
pub struct CqMem {
    /// CQE ring: `cqe_cnt * 64` bytes, every `op_own` initialised to 0xF0.
    pub(crate) buf: NonNull<u8>,
    /// Number of CQEs (power of two).
    pub(crate) cqe_cnt: u32,
    /// The CQ's doorbell record (word 0: consumer index).
    pub(crate) dbrec: NonNull<u32>,
    /// CQ number.
    pub(crate) cqn: u32,
    /// Keeps the memory alive (see the module's safety contract).
    owner: Option<MemOwner>,
}

impl CqMem {
    /// Describes completion queue `cqn`: a ring of `cqe_cnt` 64 B CQEs at `buf` and its
    /// doorbell record at `dbrec`.
    ///
    /// # Safety
    /// Until this value and the [`CompletionQueue`](crate::cq::CompletionQueue) built on it
    /// are dropped (attach the memory's owner with [`CqMem::owned_by`] to tie the two):
    /// - `buf` is valid for reads and writes of `cqe_cnt * 64` bytes and 64 B aligned, every
    ///   CQE's `op_own` byte initialised (0xF0: invalid, hardware owned) and written only
    ///   atomically by the device; `dbrec` is valid for reads and writes of one `u32` word,
    ///   4 B aligned;
    /// - nothing but that queue and the device reads or writes them (no second description of
    ///   the same memory).
    pub unsafe fn new(buf: NonNull<u8>, cqe_cnt: u32, dbrec: NonNull<u32>, cqn: u32) -> Self {
        CqMem {
            buf,
            cqe_cnt,
            dbrec,
            cqn,
            owner: None,
        }
    }

    /// Keeps `owner` (the object whose destruction frees the memory) alive as long as this
    /// description and the queue built on it.
    #[must_use]
    pub fn owned_by(mut self, owner: MemOwner) -> Self {
        self.owner = Some(owner);
        self
    }

    /// Start of the CQE ring (`cqe_cnt * 64` bytes).
    pub fn buf(&self) -> NonNull<u8> {
        self.buf
    }

    /// Number of CQEs (power of two).
    pub fn cqe_cnt(&self) -> u32 {
        self.cqe_cnt
    }

    /// The CQ's doorbell record (word 0: consumer index).
    pub fn dbrec(&self) -> NonNull<u32> {
        self.dbrec
    }

    /// CQ number.
    pub fn cqn(&self) -> u32 {
        self.cqn
    }
}

impl std::fmt::Debug for SqMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqMem")
            .field("buf", &self.buf)
            .field("wqe_cnt", &self.wqe_cnt)
            .field("dbrec", &self.dbrec)
            .field("max_inline", &self.max_inline)
            .field("max_sge", &self.max_sge)
            .field("doorbell", &self.doorbell)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for RqMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RqMem")
            .field("buf", &self.buf)
            .field("wqe_cnt", &self.wqe_cnt)
            .field("stride", &self.stride)
            .field("max_sge", &self.max_sge)
            .field("dbrec", &self.dbrec)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for SrqMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SrqMem")
            .field("ring", &self.ring)
            .field("srqn", &self.srqn)
            .finish()
    }
}

impl std::fmt::Debug for CqMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CqMem")
            .field("buf", &self.buf)
            .field("cqe_cnt", &self.cqe_cnt)
            .field("dbrec", &self.dbrec)
            .field("cqn", &self.cqn)
            .finish_non_exhaustive()
    }
}

// SAFETY: the pointers refer to DMA/provider memory kept alive by the owner (or by the
// constructor's caller), not to thread-local data; the owner is `Send + Sync`; the driver
// types that use the pointers require `&mut self` for every access.
unsafe impl Send for SqMem {}
// SAFETY: as for `SqMem`.
unsafe impl Send for RqMem {}
// SAFETY: as for `SqMem`.
unsafe impl Send for CqMem {}

/// How the driver tells the device that new send WQEs are in the ring (after updating the
/// doorbell record).
pub enum Doorbell {
    /// Hardware: the UAR / BlueFlame register (PRM "Doorbell").
    Mmio(BlueFlame),
    /// Software device model: executes the new WQEs of `qpn` synchronously.
    Sim {
        /// The model.
        device: Arc<dyn SimDoorbell>,
        /// QP whose send queue was rung.
        qpn: u32,
    },
}

impl std::fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Doorbell::Mmio(bf) => f.debug_tuple("Mmio").field(bf).finish(),
            Doorbell::Sim { qpn, .. } => f.debug_struct("Sim").field("qpn", qpn).finish(),
        }
    }
}

/// The BlueFlame / UAR register of a hardware QP.
#[derive(Debug)]
pub struct BlueFlame {
    /// Register base (`mlx5dv_qp.bf.reg`).
    pub(crate) reg: NonNull<u8>,
    /// BlueFlame buffer size in bytes (`mlx5dv_qp.bf.size`); 0: plain doorbell only.
    pub(crate) size: u32,
    /// Current offset, toggled by `size` after every doorbell.
    pub(crate) offset: u32,
}

impl BlueFlame {
    /// The register at `reg` (`mlx5dv_qp.bf.reg`) with BlueFlame buffers of `size` bytes
    /// (`mlx5dv_qp.bf.size`; 0: plain doorbell only), starting at offset 0. Its validity is
    /// part of the contract of [`SqMem::new`], which it is handed to.
    pub fn new(reg: NonNull<u8>, size: u32) -> Self {
        BlueFlame {
            reg,
            size,
            offset: 0,
        }
    }

    /// Register base.
    pub fn reg(&self) -> NonNull<u8> {
        self.reg
    }

    /// BlueFlame buffer size in bytes (0: plain doorbell only).
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Offset of the next doorbell write: 0 or `size`, toggled after every doorbell.
    pub fn offset(&self) -> u32 {
        self.offset
    }
}

// SAFETY: MMIO register of a QP owned by the same object; only used with `&mut`.
unsafe impl Send for BlueFlame {}

/// The device model's doorbell entry point.
pub trait SimDoorbell: Send + Sync {
    /// The send queue of `qpn` has new WQEs up to its doorbell record's producer index: parse
    /// and execute them (PRM semantics), write CQEs, then return. (On a joined node whose node
    /// lock stays held by someone else past its bound, the doorbell returns after the bound
    /// with the WQEs still posted; the next doorbell of the QP executes them.)
    fn ring_sq(&self, qpn: u32);
}
