//! The model's object tables and its progress engine (doorbells, steps, retries, flushes,
//! CQE posting). WQE execution is in `exec.rs`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::cqe::{Cqe, CqeOpcode, Syndrome};
use crate::error::{Error, Result};
use crate::sim::cq::{CqState, Push};
use crate::sim::faults::{Faults, Packet};
use crate::sim::memory::MrTable;
use crate::sim::node::{self, NodeLink};
use crate::sim::qpc::{self, QpcCache};
use crate::sim::recv::{RecvWqe, RqState, SrqState};
use crate::sim::table::NumTable;
use crate::sim::{QpcStats, SimConfig, SimQpState, SimStats};
use crate::verbs::{LinkLayer, PortInfo, QpType, RcParams, RcRemote};
use crate::wqe::{self, CTRL_BYTES, WQEBB};

/// The device side of a send queue.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SqState {
    pub(crate) buf: *mut u8,
    pub(crate) wqe_cnt: u32,
    pub(crate) dbrec: *mut u32,
    /// WQEBBs consumed (executed or flushed).
    pub(crate) ci: u32,
    /// Producer index recorded at the last doorbell (WQEBBs); WQEs below it may be read.
    pub(crate) rung: u32,
}

/// Why a raw WQE could not be taken from the ring.
pub(crate) struct BadWqe {
    /// WQEBBs to skip.
    pub(crate) skip: u32,
    /// The control segment's opcode byte.
    pub(crate) opcode: u8,
}

impl SqState {
    /// Copies the WQE at `ci` out of the ring (modulo the ring: it may wrap past the end) into
    /// the front of `out`. Returns its WQEBB count and byte length, or what to skip if its `ds`
    /// is invalid or it extends past the rung producer index.
    pub(crate) fn read_wqe(&self, out: &mut [u8; MAX_WQE_BYTES]) -> Result<(u32, usize), BadWqe> {
        let ring = self.wqe_cnt as usize * WQEBB;
        let start = (self.ci & (self.wqe_cnt - 1)) as usize * WQEBB;
        let mut ctrl = [0u8; CTRL_BYTES];
        // SAFETY: `start` is a WQEBB boundary inside the ring; the WQEs below `rung` were
        // published before the doorbell ("Memory ordering", edge 1).
        unsafe {
            std::ptr::copy_nonoverlapping(self.buf.add(start), ctrl.as_mut_ptr(), CTRL_BYTES)
        };
        let ds = u32::from(ctrl[7]);
        let pending = self.rung.wrapping_sub(self.ci);
        if ds == 0 || ds > wqe::MAX_DS {
            return Err(BadWqe {
                skip: 1,
                opcode: ctrl[3],
            });
        }
        let bbs = wqe::wqebbs(ds);
        if bbs > pending {
            return Err(BadWqe {
                skip: pending,
                opcode: ctrl[3],
            });
        }
        let len = ds as usize * wqe::DS_BYTES;
        let first = len.min(ring - start);
        // SAFETY: both pieces lie inside the ring ([start, start+first) and [0, len-first));
        // `len <= MAX_WQE_BYTES` (`ds <= MAX_DS`, checked above), so both fit in `out`.
        unsafe {
            std::ptr::copy_nonoverlapping(self.buf.add(start), out.as_mut_ptr(), first);
            if first < len {
                std::ptr::copy_nonoverlapping(self.buf, out.as_mut_ptr().add(first), len - first);
            }
        }
        Ok((bbs, len))
    }
}

/// Bytes of the largest WQE ([`wqe::MAX_DS`] segments of [`wqe::DS_BYTES`]).
pub(crate) const MAX_WQE_BYTES: usize = wqe::MAX_DS as usize * wqe::DS_BYTES;

/// Buffers the model reuses from WQE to WQE, so that executing a WQE allocates nothing once
/// they have grown to the largest WQE and payload seen.
#[derive(Debug)]
pub(crate) struct Scratch {
    /// The raw bytes of the WQE being executed (its first `len` bytes, per `read_wqe`).
    pub(crate) bytes: [u8; MAX_WQE_BYTES],
    /// The WQE being executed, parsed.
    pub(crate) wqe: wqe::ParsedWqe,
    /// A gathered payload (SEND, WRITE with data segments; READ data).
    pub(crate) payload: Vec<u8>,
}

