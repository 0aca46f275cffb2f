//! Session management: connect, disconnect and keepalive, in-band on the datagram channel.
//!
//! An SM packet is a packet header with `dest_session_num` = [`SM_SESSION_NUM`],
//! `pkt_type = Req`, `req_type` = the [`SmKind`], `msg_size` = 24, `pkt_num = req_num = 0`,
//! followed by a 24-byte body (little endian):
//!
//! | bytes  | field                      |
//! |--------|----------------------------|
//! | 0..8   | token                      |
//! | 8..10  | client session number      |
//! | 10..12 | server session number      |
//! | 12     | status ([`SmStatus`])      |
//! | 13..16 | zero                       |
//! | 16..24 | schema fingerprint         |
//!
//! The client's requests (connect, disconnect, ping) are re-sent until answered; the server
//! answers duplicates idempotently: a repeated connect (same client address and token) gets
//! the same session number, a disconnect of an unknown session is acknowledged. A connect
//! whose fingerprint differs from the server's is refused with `SchemaMismatch`.

use std::hash::Hash;

use super::session::{Session, SessionState};
use super::{CallError, Event, Rpc, RpcError, SessionId, Time, Tx};
use crate::erpc::pkthdr::{PKTHDR_SIZE, PktHdr, PktType};

/// `dest_session_num` of session-management packets (never a real session number).
pub const SM_SESSION_NUM: u16 = u16::MAX;
/// Size of the SM body.
const SM_BODY_LEN: usize = 24;
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
}

