//! Verbs-level objects (context, PD, MR, CQ, SRQ, QP, address handle) and the [`Provider`]
//! trait behind them.
//!
//! A [`Context`] is opened on a provider: the rdma-core hardware provider
//! ([`crate::hw`], `dlopen`ed at run time) or the software device model ([`crate::sim`]).
//! Object creation and QP state transitions go through the provider (cold path); every queue
//! operation goes through the driver types ([`SendQueue`], [`RecvQueue`],
//! [`SharedRecvQueue`], [`CompletionQueue`]) on the memory the provider handed over
//! ([`crate::queue`]), identically for both.

use std::any::Any;
use std::sync::Arc;

use crate::cq::CompletionQueue;
use crate::error::Result;
use crate::queue::{CqMem, RqMem, SqMem, SrqMem};
use crate::rq::RecvQueue;
use crate::sq::SendQueue;
use crate::srq::SharedRecvQueue;
use crate::wqe::DgramSeg;

bitflags::bitflags! {
    /// Memory region access rights (`IBV_ACCESS_*` values).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct Access: u32 {
        /// The local device may write (receives, RDMA READ results).
        const LOCAL_WRITE = 1;
        /// Peers may RDMA WRITE.
        const REMOTE_WRITE = 1 << 1;
        /// Peers may RDMA READ.
        const REMOTE_READ = 1 << 2;
        /// Peers may perform atomics.
        const REMOTE_ATOMIC = 1 << 3;
    }
}

/// Link layer of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand (addressed by LID).
    InfiniBand,
    /// RoCE (addressed by GID).
    Ethernet,
}

/// What a port reports (`ibv_query_port`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// Port number (1-based).
    pub port: u8,
    /// Local identifier (InfiniBand).
    pub lid: u16,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// Active MTU in bytes (256..4096).
    pub active_mtu: u32,
    /// GID index 0 (RoCE addressing).
    pub gid: [u8; 16],
}

/// QP transport type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpType {
    /// Reliable connected.
    Rc,
    /// Unreliable datagram.
    Ud,
}

/// Queue sizes requested at QP creation (providers may round up; the driver reads the real
/// sizes from the memory they return).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Send WQEs (each up to one WQEBB at this size; larger WQEs use more).
    pub max_send_wr: u32,
    /// Receive WQEs (ignored with an SRQ).
    pub max_recv_wr: u32,
    /// Data segments per send WQE.
    pub max_send_sge: u32,
    /// Data segments per receive WQE.
    pub max_recv_sge: u32,
    /// Largest inline payload in bytes.
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: 220,
        }
    }
}

/// The remote side of an RC connection, exchanged out of band.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RcRemote {
    /// Remote QP number.
    pub qpn: u32,
    /// Remote LID (InfiniBand).
    pub lid: u16,
    /// Remote GID (RoCE).
    pub gid: [u8; 16],
    /// The remote's send PSN (our receive PSN).
    pub psn: u32,
}

/// RC connection parameters (RTR/RTS attributes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RcParams {
    /// Our send PSN.
    pub psn: u32,
    /// Path MTU in bytes.
    pub mtu: u32,
    /// Transport retry count (0..7).
    pub retry_cnt: u8,
    /// RNR retry count (0..7; 7 = infinite on hardware).
    pub rnr_retry: u8,
    /// Local ACK timeout exponent (4.096 µs * 2^timeout).
    pub timeout: u8,
    /// Outstanding RDMA READ/atomic operations.
    pub max_rd_atomic: u8,
    /// Access rights granted to the peer on this QP.
    pub access: Access,
}

impl Default for RcParams {
    fn default() -> Self {
        RcParams {
            psn: 0,
            mtu: 4096,
            retry_cnt: 7,
            rnr_retry: 7,
            timeout: 14,
            max_rd_atomic: 16,
            access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        }
    }
}

/// A provider-side object; dropping it destroys the object in the provider.
pub type Handle = Box<dyn Any + Send + Sync>;

