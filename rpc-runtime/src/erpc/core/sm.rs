//! Session management: connect, disconnect and keepalive, in-band on the datagram channel.
//!
//! An SM packet is a packet header with `dest_session_num` = [`SM_SESSION_NUM`],
//! `pkt_type = Req`, `req_type` = the [`SmKind`], `msg_size` = 64, `pkt_num = req_num = 0`,
//! session token 0, followed by a 64-byte body (little endian):
//!
//! | bytes  | field                                                              |
//! |--------|--------------------------------------------------------------------|
//! | 0..8   | connect token (random, chosen by the client): the session's 64-bit SM token |
//! | 8..10  | client session number                                              |
//! | 10..12 | server session number                                              |
//! | 12     | status ([`SmStatus`])                                              |
//! | 13     | zero                                                               |
//! | 14..16 | session token of the sender's session (connect request: the client's, connect response: the server's) |
//! | 16..24 | sender's schema fingerprint                                        |
//! | 24..28 | sender's MTU (bytes)                                               |
//! | 28..32 | sender's `max_msg_size` (bytes)                                    |
//! | 32..34 | sender's `session_credits` (packets)                               |
//! | 34..36 | zero                                                               |
//! | 36..40 | sender's receive-ring size (datagrams, saturated; `u32::MAX`: no limit) |
//! | 40..44 | sender's live sessions (saturated)                                 |
//! | 44..48 | zero                                                               |
//! | 48..56 | connect request: the client session's request-number base (a multiple of 8 below 2^43); otherwise 0 (issue 14) |
//! | 56..60 | sender's per-source session limit (saturated; issue 14)            |
//! | 60..64 | zero                                                               |
//!
//! (Issue 14 grew the body from 48 to 64 bytes, adding bytes 48..64; endpoints of both
//! versions do not interoperate: a 48-byte body is refused as truncated.)
//!
//! The client's requests (connect, disconnect, ping) are re-sent until answered; the server
//! answers duplicates idempotently: a repeated connect (same client address and token) gets
//! the same session number, a disconnect of an unknown session is acknowledged.
//!
//! A connect request is validated before a session is created (seeds/000 §12.4: the server
//! checks the transport, MTU included, and its resources), in this order: request-number
//! base (else dropped as a bad SM packet), schema fingerprint (`SchemaMismatch`), MTU,
//! `max_msg_size` and session credits, which must equal the server's (`ConfigMismatch`; a
//! client and server that differ in these would otherwise retransmit forever), the
//! sessions its source already holds (`SourceLimit`, issue 14, see `admit.rs`), room in the
//! receive ring (`NoRingEntries`, admission control, see
//! [`Config::rx_ring_entries`](super::Config::rx_ring_entries)), and a free session number
//! (`NoResources`). Every connect response carries the server's values, so the client's
//! error names the field and both values.
//!
//! # Tokens (issues 12 and 14)
//! Each side picks a random session token for its session when it creates it (different from
//! the last token used on the same session number) and sends it in the handshake; data and
//! control packets carry the receiver's token in the header (`pkthdr`), and a packet with
//! another token is dropped and counted (`Stats::drop_stale_token`): a stale packet of an
//! ended session never reaches the session that reuses its number (issue 12; seeds/002 §4,
//! invariant I3). The header has room for 16 bits only, so the client also picks a random
//! request-number base for the session (see `pkthdr` for what a forger must then guess).
//!
//! SM packets of a session (disconnect, ping and the three responses) are authenticated by
//! the 64-bit connect token in the body, this packet kind's extension field: the server
//! acts on a disconnect or ping only if the named server session's peer address and connect
//! token are the packet's, the client on a response only if its session's are. Anything
//! else that names a live session is dropped and counted (`Stats::drop_sm_bad_token`), and
//! the session is untouched: a forged disconnect never ends a session. Before any of this,
//! SM requests pass their source's rate limit (`admit.rs`).

use std::hash::Hash;

