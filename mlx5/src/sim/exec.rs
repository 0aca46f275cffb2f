//! WQE execution, per opcode: the send-queue loop (parse, execute, complete, stall, flush), RC
//! operations between connected QPs, and UD transmission and delivery.

use crate::cqe::{CqeOpcode, Syndrome};
use crate::sim::SimQpState;
use crate::sim::faults::{Fate, Packet};
use crate::sim::memory::{self, ScatterError};
use crate::sim::model::{Model, RcConn, Scratch, WaitKind, blank_cqe};
use crate::sim::target::Target;
use crate::verbs::{Access, QpType};
use crate::wqe::{self, CQ_UPDATE, Opcode, ParsedWqe, SOLICITED};

/// Bytes of the GRH area at the start of every UD receive buffer.
pub(crate) const GRH_BYTES: usize = 40;

/// `flags_rqpn` GRH flag value for "GRH present".
const CQE_GRH: u8 = 1;

/// What executing one WQE did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Completed; `byte_cnt` for the requester CQE.
    Done { byte_cnt: u32 },
    /// Cannot proceed now (no side effects); retry later.
    Stall(WaitKind),
    /// Requester error with this syndrome (responder-side effects already applied).
    Fail(Syndrome),
}

/// What executing a WQE needs of its QP, read once per WQE.
#[derive(Clone, Copy, Debug)]
struct Requester {
    qpn: u32,
    pd: u32,
    device: u32,
    rc: Option<RcConn>,
}

impl Model {
    /// Executes (or flushes) the rung WQEs of `qpn`'s send queue until it is empty or its head
    /// stalls.
    pub(crate) fn run_sq(&mut self, qpn: u32) {
        // The WQE buffers, out of `self` while the WQEs execute (a nested call, which does not
        // happen today, would simply use fresh ones).
        let mut s = self.scratch.take().unwrap_or_else(Scratch::new);
        self.run_sq_with(qpn, &mut s);
        if s.payload.capacity() > Scratch::KEEP {
            s.payload = Vec::new();
        }
        self.scratch = Some(s);
    }

    /// [`Model::run_sq`] with its buffers.
    fn run_sq_with(&mut self, qpn: u32, s: &mut Scratch) {
        loop {
            let Some(qp) = self.qps.get(qpn) else { return };
            let sq = qp.sq;
            if sq.ci == sq.rung {
                return;
            }
            let retry = match qp.wait {
                Some(w) if w.next_try > self.step => return,
                Some(w) => Some(w.kind),
                None => None,
            };
            let (state, kind, send_cq, device) = (qp.state, qp.kind, qp.send_cq, qp.device);
            let req = Requester {
                qpn,
                pd: qp.pd,
                device,
                rc: qp.rc,
            };
            let counter = sq.ci as u16;
            let (bbs, len) = match sq.read_wqe(&mut s.bytes) {
                Ok(x) => x,
                Err(bad) => {
                    if state == SimQpState::Error {
                        self.flush_send(qpn, counter, bad.opcode);
                    } else {
                        self.requester_error(qpn, counter, bad.opcode, Syndrome::LocalQpOp);
                    }
                    self.advance(qpn, bad.skip.max(1));
                    continue;
                }
            };
            // The control segment's opcode byte (a whole WQE is at least 16 bytes).
            let opcode = s.bytes[3];
            if state == SimQpState::Error {
                self.flush_send(qpn, counter, opcode);
                self.advance(qpn, bbs);
                continue;
            }
            match retry {
                Some(WaitKind::Rnr) => self.stats.rnr_retries += 1,
                Some(WaitKind::Transport) => self.stats.transport_retries += 1,
                None => {}
            }
            // Parsed, and the control segment names this WQE slot and this QP.
            let parsed = wqe::parse_into(&s.bytes[..len], kind == QpType::Ud, &mut s.wqe).is_ok()
                && s.wqe.ctrl.wqe_index == counter
                && s.wqe.ctrl.qpn == qpn;
            let outcome = if !parsed || state != SimQpState::Rts {
                Outcome::Fail(Syndrome::LocalQpOp)
            } else {
                // The requester NIC needs the QP's context to execute the WQE.
                self.qpc_touch(device, qpn);
                self.execute(&req, kind, &s.wqe, &mut s.payload)
            };
            match outcome {
                Outcome::Done { byte_cnt } => {
                    // Only a parsed WQE completes: `s.wqe.ctrl` is its control segment.
                    let ctrl = s.wqe.ctrl;
                    if let Some(op) = Opcode::from_u8(ctrl.opcode) {
                        self.stats.wqes.bump(op);
                    }
                    if let Some(q) = self.qps.get_mut(qpn) {
                        q.wait = None;
                        q.sq.ci = q.sq.ci.wrapping_add(bbs);
                    }
                    if ctrl.fm_ce_se & CQ_UPDATE != 0 {
                        let mut c = blank_cqe(qpn);
                        c.wqe_counter = counter;
                        c.wqe_opcode = ctrl.opcode;
                        c.byte_cnt = byte_cnt;
                        self.post_cqe(send_cq, &c, CqeOpcode::Req, false);
                    }
                }
                Outcome::Stall(k) => {
                    if self.stall(qpn, k) {
                        return;
                    }
                    let s = match k {
                        WaitKind::Rnr => Syndrome::RnrRetryExc,
                        WaitKind::Transport => Syndrome::TransportRetryExc,
                    };
                    self.requester_error(qpn, counter, opcode, s);
                    self.advance(qpn, bbs);
                }
                Outcome::Fail(s) => {
                    self.requester_error(qpn, counter, opcode, s);
                    self.advance(qpn, bbs);
                }
            }
        }
    }

