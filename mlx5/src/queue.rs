//! The memory a driver reads and writes for each queue, as a provider hands it over.
//!
//! One code path for hardware and simulation (DESIGN.md "Layers"): both providers create the
//! objects and give the driver the same things — the WQE/CQE buffers, the doorbell records and
//! a [`Doorbell`] — and the driver ([`crate::sq`], [`crate::rq`], [`crate::srq`],
//! [`crate::cq`]) does everything else identically. Only the doorbell differs: MMIO to the
//! UAR/BlueFlame register on hardware, a call into the device model in simulation.
//!
//! # Safety contract
//! Every pointer here is valid for the stated size, suitably aligned (buffers to 64 B,
//! doorbell records to 4 B), and stays valid until the provider object it came from is
//! destroyed. The owning object ([`crate::verbs::Qp`], [`crate::verbs::Cq`],
//! [`crate::verbs::Srq`]) keeps the provider object alive at least as long as the driver
//! queue built on this memory.

use std::ptr::NonNull;
use std::sync::Arc;

/// Send queue memory (PRM "Send queue").
#[derive(Debug)]
pub struct SqMem {
    /// WQE ring: `wqe_cnt * 64` bytes.
    pub buf: NonNull<u8>,
    /// Ring size in WQEBBs (power of two).
    pub wqe_cnt: u32,
    /// The QP's doorbell record (2 BE32 words); the SQ producer goes to word 1.
    pub dbrec: NonNull<u32>,
    /// Largest inline payload accepted, in bytes.
    pub max_inline: u32,
    /// Most data (gather) segments per send WQE (the QP's `max_send_sge`).
    pub max_sge: u32,
    /// How to tell the device about new WQEs.
    pub doorbell: Doorbell,
}

/// Receive queue memory (PRM "Receive queues", RQ).
#[derive(Debug)]
pub struct RqMem {
    /// WQE ring: `wqe_cnt * stride` bytes.
    pub buf: NonNull<u8>,
    /// Ring size in WQEs (power of two).
    pub wqe_cnt: u32,
    /// Bytes per WQE (power of two, `>= 16 * max_sge`).
    pub stride: u32,
    /// Data segments per WQE.
    pub max_sge: u32,
    /// The QP's doorbell record; the RQ head goes to word 0.
    pub dbrec: NonNull<u32>,
}

/// Shared receive queue memory (PRM "Receive queues", SRQ).
#[derive(Debug)]
pub struct SrqMem {
    /// WQE array: `wqe_cnt * stride` bytes.
    pub buf: NonNull<u8>,
    /// Number of WQEs (power of two).
    pub wqe_cnt: u32,
    /// Bytes per WQE (power of two, `>= max(32, 16 + 16 * max_sge)`).
    pub stride: u32,
    /// Data segments per WQE.
    pub max_sge: u32,
    /// The SRQ's doorbell record (word 0: WQE counter).
    pub dbrec: NonNull<u32>,
    /// SRQ number.
    pub srqn: u32,
}

/// Completion queue memory (PRM "Completion queue").
#[derive(Debug)]
pub struct CqMem {
    /// CQE ring: `cqe_cnt * 64` bytes, every `op_own` initialised to 0xF0.
    pub buf: NonNull<u8>,
    /// Number of CQEs (power of two).
    pub cqe_cnt: u32,
    /// The CQ's doorbell record (word 0: consumer index).
    pub dbrec: NonNull<u32>,
    /// CQ number.
    pub cqn: u32,
}

// SAFETY: the pointers refer to DMA/provider memory owned by the provider object, not to
// thread-local data; the driver types that use them require `&mut self` for every access.
unsafe impl Send for SqMem {}
unsafe impl Send for RqMem {}
unsafe impl Send for SrqMem {}
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
    pub reg: NonNull<u8>,
    /// BlueFlame buffer size in bytes (`mlx5dv_qp.bf.size`); 0: plain doorbell only.
    pub size: u32,
    /// Current offset, toggled by `size` after every doorbell.
    pub offset: u32,
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
