//! Sessions: one per (peer, connection), either client or server role.
//!
//! A client session owns [`SLOTS_PER_SESSION`] client slots, the credit counter, the backlog
//! of requests waiting for a free slot and the stall queue of slots waiting for credits. A
//! server session owns [`SLOTS_PER_SESSION`] server slots (the at-most-once state). Both
//! remember the peer address, the peer's session number, the connect token, the two session
//! tokens that data packets carry (see `pkthdr`) and when a valid packet was last received
//! from the peer (for failure detection).

use std::collections::VecDeque;

use super::Time;
use super::sslot::{ClientSlot, SLOTS_PER_SESSION, ServerSlot};
use crate::erpc::rtt_filter::RttFilter;
use crate::erpc::timely::Timely;

/// A session number at this endpoint (the `dest_session_num` peers put in packets for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub(super) u16);

impl SessionId {
    /// The number.
    pub fn num(self) -> u16 {
        self.0
    }
}

/// Session life cycle. Server sessions are created `Connected`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SessionState {
    /// Client: connect request sent, no answer yet.
    Connecting,
    /// Data may flow.
    Connected,
    /// Client: disconnect request sent, no answer yet.
    Disconnecting,
}

/// A request waiting for a free slot (or for the session to connect).
#[derive(Debug)]
pub(super) struct PendingReq {
    pub req_type: u8,
    /// The request, written into a buffer of the free list; it becomes the slot's request
    /// buffer (no copy) when the request gets a slot.
    pub data: crate::erpc::msgbuf::MsgBuffer,
    pub tag: u64,
}

/// Client-role state.
#[derive(Debug)]
pub(super) struct ClientSession {
    pub credits: usize,
    pub slots: [ClientSlot; SLOTS_PER_SESSION],
    pub backlog: VecDeque<PendingReq>,
    /// Slots that have packets to send but found no credit (each at most once, see
    /// `ClientSlot::in_stall`).
    pub stall: VecDeque<usize>,
    /// Timely rate state of the session (seeds/000 §4.1 `ClientInfo::timely`).
    pub timely: Timely,
    /// The windowed minimum in front of `timely`'s samples ([`Config::cc_rtt_filter_events`](super::Config::cc_rtt_filter_events)).
    pub rtt_filter: RttFilter,
    /// Pacing: the earliest time the session's next paced packet may leave (ns); advanced by
    /// each paced packet's wire time at the current rate.
    pub next_tx_at: Time,
    /// Request number of the session's first request on slot 0 (slot `i` starts at
    /// `req_base + i`): random, chosen by the client and sent in the connect request, so
    /// that an off-path sender cannot predict the request numbers a forged packet must
    /// carry (issue 14; see `pkthdr`).
    pub req_base: u64,
}

impl ClientSession {
    /// A client session whose slot `i` starts at request number `req_base + i`
    /// (`req_base` a multiple of [`SLOTS_PER_SESSION`], see `ClientSession::req_base`), whose
    /// RTT filter spans `rtt_filter_events` completion events.
    pub(super) fn new(
        credits: usize,
        link_bps: f64,
        rtt_filter_events: usize,
        req_base: u64,
    ) -> Self {
        ClientSession {
            req_base,
            credits,
            slots: std::array::from_fn(|i| ClientSlot::new(req_base + i as u64, credits)),
            backlog: VecDeque::new(),
            stall: VecDeque::new(),
            timely: Timely::new(link_bps),
            rtt_filter: RttFilter::new(rtt_filter_events),
            next_tx_at: 0,
        }
    }

    /// A slot without an RPC, if any.
    pub(super) fn free_slot(&self) -> Option<usize> {
        self.slots.iter().position(|s| !s.active)
    }

    /// Whether any RPC is in flight or queued.
    pub(super) fn busy(&self) -> bool {
        !self.backlog.is_empty() || self.slots.iter().any(|s| s.active)
    }
}