/// What a provider does: create objects and move QPs through their states. Cold path only.
pub trait Provider: Send + Sync {
    /// Provider name for messages ("rdma-core mlx5_0" or "sim").
    fn name(&self) -> String;
    /// The port this context uses.
    fn port(&self) -> PortInfo;
    /// Allocates a protection domain.
    fn alloc_pd(&self) -> Result<Handle>;
    /// Registers `len` bytes at `addr` in `pd`; returns `(handle, lkey, rkey)`.
    ///
    /// # Safety
    /// The contract of [`Context::reg_mr`], with the returned handle in the place of the
    /// [`Mr`]: the device may access the range, as `access` allows, until the handle is
    /// dropped.
    unsafe fn reg_mr(
        &self,
        pd: &Handle,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<(Handle, u32, u32)>;
    /// Creates a CQ with at least `cqe` entries.
    fn create_cq(&self, cqe: u32) -> Result<(Handle, CqMem)>;
    /// Creates an SRQ with at least `max_wr` WQEs of `max_sge` data segments.
    fn create_srq(&self, pd: &Handle, max_wr: u32, max_sge: u32) -> Result<(Handle, SrqMem)>;
    /// Creates a QP in RESET; `recv_cq`/`srq` are the objects it reports receives to / takes
    /// receive WQEs from. Returns its QPN, send queue memory and (without SRQ) receive queue
    /// memory.
    fn create_qp(
        &self,
        pd: &Handle,
        init: &QpInit<'_>,
    ) -> Result<(Handle, u32, SqMem, Option<RqMem>)>;
    /// RC: RESET→INIT→RTR→RTS towards `remote` (PRM "QP transitions").
    fn connect_rc(&self, qp: &Handle, remote: &RcRemote, params: &RcParams) -> Result<()>;
    /// UD: RESET→INIT→RTR→RTS with `qkey`.
    fn activate_ud(&self, qp: &Handle, qkey: u32) -> Result<()>;
    /// Builds the address vector for UD sends to `dest` (hardware: via an address handle).
    fn create_ah(&self, pd: &Handle, dest: &UdDest) -> Result<(Handle, DgramSeg)>;
    /// QP contexts the NIC caches on chip (its QPC cache), if the provider knows it. The
    /// software model knows its configured size ([`crate::sim::QpcCacheConfig::entries`]);
    /// rdma-core does not report it, so hardware returns `None` (the default) and a user
    /// takes the figure from a configuration parameter instead.
    fn qpc_cache_entries(&self) -> Option<u32> {
        None
    }
}

/// QP creation attributes.
pub struct QpInit<'a> {
    /// Transport.
    pub qp_type: QpType,
    /// Completions of send WQEs.
    pub send_cq: &'a Cq,
    /// Completions of receives.
    pub recv_cq: &'a Cq,
    /// Shared receive queue, if any (then the QP has no RQ).
    pub srq: Option<&'a Srq>,
    /// Sizes.
    pub caps: QpCaps,
}

/// A UD destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdDest {
    /// Destination QPN.
    pub qpn: u32,
    /// Destination Q_Key.
    pub qkey: u32,
    /// Destination LID (InfiniBand).
    pub lid: u16,
    /// Destination GID (RoCE; all zero on InfiniBand).
    pub gid: [u8; 16],
}

/// An open device context.
#[derive(Clone)]
pub struct Context {
    provider: Arc<dyn Provider>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("provider", &self.provider.name())
            .finish()
    }
}

impl Context {
    /// Wraps a provider.
    pub fn new(provider: Arc<dyn Provider>) -> Self {
        Context { provider }
    }

    /// The provider.
    pub fn provider(&self) -> &Arc<dyn Provider> {
        &self.provider
    }

    /// The port in use.
    pub fn port(&self) -> PortInfo {
        self.provider.port()
    }

    /// QP contexts this device's NIC caches (its QPC cache), if known: the software model's
    /// configured [`crate::sim::QpcCacheConfig::entries`]; `None` on hardware (rdma-core does
    /// not report it) and on a model without a QPC cache ([`crate::sim::SimConfig::qpc_cache`]
    /// `None`).
    pub fn qpc_cache_entries(&self) -> Option<u32> {
        self.provider.qpc_cache_entries()
    }

    /// Allocates a protection domain.
    ///
    /// # Errors
    /// The provider's error.
    pub fn alloc_pd(&self) -> Result<Pd> {
        Ok(Pd {
            handle: self.provider.alloc_pd()?,
        })
    }

    /// Registers the `len` bytes at `addr` with the device under `pd`, for the uses `access`
    /// allows (local writes by receives and READ responses; remote READ/WRITE/atomics by
    /// peers holding the rkey).
    ///
    /// # Safety
    /// The device accesses `addr..addr + len` with no borrow the compiler can see (the
    /// returned [`Mr`] borrows nothing):
    /// - while a WQE naming the returned lkey is in flight, the bytes it names must stay
    ///   mapped, and if the device writes them (receives, READ responses: `LOCAL_WRITE`),
    ///   nothing else may use them meanwhile;
    /// - with any `REMOTE_*` access, a peer holding the rkey may access the range at any
    ///   time, so all of it must stay mapped and reserved for this use until the `Mr` is
    ///   dropped.
    ///
    /// The post functions of the driver queues are safe and take keys as numbers (the device
    /// checks each key against its region's PD, bounds and access, PRM "Memory regions"), so
    /// the first point binds every WQE naming the lkey: hand the lkey only to code that posts
    /// within these rules.
    ///
    /// Owning the memory and the `Mr` in one struct, with the `Mr` dropped first, satisfies
    /// both.
    ///
    /// # Errors
    /// The provider's error (e.g. a zero length).
    pub unsafe fn reg_mr(&self, pd: &Pd, addr: *mut u8, len: usize, access: Access) -> Result<Mr> {
        // SAFETY: our caller's contract, which is the provider's; the handle lives in the
        // returned `Mr`.
        let (handle, lkey, rkey) = unsafe { self.provider.reg_mr(&pd.handle, addr, len, access)? };
        Ok(Mr {
            _handle: handle,
            addr: addr as u64,
            len,
            lkey,
            rkey,
            access,
        })
    }

