//! The ScaleRPC client (seeds/003 §5.2): many connections (one RC QP each) in one context
//! sharing a send CQ, a receive CQ for the server's notices and an SRQ. A call RDMA WRITEs
//! header + payload + trailer into the server pool slot its connection's current mapping
//! names (inline up to `max_inline`, else from a registered staging slot; doorbells batched,
//! seeds/003 §8.3), and its response arrives by RDMA WRITE in the connection's response
//! slot (or is fetched by RDMA READ, [`ResponseMode::Read`]).
//!
//! A connection may issue only while its group is active or warming up
//! ([`ScaleCallErrorKind::NotActive`] otherwise: the server's scheduler decides when,
//! [`super::sched`]). On a stop notice it stops issuing and acknowledges once its last
//! response arrived.

use mlx5::cqe::Cqe;
use mlx5::fastmap::FastMap;
use mlx5::verbs::{Access, Cq, Pd, Qp, RcRemote, Srq};
use mlx5::wqe::{CQ_UPDATE, Opcode, RaddrSeg, Sge, WqeDesc};

use super::info::{ClientConnInfo, ServerConnInfo};
use super::mem::Slots;
use super::protocol::{
    REQUEST_HEADER_SIZE, REQUEST_MAGIC, RESPONSE_HEADER_SIZE, RESPONSE_MAGIC, RequestHeader,
    ResponseHeader, STATUS_OK, request_bytes, response_bytes, trailer, trailer_offset,
};
use super::server::rc_params;
use super::{
    ACK_HELLO, CTRL_EVICT, CTRL_STOP, DOORBELL_BATCH_SIZE, IMM_ACK, IMM_NOTICE, ResponseMode,
    ScaleError,
};
use crate::rc::queues::{rc_qp_on_srq, refill_srq, zero_length_srq};

/// Client configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientConfig {
    /// Most connections in this context.
    pub max_conns: u32,
    /// Response slots per connection (at least the server's `slots_per_conn`). Default
    /// [`super::server::DEFAULT_SLOTS_PER_CONN`] (33), the server's default.
    pub slots_per_conn: u32,
    /// Slot size in bytes (at least the server's), a multiple of 64. `None` (the default):
    /// [`super::server::DEFAULT_SLOT_SIZE`] (4096) for a [`ScaleClient`]; the server's slot
    /// size for a typed [`super::ScaleRpc`] ([`super::ScaleRpcAddr::new`] and
    /// `connect` take it from the listener).
    pub slot_size: Option<u32>,
    /// Send WQEs per QP (seeds/003 §7.3: 128).
    pub max_send_wr: u32,
    /// Largest inline payload (seeds/003 §7.3: 60).
    pub max_inline: u32,
    /// Zero-length receive WQEs for notices.
    pub srq_size: u32,
    /// Entries of each CQ.
    pub cq_size: u32,
    /// Schema fingerprint (0: untyped).
    pub fingerprint: u64,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            max_conns: 64,
            slots_per_conn: super::server::DEFAULT_SLOTS_PER_CONN,
            slot_size: None,
            max_send_wr: 128,
            max_inline: 60,
            srq_size: 1024,
            cq_size: 4096,
            fingerprint: 0,
        }
    }
}

/// A call was not issued: why ([`ScaleCallErrorKind`]) and the caller's user data, handed
/// back (`user`).
pub type ScaleCallError<U> = crate::rc::Refused<ScaleCallErrorKind, U>;

/// Why a call was not issued ([`ScaleCallError`]'s `kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScaleCallErrorKind {
    /// The connection's group is not scheduled now: poll and retry.
    #[error("connection not active (its group is not scheduled): poll and retry")]
    NotActive,
    /// Every slot of the connection has a call outstanding: poll and retry.
    #[error("all slots of the connection are in use: poll and retry")]
    SlotsBusy,
    /// The request does not fit a slot.
    #[error("request larger than a slot")]
    TooLarge,
    /// The connection failed, was closed ([`ScaleClient::disconnect`]) or does not exist.
    #[error("connection failed")]
    Failed,
    /// The server evicted the connection (it did not acknowledge a stop notice within the
    /// server's `ack_timeout`; [`CallFailure::Evicted`]). Final: connect again.
    #[error("connection evicted by the server (stop not acknowledged in time): connect again")]
    Evicted,
}