impl Scratch {
    /// Payload capacity kept between WQEs; a larger buffer is freed after its WQE.
    pub(crate) const KEEP: usize = 1 << 20;

    pub(crate) fn new() -> Box<Scratch> {
        Box::new(Scratch {
            bytes: [0; MAX_WQE_BYTES],
            wqe: wqe::ParsedWqe::empty(),
            payload: Vec::new(),
        })
    }
}

/// An RC connection.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RcConn {
    pub(crate) peer: u32,
    /// Peer LID (InfiniBand addressing); 0: addressed by `gid` (RoCE style).
    pub(crate) lid: u16,
    pub(crate) gid: [u8; 16],
    pub(crate) params: RcParams,
}

/// Why a QP's send queue is stalled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitKind {
    /// No receive WQE at the responder.
    Rnr,
    /// The responder is unreachable.
    Transport,
}

/// A stalled head WQE.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Wait {
    pub(crate) kind: WaitKind,
    /// Failed retries so far.
    pub(crate) retries: u32,
    /// First progress step at which the next retry may happen.
    pub(crate) next_try: u64,
}

/// One QP.
#[derive(Clone, Debug)]
pub(crate) struct QpState {
    pub(crate) device: u32,
    pub(crate) pd: u32,
    pub(crate) kind: QpType,
    pub(crate) state: SimQpState,
    pub(crate) send_cq: u32,
    pub(crate) recv_cq: u32,
    pub(crate) srq: Option<u32>,
    pub(crate) sq: SqState,
    pub(crate) rq: Option<RqState>,
    pub(crate) rc: Option<RcConn>,
    pub(crate) qkey: u32,
    pub(crate) wait: Option<Wait>,
}

/// Everything behind a fabric's lock.
pub(crate) struct Model {
    pub(crate) cfg: SimConfig,
    pub(crate) stats: SimStats,
    /// Progress steps so far.
    pub(crate) step: u64,
    pub(crate) devices: Vec<PortInfo>,
    /// Each device's QPC cache (indexed like `devices`).
    qpc: Vec<QpcCache>,
    /// [`crate::sim::QpcCacheConfig::miss_penalty`] (`None`: the cache is disabled).
    qpc_penalty: Option<Duration>,
    next_pd: u32,
    pub(crate) mrs: MrTable,
    /// CQs by CQN (direct table, `sim/table.rs`).
    pub(crate) cqs: NumTable<CqState>,
    /// SRQs by SRQN.
    pub(crate) srqs: NumTable<SrqState>,
    /// QPs by QPN.
    pub(crate) qps: NumTable<QpState>,
    next_qpn: u32,
    next_cqn: u32,
    next_srqn: u32,
    /// QPs that need attention on every step (stalled, or in the error state), in QPN order
    /// (deterministic).
    pub(crate) active: ActiveSet,
    /// The QPNs a step visits (a copy of `active`), reused from step to step so that a step
    /// with stalled QPs allocates nothing.
    step_list: Vec<u32>,
    pub(crate) faults: Faults,
    /// The node directory, when the fabric spans processes (`sim/node.rs`).
    pub(crate) node: Option<NodeLink>,
    /// WQE buffers, taken by `run_sq` while it executes (`None` meanwhile).
    pub(crate) scratch: Option<Box<Scratch>>,
    /// A UD receive's bytes (GRH area and payload), reused from packet to packet.
    pub(crate) ud_buf: Vec<u8>,
    /// A UD send's payload buffer, reused from packet to packet (see `exec_ud`).
    pub(crate) ud_tx: Vec<u8>,
    /// Payload buffers of packets that fault injection held back or delayed, returned once
    /// the packet is delivered and taken again by later sends (at most [`Model::SPARE_MAX`]).
    pub(crate) ud_spare: Vec<Vec<u8>>,
    /// Held back or delayed packets being delivered, reused from step to step.
    pub(crate) fault_out: Vec<Packet>,
}