use super::session::{Session, SessionState};
use super::sslot::{SLOTS_PER_SESSION, slot_of};
use super::{ConfigField, ErpcCallError, Event, Rpc, SessionError, SessionId, Time, Tx};
use crate::erpc::pkthdr::{PKTHDR_SIZE, PktHdr, PktType};

/// `dest_session_num` of session-management packets (never a real session number).
pub(super) const SM_SESSION_NUM: u16 = u16::MAX;
/// Request-number bases are below this (2^43): a session then has at least 2^43 request
/// numbers left, 2^40 requests per slot, before the 44-bit field runs out.
pub(super) const REQ_BASE_LIMIT: u64 = 1 << 43;
/// Size of the SM body.
const SM_BODY_LEN: usize = 64;
/// Size of a whole SM packet.
pub(super) const SM_PKT_LEN: usize = PKTHDR_SIZE + SM_BODY_LEN;

/// SM packet kinds (carried in `req_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum SmKind {
    ConnectReq = 1,
    ConnectResp = 2,
    DisconnectReq = 3,
    DisconnectResp = 4,
    Ping = 5,
    Pong = 6,
}

impl SmKind {
    fn from_u8(v: u8) -> Option<SmKind> {
        Some(match v {
            1 => SmKind::ConnectReq,
            2 => SmKind::ConnectResp,
            3 => SmKind::DisconnectReq,
            4 => SmKind::DisconnectResp,
            5 => SmKind::Ping,
            6 => SmKind::Pong,
            _ => return None,
        })
    }
}

/// Outcome carried by SM responses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum SmStatus {
    Ok = 0,
    SchemaMismatch = 1,
    NoResources = 2,
    NoSession = 3,
    ConfigMismatch = 4,
    NoRingEntries = 5,
    SourceLimit = 6,
}

impl SmStatus {
    fn from_u8(v: u8) -> Option<SmStatus> {
        Some(match v {
            0 => SmStatus::Ok,
            1 => SmStatus::SchemaMismatch,
            2 => SmStatus::NoResources,
            3 => SmStatus::NoSession,
            4 => SmStatus::ConfigMismatch,
            5 => SmStatus::NoRingEntries,
            6 => SmStatus::SourceLimit,
            _ => return None,
        })
    }
}

/// A decoded SM packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SmPkt {
    pub kind: SmKind,
    pub token: u64,
    pub client_sess: u16,
    pub server_sess: u16,
    pub status: SmStatus,
    /// Session token of the sender's session (connect request and response).
    pub sess_token: u16,
    pub fingerprint: u64,
    /// The sender's settings (bytes, bytes, packets, datagrams) and live sessions.
    pub mtu: u32,
    pub max_msg_size: u32,
    pub credits: u16,
    pub ring_entries: u32,
    pub sessions: u32,
    /// Connect request: the client session's request-number base (`ClientSession::req_base`);
    /// 0 in other packets.
    pub req_base: u64,
    /// The sender's per-source session limit (saturated).
    pub src_limit: u32,
}

impl SmPkt {
    /// Writes the packet into `buf` (at least [`SM_PKT_LEN`] bytes) and returns its length.
    pub(super) fn encode(&self, buf: &mut [u8]) -> usize {
        let hdr = PktHdr::new(
            self.kind as u8,
            SM_BODY_LEN as u32,
            SM_SESSION_NUM,
            PktType::Req,
            0,
            0,
        )
        .map(|h| h.encode())
        .unwrap_or([0; PKTHDR_SIZE]);
        buf[..PKTHDR_SIZE].copy_from_slice(&hdr);
        let b = &mut buf[PKTHDR_SIZE..SM_PKT_LEN];
        b.fill(0);
        b[0..8].copy_from_slice(&self.token.to_le_bytes());
        b[8..10].copy_from_slice(&self.client_sess.to_le_bytes());
        b[10..12].copy_from_slice(&self.server_sess.to_le_bytes());
        b[12] = self.status as u8;
        b[14..16].copy_from_slice(&self.sess_token.to_le_bytes());
        b[16..24].copy_from_slice(&self.fingerprint.to_le_bytes());
        b[24..28].copy_from_slice(&self.mtu.to_le_bytes());
        b[28..32].copy_from_slice(&self.max_msg_size.to_le_bytes());
        b[32..34].copy_from_slice(&self.credits.to_le_bytes());
        b[36..40].copy_from_slice(&self.ring_entries.to_le_bytes());
        b[40..44].copy_from_slice(&self.sessions.to_le_bytes());
        b[48..56].copy_from_slice(&self.req_base.to_le_bytes());
        b[56..60].copy_from_slice(&self.src_limit.to_le_bytes());
        SM_PKT_LEN
    }