    /// Creates a completion queue with at least `cqe` entries.
    ///
    /// # Errors
    /// The provider's error.
    pub fn create_cq(&self, cqe: u32) -> Result<Cq> {
        let (handle, mem) = self.provider.create_cq(cqe)?;
        Ok(Cq {
            cq: CompletionQueue::new(mem),
            _handle: handle,
        })
    }

    /// Creates a shared receive queue.
    ///
    /// # Errors
    /// The provider's error.
    pub fn create_srq(&self, pd: &Pd, max_wr: u32, max_sge: u32) -> Result<Srq> {
        let (handle, mem) = self.provider.create_srq(&pd.handle, max_wr, max_sge)?;
        Ok(Srq {
            srq: SharedRecvQueue::new(mem),
            _handle: handle,
        })
    }

    /// Creates a QP (in RESET; see [`Qp::connect_rc`] / [`Qp::activate_ud`]).
    ///
    /// # Errors
    /// The provider's error.
    pub fn create_qp(&self, pd: &Pd, init: &QpInit<'_>) -> Result<Qp> {
        let (handle, qpn, sq, rq) = self.provider.create_qp(&pd.handle, init)?;
        Ok(Qp {
            sq: SendQueue::new(sq, qpn),
            rq: rq.map(RecvQueue::new),
            qpn,
            qp_type: init.qp_type,
            provider: self.provider.clone(),
            handle,
        })
    }

    /// Builds the address vector for UD sends to `dest`.
    ///
    /// # Errors
    /// The provider's error.
    pub fn create_ah(&self, pd: &Pd, dest: &UdDest) -> Result<Ah> {
        let (handle, av) = self.provider.create_ah(&pd.handle, dest)?;
        Ok(Ah {
            _handle: handle,
            av,
        })
    }
}

/// A protection domain.
pub struct Pd {
    handle: Handle,
}

/// A registered memory region.
pub struct Mr {
    _handle: Handle,
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub len: usize,
    /// Local key (for data segments).
    pub lkey: u32,
    /// Remote key (for peers' RDMA/atomics).
    pub rkey: u32,
    /// Access rights.
    pub access: Access,
}

/// A completion queue: the driver's poller plus the provider object.
pub struct Cq {
    /// The driver side (poll here). It keeps the CQ's memory alive itself ([`crate::queue`]),
    /// so it stays sound when moved out of this struct.
    pub cq: CompletionQueue,
    _handle: Handle,
}

impl Cq {
    /// CQ number.
    pub fn cqn(&self) -> u32 {
        self.cq.cqn()
    }
    /// The provider-side object (for providers creating QPs on this CQ).
    pub fn handle(&self) -> &Handle {
        &self._handle
    }
}

/// A shared receive queue.
pub struct Srq {
    /// The driver side (post receive WQEs here); keeps its memory alive, as [`Cq::cq`].
    pub srq: SharedRecvQueue,
    _handle: Handle,
}

impl Srq {
    /// SRQ number.
    pub fn srqn(&self) -> u32 {
        self.srq.srqn()
    }
    /// The provider-side object.
    pub fn handle(&self) -> &Handle {
        &self._handle
    }
}

/// A queue pair.
pub struct Qp {
    /// Send queue driver; keeps its memory alive, as [`Cq::cq`] (and so does
    /// [`Qp::rq`]).
    pub sq: SendQueue,
    /// Receive queue driver (`None` when the QP uses an SRQ).
    pub rq: Option<RecvQueue>,
    qpn: u32,
    qp_type: QpType,
    provider: Arc<dyn Provider>,
    handle: Handle,
}

impl Qp {
    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// Transport.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// RC: connects to `remote` (RESET→INIT→RTR→RTS).
    ///
    /// # Errors
    /// The provider's error (wrong QP type, bad state, unknown remote).
    pub fn connect_rc(&mut self, remote: &RcRemote, params: &RcParams) -> Result<()> {
        self.provider.connect_rc(&self.handle, remote, params)
    }

    /// UD: activates the QP with `qkey` (RESET→INIT→RTR→RTS).
    ///
    /// # Errors
    /// The provider's error.
    pub fn activate_ud(&mut self, qkey: u32) -> Result<()> {
        self.provider.activate_ud(&self.handle, qkey)
    }

    /// The provider-side object.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }
}

/// An address handle: the prepared UD address vector.
pub struct Ah {
    _handle: Handle,
    /// Address vector to put in UD WQEs ([`crate::wqe::WqeDesc::ud`]).
    pub av: DgramSeg,
}
