//! The responder side of an operation: finding the destination QP of an RC request or a UD
//! packet, in this process's tables or, on a joined node, in another process's exports
//! (`sim/node.rs`), and acting on it (receive WQEs, memory regions, CQEs, errors) the same
//! way in both cases.
//!
//! A [`Target`] is a snapshot taken under the lock. Its queue views ([`RecvQ`], [`CqState`])
//! point into the destination's queue memory, which for a peer process is a mapping of its
//! shared segments; the device counters they update live in that memory too, so the owner
//! and every peer see one consumer and one producer per queue.

use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::cqe::{Cqe, CqeOpcode, Syndrome};
use crate::sim::SimQpState;
use crate::sim::cq::{CqState, Push};
use crate::sim::memory::{LKEY_TAG, RKEY_TAG, ScatterError, Span, Spans};
use crate::sim::model::{Model, blank_cqe};
use crate::sim::node::{NodeDir, NodeLink, qp_state};
use crate::sim::recv::{RecvWqe, RqState, SrqState};
use crate::verbs::{Access, QpType};
use crate::wqe::Sge;

/// A receive queue view: a QP's RQ, or an SRQ (with its number, for the CQE).
#[derive(Clone, Copy, Debug)]
pub(crate) enum RecvQ {
    Rq(RqState),
    Srq(u32, SrqState),
}

impl RecvQ {
    /// The next posted WQE, not consumed.
    pub(crate) fn peek(&self) -> Option<RecvWqe> {
        match self {
            RecvQ::Rq(q) => q.peek(),
            RecvQ::Srq(_, q) => q.peek(),
        }
    }

    /// Consumes the WQE `peek` returned.
    pub(crate) fn commit(&self) {
        match self {
            RecvQ::Rq(q) => q.commit(),
            RecvQ::Srq(_, q) => q.commit(),
        }
    }

    /// The SRQN for the CQE (0 for an RQ).
    pub(crate) fn srqn(&self) -> u32 {
        match self {
            RecvQ::Rq(_) => 0,
            RecvQ::Srq(n, _) => *n,
        }
    }
}

/// A destination QP, resolved under the lock.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Target {
    pub(crate) qpn: u32,
    /// This process's device owning it (for QPC lookups), `None` for a peer process's QP.
    pub(crate) device: Option<u32>,
    /// The owner's node slot when it is a peer process's QP.
    pub(crate) remote: Option<u32>,
    pub(crate) kind: QpType,
    pub(crate) rts: bool,
    pub(crate) pd: u32,
    /// RC responder access.
    pub(crate) access: Access,
    pub(crate) qkey: u32,
    /// RC: the QPN it is connected to.
    pub(crate) peer_qpn: Option<u32>,
    /// Its receive queue and the PD the receive buffers are checked against.
    pub(crate) recv: Option<(RecvQ, u32)>,
    /// Its receive CQ (number and producer view).
    pub(crate) cq: Option<(u32, CqState)>,
}

/// The GID of the port with LID `lid` (fe80::<lid>; the model's ports are numbered so).
pub(crate) fn gid_of_lid(lid: u16) -> [u8; 16] {
    let mut gid = [0u8; 16];
    gid[0] = 0xfe;
    gid[1] = 0x80;
    gid[12..].copy_from_slice(&u32::from(lid).to_be_bytes());
    gid
}

impl Model {
    /// The QP `qpn` addressed by `lid` (or, when `lid` is 0, `gid`): ours, or a peer
    /// process's on the node. `None`: no such QP there, or its process is gone.
    #[inline(always)]
    pub(crate) fn resolve(&mut self, lid: u16, gid: Option<&[u8; 16]>, qpn: u32) -> Option<Target> {
        if let Some(d) = self.qps.get(qpn)
            && self.addresses(d.device, lid, gid)
        {
            let recv = match (d.srq, &d.rq) {
                (Some(n), _) => self.srqs.get(n).map(|s| (RecvQ::Srq(n, *s), s.pd)),
                (None, Some(rq)) => Some((RecvQ::Rq(*rq), d.pd)),
                (None, None) => None,
            };
            return Some(Target {
                qpn,
                device: Some(d.device),
                remote: None,
                kind: d.kind,
                rts: d.state == SimQpState::Rts,
                pd: d.pd,
                access: d.rc.map(|c| c.params.access).unwrap_or(Access::empty()),
                qkey: d.qkey,
                peer_qpn: d.rc.map(|c| c.peer),
                recv,
                cq: self.cqs.get(d.recv_cq).map(|c| (d.recv_cq, *c)),
            });
        }
        if self.node.is_some() {
            self.resolve_remote(lid, gid, qpn)
        } else {
            None
        }
    }