    /// Parses an SM packet from its header and body.
    pub(super) fn decode(hdr: &PktHdr, body: &[u8]) -> Option<SmPkt> {
        if hdr.pkt_type() != PktType::Req
            || hdr.msg_size() as usize != SM_BODY_LEN
            || hdr.pkt_num() != 0
            || hdr.req_num() != 0
            || hdr.token() != 0
            || body.len() != SM_BODY_LEN
            || body[13] != 0
            || body[34..36] != [0; 2]
            || body[44..48] != [0; 4]
            || body[60..64] != [0; 4]
        {
            return None;
        }
        let u16_at = |i: usize| Some(u16::from_le_bytes(body[i..i + 2].try_into().ok()?));
        let u32_at = |i: usize| Some(u32::from_le_bytes(body[i..i + 4].try_into().ok()?));
        let u64_at = |i: usize| Some(u64::from_le_bytes(body[i..i + 8].try_into().ok()?));
        Some(SmPkt {
            kind: SmKind::from_u8(hdr.req_type())?,
            token: u64_at(0)?,
            client_sess: u16_at(8)?,
            server_sess: u16_at(10)?,
            status: SmStatus::from_u8(body[12])?,
            sess_token: u16_at(14)?,
            fingerprint: u64_at(16)?,
            mtu: u32_at(24)?,
            max_msg_size: u32_at(28)?,
            credits: u16_at(32)?,
            ring_entries: u32_at(36)?,
            sessions: u32_at(40)?,
            req_base: u64_at(48)?,
            src_limit: u32_at(56)?,
        })
    }
}

/// An SM packet in the transmit queue: its own fields only; the sender's settings are added
/// when it is rendered ([`Rpc::sm_pkt`]), which keeps transmit-queue entries small (they are
/// moved on every packet of the hot path).
#[derive(Debug, Clone, Copy)]
pub(super) struct SmOut {
    pub kind: SmKind,
    pub status: SmStatus,
    pub client_sess: u16,
    pub server_sess: u16,
    pub sess_token: u16,
    pub token: u64,
    pub req_base: u64,
}

/// `v` as a `u32`, saturated.
fn sat32(v: usize) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

impl<A: Copy + Eq + Hash + std::fmt::Debug> Rpc<A> {
    /// Client: starts connecting a session to `peer` and returns its number at once;
    /// [`Event::SessionConnected`] or [`Event::SessionFailed`] follows (the latter at the
    /// latest `failure_timeout` after this call if the server never answers: connect
    /// requests are re-sent every `sm_rto` meanwhile). Requests may be enqueued right away
    /// (they wait for the connection).
    ///
    /// # Errors
    /// [`ErpcCallError::NoSessions`] when `max_sessions` are in use;
    /// [`ErpcCallError::NoRingEntries`] when this endpoint's receive ring cannot absorb one more
    /// session's packets ([`Config::rx_ring_entries`](super::Config::rx_ring_entries)).
    pub fn create_session(&mut self, now: Time, peer: A) -> Result<SessionId, ErpcCallError> {
        self.ring_room()
            .map_err(
                |(ring_entries, sessions, credits)| ErpcCallError::NoRingEntries {
                    ring_entries,
                    sessions,
                    credits,
                },
            )?;
        let token = self.random();
        let req_base = self.random() & (REQ_BASE_LIMIT - 1) & !(SLOTS_PER_SESSION as u64 - 1);
        let generation = self.new_generation();
        let s = Session::new_client(peer, token, generation, &self.cfg, req_base, now);
        let sid = self
            .alloc_session_armed(s)
            .ok_or(ErpcCallError::NoSessions)?;
        self.send_client_sm(now, sid);
        Ok(sid)
    }