// SAFETY: the raw pointers in the tables refer to model-allocated queue memory (freed only
// after the object is removed under the lock) and to registered memory (kept alive by the
// registrant until deregistration under the lock).
unsafe impl Send for Model {}

/// A set of QPNs kept sorted in a `Vec`: iterated in QPN order (deterministic), and, unlike a
/// `BTreeSet`, it keeps its allocation when it becomes empty, so a QP that stalls and resumes
/// again and again (RNR) allocates nothing once warm. Sets are small (the QPs stalled or in
/// the error state at one time).
#[derive(Debug, Default)]
pub(crate) struct ActiveSet(Vec<u32>);

impl ActiveSet {
    /// Adds `qpn` (no effect if present).
    pub(crate) fn insert(&mut self, qpn: u32) {
        if let Err(i) = self.0.binary_search(&qpn) {
            self.0.insert(i, qpn);
        }
    }

    /// Removes `qpn` (no effect if absent).
    pub(crate) fn remove(&mut self, qpn: u32) {
        if let Ok(i) = self.0.binary_search(&qpn) {
            self.0.remove(i);
        }
    }

    /// Whether the set is empty.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The QPNs, ascending.
    pub(crate) fn as_slice(&self) -> &[u32] {
        &self.0
    }
}

/// A zeroed CQE for `qpn`.
pub(crate) fn blank_cqe(qpn: u32) -> Cqe {
    Cqe {
        opcode: 0,
        qpn,
        wqe_opcode: 0,
        wqe_counter: 0,
        byte_cnt: 0,
        imm: 0,
        src_qpn: 0,
        grh: 0,
        srqn: 0,
        syndrome: 0,
        vendor_syndrome: 0,
    }
}

impl Model {
    /// Spare UD payload buffers kept at most (more packets than this held back or delayed at
    /// once is rare; their buffers are then freed).
    pub(crate) const SPARE_MAX: usize = 64;

    pub(crate) fn new(cfg: SimConfig) -> Self {
        Model {
            faults: Faults::new(cfg.ud_faults),
            qpc_penalty: cfg.qpc_cache.map(|c| c.miss_penalty),
            qpc: Vec::new(),
            cfg,
            stats: SimStats::default(),
            step: 0,
            devices: Vec::new(),
            next_pd: 0,
            mrs: MrTable::default(),
            cqs: NumTable::default(),
            srqs: NumTable::default(),
            qps: NumTable::default(),
            next_qpn: 0xff,
            next_cqn: 0,
            next_srqn: 0,
            active: ActiveSet::default(),
            step_list: Vec::new(),
            node: None,
            scratch: Some(Scratch::new()),
            ud_buf: Vec::new(),
            ud_tx: Vec::new(),
            ud_spare: Vec::new(),
            fault_out: Vec::new(),
        }
    }

    /// This process's node slot, when joined.
    fn slot(&self) -> Option<u32> {
        self.node.as_ref().map(|l| l.dir.slot)
    }

    // ---- objects -------------------------------------------------------------------------

    /// A new device: its id and port (LID = id + 1; GID fe80::<id>).
    pub(crate) fn add_device(&mut self) -> (u32, PortInfo) {
        let id = self.devices.len() as u32;
        let lid = match &self.node {
            Some(l) => l.dir.alloc_lid(),
            None => u16::try_from(id + 1).unwrap_or(0xbfff),
        };
        let gid = crate::sim::target::gid_of_lid(lid);
        let port = PortInfo {
            port: 1,
            lid,
            link_layer: LinkLayer::InfiniBand,
            active_mtu: self.cfg.mtu,
            gid,
        };
        self.devices.push(port);
        self.qpc.push(QpcCache::new(self.cfg.qpc_cache));
        (id, port)
    }

    /// Device `device` looks up the context of its QP `qpn` (a WQE being executed): counts a
    /// hit or a miss, and on a miss stalls for the miss penalty, holding the fabric lock.
    #[inline(always)]
    pub(crate) fn qpc_touch(&mut self, device: u32, qpn: u32) {
        if self.qpc_penalty.is_none() {
            return;
        }
        if let Some(cache) = self.qpc.get_mut(device as usize)
            && cache.touch_mru(qpn)
        {
            self.stats.qpc_hits += 1;
            return;
        }
        self.qpc_lookup(device, qpn);
    }