    fn advance(&mut self, qpn: u32, bbs: u32) {
        if let Some(q) = self.qps.get_mut(qpn) {
            q.sq.ci = q.sq.ci.wrapping_add(bbs);
        }
    }

    fn flush_send(&mut self, qpn: u32, counter: u16, opcode: u8) {
        let Some(qp) = self.qps.get(qpn) else { return };
        let cqn = qp.send_cq;
        let mut c = blank_cqe(qpn);
        c.wqe_counter = counter;
        c.wqe_opcode = opcode;
        c.syndrome = Syndrome::WrFlush as u8;
        self.post_cqe(cqn, &c, CqeOpcode::ReqErr, false);
    }

    /// Executes WQE `w` of `qpn`; `buf` is a buffer for a payload that must be gathered.
    fn execute(
        &mut self,
        q: &Requester,
        kind: QpType,
        w: &ParsedWqe,
        buf: &mut Vec<u8>,
    ) -> Outcome {
        let Some(op) = Opcode::from_u8(w.ctrl.opcode) else {
            return Outcome::Fail(Syndrome::LocalQpOp);
        };
        if op == Opcode::Nop {
            return Outcome::Done { byte_cnt: 0 };
        }
        match kind {
            QpType::Rc => self.exec_rc(q, op, w, buf),
            QpType::Ud => self.exec_ud(q, op, w, buf),
        }
    }

    // ---- RC ------------------------------------------------------------------------------

    /// The connected responder, if reachable: exists (in this process or, on a joined node,
    /// in a running peer process), is RC and in RTS, is connected back to `qpn`, and sits on
    /// the LID given at connect time (or, with LID 0, the GID); the responder NIC then looks
    /// up its context (the packet reached it; only for this process's devices).
    #[inline(always)]
    fn rc_responder(&mut self, q: &Requester) -> Option<Target> {
        let (qpn, conn) = (q.qpn, q.rc.as_ref()?);
        // Checked in place (the Target is not moved out of the Option and back in).
        let t = self.resolve(conn.lid, Some(&conn.gid), conn.peer);
        match &t {
            Some(p) if p.kind == QpType::Rc && p.rts && p.peer_qpn == Some(qpn) => {
                if let Some(d) = p.device {
                    self.qpc_touch(d, p.qpn);
                }
            }
            _ => return None,
        }
        t
    }