    /// Client: disconnects an idle connected session; [`Event::SessionDisconnected`] follows
    /// (or `SessionFailed` if the server stays silent).
    ///
    /// # Errors
    /// [`ErpcCallError::BadSession`] unless `session` is a connected client session,
    /// [`ErpcCallError::Busy`] while it has requests in flight or queued.
    pub fn destroy_session(&mut self, now: Time, session: SessionId) -> Result<(), ErpcCallError> {
        let s = super::sess_mut(&mut self.sessions, session).ok_or(ErpcCallError::BadSession)?;
        let c = s.role.client().ok_or(ErpcCallError::BadSession)?;
        if s.state != SessionState::Connected {
            return Err(ErpcCallError::BadSession);
        }
        if c.busy() {
            return Err(ErpcCallError::Busy);
        }
        s.state = SessionState::Disconnecting;
        self.send_client_sm(now, session);
        Ok(())
    }

    /// Renders SM packet `o` into `buf` (at least [`SM_PKT_LEN`] bytes); returns its length.
    /// Out of line: the transmit path of data packets stays small.
    #[cold]
    #[inline(never)]
    pub(super) fn render_sm(&self, o: &SmOut, buf: &mut [u8]) -> usize {
        self.sm_pkt(o).encode(buf)
    }

    /// The SM packet `o` with this endpoint's settings, as rendered for sending.
    pub(super) fn sm_pkt(&self, o: &SmOut) -> SmPkt {
        let cfg = &self.cfg;
        SmPkt {
            kind: o.kind,
            token: o.token,
            client_sess: o.client_sess,
            server_sess: o.server_sess,
            status: o.status,
            sess_token: o.sess_token,
            fingerprint: cfg.schema_fingerprint,
            mtu: sat32(cfg.mtu),
            max_msg_size: sat32(cfg.max_msg_size),
            // At most MAX_PKT_NUM (checked by `Rpc::new`).
            credits: u16::try_from(cfg.session_credits).unwrap_or(u16::MAX),
            ring_entries: sat32(cfg.rx_ring_entries.unwrap_or(usize::MAX)),
            sessions: sat32(self.live_sessions),
            req_base: o.req_base,
            src_limit: sat32(self.src_limit),
        }
    }

    /// Client: (re-)sends the SM request the session's state calls for.
    fn send_client_sm(&mut self, now: Time, sid: SessionId) {
        let sm_rto = self.cfg.sm_rto;
        let Some(s) = super::sess_mut(&mut self.sessions, sid) else {
            return;
        };
        let kind = match s.state {
            SessionState::Connecting => SmKind::ConnectReq,
            SessionState::Disconnecting => SmKind::DisconnectReq,
            SessionState::Connected => SmKind::Ping,
        };
        // A ping is re-sent every `sm_rto` until something arrives (`sm_deadline` also waits
        // for `keepalive` of silence).
        s.sm_due = now + sm_rto;
        let (token, remote, rx_token, dest) = (s.token, s.remote_num, s.rx_token, s.peer);
        let base = match (kind, s.role.client()) {
            (SmKind::ConnectReq, Some(c)) => c.req_base,
            _ => 0,
        };
        let out = SmOut {
            kind,
            status: SmStatus::Ok,
            client_sess: sid.0,
            server_sess: remote,
            sess_token: rx_token,
            token,
            req_base: base,
        };
        self.txq.push_back(Tx::Sm { dest, out });
        self.stats.sm_tx += 1;
        self.arm(now + sm_rto);
    }

    fn send_sm_resp(
        &mut self,
        dest: A,
        req: &SmPkt,
        kind: SmKind,
        server_sess: u16,
        status: SmStatus,
        sess_token: u16,
    ) {
        let out = SmOut {
            kind,
            status,
            client_sess: req.client_sess,
            server_sess,
            sess_token,
            token: req.token,
            req_base: 0,
        };
        self.txq.push_back(Tx::Sm { dest, out });
        self.stats.sm_tx += 1;
    }