    /// [`Model::resolve`] in a peer process's exports.
    #[cold]
    fn resolve_remote(&mut self, lid: u16, gid: Option<&[u8; 16]>, qpn: u32) -> Option<Target> {
        let link = self.node.as_mut()?;
        let dir = link.dir.clone();
        let (slot, e) = dir.qp(qpn)?;
        if slot == dir.slot || !dir.alive(slot) || e.live.load(Ordering::Acquire) != 1 {
            return None;
        }
        let elid = u16::try_from(e.lid.load(Ordering::Relaxed)).ok()?;
        let here = if lid != 0 {
            lid == elid
        } else {
            gid.is_some_and(|g| *g == gid_of_lid(elid))
        };
        if !here {
            return None;
        }
        let t = Self::remote_target(link, &dir, slot, e, qpn);
        if t.is_none() {
            // A live export we cannot use: inconsistent fields, a segment that is gone or
            // too short. Corrupt (or torn by a crash) shared state, never trusted.
            self.stats.remote_bad_exports += 1;
            tracing::warn!(qpn, slot, "sim: unusable export of a peer process's QP");
        }
        t
    }

    /// The [`Target`] for a peer's live, addressed export `e`, validated field by field.
    fn remote_target(
        link: &mut NodeLink,
        dir: &NodeDir,
        slot: u32,
        e: &crate::sim::node::QpExport,
        qpn: u32,
    ) -> Option<Target> {
        let pid = dir.pid(slot);
        let backing = &dir.backing;
        let maps = &mut link.maps;
        let mut map = |seg: u32, need: usize| -> Option<*mut u8> {
            let (p, len) = maps.get(backing, pid, seg)?;
            (need <= len).then_some(p as *mut u8)
        };
        let pd = e.pd.load(Ordering::Relaxed);
        let srqn = e.srq.load(Ordering::Relaxed);
        let recv = if srqn != 0 {
            let (sslot, s) = dir.srq(srqn)?;
            if sslot != slot || s.live.load(Ordering::Acquire) != 1 {
                return None;
            }
            let (cnt, stride) = (
                s.wqe_cnt.load(Ordering::Relaxed),
                s.stride.load(Ordering::Relaxed),
            );
            let max_sge = s.max_sge.load(Ordering::Relaxed);
            if !cnt.is_power_of_two()
                || stride < 32
                || (max_sge as usize * 16 + 16) > stride as usize
            {
                return None;
            }
            let buf = map(
                s.ring_seg.load(Ordering::Relaxed),
                cnt as usize * stride as usize,
            )?;
            let db = map(s.db_seg.load(Ordering::Relaxed), 64)?;
            let srq_pd = s.pd.load(Ordering::Relaxed);
            Some((
                RecvQ::Srq(
                    srqn,
                    SrqState {
                        buf,
                        wqe_cnt: cnt,
                        stride,
                        max_sge,
                        dbrec: db.cast(),
                        pd: srq_pd,
                    },
                ),
                srq_pd,
            ))
        } else {
            let (cnt, stride) = (
                e.rq_wqe_cnt.load(Ordering::Relaxed),
                e.rq_stride.load(Ordering::Relaxed),
            );
            if cnt == 0 {
                None
            } else {
                if !cnt.is_power_of_two() || stride < 16 || stride % 16 != 0 {
                    return None;
                }
                let buf = map(
                    e.rq_seg.load(Ordering::Relaxed),
                    cnt as usize * stride as usize,
                )?;
                let db = map(e.db_seg.load(Ordering::Relaxed), 64)?;
                Some((
                    RecvQ::Rq(RqState {
                        buf,
                        wqe_cnt: cnt,
                        stride,
                        max_sge: stride / 16,
                        dbrec: db.cast(),
                    }),
                    pd,
                ))
            }
        };
        let cqn = e.recv_cq.load(Ordering::Relaxed);
        let cq = match dir.cq(cqn) {
            Some((cslot, c)) if cslot == slot && c.live.load(Ordering::Acquire) == 1 => {
                let cnt = c.cqe_cnt.load(Ordering::Relaxed);
                if !cnt.is_power_of_two() {
                    return None;
                }
                let ring = map(c.ring_seg.load(Ordering::Relaxed), cnt as usize * 64)?;
                let db = map(c.db_seg.load(Ordering::Relaxed), 64)?;
                Some((cqn, CqState::new(ring, cnt, db.cast())))
            }
            _ => None,
        };
        let kind = if e.kind.load(Ordering::Relaxed) == 1 {
            QpType::Ud
        } else {
            QpType::Rc
        };
        Some(Target {
            qpn,
            device: None,
            remote: Some(slot),
            kind,
            rts: e.state.load(Ordering::Acquire) == qp_state::RTS
                && e.err_pending.load(Ordering::Acquire) == 0,
            pd,
            access: Access::from_bits_truncate(e.access.load(Ordering::Relaxed)),
            qkey: e.qkey.load(Ordering::Relaxed),
            peer_qpn: (kind == QpType::Rc).then(|| e.peer_qpn.load(Ordering::Relaxed)),
            recv,
            cq,
        })
    }