/// Why a call failed after it was issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CallFailure {
    /// The server rejected the request (status code).
    #[error("server rejected the request (status {0})")]
    Rejected(u32),
    /// The connection failed (error completion: the server is gone or refused access), or
    /// was closed by [`ScaleClient::disconnect`] with the call outstanding.
    #[error("connection failed")]
    ConnFailed,
    /// The server evicted the connection: it did not acknowledge a stop notice within the
    /// server's `ack_timeout` (a client that was stopped or descheduled, or a server that
    /// held a reply that long). The server told it with an eviction notice
    /// ([`super::CTRL_EVICT`]) and closed the connection; every call outstanding on it ends
    /// with this error, later calls are refused with [`ScaleCallErrorKind::Evicted`]. The
    /// client does not rejoin by itself: connect again (a new connection, possibly in
    /// another group).
    #[error("connection evicted by the server (stop not acknowledged within its ack timeout)")]
    Evicted,
}

/// Client counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScaleClientStats {
    /// Requests written.
    pub calls: u64,
    /// Responses delivered.
    pub responses: u64,
    /// Inline request WRITEs.
    pub inline_writes: u64,
    /// Doorbells rung.
    pub doorbells: u64,
    /// Notices received (activate, stop).
    pub notices: u64,
    /// Acknowledgements sent.
    pub acks: u64,
    /// RDMA READs of responses posted ([`ResponseMode::Read`]).
    pub reads: u64,
    /// Malformed notices or responses (ignored).
    pub bad_input: u64,
    /// Error completions.
    pub error_cqes: u64,
    /// Eviction notices received (connections the server evicted).
    pub evictions: u64,
    /// Goodbyes sent ([`ScaleClient::disconnect`]).
    pub disconnects: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CState {
    Idle,
    Active { base: u32 },
    Stopped { epoch: u32 },
}

struct Outstanding<U> {
    user: U,
    req_id: u64,
    pool_slot: u32,
    read_in_flight: bool,
}

struct ClientConn<U> {
    qp: Qp,
    server: Option<ServerConnInfo>,
    state: CState,
    slots: Vec<Option<Outstanding<U>>>,
    busy: u32,
    next_req_id: u64,
    issued: u32,
    ack_pending: Option<u32>,
    failed: bool,
    /// The server evicted it (implies `failed`).
    evicted: bool,
    /// WQE index of the goodbye, until its completion arrives.
    bye_at: Option<u16>,
    pending_db: u32,
    unsignaled: u32,
    in_busy: bool,
    in_dirty: bool,
    /// Signaled READs in flight: (wqe index, slot).
    reads: std::collections::VecDeque<(u16, u32)>,
}

/// A ScaleRPC client context. `U` is kept with each call and handed back with its response.
/// Field order is drop order.
pub struct ScaleClient<U> {
    conns: Vec<ClientConn<U>>,
    by_qpn: FastMap<u32>,
    busy: Vec<u32>,
    dirty: Vec<u32>,
    resp: Slots,
    staging: Slots,
    ctrl: Slots,
    srq: Srq,
    send_cq: Cq,
    recv_cq: Cq,
    pd: Pd,
    device: mlx5::verbs::Context,
    cfg: ClientConfig,
    /// `cfg.slot_size`, resolved.
    slot_size: u32,
    stats: ScaleClientStats,
}