    /// [`Model::qpc_touch`] past the most-recently-used fast path.
    #[inline(never)]
    fn qpc_lookup(&mut self, device: u32, qpn: u32) {
        let Some(cache) = self.qpc.get_mut(device as usize) else {
            return;
        };
        match cache.touch(qpn) {
            None => {}
            Some(true) => self.stats.qpc_hits += 1,
            Some(false) => {
                self.stats.qpc_misses += 1;
                qpc::spin_for(self.qpc_penalty.unwrap_or_default());
            }
        }
    }

    /// QPC cache counters of the device whose port has LID `lid`.
    pub(crate) fn qpc_stats_by_lid(&self, lid: u16) -> Option<QpcStats> {
        let id = self.devices.iter().position(|p| p.lid == lid)?;
        Some(self.qpc[id].snapshot())
    }

    /// QPC cache counters of device `device`.
    pub(crate) fn qpc_stats(&self, device: u32) -> QpcStats {
        self.qpc
            .get(device as usize)
            .map(QpcCache::snapshot)
            .unwrap_or_default()
    }

    /// A new protection domain number.
    pub(crate) fn alloc_pd(&mut self) -> u32 {
        self.next_pd += 1;
        match self.slot() {
            Some(s) => ((s + 1) << node::PD_BITS) | (self.next_pd & ((1 << node::PD_BITS) - 1)),
            None => self.next_pd,
        }
    }

    /// Adds a CQ over `cqe_cnt` entries at `ring` with doorbell block `dbrec`.
    pub(crate) fn add_cq(
        &mut self,
        cq: CqState,
        cqe_cnt: u32,
        ring: *mut u8,
        dbrec: *mut u32,
    ) -> Result<u32> {
        let slot = self.slot();
        let cqn = self
            .cqs
            .alloc(&mut self.next_cqn, slot, node::CQ_BITS, 2, cq)?;
        self.export_cq(cqn, Some((cqe_cnt, ring, dbrec)));
        Ok(cqn)
    }

    /// Removes a CQ (its memory may be freed afterwards).
    pub(crate) fn remove_cq(&mut self, cqn: u32) {
        self.export_cq(cqn, None);
        self.cqs.remove(cqn);
    }

    pub(crate) fn add_srq(&mut self, srq: SrqState) -> Result<u32> {
        let slot = self.slot();
        let srqn = self
            .srqs
            .alloc(&mut self.next_srqn, slot, node::SRQ_BITS, 2, srq)?;
        self.export_srq(srqn, Some(&srq));
        Ok(srqn)
    }

    /// Removes an SRQ (its memory may be freed afterwards).
    pub(crate) fn remove_srq(&mut self, srqn: u32) {
        self.export_srq(srqn, None);
        self.srqs.remove(srqn);
    }

    /// Registers a memory region: `(index, lkey, rkey)`.
    pub(crate) fn register_mr(
        &mut self,
        e: crate::sim::memory::MrEntry,
    ) -> Result<(u32, u32, u32)> {
        let r = self
            .mrs
            .register(e)
            .ok_or_else(|| Error::InvalidArgument("no free memory region index".into()))?;
        self.export_mr(r.0, Some((e.addr, e.len, e.access, e.pd)));
        Ok(r)
    }

    /// Deregisters memory region `idx` (its memory may be freed afterwards).
    pub(crate) fn deregister_mr(&mut self, idx: u32) {
        self.export_mr(idx, None);
        self.mrs.deregister(idx);
    }

    pub(crate) fn add_qp(&mut self, qp: QpState) -> Result<u32> {
        let slot = self.slot();
        let qpn = self
            .qps
            .alloc(&mut self.next_qpn, slot, node::QP_BITS, 2, qp)?;
        self.export_qp(qpn);
        Ok(qpn)
    }

    pub(crate) fn remove_qp(&mut self, qpn: u32) {
        self.unexport_qp(qpn);
        if let Some(qp) = self.qps.remove(qpn)
            && let Some(cache) = self.qpc.get_mut(qp.device as usize)
        {
            cache.remove(qpn);
        }
        self.active.remove(qpn);
    }

