//! A simulated device: the [`Provider`] that creates objects in the model and hands their
//! memory to the driver, and the provider handles that destroy them.
//!
//! Sizes follow rdma-core's mlx5 provider where it matters to a driver: queue sizes are powers
//! of two, an SQ holds `max_send_wr` WQEs of the largest size the caps allow, an SRQ has one
//! WQE more than requested (the free list keeps one sentinel) and its free list is initialised
//! `i → i+1`, every CQE's `op_own` starts as 0xF0.

use std::any::Any;
use std::sync::Arc;

use crate::cqe::{CQE_BYTES, OP_OWN_INVALID, off};
use crate::error::{Error, Result};
use crate::queue::{CqMem, Doorbell, MemOwner, RqMem, SimDoorbell, SqMem, SrqMem};
use crate::sim::alloc::ModelMem;
use crate::sim::cq::CqState;
use crate::sim::memory::MrEntry;
use crate::sim::model::{QpState, SqState};
use crate::sim::recv::{RqState, SrqState};
use crate::sim::{QpcStats, Shared, SimQpState};
use crate::verbs::{
    Access, Handle, PortInfo, Provider, QpInit, QpType, RcParams, RcRemote, UdDest,
};
use crate::wqe::{
    ATOMIC_BYTES, CTRL_BYTES, DATA_BYTES, DGRAM_BYTES, DS_BYTES, DgramSeg, MAX_DS, RADDR_BYTES,
    WQEBB, inline_seg_bytes,
};

/// Largest SQ/RQ/SRQ in WQEs (16-bit indices and counters must stay unambiguous).
const MAX_WQES: u32 = 1 << 15;
/// Largest CQ in entries.
const MAX_CQES: u32 = 1 << 22;
/// Largest scatter/gather list.
const MAX_SGE: u32 = 32;

/// A simulated ConnectX device with one port, on a [`crate::sim::Fabric`].
pub struct SimDevice {
    shared: Arc<Shared>,
    id: u32,
    port: PortInfo,
}

impl std::fmt::Debug for SimDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimDevice")
            .field("id", &self.id)
            .field("port", &self.port)
            .finish()
    }
}

struct PdHandle {
    shared: Arc<Shared>,
    device: u32,
    pd: u32,
}

struct MrHandle {
    shared: Arc<Shared>,
    idx: u32,
}

impl Drop for MrHandle {
    fn drop(&mut self) {
        self.shared.lock_for_teardown().deregister_mr(self.idx);
    }
}

struct CqHandle {
    shared: Arc<Shared>,
    device: u32,
    cqn: u32,
    /// The ring and doorbell record, shared with the [`CqMem`] (and then the driver queue),
    /// which keeps them alive after this handle removed the CQ from the model.
    _mem: MemOwner,
}

impl Drop for CqHandle {
    fn drop(&mut self) {
        // Removed under the lock before the memory (the fields) is freed.
        self.shared.lock_for_teardown().remove_cq(self.cqn);
    }
}

struct SrqHandle {
    shared: Arc<Shared>,
    device: u32,
    srqn: u32,
    /// The WQE array and doorbell record, shared with the [`SrqMem`] (see [`CqHandle`]).
    _mem: MemOwner,
}

impl Drop for SrqHandle {
    fn drop(&mut self) {
        self.shared.lock_for_teardown().remove_srq(self.srqn);
    }
}

struct QpHandle {
    shared: Arc<Shared>,
    qpn: u32,
    /// The send and receive rings and the doorbell record, shared with the [`SqMem`] and
    /// [`RqMem`] (see [`CqHandle`]).
    _mem: MemOwner,
}

impl Drop for QpHandle {
    fn drop(&mut self) {
        self.shared.lock_for_teardown().remove_qp(self.qpn);
    }
}

struct AhHandle;

impl SimDevice {
    pub(crate) fn new(shared: Arc<Shared>, id: u32, port: PortInfo) -> Self {
        SimDevice { shared, id, port }
    }

    /// Device index on its fabric.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// This device's QPC cache counters (same as [`crate::sim::Fabric::qpc_stats`] with its
    /// LID).
    pub fn qpc_stats(&self) -> QpcStats {
        self.shared.lock_local().qpc_stats(self.id)
    }

    /// `h` as a `T` of this device.
    fn mine<'a, T: Any + HasOwner>(&self, h: &'a Handle, what: &str) -> Result<&'a T> {
        let t = h
            .downcast_ref::<T>()
            .ok_or_else(|| Error::InvalidArgument(format!("{what}: not a sim object")))?;
        if !Arc::ptr_eq(t.shared(), &self.shared) || t.device() != self.id {
            return Err(Error::InvalidArgument(format!(
                "{what}: belongs to another device or fabric"
            )));
        }
        Ok(t)
    }
}