/// Server-role state.
#[derive(Debug)]
pub(super) struct ServerSession {
    pub slots: [ServerSlot; SLOTS_PER_SESSION],
    /// When the session was created (ns): without any request by
    /// `created + idle_session_timeout` it is reclaimed (issue 14).
    pub created: Time,
}

/// The role-specific part.
#[derive(Debug)]
pub(super) enum Role {
    Client(Box<ClientSession>),
    Server(Box<ServerSession>),
}

impl Role {
    pub(super) fn is_client(&self) -> bool {
        matches!(self, Role::Client(_))
    }

    pub(super) fn client(&self) -> Option<&ClientSession> {
        match self {
            Role::Client(c) => Some(c),
            Role::Server(_) => None,
        }
    }

    pub(super) fn client_mut(&mut self) -> Option<&mut ClientSession> {
        match self {
            Role::Client(c) => Some(c),
            Role::Server(_) => None,
        }
    }

    pub(super) fn server_mut(&mut self) -> Option<&mut ServerSession> {
        match self {
            Role::Server(s) => Some(s),
            Role::Client(_) => None,
        }
    }

    pub(super) fn server(&self) -> Option<&ServerSession> {
        match self {
            Role::Server(s) => Some(s),
            Role::Client(_) => None,
        }
    }
}

/// One session.
#[derive(Debug)]
pub(super) struct Session<A> {
    pub role: Role,
    pub state: SessionState,
    pub peer: A,
    /// The peer's number for this session (client: learned from the connect response).
    pub remote_num: u16,
    /// Connect token: random, chosen by the client; session-management packets carry it.
    pub token: u64,
    /// Session token this endpoint chose for the session: every data/control packet
    /// addressed to it must carry it (else it is stale or forged and dropped).
    pub rx_token: u16,
    /// The peer's session token for the session (learned in the handshake): put in every
    /// data/control packet sent to the peer.
    pub tx_token: u16,
    /// Distinguishes this session from earlier owners of the same number.
    pub generation: u64,
    /// When a valid packet for this session last arrived (creation time initially).
    pub last_rx: Time,
    /// Client: when the next connect/disconnect re-send or keepalive ping is due.
    pub sm_due: Time,
}

impl<A> Session<A> {
    pub(super) fn new_client(
        peer: A,
        token: u64,
        generation: u64,
        cfg: &super::Config,
        req_base: u64,
        now: Time,
    ) -> Self {
        Session {
            role: Role::Client(Box::new(ClientSession::new(
                cfg.session_credits,
                cfg.link_bandwidth_bps as f64,
                cfg.cc_rtt_filter_events,
                req_base,
            ))),
            state: SessionState::Connecting,
            peer,
            remote_num: 0,
            token,
            rx_token: 0,
            tx_token: 0,
            generation,
            last_rx: now,
            sm_due: now,
        }
    }

    pub(super) fn new_server(
        peer: A,
        remote_num: u16,
        token: u64,
        tx_token: u16,
        generation: u64,
        req_base: u64,
        now: Time,
    ) -> Self {
        Session {
            role: Role::Server(Box::new(ServerSession {
                slots: std::array::from_fn(|i| ServerSlot::new(req_base + i as u64)),
                created: now,
            })),
            state: SessionState::Connected,
            peer,
            remote_num,
            token,
            rx_token: 0,
            tx_token,
            generation,
            last_rx: now,
            sm_due: now,
        }
    }
}

impl ServerSession {
    /// Whether the client has sent any request on the session (a slot holds one).
    pub(super) fn got_request(&self) -> bool {
        self.slots.iter().any(|s| s.req_num.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_session_slots_and_backlog() {
        let mut c = ClientSession::new(8, 25e9, 1, 0);
        assert_eq!(c.free_slot(), Some(0));
        assert!(!c.busy());
        for (i, s) in c.slots.iter().enumerate() {
            assert_eq!(s.req_num, i as u64);
        }
        c.slots[0].active = true;
        assert_eq!(c.free_slot(), Some(1));
        assert!(c.busy());
        for s in &mut c.slots {
            s.active = true;
        }
        assert_eq!(c.free_slot(), None);
    }
}