    /// RC: RESET → RTS towards `remote`.
    pub(crate) fn connect_rc(
        &mut self,
        qpn: u32,
        remote: &RcRemote,
        params: &RcParams,
    ) -> Result<()> {
        let qp = self
            .qps
            .get_mut(qpn)
            .ok_or_else(|| Error::InvalidArgument(format!("no QP {qpn:#x}")))?;
        if qp.kind != QpType::Rc {
            return Err(Error::InvalidArgument(format!("QP {qpn:#x} is not RC")));
        }
        if qp.state != SimQpState::Reset {
            return Err(Error::InvalidArgument(format!(
                "QP {qpn:#x} is in {:?}, not RESET",
                qp.state
            )));
        }
        if params.rnr_retry > 7 || params.retry_cnt > 7 {
            return Err(Error::InvalidArgument(
                "rnr_retry and retry_cnt are 0..=7".into(),
            ));
        }
        qp.rc = Some(RcConn {
            peer: remote.qpn & 0x00ff_ffff,
            lid: remote.lid,
            gid: remote.gid,
            params: *params,
        });
        qp.state = SimQpState::Rts;
        self.export_qp(qpn);
        Ok(())
    }

    /// UD: RESET → RTS with `qkey`.
    pub(crate) fn activate_ud(&mut self, qpn: u32, qkey: u32) -> Result<()> {
        let qp = self
            .qps
            .get_mut(qpn)
            .ok_or_else(|| Error::InvalidArgument(format!("no QP {qpn:#x}")))?;
        if qp.kind != QpType::Ud {
            return Err(Error::InvalidArgument(format!("QP {qpn:#x} is not UD")));
        }
        if qp.state != SimQpState::Reset {
            return Err(Error::InvalidArgument(format!(
                "QP {qpn:#x} is in {:?}, not RESET",
                qp.state
            )));
        }
        qp.qkey = qkey;
        qp.state = SimQpState::Rts;
        self.export_qp(qpn);
        Ok(())
    }

    /// Whether `lid` (or, when `lid` is 0, `gid`) addresses device `device`'s port.
    pub(crate) fn addresses(&self, device: u32, lid: u16, gid: Option<&[u8; 16]>) -> bool {
        self.devices.get(device as usize).is_some_and(|p| {
            if lid != 0 {
                p.lid == lid
            } else {
                gid.is_some_and(|g| *g == p.gid)
            }
        })
    }

    pub(crate) fn cq_overrun(&self, cqn: u32) -> bool {
        self.cqs.get(cqn).is_some_and(|c| c.overrun())
    }

    pub(crate) fn qp_state(&self, qpn: u32) -> Option<SimQpState> {
        self.qps.get(qpn).map(|q| q.state)
    }

    // ---- progress ------------------------------------------------------------------------

    /// A doorbell on `qpn`'s send queue: record the producer index, make a progress step, then
    /// execute the new WQEs.
    pub(crate) fn ring(&mut self, qpn: u32) {
        self.stats.doorbells += 1;
        if let Some(qp) = self.qps.get_mut(qpn) {
            let sq = &mut qp.sq;
            // SAFETY: the QP's doorbell record (model memory, alive while the QP is in the
            // table). The ringing thread wrote it; Acquire is for form's sake.
            let raw = u32::from_be(
                unsafe { AtomicU32::from_ptr(sq.dbrec.add(1)) }.load(Ordering::Acquire),
            );
            // Extend the 16-bit producer against our own consumer counter.
            let pi = sq
                .ci
                .wrapping_add((raw & 0xffff).wrapping_sub(sq.ci) & 0xffff);
            let ahead = pi.wrapping_sub(sq.ci);
            if ahead <= sq.wqe_cnt && ahead >= sq.rung.wrapping_sub(sq.ci) {
                sq.rung = pi;
            } else {
                tracing::warn!(
                    qpn,
                    pi,
                    ci = sq.ci,
                    "sim: doorbell with an impossible producer index ignored"
                );
            }
        }
        self.step();
        self.run_sq(qpn);
    }