    fn exec_rc(&mut self, q: &Requester, op: Opcode, w: &ParsedWqe, buf: &mut Vec<u8>) -> Outcome {
        let (qpn, pd) = (q.qpn, q.pd);
        match op {
            Opcode::Send | Opcode::SendImm => {
                let Some(payload) = self.mrs.gather(pd, &w.inline, &w.sges, buf) else {
                    return Outcome::Fail(Syndrome::LocalProt);
                };
                let resp = self.rc_responder(q);
                let Some(peer) = &resp else {
                    return Outcome::Stall(WaitKind::Transport);
                };
                let Some((rq, rpd)) = &peer.recv else {
                    return Outcome::Stall(WaitKind::Rnr);
                };
                let Some(r) = rq.peek() else {
                    return Outcome::Stall(WaitKind::Rnr);
                };
                rq.commit();
                match self.target_scatter(peer, *rpd, r.sges(), payload.len()) {
                    Err(ScatterError::Protection) => {
                        self.target_error(peer, &r, rq.srqn(), Syndrome::LocalProt);
                        Outcome::Fail(Syndrome::RemoteOp)
                    }
                    Err(ScatterError::Length) => {
                        self.target_error(peer, &r, rq.srqn(), Syndrome::LocalLength);
                        Outcome::Fail(Syndrome::RemoteInvalReq)
                    }
                    Ok(spans) => {
                        memory::scatter(spans.as_slice(), payload);
                        self.stats.bytes += payload.len() as u64;
                        let opcode = if op == Opcode::SendImm {
                            CqeOpcode::RespSendImm
                        } else {
                            CqeOpcode::RespSend
                        };
                        self.respond(
                            qpn,
                            peer,
                            rq.srqn(),
                            r.wqe_counter,
                            payload.len(),
                            w,
                            opcode,
                        );
                        Outcome::Done { byte_cnt: 0 }
                    }
                }
            }
            Opcode::RdmaWrite | Opcode::RdmaWriteImm => {
                let Some(payload) = self.mrs.gather(pd, &w.inline, &w.sges, buf) else {
                    return Outcome::Fail(Syndrome::LocalProt);
                };
                let resp = self.rc_responder(q);
                let Some(peer) = &resp else {
                    return Outcome::Stall(WaitKind::Transport);
                };
                let recv = if op == Opcode::RdmaWriteImm {
                    // Borrowed from `peer` (no copy of the queue view).
                    let Some((rq, _)) = &peer.recv else {
                        return Outcome::Stall(WaitKind::Rnr);
                    };
                    let Some(r) = rq.peek() else {
                        return Outcome::Stall(WaitKind::Rnr);
                    };
                    Some((r, rq))
                } else {
                    None
                };
                if !peer.access.contains(Access::REMOTE_WRITE) {
                    return Outcome::Fail(Syndrome::RemoteInvalReq);
                }
                let Some(remote) = w.remote else {
                    return Outcome::Fail(Syndrome::LocalQpOp);
                };
                if !payload.is_empty() {
                    let Some(span) = self.target_mr(
                        peer,
                        remote.rkey,
                        false,
                        peer.pd,
                        remote.raddr,
                        payload.len(),
                        Access::REMOTE_WRITE,
                    ) else {
                        return Outcome::Fail(Syndrome::RemoteAccess);
                    };
                    memory::write_span(span, payload);
                    self.stats.bytes += payload.len() as u64;
                }
                if let Some((r, rq)) = recv {
                    rq.commit();
                    self.respond(
                        qpn,
                        peer,
                        rq.srqn(),
                        r.wqe_counter,
                        payload.len(),
                        w,
                        CqeOpcode::RespWrImm,
                    );
                }
                Outcome::Done { byte_cnt: 0 }
            }
            Opcode::RdmaRead => {
                if !w.inline.is_empty() {
                    return Outcome::Fail(Syndrome::LocalQpOp);
                }
                let len: usize = w.sges.iter().map(|s| s.len as usize).sum();
                let Ok(local) = self.mrs.scatter_list(pd, w.sges.iter().copied(), len) else {
                    return Outcome::Fail(Syndrome::LocalProt);
                };
                let Some(peer) = self.rc_responder(q) else {
                    return Outcome::Stall(WaitKind::Transport);
                };
                if !peer.access.contains(Access::REMOTE_READ) {
                    return Outcome::Fail(Syndrome::RemoteInvalReq);
                }
                let Some(remote) = w.remote else {
                    return Outcome::Fail(Syndrome::LocalQpOp);
                };
                if len > 0 {
                    let Some(span) = self.target_mr(
                        &peer,
                        remote.rkey,
                        false,
                        peer.pd,
                        remote.raddr,
                        len,
                        Access::REMOTE_READ,
                    ) else {
                        return Outcome::Fail(Syndrome::RemoteAccess);
                    };
                    buf.clear();
                    memory::read_into(span, buf);
                    memory::scatter(local.as_slice(), buf);
                    self.stats.bytes += len as u64;
                }
                Outcome::Done {
                    byte_cnt: len as u32,
                }
            }
            Opcode::AtomicCs | Opcode::AtomicFa => {
                if !w.inline.is_empty() {
                    return Outcome::Fail(Syndrome::LocalQpOp);
                }
                let local = match self.mrs.scatter_list(pd, w.sges.iter().copied(), 8) {
                    Ok(l) => l,
                    Err(ScatterError::Protection) => return Outcome::Fail(Syndrome::LocalProt),
                    Err(ScatterError::Length) => return Outcome::Fail(Syndrome::LocalLength),
                };
                let Some(peer) = self.rc_responder(q) else {
                    return Outcome::Stall(WaitKind::Transport);
                };
                if !peer.access.contains(Access::REMOTE_ATOMIC) {
                    return Outcome::Fail(Syndrome::RemoteInvalReq);
                }
                let (Some(remote), Some(a)) = (w.remote, w.atomic) else {
                    return Outcome::Fail(Syndrome::LocalQpOp);
                };
                if remote.raddr % 8 != 0 {
                    return Outcome::Fail(Syndrome::RemoteInvalReq);
                }
                let Some(span) = self.target_mr(
                    &peer,
                    remote.rkey,
                    false,
                    peer.pd,
                    remote.raddr,
                    8,
                    Access::REMOTE_ATOMIC,
                ) else {
                    return Outcome::Fail(Syndrome::RemoteAccess);
                };
                let mut old = [0u8; 8];
                memory::read_span(span, &mut old);
                let cur = u64::from_be_bytes(old);
                let new = match op {
                    Opcode::AtomicCs if cur == a.compare => a.swap_add,
                    Opcode::AtomicCs => cur,
                    _ => cur.wrapping_add(a.swap_add),
                };
                memory::write_span(span, &new.to_be_bytes());
                memory::scatter(local.as_slice(), &old);
                self.stats.bytes += 16;
                Outcome::Done { byte_cnt: 8 }
            }
            Opcode::Nop => Outcome::Done { byte_cnt: 0 },
        }
    }