trait HasOwner {
    fn shared(&self) -> &Arc<Shared>;
    fn device(&self) -> u32;
}

macro_rules! owner {
    ($t:ty) => {
        impl HasOwner for $t {
            fn shared(&self) -> &Arc<Shared> {
                &self.shared
            }
            fn device(&self) -> u32 {
                self.device
            }
        }
    };
}
owner!(PdHandle);
owner!(CqHandle);
owner!(SrqHandle);

fn pow2(n: u32, min: u32, max: u32, what: &str) -> Result<u32> {
    let v = n.max(min).checked_next_power_of_two().unwrap_or(u32::MAX);
    if v > max {
        return Err(Error::InvalidArgument(format!(
            "{what} {n} exceeds the model's limit {max}"
        )));
    }
    Ok(v)
}

fn mem_ptr<T>(m: &ModelMem) -> std::ptr::NonNull<T> {
    m.ptr().cast()
}

impl Provider for SimDevice {
    fn name(&self) -> String {
        format!("sim{}", self.id)
    }

    fn port(&self) -> PortInfo {
        self.port
    }

    fn qpc_cache_entries(&self) -> Option<u32> {
        self.shared
            .lock_local()
            .cfg
            .qpc_cache
            .map(|c| u32::try_from(c.entries).unwrap_or(u32::MAX))
    }

    fn alloc_pd(&self) -> Result<Handle> {
        let pd = self.shared.lock()?.alloc_pd();
        Ok(Box::new(PdHandle {
            shared: self.shared.clone(),
            device: self.id,
            pd,
        }))
    }