    /// When the client session's next SM re-send or ping is due.
    pub(super) fn sm_deadline(&self, s: &Session<A>) -> Option<Time> {
        if !s.role.is_client() {
            return None;
        }
        Some(match s.state {
            SessionState::Connected => s.sm_due.max(s.last_rx + self.cfg.keepalive),
            _ => s.sm_due,
        })
    }

    /// Client: re-sends unanswered SM requests and sends keepalive pings when due.
    pub(super) fn sm_timers(&mut self, now: Time, sid: SessionId) {
        let Some(s) = self.session(sid) else { return };
        if self.sm_deadline(s).is_some_and(|d| d <= now) {
            self.send_client_sm(now, sid);
        }
    }

    /// Processes a packet addressed to [`SM_SESSION_NUM`]. Requests (connect, disconnect,
    /// ping, and anything not a response) first pass their source's rate limit
    /// (`admit.rs`); requests and responses that name a live session with another peer or
    /// connect token are dropped and counted (`Stats::drop_sm_bad_token`, issue 14).
    #[cold]
    #[inline(never)]
    pub(super) fn handle_sm(&mut self, now: Time, from: A, hdr: &PktHdr, body: &[u8]) {
        let response = matches!(
            SmKind::from_u8(hdr.req_type()),
            Some(SmKind::ConnectResp | SmKind::DisconnectResp | SmKind::Pong)
        );
        if !response && !self.sm_limiter.admit(&from, now) {
            self.stats.drop_sm_rate_limited += 1;
            return;
        }
        let Some(pkt) = SmPkt::decode(hdr, body) else {
            if body.len() < SM_BODY_LEN {
                self.stats.drop_truncated += 1;
            } else {
                self.stats.drop_bad_sm += 1;
            }
            return;
        };
        match pkt.kind {
            SmKind::ConnectReq => self.server_connect(now, from, &pkt),
            SmKind::DisconnectReq => {
                let sid = SessionId(pkt.server_sess);
                match self.server_session_of(sid, from, pkt.token) {
                    Some(true) => {
                        self.free_session(sid);
                        self.events.push_back(Event::ServerSessionClosed(sid));
                    }
                    // Forged, or a late duplicate after the number was reused: the session
                    // stays. (The acknowledgement below changes nothing: the real client
                    // drops it, its connect token differs.)
                    Some(false) => self.stats.drop_sm_bad_token += 1,
                    None => {}
                }
                self.send_sm_resp(
                    from,
                    &pkt,
                    SmKind::DisconnectResp,
                    pkt.server_sess,
                    SmStatus::Ok,
                    0,
                );
            }
            SmKind::Ping => {
                let sid = SessionId(pkt.server_sess);
                let status = match self.server_session_of(sid, from, pkt.token) {
                    Some(true) => {
                        if let Some(s) = super::sess_mut(&mut self.sessions, sid) {
                            s.last_rx = now;
                        }
                        SmStatus::Ok
                    }
                    Some(false) => {
                        self.stats.drop_sm_bad_token += 1;
                        SmStatus::NoSession
                    }
                    None => SmStatus::NoSession,
                };
                self.send_sm_resp(from, &pkt, SmKind::Pong, pkt.server_sess, status, 0);
            }
            SmKind::ConnectResp | SmKind::DisconnectResp | SmKind::Pong => {
                self.client_sm_resp(now, from, &pkt)
            }
        }
    }

    /// Whether server session `sid` belongs to `from` with connect token `token`: None if
    /// there is no such server session, `Some(false)` if it is another peer's or another
    /// connection's.
    fn server_session_of(&self, sid: SessionId, from: A, token: u64) -> Option<bool> {
        let s = self.session(sid).filter(|s| !s.role.is_client())?;
        Some(s.peer == from && s.token == token)
    }