    /// One progress step: due delayed UD packets, released reordered ones, one retry per
    /// stalled QP, flushes of QPs in error. Inline: with nothing to do (no node, no packet
    /// waiting, no QP stalled or in error: every doorbell of a healthy fabric) a step is two
    /// counter increments and three tests.
    #[inline]
    pub(crate) fn step(&mut self) {
        self.step += 1;
        self.stats.steps += 1;
        if self.node.is_some() || self.faults.pending() || !self.active.is_empty() {
            self.step_work();
        }
    }

    /// The work of [`Model::step`] past its counters.
    #[inline(never)]
    fn step_work(&mut self) {
        if self.node.is_some() {
            self.node_step();
        }
        if self.faults.pending() {
            let mut out = std::mem::take(&mut self.fault_out);
            self.faults.take_due(self.step, &mut out);
            self.deliver_all(&mut out);
            self.faults.take_stale_held(self.step, &mut out);
            self.deliver_all(&mut out);
            self.fault_out = out;
        }
        if self.active.is_empty() {
            return;
        }
        let mut list = std::mem::take(&mut self.step_list);
        list.clear();
        list.extend_from_slice(self.active.as_slice());
        for &qpn in &list {
            self.run_sq(qpn);
            self.flush_rq(qpn);
            let keep = self
                .qps
                .get(qpn)
                .is_some_and(|q| q.wait.is_some() || q.state == SimQpState::Error);
            if !keep {
                self.active.remove(qpn);
            }
        }
        self.step_list = list;
    }

    /// Records a stall of `qpn`'s head WQE; `false` when the retry budget is exhausted.
    pub(crate) fn stall(&mut self, qpn: u32, kind: WaitKind) -> bool {
        let step = self.step;
        let (rnr_interval, tr_interval) = (
            u64::from(self.cfg.rnr_retry_interval),
            u64::from(self.cfg.transport_retry_interval),
        );
        let rnr_override = self.cfg.rnr_retry_override;
        let Some(qp) = self.qps.get_mut(qpn) else {
            return false;
        };
        let params = qp.rc.map(|c| c.params).unwrap_or_default();
        let (limit, interval, infinite) = match kind {
            WaitKind::Rnr => {
                let l = rnr_override.unwrap_or(params.rnr_retry);
                (u32::from(l), rnr_interval, l == 7)
            }
            WaitKind::Transport => (u32::from(params.retry_cnt), tr_interval, false),
        };
        let continuing = matches!(qp.wait, Some(w) if w.kind == kind);
        let retries = match qp.wait {
            Some(w) if continuing => w.retries + 1,
            _ => 0,
        };
        let exhausted = if continuing {
            retries >= limit
        } else {
            limit == 0
        };
        if exhausted && !infinite {
            qp.wait = None;
            return false;
        }
        qp.wait = Some(Wait {
            kind,
            retries,
            next_try: step + interval,
        });
        self.active.insert(qpn);
        true
    }

    /// Moves `qpn` to the error state (its WQEs will be flushed).
    pub(crate) fn set_error(&mut self, qpn: u32) {
        if let Some(qp) = self.qps.get_mut(qpn) {
            qp.state = SimQpState::Error;
            qp.wait = None;
            self.active.insert(qpn);
            self.export_qp(qpn);
        }
    }

    /// Flushes the posted receive WQEs of `qpn` (own RQ only) if it is in the error state.
    pub(crate) fn flush_rq(&mut self, qpn: u32) {
        let Some(qp) = self.qps.get(qpn) else { return };
        if qp.state != SimQpState::Error {
            return;
        }
        let recv_cq = qp.recv_cq;
        let Some(rq) = qp.rq else { return };
        let n = rq.available();
        for _ in 0..n {
            let mut c = blank_cqe(qpn);
            c.wqe_counter = rq.consumed() as u16;
            c.syndrome = Syndrome::WrFlush as u8;
            rq.commit();
            self.post_cqe(recv_cq, &c, CqeOpcode::RespErr, false);
        }
    }

    // ---- completions ---------------------------------------------------------------------