    /// Validates `[addr, addr + len)` against memory region key `key` (an rkey, or an lkey
    /// when `lkey`) of the target's owner with protection domain `pd`.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(crate) fn target_mr(
        &mut self,
        t: &Target,
        key: u32,
        lkey: bool,
        pd: u32,
        addr: u64,
        len: usize,
        need: Access,
    ) -> Option<Span> {
        if t.remote.is_none() {
            return if lkey {
                self.mrs.local(key, pd, addr, len, need)
            } else {
                self.mrs.remote(key, pd, addr, len, need)
            };
        }
        self.target_mr_remote(t, key, lkey, pd, addr, len, need)
    }

    /// [`Model::target_mr`] for a peer process's QP (its exports).
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn target_mr_remote(
        &mut self,
        t: &Target,
        key: u32,
        lkey: bool,
        pd: u32,
        addr: u64,
        len: usize,
        need: Access,
    ) -> Option<Span> {
        let tag = if lkey { LKEY_TAG } else { RKEY_TAG };
        if key & 0xff != tag {
            return None;
        }
        let link = self.node.as_mut()?;
        let (slot, e) = link.dir.mr(key >> 8)?;
        if Some(slot) != t.remote || e.live.load(Ordering::Acquire) != 1 {
            return None;
        }
        let (base, elen) = (
            e.addr.load(Ordering::Relaxed),
            e.len.load(Ordering::Relaxed),
        );
        let end = addr.checked_add(len as u64)?;
        let access = Access::from_bits_truncate(e.access.load(Ordering::Relaxed));
        if e.pd.load(Ordering::Relaxed) != pd
            || addr < base
            || end > base.checked_add(elen)?
            || !access.contains(need)
        {
            return None;
        }
        let seg = e.seg.load(Ordering::Relaxed);
        if seg == u32::MAX {
            // Registered on private memory: the owner's model can reach it, no peer can.
            self.stats.remote_unreachable_mr += 1;
            return None;
        }
        let off = e.seg_off.load(Ordering::Relaxed).checked_add(addr - base)?;
        let pid = link.dir.pid(slot);
        let (p, mlen) = link.maps.get(&link.dir.backing, pid, seg)?;
        if off.checked_add(len as u64)? > mlen as u64 {
            return None;
        }
        Some(Span {
            ptr: (p + off as usize) as *mut u8,
            len,
        })
    }

    /// Validates the target's receive scatter list for `len` bytes (only the entries the
    /// payload reaches; see [`crate::sim::memory::MrTable::scatter_list`]).
    pub(crate) fn target_scatter(
        &mut self,
        t: &Target,
        pd: u32,
        sges: impl Iterator<Item = Sge>,
        len: usize,
    ) -> Result<Spans, ScatterError> {
        if t.remote.is_none() {
            return self.mrs.scatter_list(pd, sges, len);
        }
        crate::sim::memory::scatter_with(sges, len, |s| {
            self.target_mr(
                t,
                s.lkey,
                true,
                pd,
                s.addr,
                s.len as usize,
                Access::LOCAL_WRITE,
            )
        })
    }

    /// Writes a responder CQE to the target's receive CQ.
    pub(crate) fn target_cqe(&mut self, t: &Target, c: &Cqe, opcode: CqeOpcode, solicited: bool) {
        let Some((cqn, cq)) = t.cq else {
            self.stats.cqes_lost += 1;
            return;
        };
        // The view taken at resolve time (no second table lookup for a local CQ).
        if self.write_cqe(cqn, cq, c, opcode, solicited) == Push::Overrun {
            if t.remote.is_none() {
                self.cq_overran(cqn);
            } else {
                self.remote_error(t);
            }
        }
    }

    /// Responder error on the receive WQE `r` of the target: RESP_ERR CQE, QP to error.
    pub(crate) fn target_error(&mut self, t: &Target, r: &RecvWqe, srqn: u32, s: Syndrome) {
        if t.remote.is_none() {
            self.responder_error(t.qpn, srqn, r, s);
            return;
        }
        let mut c = blank_cqe(t.qpn);
        c.wqe_counter = r.wqe_counter;
        c.syndrome = s as u8;
        c.srqn = srqn;
        self.remote_error(t);
        self.target_cqe(t, &c, CqeOpcode::RespErr, false);
    }

    /// Asks the owner of a peer process's QP to move it to the error state.
    fn remote_error(&mut self, t: &Target) {
        let (Some(slot), Some(link)) = (t.remote, self.node.as_ref()) else {
            return;
        };
        if let Some((_, e)) = link.dir.qp(t.qpn) {
            e.err_pending.store(1, Ordering::Release);
            link.dir.poke(slot);
        }
    }

    // ---- the node side of a joined model -------------------------------------------------

    /// Per step: apply error transitions peers asked for (and overruns of our CQs by peers),
    /// and check peers' liveness at most every [`crate::sim::node::LIVENESS_PERIOD`].
    pub(crate) fn node_step(&mut self) {
        let Some(link) = self.node.as_mut() else {
            return;
        };
        let att = link.dir.attention();
        let now = Instant::now();
        if now.duration_since(link.last_check) >= crate::sim::node::LIVENESS_PERIOD {
            link.last_check = now;
            let died = link.dir.check_liveness();
            self.stats.peer_deaths += u64::from(died);
        }
        let Some(link) = self.node.as_mut() else {
            return;
        };
        if att == link.seen_attention {
            return;
        }
        link.seen_attention = att;
        let dir = link.dir.clone();
        let mut hit = Vec::new();
        for (qpn, q) in self.qps.iter() {
            let pending = dir
                .qp(qpn)
                .is_some_and(|(_, e)| e.err_pending.swap(0, Ordering::AcqRel) != 0);
            let overrun = [q.send_cq, q.recv_cq]
                .iter()
                .any(|&c| self.cqs.get(c).is_some_and(|c| c.overrun()));
            if (pending || overrun) && q.state != SimQpState::Error {
                hit.push(qpn);
            }
        }
        hit.sort_unstable();
        for qpn in hit {
            self.set_error(qpn);
        }
    }

    /// Publishes QP `qpn`'s current description (joined models only).
    pub(crate) fn export_qp(&self, qpn: u32) {
        let (Some(link), Some(q)) = (self.node.as_ref(), self.qps.get(qpn)) else {
            return;
        };
        let Some((_, e)) = link.dir.qp(qpn) else {
            return;
        };
        let seg =
            |p: *mut u8| crate::mem::shared_segment_of(p as usize, 1).map_or(u32::MAX, |(s, _)| s);
        let lid = self.devices.get(q.device as usize).map_or(0, |p| p.lid);
        e.kind
            .store(u32::from(q.kind == QpType::Ud), Ordering::Relaxed);
        e.lid.store(u32::from(lid), Ordering::Relaxed);
        e.pd.store(q.pd, Ordering::Relaxed);
        e.access.store(
            q.rc.map_or(0, |c| c.params.access.bits()),
            Ordering::Relaxed,
        );
        e.qkey.store(q.qkey, Ordering::Relaxed);
        e.peer_qpn
            .store(q.rc.map_or(0, |c| c.peer), Ordering::Relaxed);
        e.recv_cq.store(q.recv_cq, Ordering::Relaxed);
        e.srq.store(q.srq.unwrap_or(0), Ordering::Relaxed);
        e.db_seg.store(seg(q.sq.dbrec.cast()), Ordering::Relaxed);
        match &q.rq {
            Some(rq) => {
                e.rq_seg.store(seg(rq.buf), Ordering::Relaxed);
                e.rq_wqe_cnt.store(rq.wqe_cnt, Ordering::Relaxed);
                e.rq_stride.store(rq.stride, Ordering::Relaxed);
            }
            None => e.rq_wqe_cnt.store(0, Ordering::Relaxed),
        }
        let st = match q.state {
            SimQpState::Reset => qp_state::RESET,
            SimQpState::Rts => qp_state::RTS,
            SimQpState::Error => qp_state::ERROR,
        };
        e.state.store(st, Ordering::Release);
        e.live.store(1, Ordering::Release);
    }

    /// Withdraws QP `qpn`'s export.
    pub(crate) fn unexport_qp(&self, qpn: u32) {
        if let Some(link) = &self.node
            && let Some((_, e)) = link.dir.qp(qpn)
        {
            e.live.store(0, Ordering::Release);
            e.err_pending.store(0, Ordering::Relaxed);
        }
    }

    /// Publishes (`Some`) or withdraws (`None`) CQ `cqn`: `(cqe_cnt, ring, dbrec)`.
    pub(crate) fn export_cq(&self, cqn: u32, what: Option<(u32, *mut u8, *mut u32)>) {
        let Some(link) = &self.node else { return };
        let Some((_, e)) = link.dir.cq(cqn) else {
            return;
        };
        match what {
            Some((cnt, ring, db)) => {
                let seg = |p: usize| crate::mem::shared_segment_of(p, 1).map_or(u32::MAX, |s| s.0);
                e.cqe_cnt.store(cnt, Ordering::Relaxed);
                e.ring_seg.store(seg(ring as usize), Ordering::Relaxed);
                e.db_seg.store(seg(db as usize), Ordering::Relaxed);
                e.live.store(1, Ordering::Release);
            }
            None => e.live.store(0, Ordering::Release),
        }
    }

    /// Publishes (`Some`) or withdraws (`None`) SRQ `srqn`.
    pub(crate) fn export_srq(&self, srqn: u32, what: Option<&SrqState>) {
        let Some(link) = &self.node else { return };
        let Some((_, e)) = link.dir.srq(srqn) else {
            return;
        };
        match what {
            Some(s) => {
                let seg = |p: usize| crate::mem::shared_segment_of(p, 1).map_or(u32::MAX, |s| s.0);
                e.wqe_cnt.store(s.wqe_cnt, Ordering::Relaxed);
                e.stride.store(s.stride, Ordering::Relaxed);
                e.max_sge.store(s.max_sge, Ordering::Relaxed);
                e.pd.store(s.pd, Ordering::Relaxed);
                e.ring_seg.store(seg(s.buf as usize), Ordering::Relaxed);
                e.db_seg.store(seg(s.dbrec as usize), Ordering::Relaxed);
                e.live.store(1, Ordering::Release);
            }
            None => e.live.store(0, Ordering::Release),
        }
    }

    /// Publishes (`Some((addr, len, access, pd))`) or withdraws (`None`) MR index `idx`.
    pub(crate) fn export_mr(&self, idx: u32, what: Option<(u64, u64, Access, u32)>) {
        let Some(link) = &self.node else { return };
        let Some((_, e)) = link.dir.mr(idx) else {
            return;
        };
        match what {
            Some((addr, len, access, pd)) => {
                let (seg, off) = match crate::mem::shared_segment_of(addr as usize, len as usize) {
                    Some((s, base)) => (s, addr - base as u64),
                    None => {
                        tracing::warn!(
                            addr,
                            len,
                            "sim: memory registered outside a shared DmaBuf; peer processes \
                             cannot reach it (allocate registered memory after Fabric::join)"
                        );
                        (u32::MAX, 0)
                    }
                };
                e.access.store(access.bits(), Ordering::Relaxed);
                e.pd.store(pd, Ordering::Relaxed);
                e.seg.store(seg, Ordering::Relaxed);
                e.addr.store(addr, Ordering::Relaxed);
                e.len.store(len, Ordering::Relaxed);
                e.seg_off.store(off, Ordering::Relaxed);
                e.live.store(1, Ordering::Release);
            }
            None => e.live.store(0, Ordering::Release),
        }
    }
}

/// A new link to a joined directory.
pub(crate) fn link(dir: std::sync::Arc<NodeDir>) -> NodeLink {
    let seen = dir.attention();
    NodeLink {
        dir,
        maps: Default::default(),
        last_check: Instant::now(),
        seen_attention: seen,
    }
}