    /// Responder CQE at `t` for a SEND/SEND_IMM/WRITE_IMM from `src_qpn`.
    #[allow(clippy::too_many_arguments)]
    fn respond(
        &mut self,
        src_qpn: u32,
        t: &Target,
        srqn: u32,
        wqe_counter: u16,
        len: usize,
        w: &ParsedWqe,
        opcode: CqeOpcode,
    ) {
        let mut c = blank_cqe(t.qpn);
        c.wqe_counter = wqe_counter;
        c.byte_cnt = len as u32;
        c.src_qpn = src_qpn;
        if opcode != CqeOpcode::RespSend {
            c.imm = w.ctrl.imm;
        }
        c.srqn = srqn;
        self.target_cqe(t, &c, opcode, w.ctrl.fm_ce_se & SOLICITED != 0);
    }

    // ---- UD ------------------------------------------------------------------------------

    /// UD SEND / SEND_IMM. Out of line: keeps the RC path through `run_sq` small.
    #[inline(never)]
    fn exec_ud(&mut self, q: &Requester, op: Opcode, w: &ParsedWqe, buf: &mut Vec<u8>) -> Outcome {
        if !matches!(op, Opcode::Send | Opcode::SendImm) {
            return Outcome::Fail(Syndrome::LocalQpOp);
        }
        let (qpn, pd, device) = (q.qpn, q.pd, q.device);
        let Some(payload) = self.mrs.gather(pd, &w.inline, &w.sges, buf) else {
            return Outcome::Fail(Syndrome::LocalProt);
        };
        if payload.len() > self.cfg.mtu as usize {
            return Outcome::Fail(Syndrome::LocalLength);
        }
        let Some(av) = w.ud else {
            return Outcome::Fail(Syndrome::LocalQpOp);
        };
        self.stats.ud_sent += 1;
        // The packet's payload buffer is kept from send to send; it leaves with the packet
        // only when fault injection holds the packet back (and returns to `ud_spare` when
        // that packet is delivered).
        let mut owned = std::mem::take(&mut self.ud_tx);
        if owned.capacity() == 0
            && let Some(b) = self.ud_spare.pop()
        {
            owned = b;
        }
        owned.clear();
        owned.extend_from_slice(payload);
        let p = Packet {
            src_qpn: qpn,
            src_gid: self.devices[device as usize].gid,
            av,
            imm: (op == Opcode::SendImm).then_some(w.ctrl.imm),
            solicited: w.ctrl.fm_ce_se & SOLICITED != 0,
            payload: owned,
        };
        if let Some(back) = self.transmit(p)
            && back.capacity() <= Scratch::KEEP
        {
            self.ud_tx = back;
        }
        Outcome::Done { byte_cnt: 0 }
    }