    /// Writes a CQE to `cqn`; handles overruns (every QP reporting to the CQ enters the error
    /// state) and destroyed CQs.
    pub(crate) fn post_cqe(&mut self, cqn: u32, c: &Cqe, opcode: CqeOpcode, solicited: bool) {
        let Some(cq) = self.cqs.get(cqn).copied() else {
            self.stats.cqes_lost += 1;
            return;
        };
        if self.write_cqe(cqn, cq, c, opcode, solicited) == Push::Overrun {
            self.cq_overran(cqn);
        }
    }

    /// CQ `cqn` (ours) overran: every QP reporting to it enters the error state.
    #[cold]
    pub(crate) fn cq_overran(&mut self, cqn: u32) {
        let mut hit: Vec<u32> = self
            .qps
            .iter()
            .filter(|(_, qp)| qp.send_cq == cqn || qp.recv_cq == cqn)
            .map(|(n, _)| n)
            .collect();
        hit.sort_unstable();
        for qpn in hit {
            self.set_error(qpn);
        }
    }

    /// Writes a CQE through the producer view `cq` of CQ `cqn` and counts what happened;
    /// the caller handles an overrun (the QPs to move to the error state).
    pub(crate) fn write_cqe(
        &mut self,
        cqn: u32,
        cq: CqState,
        c: &Cqe,
        opcode: CqeOpcode,
        solicited: bool,
    ) -> Push {
        // `push` encodes everything but `op_own`, which it derives from `opcode` (the CQE's
        // own `opcode` field is not read).
        let r = cq.push(c, opcode, solicited);
        match r {
            Push::Written => {
                self.stats.cqes += 1;
                if matches!(opcode, CqeOpcode::ReqErr | CqeOpcode::RespErr) {
                    self.stats.error_cqes += 1;
                    if c.syndrome == Syndrome::WrFlush as u8 {
                        self.stats.flushes += 1;
                    }
                }
            }
            Push::Overrun => {
                tracing::warn!(
                    cqn,
                    "sim: CQ overrun; QPs reporting to it enter the error state"
                );
                self.stats.cq_overruns += 1;
                self.stats.cqes_lost += 1;
            }
            Push::Dead => self.stats.cqes_lost += 1,
        }
        r
    }

    /// Requester error: error CQE (even if unsignaled), QP to error.
    pub(crate) fn requester_error(
        &mut self,
        qpn: u32,
        wqe_counter: u16,
        wqe_opcode: u8,
        s: Syndrome,
    ) {
        let Some(qp) = self.qps.get(qpn) else { return };
        let cqn = qp.send_cq;
        let mut c = blank_cqe(qpn);
        c.wqe_counter = wqe_counter;
        c.wqe_opcode = wqe_opcode;
        c.syndrome = s as u8;
        self.set_error(qpn);
        self.post_cqe(cqn, &c, CqeOpcode::ReqErr, false);
    }

    /// Responder error on the receive WQE `r` taken from `src`: RESP_ERR CQE, QP to error.
    pub(crate) fn responder_error(&mut self, qpn: u32, srqn: u32, r: &RecvWqe, s: Syndrome) {
        let Some(qp) = self.qps.get(qpn) else { return };
        let cqn = qp.recv_cq;
        let mut c = blank_cqe(qpn);
        c.wqe_counter = r.wqe_counter;
        c.syndrome = s as u8;
        c.srqn = srqn;
        self.set_error(qpn);
        self.post_cqe(cqn, &c, CqeOpcode::RespErr, false);
    }
}

#[cfg(test)]
mod tests {
    use super::ActiveSet;

    #[test]
    fn active_set_is_sorted_without_duplicates_and_keeps_its_buffer() {
        let mut s = ActiveSet::default();
        for n in [9, 3, 7, 3, 12, 9, 1] {
            s.insert(n);
        }
        assert_eq!(s.as_slice(), [1, 3, 7, 9, 12]);
        s.remove(7);
        s.remove(8);
        assert_eq!(s.as_slice(), [1, 3, 9, 12]);
        let cap = s.0.capacity();
        for n in [1, 3, 9, 12] {
            s.remove(n);
        }
        assert!(s.is_empty());
        assert_eq!(s.0.capacity(), cap, "an empty set keeps its allocation");
        s.insert(5);
        assert_eq!(s.as_slice(), [5]);
    }
}