    unsafe fn reg_mr(
        &self,
        pd: &Handle,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<(Handle, u32, u32)> {
        let pd = self.mine::<PdHandle>(pd, "reg_mr pd")?.pd;
        if addr.is_null() || len == 0 {
            return Err(Error::InvalidArgument(
                "reg_mr: null address or zero length".into(),
            ));
        }
        if (addr as u64).checked_add(len as u64).is_none() {
            return Err(Error::InvalidArgument("reg_mr: range wraps".into()));
        }
        // IB: remote write or atomic access requires local write (ibv_reg_mr fails with EINVAL).
        if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
            && !access.contains(Access::LOCAL_WRITE)
        {
            return Err(Error::InvalidArgument(
                "reg_mr: REMOTE_WRITE/REMOTE_ATOMIC require LOCAL_WRITE".into(),
            ));
        }
        let (idx, lkey, rkey) = self.shared.lock()?.register_mr(MrEntry {
            addr: addr as u64,
            len: len as u64,
            access,
            pd,
        })?;
        Ok((
            Box::new(MrHandle {
                shared: self.shared.clone(),
                idx,
            }),
            lkey,
            rkey,
        ))
    }

    fn create_cq(&self, cqe: u32) -> Result<(Handle, CqMem)> {
        let cnt = pow2(cqe, 2, MAX_CQES, "CQ size")?;
        let ring = ModelMem::zeroed(cnt as usize * CQE_BYTES)?;
        let dbrec = ModelMem::zeroed(8)?;
        for i in 0..cnt as usize {
            // SAFETY: inside the ring just allocated.
            unsafe {
                ring.ptr()
                    .as_ptr()
                    .add(i * CQE_BYTES + off::OP_OWN)
                    .write(OP_OWN_INVALID)
            };
        }
        let state = CqState::new(ring.ptr().as_ptr(), cnt, dbrec.ptr().as_ptr().cast());
        let cqn = self.shared.lock()?.add_cq(
            state,
            cnt,
            ring.ptr().as_ptr(),
            dbrec.ptr().as_ptr().cast(),
        )?;
        let (buf, db) = (ring.ptr(), mem_ptr(&dbrec));
        let owner: MemOwner = Arc::new((ring, dbrec));
        // SAFETY: `buf` is the ring of `cnt` CQEs just allocated (page aligned, every
        // `op_own` initialised to INVALID), `db` an 8-byte record; both are owned by `owner`,
        // which the description keeps alive; only the model (under its lock, until the handle
        // removes the CQ) and the driver queue built on the description use them.
        let mem = unsafe { CqMem::new(buf, cnt, db, cqn) }.owned_by(owner.clone());
        Ok((
            Box::new(CqHandle {
                shared: self.shared.clone(),
                device: self.id,
                cqn,
                _mem: owner,
            }),
            mem,
        ))
    }

    fn create_srq(&self, pd: &Handle, max_wr: u32, max_sge: u32) -> Result<(Handle, SrqMem)> {
        let pd = self.mine::<PdHandle>(pd, "create_srq pd")?.pd;
        if max_wr == 0 || max_sge == 0 || max_sge > MAX_SGE {
            return Err(Error::InvalidArgument(format!(
                "create_srq: max_wr {max_wr} / max_sge {max_sge} out of range"
            )));
        }
        let cnt = pow2(max_wr.saturating_add(1), 2, MAX_WQES, "SRQ size")?;
        let stride = (16 + 16 * max_sge).max(32).next_power_of_two();
        let buf = ModelMem::zeroed(cnt as usize * stride as usize)?;
        let dbrec = ModelMem::zeroed(8)?;
        for i in 0..cnt {
            let next = ((i + 1) & (cnt - 1)) as u16;
            // SAFETY: bytes 2..4 of WQE i, inside the buffer just allocated.
            unsafe {
                let p = buf.ptr().as_ptr().add(i as usize * stride as usize + 2);
                std::ptr::copy_nonoverlapping(next.to_be_bytes().as_ptr(), p, 2);
            }
        }
        let real_sge = (stride - 16) / DATA_BYTES as u32;
        let state = SrqState {
            buf: buf.ptr().as_ptr(),
            wqe_cnt: cnt,
            stride,
            max_sge: real_sge,
            dbrec: dbrec.ptr().as_ptr().cast(),
            pd,
        };
        let srqn = self.shared.lock()?.add_srq(state)?;
        let (b, db) = (buf.ptr(), mem_ptr(&dbrec));
        let owner: MemOwner = Arc::new((buf, dbrec));
        // SAFETY: `b` is the array of `cnt` WQEs of `stride` bytes just allocated (with room
        // for `real_sge` data segments after the next segment), `db` an 8-byte record; both
        // are owned by `owner`, which the description keeps alive; only the model and the
        // driver queue built on the description use them.
        let mem =
            unsafe { SrqMem::new(b, cnt, stride, real_sge, db, srqn) }.owned_by(owner.clone());
        Ok((
            Box::new(SrqHandle {
                shared: self.shared.clone(),
                device: self.id,
                srqn,
                _mem: owner,
            }),
            mem,
        ))
    }

    fn create_qp(
        &self,
        pd: &Handle,
        init: &QpInit<'_>,
    ) -> Result<(Handle, u32, SqMem, Option<RqMem>)> {
        let pd = self.mine::<PdHandle>(pd, "create_qp pd")?.pd;
        let send_cq = self
            .mine::<CqHandle>(init.send_cq.handle(), "create_qp send_cq")?
            .cqn;
        let recv_cq = self
            .mine::<CqHandle>(init.recv_cq.handle(), "create_qp recv_cq")?
            .cqn;
        let srq = match init.srq {
            Some(s) => Some(self.mine::<SrqHandle>(s.handle(), "create_qp srq")?.srqn),
            None => None,
        };
        let caps = init.caps;
        if caps.max_send_wr == 0 || caps.max_send_sge > MAX_SGE || caps.max_recv_sge > MAX_SGE {
            return Err(Error::InvalidArgument(format!(
                "create_qp: caps out of range: {caps:?}"
            )));
        }
        // Largest WQE the caps allow: ctrl, address vector (UD) or raddr + atomic (RC), one
        // inline segment, the gather list.
        let fixed = CTRL_BYTES
            + match init.qp_type {
                QpType::Ud => DGRAM_BYTES,
                QpType::Rc => RADDR_BYTES + ATOMIC_BYTES,
            };
        let inline = if caps.max_inline_data > 0 {
            inline_seg_bytes(caps.max_inline_data as usize)
        } else {
            0
        };
        let wqe_bytes = fixed + inline + DATA_BYTES * caps.max_send_sge as usize;
        if wqe_bytes > MAX_DS as usize * DS_BYTES {
            return Err(Error::InvalidArgument(format!(
                "create_qp: a WQE with {} inline bytes and {} SGEs exceeds {MAX_DS} ds",
                caps.max_inline_data, caps.max_send_sge
            )));
        }
        let bbs = wqe_bytes.div_ceil(WQEBB) as u32;
        let sq_cnt = pow2(caps.max_send_wr.saturating_mul(bbs), 1, MAX_WQES, "SQ size")?;
        let sq_buf = ModelMem::zeroed(sq_cnt as usize * WQEBB)?;
        let dbrec = ModelMem::zeroed(8)?;
        let dbrec_ptr: *mut u32 = dbrec.ptr().as_ptr().cast();
        let (rq_buf, rq_state) = if srq.is_none() {
            let cnt = pow2(caps.max_recv_wr, 1, MAX_WQES, "RQ size")?;
            let stride = pow2(
                DATA_BYTES as u32 * caps.max_recv_sge,
                DATA_BYTES as u32,
                1 << 12,
                "RQ stride",
            )?;
            let buf = ModelMem::zeroed(cnt as usize * stride as usize)?;
            let st = RqState {
                buf: buf.ptr().as_ptr(),
                wqe_cnt: cnt,
                stride,
                max_sge: stride / DATA_BYTES as u32,
                dbrec: dbrec_ptr,
            };
            (Some(buf), Some(st))
        } else {
            (None, None)
        };
        let state = QpState {
            device: self.id,
            pd,
            kind: init.qp_type,
            state: SimQpState::Reset,
            send_cq,
            recv_cq,
            srq,
            sq: SqState {
                buf: sq_buf.ptr().as_ptr(),
                wqe_cnt: sq_cnt,
                dbrec: dbrec_ptr,
                ci: 0,
                rung: 0,
            },
            rq: rq_state,
            rc: None,
            qkey: 0,
            wait: None,
        };
        let qpn = self.shared.lock()?.add_qp(state)?;
        let doorbell: Arc<dyn SimDoorbell> = self.shared.clone();
        let (sq_ptr, rq_ptr, db) = (
            sq_buf.ptr(),
            rq_buf.as_ref().map(ModelMem::ptr),
            mem_ptr(&dbrec),
        );
        let owner: MemOwner = Arc::new((sq_buf, rq_buf, dbrec));
        // SAFETY: `sq_ptr` is the ring of `sq_cnt` WQEBBs just allocated (page aligned), `db`
        // the QP's 8-byte doorbell record; both are owned by `owner`, which the description
        // keeps alive; only the model (which executes at most the caps' gather entries and
        // inline bytes, checked above) and the driver queue built on the description use them.
        let sq = unsafe {
            SqMem::new(
                sq_ptr,
                sq_cnt,
                db,
                caps.max_inline_data,
                caps.max_send_sge,
                Doorbell::Sim {
                    device: doorbell,
                    qpn,
                },
            )
        }
        .owned_by(owner.clone());
        let rq = match (rq_ptr, rq_state) {
            // SAFETY: `b` is the ring of `st.wqe_cnt` WQEs of `st.stride` bytes just allocated
            // and owned by `owner`, as is the doorbell record (word 0 is the RQ's, word 1 the
            // SQ's); only the model and the driver queue built on the description use them.
            (Some(b), Some(st)) => Some(
                unsafe { RqMem::new(b, st.wqe_cnt, st.stride, st.max_sge, db) }
                    .owned_by(owner.clone()),
            ),
            _ => None,
        };
        Ok((
            Box::new(QpHandle {
                shared: self.shared.clone(),
                qpn,
                _mem: owner,
            }),
            qpn,
            sq,
            rq,
        ))
    }

    fn connect_rc(&self, qp: &Handle, remote: &RcRemote, params: &RcParams) -> Result<()> {
        let qpn = self.qp(qp)?;
        self.shared.lock()?.connect_rc(qpn, remote, params)
    }

    fn activate_ud(&self, qp: &Handle, qkey: u32) -> Result<()> {
        let qpn = self.qp(qp)?;
        self.shared.lock()?.activate_ud(qpn, qkey)
    }

    fn create_ah(&self, pd: &Handle, dest: &UdDest) -> Result<(Handle, DgramSeg)> {
        self.mine::<PdHandle>(pd, "create_ah pd")?;
        let grh = dest.gid != [0; 16];
        Ok((
            Box::new(AhHandle),
            DgramSeg {
                qkey: dest.qkey,
                dqpn: dest.qpn & 0x00ff_ffff,
                rlid: dest.lid,
                stat_rate_sl: 0,
                grh,
                rgid: dest.gid,
            },
        ))
    }
}

impl SimDevice {
    fn qp(&self, h: &Handle) -> Result<u32> {
        let q = h
            .downcast_ref::<QpHandle>()
            .ok_or_else(|| Error::InvalidArgument("not a sim QP".into()))?;
        if !Arc::ptr_eq(&q.shared, &self.shared) {
            return Err(Error::InvalidArgument(
                "QP belongs to another fabric".into(),
            ));
        }
        Ok(q.qpn)
    }
}