    /// Which setting of a connect request `pkt` differs from this endpoint's, if any.
    fn config_mismatch(&self, pkt: &SmPkt) -> Option<(ConfigField, u64, u64)> {
        let ours = self.sm_pkt(&SmOut {
            kind: pkt.kind,
            status: SmStatus::Ok,
            client_sess: 0,
            server_sess: 0,
            sess_token: 0,
            token: 0,
            req_base: 0,
        });
        [
            (ConfigField::Mtu, pkt.mtu, ours.mtu),
            (ConfigField::MaxMsgSize, pkt.max_msg_size, ours.max_msg_size),
            (
                ConfigField::SessionCredits,
                u32::from(pkt.credits),
                u32::from(ours.credits),
            ),
        ]
        .into_iter()
        .find(|(_, theirs, ours)| theirs != ours)
        .map(|(f, theirs, ours)| (f, u64::from(theirs), u64::from(ours)))
    }

    fn server_connect(&mut self, now: Time, from: A, pkt: &SmPkt) {
        if let Some(&sid) = self.conn_tokens.get(&(from, pkt.token)) {
            // Duplicate: same answer as before.
            let mut tok = 0;
            if let Some(s) = super::sess_mut(&mut self.sessions, sid) {
                s.last_rx = now;
                tok = s.rx_token;
            }
            self.send_sm_resp(from, pkt, SmKind::ConnectResp, sid.0, SmStatus::Ok, tok);
            return;
        }
        // A base the client could not have produced (not a multiple of the window, or too
        // large to leave room for its requests) is a bad packet.
        if pkt.req_base >= REQ_BASE_LIMIT || slot_of(pkt.req_base) != 0 {
            self.stats.drop_bad_sm += 1;
            return;
        }
        let refuse = if pkt.fingerprint != self.cfg.schema_fingerprint {
            Some(SmStatus::SchemaMismatch)
        } else if self.config_mismatch(pkt).is_some() {
            Some(SmStatus::ConfigMismatch)
        } else if self.src_sessions.get(&from).copied().unwrap_or(0) >= self.src_limit {
            self.stats.connects_refused_source_limit += 1;
            Some(SmStatus::SourceLimit)
        } else if self.ring_room().is_err() {
            Some(SmStatus::NoRingEntries)
        } else {
            None
        };
        if let Some(status) = refuse {
            self.stats.connects_refused += 1;
            self.send_sm_resp(from, pkt, SmKind::ConnectResp, 0, status, 0);
            return;
        }
        let generation = self.new_generation();
        let s = Session::new_server(
            from,
            pkt.client_sess,
            pkt.token,
            pkt.sess_token,
            generation,
            pkt.req_base,
            now,
        );
        match self.alloc_session_armed(s) {
            Some(sid) => {
                self.conn_tokens.insert((from, pkt.token), sid);
                *self.src_sessions.entry(from).or_insert(0) += 1;
                self.arm(now.saturating_add(self.cfg.idle_session_timeout));
                let tok = self.session(sid).map_or(0, |s| s.rx_token);
                self.send_sm_resp(from, pkt, SmKind::ConnectResp, sid.0, SmStatus::Ok, tok);
            }
            None => {
                self.stats.connects_refused += 1;
                self.send_sm_resp(from, pkt, SmKind::ConnectResp, 0, SmStatus::NoResources, 0)
            }
        }
    }