impl SmStatus {
    fn from_u8(v: u8) -> Option<SmStatus> {
        Some(match v {
            0 => SmStatus::Ok,
            1 => SmStatus::SchemaMismatch,
            2 => SmStatus::NoResources,
            3 => SmStatus::NoSession,
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
    pub fingerprint: u64,
}

impl SmPkt {
    /// Writes the packet into `buf` (at least [`SM_PKT_LEN`] bytes) and returns its length.
    pub fn encode(&self, buf: &mut [u8]) -> usize {
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
        b[0..8].copy_from_slice(&self.token.to_le_bytes());
        b[8..10].copy_from_slice(&self.client_sess.to_le_bytes());
        b[10..12].copy_from_slice(&self.server_sess.to_le_bytes());
        b[12] = self.status as u8;
        b[13..16].fill(0);
        b[16..24].copy_from_slice(&self.fingerprint.to_le_bytes());
        SM_PKT_LEN
    }

    /// Parses an SM packet from its header and body.
    pub fn decode(hdr: &PktHdr, body: &[u8]) -> Option<SmPkt> {
        if hdr.pkt_type() != PktType::Req
            || hdr.msg_size() as usize != SM_BODY_LEN
            || hdr.pkt_num() != 0
            || hdr.req_num() != 0
            || body.len() != SM_BODY_LEN
            || body[13..16] != [0; 3]
        {
            return None;
        }
        Some(SmPkt {
            kind: SmKind::from_u8(hdr.req_type())?,
            token: u64::from_le_bytes(body[0..8].try_into().ok()?),
            client_sess: u16::from_le_bytes(body[8..10].try_into().ok()?),
            server_sess: u16::from_le_bytes(body[10..12].try_into().ok()?),
            status: SmStatus::from_u8(body[12])?,
            fingerprint: u64::from_le_bytes(body[16..24].try_into().ok()?),
        })
    }
}

impl<A: Copy + Eq + Hash + std::fmt::Debug> Rpc<A> {
    /// Client: starts connecting a session to `peer` and returns its number at once;
    /// [`Event::SessionConnected`] or [`Event::SessionFailed`] follows. Requests may be
    /// enqueued right away (they wait for the connection).
    ///
    /// # Errors
    /// [`CallError::NoSessions`] when `max_sessions` are in use.
    pub fn create_session(&mut self, now: Time, peer: A) -> Result<SessionId, CallError> {
        self.token_counter += 1;
        let token = self
            .cfg
            .token_nonce
            .wrapping_add(self.token_counter.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let generation = self.new_generation();
        let s = Session::new_client(
            peer,
            token,
            generation,
            self.cfg.session_credits,
            self.cfg.link_bandwidth_bps as f64,
            now,
        );
        let sid = self.alloc_session_armed(s).ok_or(CallError::NoSessions)?;
        self.send_client_sm(now, sid);
        Ok(sid)
    }

    /// Client: disconnects an idle connected session; [`Event::SessionDisconnected`] follows
    /// (or `SessionFailed` if the server stays silent).
    ///
    /// # Errors
    /// [`CallError::BadSession`] unless `session` is a connected client session,
    /// [`CallError::Busy`] while it has requests in flight or queued.
    pub fn destroy_session(&mut self, now: Time, session: SessionId) -> Result<(), CallError> {
        let s = super::sess_mut(&mut self.sessions, session).ok_or(CallError::BadSession)?;
        let c = s.role.client().ok_or(CallError::BadSession)?;
        if s.state != SessionState::Connected {
            return Err(CallError::BadSession);
        }
        if c.busy() {
            return Err(CallError::Busy);
        }
        s.state = SessionState::Disconnecting;
        self.send_client_sm(now, session);
        Ok(())
    }

    /// Client: (re-)sends the SM request the session's state calls for.
    fn send_client_sm(&mut self, now: Time, sid: SessionId) {
        let (sm_rto, fp) = (self.cfg.sm_rto, self.cfg.schema_fingerprint);
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
        let pkt = SmPkt {
            kind,
            token: s.token,
            client_sess: sid.0,
            server_sess: s.remote_num,
            status: SmStatus::Ok,
            fingerprint: fp,
        };
        let dest = s.peer;
        self.txq.push_back(Tx::Sm { dest, pkt });
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
    ) {
        let pkt = SmPkt {
            kind,
            token: req.token,
            client_sess: req.client_sess,
            server_sess,
            status,
            fingerprint: self.cfg.schema_fingerprint,
        };
        self.txq.push_back(Tx::Sm { dest, pkt });
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

    /// Processes a packet addressed to [`SM_SESSION_NUM`].
    pub(super) fn handle_sm(&mut self, now: Time, from: A, hdr: &PktHdr, body: &[u8]) {
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
                if self
                    .session(sid)
                    .is_some_and(|s| !s.role.is_client() && s.peer == from && s.token == pkt.token)
                {
                    self.free_session(sid);
                    self.events.push_back(Event::ServerSessionClosed(sid));
                }
                self.send_sm_resp(
                    from,
                    &pkt,
                    SmKind::DisconnectResp,
                    pkt.server_sess,
                    SmStatus::Ok,
                );
            }
            SmKind::Ping => {
                let sid = SessionId(pkt.server_sess);
                let status = match super::sess_mut(&mut self.sessions, sid) {
                    Some(s) if !s.role.is_client() && s.peer == from && s.token == pkt.token => {
                        s.last_rx = now;
                        SmStatus::Ok
                    }
                    _ => SmStatus::NoSession,
                };
                self.send_sm_resp(from, &pkt, SmKind::Pong, pkt.server_sess, status);
            }
            SmKind::ConnectResp | SmKind::DisconnectResp | SmKind::Pong => {
                self.client_sm_resp(now, from, &pkt)
            }
        }
    }

    fn server_connect(&mut self, now: Time, from: A, pkt: &SmPkt) {
        if let Some(&sid) = self.conn_tokens.get(&(from, pkt.token)) {
            // Duplicate: same answer as before.
            if let Some(s) = super::sess_mut(&mut self.sessions, sid) {
                s.last_rx = now;
            }
            self.send_sm_resp(from, pkt, SmKind::ConnectResp, sid.0, SmStatus::Ok);
            return;
        }
        if pkt.fingerprint != self.cfg.schema_fingerprint {
            self.send_sm_resp(from, pkt, SmKind::ConnectResp, 0, SmStatus::SchemaMismatch);
            return;
        }
        let generation = self.new_generation();
        let s = Session::new_server(from, pkt.client_sess, pkt.token, generation, now);
        match self.alloc_session_armed(s) {
            Some(sid) => {
                self.conn_tokens.insert((from, pkt.token), sid);
                self.send_sm_resp(from, pkt, SmKind::ConnectResp, sid.0, SmStatus::Ok);
            }
            None => self.send_sm_resp(from, pkt, SmKind::ConnectResp, 0, SmStatus::NoResources),
        }
    }

    fn client_sm_resp(&mut self, now: Time, from: A, pkt: &SmPkt) {
        let sid = SessionId(pkt.client_sess);
        let Some(s) = self
            .session_mut(sid)
            .filter(|s| s.role.is_client() && s.peer == from && s.token == pkt.token)
        else {
            self.stats.drop_unknown_session += 1;
            return;
        };
        match (pkt.kind, s.state) {
            (SmKind::ConnectResp, SessionState::Connecting) => {
                s.last_rx = now;
                match pkt.status {
                    SmStatus::Ok => {
                        s.remote_num = pkt.server_sess;
                        s.state = SessionState::Connected;
                        s.sm_due = now;
                        self.arm(now + self.cfg.keepalive);
                        self.events.push_back(Event::SessionConnected(sid));
                        self.drain_backlog(now, sid);
                    }
                    SmStatus::SchemaMismatch => {
                        self.fail_client_session(sid, RpcError::SchemaMismatch)
                    }
                    SmStatus::NoResources => self.fail_client_session(sid, RpcError::NoResources),
                    SmStatus::NoSession => self.fail_client_session(sid, RpcError::SessionLost),
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
                    self.fail_client_session(sid, RpcError::SessionLost);
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
            fingerprint: 42,
        };
        let mut buf = [0u8; 64];
        let n = p.encode(&mut buf);
        assert_eq!(n, SM_PKT_LEN);
        let hdr = PktHdr::decode(&buf).unwrap();
        assert_eq!(hdr.dest_session_num(), SM_SESSION_NUM);
        assert_eq!(SmPkt::decode(&hdr, &buf[PKTHDR_SIZE..n]), Some(p));
        assert_eq!(SmPkt::decode(&hdr, &buf[PKTHDR_SIZE..n - 1]), None);
        let mut bad = buf;
        bad[PKTHDR_SIZE + 12] = 77; // unknown status
        assert_eq!(SmPkt::decode(&hdr, &bad[PKTHDR_SIZE..n]), None);
        let hdr2 = PktHdr::new(99, 24, SM_SESSION_NUM, PktType::Req, 0, 0).unwrap();
        assert_eq!(SmPkt::decode(&hdr2, &buf[PKTHDR_SIZE..n]), None);
    }
}