    /// Puts a UD packet on the wire: fault injection decides its fate. Returns the packet's
    /// payload buffer when the packet is done with (delivered or dropped), `None` when it is
    /// held back.
    fn transmit(&mut self, p: Packet) -> Option<Vec<u8>> {
        match self.faults.fate() {
            Fate::Deliver => {
                self.deliver(&p);
                self.release_held();
                Some(p.payload)
            }
            Fate::Drop => {
                self.stats.ud_drops += 1;
                Some(p.payload)
            }
            Fate::Duplicate => {
                self.stats.ud_dups += 1;
                self.deliver(&p);
                self.deliver(&p);
                self.release_held();
                Some(p.payload)
            }
            Fate::Reorder => {
                self.stats.ud_reorders += 1;
                self.faults.hold(self.step, p);
                None
            }
            Fate::Delay(k) => {
                self.stats.ud_delays += 1;
                self.faults.delay(self.step + u64::from(k), p);
                None
            }
        }
    }

    fn release_held(&mut self) {
        if !self.faults.pending() {
            return;
        }
        let mut out = std::mem::take(&mut self.fault_out);
        self.faults.take_held(&mut out);
        self.deliver_all(&mut out);
        self.fault_out = out;
    }

    /// Delivers (in order) and empties `out`, keeping the packets' payload buffers for later
    /// sends.
    pub(crate) fn deliver_all(&mut self, out: &mut Vec<Packet>) {
        for p in out.drain(..) {
            self.deliver(&p);
            if p.payload.capacity() <= Scratch::KEEP && self.ud_spare.len() < Model::SPARE_MAX {
                self.ud_spare.push(p.payload);
            }
        }
    }

    /// Delivers a UD packet to its destination QP (or drops it, counted).
    pub(crate) fn deliver(&mut self, p: &Packet) {
        let dqpn = p.av.dqpn;
        let found = self.resolve(p.av.rlid, p.av.grh.then_some(&p.av.rgid), dqpn);
        let Some(t) = found.as_ref().filter(|t| t.kind == QpType::Ud && t.rts) else {
            self.stats.ud_no_dest += 1;
            return;
        };
        // The destination NIC needs the QP's context (Q_Key, receive queue) to deliver.
        if let Some(device) = t.device {
            self.qpc_touch(device, dqpn);
        }
        if t.qkey != p.av.qkey {
            self.stats.ud_bad_qkey += 1;
            return;
        }
        let Some((rq, rpd)) = &t.recv else {
            self.stats.ud_no_recv += 1;
            return;
        };
        let Some(r) = rq.peek() else {
            self.stats.ud_no_recv += 1;
            return;
        };
        rq.commit();
        let len = GRH_BYTES + p.payload.len();
        match self.target_scatter(t, *rpd, r.sges(), len) {
            Err(ScatterError::Protection) => {
                self.target_error(t, &r, rq.srqn(), Syndrome::LocalProt)
            }
            Err(ScatterError::Length) => self.target_error(t, &r, rq.srqn(), Syndrome::LocalLength),
            Ok(spans) => {
                let mut data = std::mem::take(&mut self.ud_buf);
                data.clear();
                data.extend_from_slice(&grh(p));
                data.extend_from_slice(&p.payload);
                memory::scatter(spans.as_slice(), &data);
                if data.capacity() <= Scratch::KEEP {
                    self.ud_buf = data;
                }
                self.stats.bytes += p.payload.len() as u64;
                self.stats.ud_delivered += 1;
                let mut c = blank_cqe(dqpn);
                c.wqe_counter = r.wqe_counter;
                c.byte_cnt = len as u32;
                c.src_qpn = p.src_qpn;
                c.imm = p.imm.unwrap_or(0);
                c.grh = if p.av.grh { CQE_GRH } else { 0 };
                c.srqn = rq.srqn();
                let opcode = if p.imm.is_some() {
                    CqeOpcode::RespSendImm
                } else {
                    CqeOpcode::RespSend
                };
                self.target_cqe(t, &c, opcode, p.solicited);
            }
        }
    }
}

/// The 40 B GRH area of a UD receive: zeros without a GRH; with one, an IPv6-style GRH
/// (version 6, payload length, next header 0x1B, hop limit, source and destination GIDs).
fn grh(p: &Packet) -> [u8; GRH_BYTES] {
    let mut g = [0u8; GRH_BYTES];
    if p.av.grh {
        g[0] = 0x60;
        // Payload length: BTH (12) + DETH (8) + payload + ICRC (4).
        let plen = (12 + 8 + p.payload.len() + 4) as u16;
        g[4..6].copy_from_slice(&plen.to_be_bytes());
        g[6] = 0x1b;
        g[7] = 64;
        g[8..24].copy_from_slice(&p.src_gid);
        g[24..40].copy_from_slice(&p.av.rgid);
    }
    g
}