impl<U> std::fmt::Debug for ScaleClient<U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScaleClient")
            .field("conns", &self.conns.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<U> ScaleClient<U> {
    /// Creates a client context on `device`: response, staging and control regions for
    /// `max_conns` connections, CQs and the SRQ.
    ///
    /// # Errors
    /// [`ScaleError::Config`] (slot size not a positive multiple of 64, zero sizes);
    /// [`ScaleError::Device`].
    pub fn new(device: &mlx5::verbs::Context, cfg: ClientConfig) -> Result<Self, ScaleError> {
        let slot_size = cfg.slot_size.unwrap_or(super::server::DEFAULT_SLOT_SIZE);
        let cfg = ClientConfig {
            slot_size: Some(slot_size),
            ..cfg
        };
        if slot_size == 0 || !slot_size.is_multiple_of(64) {
            return Err(ScaleError::Config(
                "slot_size must be a positive multiple of 64",
            ));
        }
        if cfg.max_conns == 0 || cfg.slots_per_conn == 0 {
            return Err(ScaleError::Config(
                "max_conns and slots_per_conn must be > 0",
            ));
        }
        let n = (cfg.max_conns * cfg.slots_per_conn) as usize;
        let pd = device.alloc_pd()?;
        let resp = Slots::new(
            device,
            &pd,
            n,
            slot_size as usize,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )?;
        let staging = Slots::new(device, &pd, n, slot_size as usize, Access::LOCAL_WRITE)?;
        let ctrl = Slots::new(
            device,
            &pd,
            cfg.max_conns as usize,
            8,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )?;
        let send_cq = device.create_cq(cfg.cq_size)?;
        let recv_cq = device.create_cq(cfg.cq_size)?;
        let srq = zero_length_srq(device, &pd, cfg.srq_size)?;
        Ok(ScaleClient {
            conns: Vec::new(),
            by_qpn: FastMap::new(),
            busy: Vec::new(),
            dirty: Vec::new(),
            resp,
            staging,
            ctrl,
            srq,
            send_cq,
            recv_cq,
            pd,
            device: device.clone(),
            cfg,
            slot_size,
            stats: ScaleClientStats::default(),
        })
    }

    /// Counters.
    pub fn stats(&self) -> &ScaleClientStats {
        &self.stats
    }

    /// Connections created.
    pub fn num_conns(&self) -> u32 {
        self.conns.len() as u32
    }

    /// Whether connection `c` may issue now.
    pub fn is_active(&self, c: u32) -> bool {
        self.conns.get(c as usize).is_some_and(|c| {
            !c.failed && c.server.is_some() && matches!(c.state, CState::Active { .. })
        })
    }

    /// Whether connection `c` failed (or was evicted, or closed).
    pub fn is_failed(&self, c: u32) -> bool {
        self.conns.get(c as usize).is_none_or(|c| c.failed)
    }

    /// Whether the server evicted connection `c` ([`CallFailure::Evicted`]).
    pub fn is_evicted(&self, c: u32) -> bool {
        self.conns.get(c as usize).is_some_and(|c| c.evicted)
    }

    /// Closes connection `c`: sends the server a goodbye ([`super::ACK_BYE`]; the server
    /// destroys its QP and reclaims the connection's id and slots at its next poll) and fails
    /// the calls outstanding on it with [`CallFailure::ConnFailed`] through `on_response`.
    /// Later calls on `c` are refused ([`ScaleCallErrorKind::Failed`]). Nothing is sent for a
    /// connection that failed or was never connected.
    ///
    /// The goodbye is executed by the NIC after this returns: keep the client context (its
    /// QPs) alive until [`ScaleClient::goodbye_sent`] says it completed, polling meanwhile;
    /// a goodbye lost because the context was dropped first looks like a crash to the
    /// server, which then reclaims the connection at its next notice to it (its WRITE fails).
    pub fn disconnect(
        &mut self,
        c: u32,
        mut on_response: impl FnMut(U, Result<&[u8], CallFailure>),
    ) {
        let Some(conn) = self.conns.get_mut(c as usize) else {
            return;
        };
        if conn.failed || conn.server.is_none() {
            return;
        }
        conn.bye_at = Self::control(&mut self.stats, conn, super::ACK_BYE, 0);
        conn.qp.sq.ring_doorbell();
        self.stats.disconnects += 1;
        self.fail_with(c, CallFailure::ConnFailed, &mut on_response);
    }

    /// Whether the goodbye of connection `c` ([`ScaleClient::disconnect`]) completed (or
    /// cannot complete any more: the connection failed). Updated by [`ScaleClient::poll`].
    pub fn goodbye_sent(&self, c: u32) -> bool {
        self.conns
            .get(c as usize)
            .is_none_or(|c| c.bye_at.is_none())
    }

    /// Calls outstanding on connection `c`.
    pub fn outstanding(&self, c: u32) -> u32 {
        self.conns.get(c as usize).map_or(0, |c| c.busy)
    }

    /// Creates connection `c` (its QP) and returns what the server's `accept` needs.
    ///
    /// # Errors
    /// [`ScaleError::Config`] when `max_conns` connections exist; [`ScaleError::Device`].
    pub fn create_conn(&mut self) -> Result<(u32, ClientConnInfo), ScaleError> {
        let c = self.conns.len() as u32;
        if c >= self.cfg.max_conns {
            return Err(ScaleError::Config("the client has max_conns connections"));
        }
        let qp = rc_qp_on_srq(
            &self.device,
            &self.pd,
            &self.send_cq,
            &self.recv_cq,
            &self.srq,
            self.cfg.max_send_wr,
            self.cfg.max_inline,
        )?;
        self.by_qpn.insert(qp.qpn(), c)?;
        let k = self.cfg.slots_per_conn as usize;
        let port = self.device.port();
        let info = ClientConnInfo {
            qpn: qp.qpn(),
            lid: port.lid,
            gid: port.gid,
            resp_addr: self.resp.addr(c as usize * k, 0),
            resp_len: (k * self.resp.slot) as u64,
            resp_rkey: self.resp.mr.rkey,
            ctrl_addr: self.ctrl.addr(c as usize, 0),
            ctrl_rkey: self.ctrl.mr.rkey,
            fingerprint: self.cfg.fingerprint,
        };
        self.conns.push(ClientConn {
            qp,
            server: None,
            state: CState::Idle,
            slots: (0..k).map(|_| None).collect(),
            busy: 0,
            next_req_id: 1,
            issued: 0,
            ack_pending: None,
            failed: false,
            evicted: false,
            bye_at: None,
            pending_db: 0,
            unsignaled: 0,
            in_busy: false,
            in_dirty: false,
            reads: std::collections::VecDeque::new(),
        });
        Ok((c, info))
    }

    /// Completes connection `c` with the server's answer: checks it, moves the QP to RTS,
    /// takes the initial schedule and says hello (so the server may send notices).
    ///
    /// # Errors
    /// [`ScaleError::SchemaMismatch`]; [`ScaleError::Config`] if the server's slots are
    /// larger or more numerous than ours; [`ScaleError::Device`].
    pub fn connect(&mut self, c: u32, server: &ServerConnInfo) -> Result<(), ScaleError> {
        if server.fingerprint != self.cfg.fingerprint {
            return Err(ScaleError::SchemaMismatch {
                ours: self.cfg.fingerprint,
                theirs: server.fingerprint,
            });
        }
        if server.slot_size > self.slot_size || server.slots_per_conn > self.cfg.slots_per_conn {
            return Err(ScaleError::Config(
                "the server's slots are larger or more numerous than the client's: set ClientConfig::slot_size and slots_per_conn to at least the server's (ServerConnInfo::slot_size, slots_per_conn)",
            ));
        }
        let conn = self
            .conns
            .get_mut(c as usize)
            .filter(|x| x.server.is_none())
            .ok_or(ScaleError::Config("no such unconnected connection"))?;
        conn.qp.connect_rc(
            &RcRemote {
                qpn: server.qpn,
                lid: server.lid,
                gid: server.gid,
                psn: 0,
            },
            &rc_params(),
        )?;
        conn.server = Some(*server);
        conn.slots.truncate(server.slots_per_conn as usize);
        if server.active {
            conn.state = CState::Active { base: server.base };
        }
        let _ = Self::control(&mut self.stats, conn, ACK_HELLO, 0);
        conn.qp.sq.ring_doorbell();
        Ok(())
    }

    /// Posts an 8 B WRITE+IMM into the server's ack word: `word0 u32 | word1 u32`. Returns
    /// its WQE index (signaled) if posted.
    fn control(
        stats: &mut ScaleClientStats,
        conn: &mut ClientConn<U>,
        word0: u32,
        word1: u32,
    ) -> Option<u16> {
        let s = conn.server?;
        let data = (word0 as u64 | ((word1 as u64) << 32)).to_le_bytes();
        let r = conn.qp.sq.post(&WqeDesc {
            opcode: Opcode::RdmaWriteImm,
            flags: CQ_UPDATE,
            imm: IMM_ACK,
            ud: None,
            remote: Some(RaddrSeg {
                raddr: s.ack_addr,
                rkey: s.ack_rkey,
            }),
            atomic: None,
            inline: &data,
            sges: &[],
        });
        if let Err(e) = &r {
            tracing::warn!(
                word0,
                "scalerpc: connection failed: its control message could not be posted: {e}"
            );
            conn.failed = true;
        }
        conn.unsignaled = 0;
        stats.acks += u64::from(word0 != ACK_HELLO && word0 != super::ACK_BYE);
        stats.doorbells += 1;
        r.ok()
    }

    /// Whether connection `c` can take a call of at most `max_len` payload bytes now, and
    /// where: the server's information, the connection's first pool slot (`base`) and a free
    /// slot index `j` below `slots_per_conn`.
    ///
    /// # Errors
    /// In this order: `Failed` (no such connection, or it failed or was closed), `Evicted`,
    /// `NotActive` (its group is not scheduled), `TooLarge` (the request does not fit a
    /// slot), `SlotsBusy` (every slot has a call outstanding).
    #[inline]
    fn admit(
        &self,
        c: u32,
        max_len: usize,
    ) -> Result<(ServerConnInfo, u32, usize), ScaleCallErrorKind> {
        let conn = self
            .conns
            .get(c as usize)
            .ok_or(ScaleCallErrorKind::Failed)?;
        let (Some(server), false) = (conn.server, conn.failed) else {
            return Err(if conn.evicted {
                ScaleCallErrorKind::Evicted
            } else {
                ScaleCallErrorKind::Failed
            });
        };
        let CState::Active { base } = conn.state else {
            return Err(ScaleCallErrorKind::NotActive);
        };
        if request_bytes(max_len) > server.slot_size as usize || max_len > u32::MAX as usize {
            return Err(ScaleCallErrorKind::TooLarge);
        }
        let j = conn
            .slots
            .iter()
            .position(Option::is_none)
            .ok_or(ScaleCallErrorKind::SlotsBusy)?;
        Ok((server, base, j))
    }

    /// Issues a call on connection `c`: `encode` writes at most `max_len` payload bytes;
    /// `rpc_type` is carried in the header. Sent when the doorbell batch fills or at the next
    /// poll. Returns the request id.
    ///
    /// # Errors
    /// See [`ScaleCallError`]; `user` comes back.
    #[inline]
    pub fn call(
        &mut self,
        c: u32,
        rpc_type: u16,
        max_len: usize,
        user: U,
        encode: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<u64, ScaleCallError<U>> {
        let (server, base, j) = match self.admit(c, max_len) {
            Ok(a) => a,
            Err(kind) => return Err(ScaleCallError::new(kind, user)),
        };
        let conn = &mut self.conns[c as usize];
        let k = self.cfg.slots_per_conn as usize;
        let s = c as usize * k + j;
        let req_id = conn.next_req_id;
        conn.next_req_id += 1;
        // The response slot: clear the previous response's magic so only a new one matches.
        self.resp.store_u32(s, 0, 0);
        // SAFETY: staging slot `s` belongs to this call; the previous WRITE from it completed
        // (its response arrived, so the server read it).
        let b = unsafe { self.staging.bytes_mut(s) };
        let len = encode(&mut b[REQUEST_HEADER_SIZE..REQUEST_HEADER_SIZE + max_len]).min(max_len);
        RequestHeader {
            magic: REQUEST_MAGIC,
            req_id,
            rpc_type,
            payload_len: len as u32,
            client_slot_addr: self.resp.addr(s, 0),
            client_slot_rkey: self.resp.mr.rkey,
        }
        .write(&mut b[..REQUEST_HEADER_SIZE]);
        let t = trailer_offset(REQUEST_HEADER_SIZE, len);
        b[t..t + 8].copy_from_slice(&trailer(REQUEST_MAGIC, req_id).to_le_bytes());
        let total = request_bytes(len);
        let pool_slot = base + j as u32;
        let inline = total <= self.cfg.max_inline as usize;
        let sge = [Sge {
            addr: self.staging.addr(s, 0),
            len: total as u32,
            lkey: self.staging.mr.lkey,
        }];
        let signal = conn.unsignaled + 1 >= conn.qp.sq.wqe_cnt() / 4;
        let r = conn.qp.sq.post(&WqeDesc {
            opcode: Opcode::RdmaWrite,
            flags: if signal { CQ_UPDATE } else { 0 },
            imm: 0,
            ud: None,
            remote: Some(RaddrSeg {
                raddr: server.pool_addr + pool_slot as u64 * server.slot_size as u64,
                rkey: server.pool_rkey,
            }),
            atomic: None,
            inline: if inline { &b[..total] } else { &[] },
            sges: if inline { &[] } else { &sge },
        });
        if r.is_err() {
            // Send queue full: the previous batch has not completed yet.
            conn.next_req_id -= 1;
            return Err(ScaleCallError::new(ScaleCallErrorKind::SlotsBusy, user));
        }
        conn.unsignaled = if signal { 0 } else { conn.unsignaled + 1 };
        conn.slots[j] = Some(Outstanding {
            user,
            req_id,
            pool_slot,
            read_in_flight: false,
        });
        conn.busy += 1;
        conn.issued = conn.issued.wrapping_add(1);
        conn.pending_db += 1;
        self.stats.calls += 1;
        if inline {
            self.stats.inline_writes += 1;
        }
        if conn.pending_db >= DOORBELL_BATCH_SIZE {
            conn.qp.sq.ring_doorbell();
            conn.pending_db = 0;
            self.stats.doorbells += 1;
        } else if !conn.in_dirty {
            conn.in_dirty = true;
            self.dirty.push(c);
        }
        if !conn.in_busy {
            conn.in_busy = true;
            self.busy.push(c);
        }
        Ok(req_id)
    }

    /// Rings the doorbells of connections with unsent requests.
    pub fn flush(&mut self) {
        for &c in &self.dirty {
            let conn = &mut self.conns[c as usize];
            conn.in_dirty = false;
            if conn.pending_db > 0 {
                conn.qp.sq.ring_doorbell();
                conn.pending_db = 0;
                self.stats.doorbells += 1;
            }
        }
        self.dirty.clear();
    }

    /// Sends pending requests, handles the server's notices and completions, and delivers
    /// arrived responses as `on_response(user, Ok(payload) | Err(why))`. Returns how many
    /// calls completed.
    pub fn poll(&mut self, mut on_response: impl FnMut(U, Result<&[u8], CallFailure>)) -> usize {
        self.flush();
        self.poll_notices(&mut on_response);
        self.poll_send(&mut on_response);
        let mut n = 0;
        let mut i = 0;
        while i < self.busy.len() {
            let c = self.busy[i];
            n += self.collect(c, &mut on_response);
            let conn = &mut self.conns[c as usize];
            if conn.busy == 0 {
                conn.in_busy = false;
                self.busy.swap_remove(i);
                if let Some(epoch) = conn.ack_pending.take() {
                    let issued = conn.issued;
                    let _ = Self::control(&mut self.stats, conn, epoch, issued);
                    conn.qp.sq.ring_doorbell();
                }
            } else {
                i += 1;
            }
        }
        n
    }

    fn poll_notices(&mut self, on_response: &mut impl FnMut(U, Result<&[u8], CallFailure>)) {
        let mut any = false;
        while let Some(cqe) = self.recv_cq.cq.poll_one() {
            any = true;
            if self.srq.srq.is_posted(cqe.wqe_counter) {
                let _ = self.srq.srq.release(cqe.wqe_counter);
            }
            let Some(&c) = self.by_qpn.get(cqe.qpn) else {
                self.stats.bad_input += 1;
                continue;
            };
            if cqe.is_error() {
                self.fail(c, "error completion on the receive CQ", &cqe, on_response);
                continue;
            }
            if cqe.imm != IMM_NOTICE {
                self.stats.bad_input += 1;
                continue;
            }
            self.stats.notices += 1;
            // One load: the server may be writing the next notice into the word.
            let word = self.ctrl.load_u64(c as usize, 0);
            let (epoch, base) = (word as u32, (word >> 32) as u32);
            let k = self.cfg.slots_per_conn;
            let conn = &mut self.conns[c as usize];
            let Some(server) = conn.server else { continue };
            if base == CTRL_EVICT {
                self.evicted(c, on_response);
                continue;
            }
            if conn.failed {
                continue;
            }
            if base == CTRL_STOP {
                if conn.state == (CState::Stopped { epoch }) {
                    // The word holds one notice: an activation and the stop that followed it
                    // both arrived before this poll, so both completions read the stop.
                    continue;
                }
                conn.state = CState::Stopped { epoch };
                if conn.busy == 0 {
                    let issued = conn.issued;
                    let _ = Self::control(&mut self.stats, conn, epoch, issued);
                    conn.qp.sq.ring_doorbell();
                } else {
                    conn.ack_pending = Some(epoch);
                }
            } else {
                // A base beyond the pool makes our WRITEs fail with a remote access error
                // (the connection fails); only arithmetic overflow is refused here.
                if base.checked_add(server.slots_per_conn.min(k)).is_none() {
                    self.stats.bad_input += 1;
                    continue;
                }
                conn.state = CState::Active { base };
                conn.ack_pending = None;
            }
        }
        if any {
            self.recv_cq.cq.update_dbrec();
            refill_srq(&mut self.srq);
        }
    }

    fn poll_send(&mut self, on_response: &mut impl FnMut(U, Result<&[u8], CallFailure>)) {
        let mut any = false;
        while let Some(cqe) = self.send_cq.cq.poll_one() {
            any = true;
            let Some(&c) = self.by_qpn.get(cqe.qpn) else {
                continue;
            };
            let conn = &mut self.conns[c as usize];
            conn.qp.sq.retire(cqe.wqe_counter);
            if cqe.is_error() {
                conn.bye_at = None;
                self.stats.error_cqes += 1;
                self.fail(c, "error completion on the send CQ", &cqe, on_response);
                continue;
            }
            if conn.bye_at == Some(cqe.wqe_counter) {
                conn.bye_at = None;
            }
            // Completed READs (signaled, in order): their slots may be checked again.
            while let Some(&(idx, j)) = conn.reads.front() {
                if idx.wrapping_sub(cqe.wqe_counter) < 0x8000 && idx != cqe.wqe_counter {
                    break;
                }
                conn.reads.pop_front();
                if let Some(o) = conn.slots[j as usize].as_mut() {
                    o.read_in_flight = false;
                }
            }
        }
        if any {
            self.send_cq.cq.update_dbrec();
        }
    }

    /// Delivers the arrived responses of connection `c`; in READ mode posts READs for the
    /// others.
    fn collect(
        &mut self,
        c: u32,
        on_response: &mut impl FnMut(U, Result<&[u8], CallFailure>),
    ) -> usize {
        let k = self.cfg.slots_per_conn as usize;
        let conn = &mut self.conns[c as usize];
        let Some(server) = conn.server else { return 0 };
        let mut n = 0;
        let mut posted = false;
        for j in 0..conn.slots.len() {
            let Some(o) = conn.slots[j].as_mut() else {
                continue;
            };
            let s = c as usize * k + j;
            if o.read_in_flight {
                continue;
            }
            if self.resp.load_u32(s, 0) == RESPONSE_MAGIC {
                // SAFETY: response slot `s` of this connection; bytes read after the magic
                // (Acquire) and accepted only with a matching trailer (Acquire).
                let b = unsafe { self.resp.bytes(s) };
                let h = ResponseHeader::read(
                    b.first_chunk()
                        .expect("slot_size >= 64 >= RESPONSE_HEADER_SIZE, checked at construction"),
                );
                let len = h.payload_len as usize;
                if h.req_id == o.req_id && response_bytes(len) <= self.resp.slot {
                    let t = trailer_offset(RESPONSE_HEADER_SIZE, len);
                    if self.resp.load_u64(s, t) == trailer(RESPONSE_MAGIC, o.req_id) {
                        let o = conn.slots[j].take().expect("outstanding");
                        conn.busy -= 1;
                        n += 1;
                        self.stats.responses += 1;
                        if h.status == STATUS_OK {
                            on_response(
                                o.user,
                                Ok(&b[RESPONSE_HEADER_SIZE..RESPONSE_HEADER_SIZE + len]),
                            );
                        } else {
                            on_response(o.user, Err(CallFailure::Rejected(h.status)));
                        }
                        continue;
                    }
                }
            }
            if server.response_mode == ResponseMode::Read && !conn.failed {
                // Fetch the server's slot (seeds/003 §8.2).
                let sge = [Sge {
                    addr: self.resp.addr(s, 0),
                    len: server.slot_size,
                    lkey: self.resp.mr.lkey,
                }];
                let remote = RaddrSeg {
                    raddr: server.pool_addr + o.pool_slot as u64 * server.slot_size as u64,
                    rkey: server.pool_rkey,
                };
                // SAFETY: response slot `s` belongs to this call and is read only after the
                // READ's completion (`read_in_flight`); the response pool lives as long as the
                // connections' QPs.
                let r = unsafe {
                    conn.qp
                        .sq
                        .post_local_write(&WqeDesc::rdma_read(remote, &sge))
                };
                if let Ok(idx) = r {
                    o.read_in_flight = true;
                    conn.reads.push_back((idx, j as u32));
                    conn.unsignaled = 0;
                    posted = true;
                    self.stats.reads += 1;
                }
            }
        }
        if posted {
            conn.qp.sq.ring_doorbell();
            self.stats.doorbells += 1;
        }
        n
    }

    /// Connection `c` failed on an error completion (`why`, `cqe`): logged with the CQE's
    /// syndromes (PRM "CQE error syndrome"), so that a failure is diagnosable from the log.
    #[cold]
    fn fail(
        &mut self,
        c: u32,
        why: &'static str,
        cqe: &Cqe,
        on_response: &mut impl FnMut(U, Result<&[u8], CallFailure>),
    ) {
        if !self.conns[c as usize].failed {
            tracing::warn!(
                conn = c,
                qpn = cqe.qpn,
                wqe_counter = cqe.wqe_counter,
                wqe_opcode = cqe.wqe_opcode,
                syndrome = cqe.syndrome,
                vendor_syndrome = cqe.vendor_syndrome,
                "scalerpc: connection failed: {why}"
            );
        }
        self.fail_with(c, CallFailure::ConnFailed, on_response);
    }

    /// Marks connection `c` failed and ends every call outstanding on it with `why`.
    #[cold]
    fn fail_with(
        &mut self,
        c: u32,
        why: CallFailure,
        on_response: &mut impl FnMut(U, Result<&[u8], CallFailure>),
    ) {
        let conn = &mut self.conns[c as usize];
        conn.failed = true;
        conn.ack_pending = None;
        for o in conn.slots.iter_mut() {
            if let Some(o) = o.take() {
                conn.busy -= 1;
                on_response(o.user, Err(why));
            }
        }
    }

    /// The server's eviction notice for connection `c`: responses that arrived before it
    /// are delivered (RC order: the server wrote them before the notice), the rest of the
    /// outstanding calls end with [`CallFailure::Evicted`].
    #[cold]
    fn evicted(&mut self, c: u32, on_response: &mut impl FnMut(U, Result<&[u8], CallFailure>)) {
        let conn = &mut self.conns[c as usize];
        if conn.evicted {
            return;
        }
        tracing::debug!(conn = c, "scalerpc: connection evicted by the server");
        self.stats.evictions += 1;
        if !conn.failed {
            self.collect(c, on_response);
        }
        let conn = &mut self.conns[c as usize];
        conn.evicted = true;
        conn.state = CState::Idle;
        self.fail_with(c, CallFailure::Evicted, on_response);
    }
}