    fn client_sm_resp(&mut self, now: Time, from: A, pkt: &SmPkt) {
        let sid = SessionId(pkt.client_sess);
        // The connect token (random, 64 bits) identifies the session's SM exchange.
        let Some(s) = self.session_mut(sid).filter(|s| s.role.is_client()) else {
            self.stats.drop_unknown_session += 1;
            return;
        };
        if s.peer != from || s.token != pkt.token {
            // Forged, or a late answer to a previous owner of the session number.
            self.stats.drop_sm_bad_token += 1;
            return;
        }
        match (pkt.kind, s.state) {
            (SmKind::ConnectResp, SessionState::Connecting) => {
                s.last_rx = now;
                match pkt.status {
                    SmStatus::Ok => {
                        s.remote_num = pkt.server_sess;
                        s.tx_token = pkt.sess_token;
                        s.state = SessionState::Connected;
                        s.sm_due = now;
                        self.arm(now + self.cfg.keepalive);
                        self.events.push_back(Event::SessionConnected(sid));
                        self.drain_backlog(now, sid);
                    }
                    SmStatus::SchemaMismatch => self.fail_client_session(
                        sid,
                        SessionError::SchemaMismatch {
                            server: pkt.fingerprint,
                        },
                    ),
                    SmStatus::ConfigMismatch => {
                        // The response carries the server's settings.
                        let error = match self.config_mismatch(pkt) {
                            Some((field, server, client)) => SessionError::ConfigMismatch {
                                field,
                                client,
                                server,
                            },
                            None => SessionError::NoResources,
                        };
                        self.fail_client_session(sid, error)
                    }
                    SmStatus::NoRingEntries => self.fail_client_session(
                        sid,
                        SessionError::NoRingEntries {
                            ring_entries: u64::from(pkt.ring_entries),
                            sessions: u64::from(pkt.sessions),
                            credits: u64::from(pkt.credits),
                        },
                    ),
                    SmStatus::SourceLimit => self.fail_client_session(
                        sid,
                        SessionError::SourceLimit {
                            limit: u64::from(pkt.src_limit),
                        },
                    ),
                    SmStatus::NoResources => {
                        self.fail_client_session(sid, SessionError::NoResources)
                    }
                    SmStatus::NoSession => self.fail_client_session(sid, SessionError::SessionLost),
                }
            }
            (SmKind::DisconnectResp, SessionState::Disconnecting) => {
                self.free_session(sid);
                self.events.push_back(Event::SessionDisconnected(sid));
            }
            (SmKind::Pong, SessionState::Connected) if pkt.server_sess == s.remote_num => {
                if pkt.status == SmStatus::Ok {
                    s.last_rx = now;
                } else {
                    self.fail_client_session(sid, SessionError::SessionLost);
                }
            }
            _ => self.stats.drop_bad_sm += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sm_pkt_round_trip_and_rejects() {
        let p = SmPkt {
            kind: SmKind::ConnectResp,
            token: 0x0123_4567_89ab_cdef,
            client_sess: 7,
            server_sess: 9,
            status: SmStatus::SchemaMismatch,
            sess_token: 0xbeef,
            fingerprint: 42,
            mtu: 1472,
            max_msg_size: 8 << 20,
            credits: 8,
            ring_entries: 512,
            sessions: 3,
            req_base: 0x0000_0123_4567_89a8,
            src_limit: 17,
        };
        let mut buf = [0u8; 128];
        let n = p.encode(&mut buf);
        assert_eq!(n, SM_PKT_LEN);
        let hdr = PktHdr::decode(&buf).unwrap();
        assert_eq!(hdr.dest_session_num(), SM_SESSION_NUM);
        assert_eq!(SmPkt::decode(&hdr, &buf[PKTHDR_SIZE..n]), Some(p));
        assert_eq!(SmPkt::decode(&hdr, &buf[PKTHDR_SIZE..n - 1]), None);
        let mut bad = buf;
        bad[PKTHDR_SIZE + 12] = 77; // unknown status
        assert_eq!(SmPkt::decode(&hdr, &bad[PKTHDR_SIZE..n]), None);
        let mut bad = buf;
        bad[PKTHDR_SIZE + 45] = 1; // reserved bytes
        assert_eq!(SmPkt::decode(&hdr, &bad[PKTHDR_SIZE..n]), None);
        let mut bad = buf;
        bad[PKTHDR_SIZE + 61] = 1; // reserved bytes after the extension
        assert_eq!(SmPkt::decode(&hdr, &bad[PKTHDR_SIZE..n]), None);
        let hdr2 = PktHdr::new(99, 48, SM_SESSION_NUM, PktType::Req, 0, 0).unwrap();
        assert_eq!(SmPkt::decode(&hdr2, &buf[PKTHDR_SIZE..n]), None);
        // A session token in an SM header is refused.
        assert_eq!(
            SmPkt::decode(&hdr.with_token(1), &buf[PKTHDR_SIZE..n]),
            None
        );
    }
}
