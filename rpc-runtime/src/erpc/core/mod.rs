//! The sans-I/O eRPC protocol core (issue 5; seeds/002 §6-§11).
//!
//! [`Rpc`] is a pure state machine: it never touches a socket, a NIC or a clock. The caller
//! (an event loop over a [`DatagramTransport`](super::datagram::DatagramTransport), or a test
//! with a simulated wire) feeds it inputs and drains its outputs:
//!
//! | inputs                                   | outputs                                    |
//! |------------------------------------------|--------------------------------------------|
//! | [`Rpc::handle_datagram`] / [`Rpc::handle_datagram_zc`] (packet arrived) | [`Rpc::poll_transmit`] / [`Rpc::poll_transmit_at`] (packets to send) |
//! | [`Rpc::handle_timeout`] (time passed)    | [`Rpc::poll_event`] ([`Event`]s)           |
//! | [`Rpc::create_session`], [`Rpc::destroy_session`], [`Rpc::enqueue_request`], [`Rpc::reply`] / [`Rpc::reply_with`], [`Rpc::recycle`] | [`Rpc::next_timeout`] (when to call `handle_timeout`) |
//!
//! Time is a [`Time`]: nanoseconds since an epoch the caller picks (virtual in tests). After
//! any input, drain `poll_transmit` and `poll_event`, then sleep until `next_timeout()` or the
//! next datagram.
//!
//! # Protocol (client driven, invariant I4)
//! One endpoint can be client and server at once; each session has one role. A client session
//! has [`SLOTS_PER_SESSION`] slots; slot `i` carries requests `i, i + 8, i + 16, ..` (the
//! `req_num` advances by the window), so at most 8 RPCs are in flight per session and the rest
//! wait in a backlog. Every packet the client sends is answered by exactly one server packet
//! with the same `pkt_num`: request packet `k < N-1` by an explicit credit return (`ExplCr`),
//! the last request packet by response packet 0, and RFR `k >= N` by response packet
//! `k - (N - 1)` (response packet `j` carries `pkt_num = N - 1 + j`). Each sent packet takes one
//! of the session's credits (default 8) and each accepted answer gives it back; slots that have
//! packets to send but no credit wait in the session's stall queue. The client accepts
//! answers only in order (`pkt_num == num_rx`); a slot that makes no progress for an RTO (5 ms
//! default) rolls back (`num_tx = num_rx`, credits returned) and re-sends (go-back-N, see
//! `pkt_loss.rs`). The server keeps per slot the last `req_num` and its response: duplicates
//! of the current request are answered from that cache, older requests are dropped, and each
//! request is handed to the application ([`Event::Request`]) exactly once.
//!
//! Session management (`sm.rs`) uses the same datagram channel with
//! `dest_session_num = 0xffff`; connect/disconnect requests carry a random connect token, are
//! re-sent every `sm_rto`, and duplicates get the same answer. The connect handshake carries
//! both ends' schema fingerprint, MTU, `max_msg_size` and session credits (a mismatch refuses
//! the session with an error naming the field and both values), and the server admits a
//! session only if its receive ring can absorb every session's credits (admission control,
//! [`Config::rx_ring_entries`]).
//!
//! # Session tokens (issue 12; seeds/002 §4 invariant I3)
//! Session numbers are reused after a session ends, and a request number restarts at the
//! slot index in every session, so a late packet of an ended session could otherwise be taken
//! for one of a new session on the same number (a stale request executed twice, a stale
//! response completing another call). Each end therefore picks a random 16-bit session token
//! for its session at connect (different from the last token of that session number), the
//! handshake exchanges them, every data and control packet carries the receiver's token in
//! the header's top 16 bits, and a packet with another token is dropped and counted
//! ([`Stats::drop_stale_token`]). Tokens come from an OS-seeded ChaCha12 generator per endpoint, so
//! a peer cannot predict another session's token (it can still guess one in 2^16). A peer that is silent for
//! `failure_timeout` fails its sessions (`failure.rs`); connected idle clients send keepalive
//! pings so that a live peer is never silent.
//!
//! # Forged packets and floods (issue 14)
//! Against senders of arbitrary datagrams (off path: they cannot read the session's
//! packets but can spoof source addresses):
//! - request numbers start at a random per-session base sent in the connect request, and a
//!   server slot takes only the exact next request number, so a forged data or control
//!   packet must match the 16-bit token *and* an unpredictable request number (about 56
//!   bits; the list of what must be guessed is in [`pkthdr`](super::pkthdr));
//! - session-management packets of a session must carry its 64-bit connect token and come
//!   from its peer; others are dropped and counted ([`Stats::drop_sm_bad_token`]), so a
//!   forged disconnect ends nothing;
//! - per source (the peer address `A`), a server holds at most
//!   [`Config::max_sessions_per_source`] sessions and takes at most
//!   [`Config::sm_rate_per_source`] session-management requests per second, with state in
//!   memory bounded whatever the number of sources (`admit.rs`);
//! - a server session whose client sends no request within
//!   [`Config::idle_session_timeout`] of connecting is reclaimed
//!   ([`Stats::server_sessions_idle_reclaimed`]).
//!
//! Not defended against: an on-path attacker (it reads tokens and request numbers), and a
//! flood from many sources (many ports or spoofed addresses), which only the global limits
//! (`max_sessions`, receive-ring admission) and the idle reclaim bound.
//!
//! # Zero-copy single-packet messages (seeds/002 §7.2, seeds/000 §12.2)
//! eRPC hands a single-packet request to a dispatch-mode handler in place, in the RX ring,
//! before the receive descriptor is re-posted, and copies only multi-packet messages into a
//! message buffer. [`Rpc::handle_datagram_zc`] does the same: for a new, complete
//! single-packet request or response it does all the protocol bookkeeping (at-most-once state,
//! credits, congestion control, counters) and returns a [`Zc`] naming the message's bytes
//! inside the datagram instead of copying them into an [`Event`]; the caller handles them
//! while it still owns the datagram (see `Endpoint::rx_burst_zc` in `event_loop`).
//! [`Rpc::handle_datagram`] is the same function followed by a copy into an event.
//!
//! # Buffers (seeds/000 §3; issue 15)
//! Message data lives in [`MsgBuffer`]s (data contiguous, one header slot per packet). Each
//! client slot keeps its request buffer and each server slot its response buffer across
//! RPCs; [`Rpc::enqueue_request_with`] and [`Rpc::reply_with`] let the application write
//! the message straight into them, and their packets are sent in place: a transmit queue
//! entry is a small descriptor, which [`Rpc::poll_transmit_gather`] turns into the header
//! (written into the buffer's header slot) plus the data slice ([`Rpc::msg_pkt`]), or, for
//! datagrams of at most [`RENDER_MAX`] bytes and for control packets, renders into the
//! caller's buffer ([`Rpc::poll_transmit`] copies everything, for simulated wires).
//! Multi-packet messages are reassembled into buffers from a free list inside the core,
//! each packet's data written at its offset ([`MsgBuffer::write_pkt`], which refuses an
//! index or length that does not fit), and handed out in the [`Event`]; hand them back with
//! [`Rpc::recycle`] and the steady state maps nothing per message (buffers not returned are
//! simply dropped and the free list refills by mapping; [`Stats::msgbufs_allocated`]
//! counts every mapping). The module docs of [`crate::erpc`] count the copies per message.
//!
//! # Congestion control (seeds/000 §6, §12.3, §12.7; seeds/002 §6.3)
//! Each client session runs [Timely](crate::erpc::timely): every accepted answer (credit
//! return or response packet) yields an RTT sample against the time its client packet left
//! (`tx_ts` per slot, seeds/000 §4.2): the `poll_transmit_at`/`handle_datagram` call time,
//! i.e. once per event-loop batch (seeds/002 §6.3 "bypass 3"), plus the packet's
//! serialization behind the burst handed out before it at the link rate (Timely §4.1; see
//! `cc.rs`). A session whose rate is
//! the link rate is *uncongested*: its samples below `T_LOW` skip the update (Timely bypass)
//! and its packets go straight to the transmit queue (wheel bypass). A congested session's
//! packets (request packets and RFRs; servers only answer and are not rate limited) are
//! spaced by their wire time at the session's rate and parked in a Carousel timing wheel
//! ([`crate::erpc::wheel`]) until due; `poll_transmit_at` releases only due packets and
//! [`Rpc::next_timeout`] includes the wheel's next due time. A slot with packets in the wheel
//! sends all its packets through the wheel (so none overtakes another), and its
//! retransmission timer counts from when its last paced packet is due (packets waiting for
//! their time are not lost). When an exchange completes while re-sent copies of its packets
//! still wait in the wheel (after go-back-N, the answer to an original copy can arrive
//! first), or when a slot rolls back or its session is freed, the slot's queued packets are
//! purged first (invariant I1 of seeds/002 §4: nothing of a finished or rolled-back exchange
//! stays queued; eRPC instead drops responses meanwhile, seeds/002 §8.1).
//! [`Config::cc_rate_comp`] and [`Config::cc_pacing`] switch the two halves off (eRPC's
//! `kCcRateComp` / `kCcPacing`).
//!
//! # Timers
//! [`Rpc::next_timeout`] is a lower bound kept up to date as deadlines are armed (O(1)); only
//! when it is reached does [`Rpc::handle_timeout`] scan the sessions (failure detection,
//! keepalives, session-management re-sends, retransmission) and compute the exact next
//! deadline. Deadlines that move later (every received packet moves the failure deadline)
//! therefore cost nothing until the bound is reached.

mod admit;
mod cc;
mod cr;
mod failure;
mod pkt_loss;
mod pool;
mod req;
mod resp;
mod rfr;
mod session;
mod sm;
mod sslot;

#[cfg(test)]
mod admission_tests;
#[cfg(test)]
mod cc_tests;
#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod msgbuf_tests;
#[cfg(test)]
mod sim_tests;
#[cfg(test)]
mod zc_tests;

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

use thiserror::Error;

use super::msgbuf::MsgBuffer;
use super::pkthdr::{MAX_MSG_SIZE, MAX_PKT_NUM, PKTHDR_SIZE, PktHdr, PktType};
use super::timely::MIN_RATE_BPS;
use super::wheel::TimingWheel;
use crate::fifo::Fifo;
use cc::WheelEnt;
pub use cc::{WHEEL_NUM_SLOTS, WHEEL_SLOT_WIDTH_NS};
use pool::BufPool;
pub use pool::{POOL_MAX_BUFS, POOL_MAX_BYTES};
pub use session::SessionId;
use session::{Session, SessionState};
pub use sslot::SLOTS_PER_SESSION;

/// Nanoseconds since a caller-chosen epoch.
pub type Time = u64;

/// One millisecond in [`Time`] units.
pub const MS: Time = 1_000_000;

/// Tunables of an [`Rpc`] endpoint.
#[derive(Clone, Debug)]
pub struct Config {
    /// Largest datagram in bytes, header included; data per packet is `mtu - 16`.
    pub mtu: usize,
    /// Packets a client session may have outstanding (default 8).
    pub session_credits: usize,
    /// Retransmission timeout of a slot that makes no progress (default 5 ms).
    pub rto: Time,
    /// Re-send interval of unanswered session-management requests (default 10 ms).
    pub sm_rto: Time,
    /// A peer silent this long fails its sessions (default 200 ms).
    pub failure_timeout: Time,
    /// A connected client that heard nothing from its server for this long pings it
    /// (default 50 ms; must be below `failure_timeout`).
    pub keepalive: Time,
    /// Largest request or response data in bytes (default 8 MiB).
    pub max_msg_size: usize,
    /// Sessions (both roles) this endpoint holds at most (at most 65535).
    pub max_sessions: usize,
    /// Fingerprint of the RPC schema; a connect request with another value is refused.
    pub schema_fingerprint: u64,
    /// XORed into connect and session tokens, which come from a generator seeded from the OS
    /// per endpoint (so a restarted endpoint at the same address does not repeat the tokens
    /// of its previous life even with the same nonce).
    pub token_nonce: u64,
    /// Link bandwidth in bits per second (default 25 Gbit/s, i.e. 25 GbE): Timely's maximum
    /// rate; a client session at this rate is uncongested and bypasses the wheel. At least
    /// [`MIN_RATE_BPS`] (15 Mbit/s). Wire time for pacing
    /// counts the eRPC packet (16-byte header + data), not lower-layer headers.
    pub link_bandwidth_bps: u64,
    /// Compute Timely rates from RTT samples (eRPC's `kCcRateComp`; default true). When false,
    /// every session stays at the link rate, so nothing is paced.
    pub cc_rate_comp: bool,
    /// Pace packets of congested sessions through the timing wheel (eRPC's `kCcPacing`;
    /// default true). When false, rates are still computed (if `cc_rate_comp`) but every
    /// packet goes straight to the transmit queue.
    pub cc_pacing: bool,
    /// Completion events over which a client session's RTT samples are filtered before
    /// Timely sees them: the smallest sample of the current event and the previous
    /// `cc_rtt_filter_events - 1` ([`crate::erpc::rtt_filter`]; default 4). A server stall
    /// or a scheduling blip shorter than that many events then leaves the rate alone, and
    /// sustained queueing reaches Timely that many events (round trips) minus one late.
    /// 1 feeds every sample as eRPC does. Clamped to
    /// `1..=`[`MAX_FILTER_EVENTS`](crate::erpc::rtt_filter::MAX_FILTER_EVENTS).
    pub cc_rtt_filter_events: usize,
    /// Datagrams this endpoint's receive ring can hold before it drops (a UD RQ's receive
    /// WQEs, a UDP socket's receive buffer): admission control (issue 12; eRPC refuses
    /// sessions it lacks RX ring entries for, seeds/000 §12.4 "resources"). Every session,
    /// of either role, may have up to `session_credits` packets in flight towards this
    /// endpoint, so a new session is refused (server: [`SessionError::NoRingEntries`] at the
    /// client's connect; client: [`ErpcCallError::NoRingEntries`] from `create_session`) when
    /// `(sessions + 1) * session_credits` would exceed it. `None` (the default of the
    /// sans-I/O core): no limit; [`Endpoint::new`](crate::erpc::event_loop::Endpoint::new)
    /// fills in the transport's `rx_ring_entries()`; `Some(usize::MAX)` disables the check.
    pub rx_ring_entries: Option<usize>,
    /// Server sessions one source (peer address: IP address and port over UDP, LID and QPN
    /// over UD) may hold at once (issue 14); a connect request beyond it is refused
    /// ([`SessionError::SourceLimit`] at the client). `None` (default): half of the sessions the
    /// endpoint can hold ([`Config::source_session_limit`]), so that one source never holds
    /// them all. `Some(0)` is refused by [`Rpc::new`].
    pub max_sessions_per_source: Option<usize>,
    /// Session-management requests (connect, disconnect, ping) one source may send per
    /// second (issue 14; default 2000); requests beyond the budget are dropped unanswered
    /// and counted ([`Stats::drop_sm_rate_limited`]). A connected idle client sends one ping
    /// per `keepalive` per session, a connecting one one request per `sm_rto`.
    pub sm_rate_per_source: u64,
    /// Session-management requests one source may send in a burst above the rate (default
    /// 256: a client connecting that many sessions at once is not slowed).
    pub sm_burst_per_source: u64,
    /// Entries of the fixed table of per-source rate buckets (default 4096, 16 bytes each);
    /// sources beyond it share entries (see `admit.rs`), so memory does not grow with the
    /// number of sources.
    pub sm_rate_table_entries: usize,
    /// A server session whose client has sent no request packet this long (ns) after the
    /// connect is reclaimed (issue 14; default 10 s), counted in
    /// [`Stats::server_sessions_idle_reclaimed`]; its client learns it at its next ping
    /// ([`SessionError::SessionLost`]). Keepalive pings do not count as requests. `Time::MAX`
    /// keeps such sessions.
    pub idle_session_timeout: Time,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mtu: 4096,
            session_credits: 8,
            rto: 5 * MS,
            sm_rto: 10 * MS,
            failure_timeout: 200 * MS,
            keepalive: 50 * MS,
            max_msg_size: super::msgbuf::MAX_DATA_SIZE,
            max_sessions: 4096,
            schema_fingerprint: 0,
            token_nonce: 0,
            link_bandwidth_bps: 25_000_000_000,
            cc_rate_comp: true,
            cc_pacing: true,
            cc_rtt_filter_events: 4,
            rx_ring_entries: None,
            max_sessions_per_source: None,
            sm_rate_per_source: 2000,
            sm_burst_per_source: 256,
            sm_rate_table_entries: 4096,
            idle_session_timeout: 10_000 * MS,
        }
    }
}

impl Config {
    /// The sessions (both roles) this endpoint can hold: `max_sessions`, and no more than its
    /// receive ring absorbs at full credit (`rx_ring_entries / session_credits`; see
    /// [`Config::rx_ring_entries`]).
    pub fn session_capacity(&self) -> usize {
        let ring = self.rx_ring_entries.unwrap_or(usize::MAX);
        self.max_sessions.min(ring / self.session_credits.max(1))
    }

    /// The server sessions one source may hold: [`Config::max_sessions_per_source`], or by
    /// default half of [`Config::session_capacity`] (at least 1).
    pub fn source_session_limit(&self) -> usize {
        self.max_sessions_per_source
            .unwrap_or_else(|| (self.session_capacity() / 2).max(1))
    }
}

/// Why a [`Config`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// The MTU leaves no room for data or for a session-management packet.
    #[error("mtu {0} too small (at least {min})", min = sm::SM_PKT_LEN + 1)]
    MtuTooSmall(usize),
    /// `session_credits` is 0 or above the packet-number space.
    #[error("session_credits {0} out of range")]
    BadCredits(usize),
    /// A maximal request plus a maximal response would not fit the 14-bit `pkt_num`, or
    /// the size exceeds the 24-bit `msg_size`.
    #[error("max_msg_size {0} too large for this mtu")]
    MsgTooLarge(usize),
    /// `max_sessions` above 65535 or zero.
    #[error("max_sessions {0} out of range")]
    BadMaxSessions(usize),
    /// `keepalive` not below `failure_timeout`, or a zero timeout.
    #[error("timeouts inconsistent")]
    BadTimeouts,
    /// `link_bandwidth_bps` below Timely's minimum rate (15 Mbit/s).
    #[error("link bandwidth {0} bit/s below the 15 Mbit/s minimum rate")]
    BadLinkBandwidth(u64),
    /// A per-source limit is zero (`max_sessions_per_source`, `sm_rate_per_source`,
    /// `sm_burst_per_source`, `sm_rate_table_entries`) or `idle_session_timeout` is zero.
    #[error("Config::{0} must be at least 1")]
    BadSourceLimit(&'static str),
}

/// A protocol setting that both ends of a session must share; the connect handshake carries
/// each and the server refuses a session whose client differs ([`SessionError::ConfigMismatch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigField {
    /// [`Config::mtu`] (bytes): both ends cut messages into packets of `mtu - 16` data bytes
    /// and number them alike; a datagram above the receiver's MTU is dropped.
    Mtu,
    /// [`Config::max_msg_size`] (bytes): a message above the receiver's is dropped.
    MaxMsgSize,
    /// [`Config::session_credits`] (packets): the server's admission control counts them.
    SessionCredits,
}

impl ConfigField {
    /// The field's name in [`Config`].
    pub fn name(self) -> &'static str {
        match self {
            ConfigField::Mtu => "mtu",
            ConfigField::MaxMsgSize => "max_msg_size",
            ConfigField::SessionCredits => "session_credits",
        }
    }

    /// The field's unit.
    pub fn unit(self) -> &'static str {
        match self {
            ConfigField::Mtu | ConfigField::MaxMsgSize => "bytes",
            ConfigField::SessionCredits => "packets",
        }
    }

    /// Where a client sets it.
    pub fn setting(self) -> &'static str {
        match self {
            ConfigField::Mtu => {
                "Config::mtu, which is the transport's MTU: UdpConfig::mtu or \
                 ErpcConfig::udp_mtu over UDP, UdConfig::mtu over UD"
            }
            ConfigField::MaxMsgSize => "Config::max_msg_size",
            ConfigField::SessionCredits => "Config::session_credits",
        }
    }
}

impl std::fmt::Display for ConfigField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a session, or an RPC on it, failed: eRPC's session-management errors (`SmErrType`
/// in the paper's code). Not the typed layer's [`crate::RpcError`]: [`crate::erpc::Erpc`]
/// maps these to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum SessionError {
    /// The peer was silent for `failure_timeout`.
    #[error("peer silent for the failure timeout")]
    PeerFailed,
    /// The server refused the connection: its schema fingerprint differs.
    #[error("schema fingerprint mismatch: the server's is {server:#018x}")]
    SchemaMismatch {
        /// The server's fingerprint (carried in its connect response).
        server: u64,
    },
    /// The server refused the connection: a setting both ends must share differs (issue
    /// 12; seeds/000 §12.4: the server validates the transport, MTU included, before it
    /// creates a session). The client is the side to change: a server serves many clients.
    #[error(
        "the server refused the session: {field} differs: client {client} {unit}, server \
         {server} {unit}; change the client's setting ({setting}) to {server}",
        unit = .field.unit(),
        setting = .field.setting()
    )]
    ConfigMismatch {
        /// Which setting.
        field: ConfigField,
        /// The client's value.
        client: u64,
        /// The server's value.
        server: u64,
    },
    /// The server refused the connection: its receive ring cannot absorb the packets of one
    /// more session (admission control, [`Config::rx_ring_entries`]).
    #[error(
        "the server refused the session: its receive ring holds {ring_entries} datagrams and it \
         has {sessions} sessions; one more at {credits} credits each would exceed it (enlarge \
         the server's receive ring: UD rq_depth, UDP socket buffer (net.core.rmem_max); or open \
         fewer sessions)"
    )]
    NoRingEntries {
        /// The server's receive-ring size, datagrams.
        ring_entries: u64,
        /// Sessions the server holds (both roles).
        sessions: u64,
        /// Credits per session (packets).
        credits: u64,
    },
    /// The server refused the connection: this client's address (IP address and port over
    /// UDP; LID and QPN over UD) already holds as many sessions as the server admits per
    /// source (issue 14; the server's [`Config::max_sessions_per_source`]).
    #[error(
        "the server refused the session: this address already holds {limit} sessions, the \
         server's per-source limit (raise the server's Config::max_sessions_per_source, or \
         open fewer sessions, e.g. a smaller max_in_flight)"
    )]
    SourceLimit {
        /// The server's per-source session limit.
        limit: u64,
    },
    /// The server refused the connection for lack of session slots.
    #[error("server has no free sessions")]
    NoResources,
    /// The server no longer knows the session (it freed it).
    #[error("server lost the session")]
    SessionLost,
}

/// Why a call on [`Rpc`] was refused (caller errors; nothing changed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ErpcCallError {
    /// No such session, or not in a state that allows the call.
    #[error("unknown session or wrong session state")]
    BadSession,
    /// The message exceeds `max_msg_size`.
    #[error("message of {0} bytes exceeds max_msg_size")]
    TooLarge(usize),
    /// The session still has requests in flight or queued.
    #[error("session busy")]
    Busy,
    /// All session numbers are in use.
    #[error("no free session numbers")]
    NoSessions,
    /// This endpoint's receive ring cannot absorb the packets of one more session
    /// (admission control, [`Config::rx_ring_entries`]).
    #[error(
        "receive ring of {ring_entries} datagrams too small for {sessions} + 1 sessions of \
         {credits} credits (enlarge the receive ring or open fewer sessions)"
    )]
    NoRingEntries {
        /// The receive-ring size, datagrams.
        ring_entries: u64,
        /// Sessions this endpoint holds (both roles).
        sessions: u64,
        /// Credits per session (packets).
        credits: u64,
    },
    /// The token does not name a request awaiting a reply (already replied, or the session
    /// was freed).
    #[error("stale request token")]
    StaleToken,
    /// A message buffer ([`MsgBuffer`]) for the request or response could not be mapped
    /// (out of memory); nothing was queued.
    #[error("no message buffer: mapping its memory failed")]
    NoBuffer,
}

/// Names one received request on the server; pass it to [`Rpc::reply`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReqToken {
    session: SessionId,
    generation: u64,
    req_num: u64,
}

impl ReqToken {
    /// The server session the request arrived on.
    pub fn session(&self) -> SessionId {
        self.session
    }

    /// The request number (unique within the session).
    pub fn req_num(&self) -> u64 {
        self.req_num
    }
}

/// A complete single-packet message handed out in place by [`Rpc::handle_datagram_zc`]
/// (seeds/002 §7.2): its data is `bytes[offset..offset + len]` of the datagram that was
/// passed in. The core keeps no reference to those bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zc {
    /// Server: a new, complete single-packet request: data is `bytes[offset..offset+len]`.
    /// It counts as dispatched (`requests_dispatched`); answer it with [`Rpc::reply`] or
    /// [`Rpc::reply_with`] (duplicates meanwhile are dropped, later ones get the cached
    /// response).
    Request {
        /// Pass to `reply`.
        token: ReqToken,
        /// The handler type.
        req_type: u8,
        /// Offset of the data in the datagram, bytes.
        offset: usize,
        /// Data length, bytes.
        len: usize,
    },
    /// Client: the complete single-packet response of the request enqueued with `tag`.
    Response {
        /// Client session.
        session: SessionId,
        /// The caller's tag.
        tag: u64,
        /// Offset of the data in the datagram, bytes.
        offset: usize,
        /// Data length, bytes.
        len: usize,
    },
}

impl Zc {
    /// The byte range of the message data within the datagram.
    pub fn range(&self) -> std::ops::Range<usize> {
        match *self {
            Zc::Request { offset, len, .. } | Zc::Response { offset, len, .. } => {
                offset..offset + len
            }
        }
    }
}

/// Something the application must know about (drained with [`Rpc::poll_event`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// Server: a complete request; answer it with [`Rpc::reply`].
    Request {
        /// Pass to `reply`.
        token: ReqToken,
        /// The handler type.
        req_type: u8,
        /// The request data: the message buffer it was reassembled in (multi-packet) or
        /// copied to (single-packet, [`Rpc::handle_datagram`]); reads as a byte slice.
        /// Return it with [`Rpc::recycle`].
        data: MsgBuffer,
    },
    /// Client: the response of the request enqueued with `tag`.
    Response {
        /// Client session.
        session: SessionId,
        /// The caller's tag.
        tag: u64,
        /// Response data: the message buffer it was reassembled in (multi-packet) or copied
        /// to (single-packet, [`Rpc::handle_datagram`]); reads as a byte slice. Return it
        /// with [`Rpc::recycle`].
        data: MsgBuffer,
    },
    /// Client: the request enqueued with `tag` failed (its session failed).
    RequestFailed {
        /// Client session.
        session: SessionId,
        /// The caller's tag.
        tag: u64,
        /// Why.
        error: SessionError,
    },
    /// Client: the session is connected (requests queued before now start).
    SessionConnected(SessionId),
    /// Client: the session failed and is freed (after the `RequestFailed` of its requests).
    SessionFailed {
        /// Client session.
        session: SessionId,
        /// Why.
        error: SessionError,
    },
    /// Client: `destroy_session` completed; the session is freed.
    SessionDisconnected(SessionId),
    /// Server: a server session was freed because its client disconnected or failed;
    /// tokens of its unanswered requests are now stale.
    ServerSessionClosed(SessionId),
}

/// Counters (all monotonically increasing).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Datagrams given to `handle_datagram`.
    pub rx_pkts: u64,
    /// Datagrams produced by `poll_transmit`.
    pub tx_pkts: u64,
    /// Dropped: shorter than the header or than a session-management packet.
    pub drop_truncated: u64,
    /// Dropped: bad magic or reserved bits.
    pub drop_bad_hdr: u64,
    /// Dropped: no such session, wrong role, or wrong sender.
    pub drop_unknown_session: u64,
    /// Dropped: `req_num`/`pkt_num` outside the expected window (stale, duplicate or out of
    /// order).
    pub drop_out_of_window: u64,
    /// Dropped: `msg_size` above `max_msg_size`.
    pub drop_msg_too_large: u64,
    /// Dropped: payload length or header fields inconsistent with the message.
    pub drop_bad_len: u64,
    /// Dropped: invalid session-management packet.
    pub drop_bad_sm: u64,
    /// Dropped: a data or control packet whose session token is not its session's: a stale
    /// packet of an ended session whose number was reused, or a forged one (issues 12, 14).
    pub drop_stale_token: u64,
    /// Dropped: a session-management packet (disconnect, ping, or a connect, disconnect or
    /// ping response) naming a live session whose peer address or 64-bit connect token is
    /// not the packet's: forged, or a late duplicate of a previous owner of the session
    /// number (issue 14). The session is not affected.
    pub drop_sm_bad_token: u64,
    /// Dropped unanswered: a session-management request over its source's rate
    /// ([`Config::sm_rate_per_source`], issue 14).
    pub drop_sm_rate_limited: u64,
    /// Server: connect requests refused because their source holds its limit of sessions
    /// ([`Config::max_sessions_per_source`]; also counted in `connects_refused`).
    pub connects_refused_source_limit: u64,
    /// Server sessions reclaimed because their client sent no request within
    /// [`Config::idle_session_timeout`] of connecting (issue 14).
    pub server_sessions_idle_reclaimed: u64,
    /// Server: connect requests refused (schema, settings, receive ring, session numbers).
    pub connects_refused: u64,
    /// Server: requests handed to the application (handler executions).
    pub requests_dispatched: u64,
    /// Server: duplicate request packets answered from the cache (CR or response).
    pub dup_req_answered: u64,
    /// Client: go-back-N rollbacks.
    pub rollbacks: u64,
    /// Client: packets re-sent after rollbacks.
    pub retransmitted_pkts: u64,
    /// Explicit credit returns sent.
    pub cr_tx: u64,
    /// Requests for response sent.
    pub rfr_tx: u64,
    /// Session-management packets sent.
    pub sm_tx: u64,
    /// Client sessions failed.
    pub sessions_failed: u64,
    /// Server sessions freed because the client went silent.
    pub server_sessions_reaped: u64,
    /// Client: RTT samples taken (an accepted CR or response packet whose client packet's
    /// send time was recorded).
    pub rtt_samples: u64,
    /// Client: answers to a request's last packet (response packet 0), which include the
    /// server's handler time and so give no RTT sample (`cc.rs`, Sampling).
    pub rtt_skipped_server_time: u64,
    /// Client: answers to a retransmitted packet, which give no RTT sample (Karn's rule).
    pub rtt_skipped_retransmit: u64,
    /// Client: RTT samples ended at the last drained receive poll instead of their handling
    /// time ([`Rpc::note_rx_drained`]): the event loop had not polled for a while, and the
    /// sample would have counted that wait as network delay.
    pub rtt_bounded_by_poll: u64,
    /// Client: RTT samples whose completion event (the answers of one receive burst,
    /// [`Timely::sample`](super::timely::Timely::sample)) updated a Timely rate.
    pub timely_updates: u64,
    /// Client: RTT samples whose completion event was skipped by the Timely bypass
    /// (uncongested session, RTT below `T_LOW`; seeds/002 §6.3 bypass 1).
    pub timely_bypassed: u64,
    /// Client: packets (request packets, RFRs) that went through the timing wheel.
    pub wheel_paced: u64,
    /// Client: packets of uncongested sessions sent directly although pacing is enabled
    /// (wheel bypass; seeds/002 §6.3 bypass 2).
    pub wheel_bypassed: u64,
    /// Client: queued wheel packets removed by go-back-N, completion or session teardown.
    pub wheel_purged: u64,
    /// Message buffers ([`MsgBuffer`]) mapped: a slot or the free list needed a buffer, or
    /// a larger one, than it had. Constant in a steady workload (issue 15).
    pub msgbufs_allocated: u64,
    /// Times a message buffer was not reused because a transport still sent from it in
    /// place ([`MsgBuffer::in_flight`]): another buffer was taken (or mapped) instead, so a
    /// queued packet never carries bytes of a later message.
    pub msgbufs_in_flight_skipped: u64,
    /// Dropped: the first packet of a multi-packet message whose reassembly buffer could not
    /// be mapped (out of memory); the peer's retransmission tries again.
    pub drop_no_buffer: u64,
}

/// A packet of a message that is sent in place from its slot's [`MsgBuffer`]: pass it to
/// [`Rpc::msg_pkt`] for the header and data slices (a gather list of two parts, seeds/000
/// §3). Produced by [`Rpc::poll_transmit_gather`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsgPkt {
    session: SessionId,
    generation: u64,
    req_num: u64,
    /// Request packet index (client) or response packet index `j` (server), below 2^14
    /// (a message has at most 2^14 packets).
    pkt: u16,
    /// A server response packet (else a client request packet).
    resp: bool,
    /// Datagram length in bytes (16-byte header plus data), set by `place_pkt`.
    len: u32,
}

impl MsgPkt {
    /// Length of the datagram in bytes: the 16-byte header plus this packet's data (at most
    /// the configured MTU).
    #[inline]
    pub fn wire_len(&self) -> usize {
        self.len as usize
    }
}

/// Datagrams of at most this many bytes (header included) are copied into the caller's
/// buffer by [`Rpc::poll_transmit_gather`] instead of being sent in place: copying a few
/// cache lines costs fewer instructions than the second slot lookup of [`Rpc::msg_pkt`]
/// (measured with `scripts/callgrind-erpc.sh`, issue 15), and the mlx5 UD transport copies
/// datagrams of at most 60 bytes into the WQE anyway (inline send).
pub const RENDER_MAX: usize = 256;

/// Packet `i` of `msg` with header `hdr`, to `dest`: copied into `buf` if the datagram is at
/// most [`RENDER_MAX`] bytes, else with the header written into its slot in `msg` and sent
/// in place as `pkt()`. `i < msg.num_pkts()`.
///
/// A datagram of at most `sink.max_len()` bytes is first offered to `sink` as header and
/// data ([`TxNext::Posted`] if it took it: no copy into `buf`).
#[inline(always)]
fn place_pkt<A: Copy, S: TxSink<A>>(
    dest: A,
    msg: &mut MsgBuffer,
    i: usize,
    hdr: [u8; PKTHDR_SIZE],
    buf: &mut [u8],
    sink: &mut S,
    pkt: impl FnOnce() -> MsgPkt,
) -> TxNext<A> {
    let len = msg.pkt_data_len(i);
    if PKTHDR_SIZE + len <= RENDER_MAX {
        let data = msg.pkt_data(i);
        if PKTHDR_SIZE + len <= sink.max_len() && sink.post(dest, &hdr, data) {
            return TxNext::Posted {
                len: PKTHDR_SIZE + len,
            };
        }
        buf[..PKTHDR_SIZE].copy_from_slice(&hdr);
        buf[PKTHDR_SIZE..PKTHDR_SIZE + len].copy_from_slice(data);
        return TxNext::Out(TxOut::Rendered {
            dest,
            len: PKTHDR_SIZE + len,
        });
    }
    // A retransmission renders the same header again: it is not rewritten, since the NIC may
    // still be reading the earlier copy from the buffer (in-place sends, `Rpc::msg_pkt_in`).
    if *msg.pkthdr(i) != hdr {
        *msg.pkthdr_mut(i) = hdr;
    }
    let mut pkt = pkt();
    // At most the MTU, which is a datagram length (below 2^32 on every transport).
    pkt.len = u32::try_from(PKTHDR_SIZE + len).unwrap_or(u32::MAX);
    TxNext::Out(TxOut::Msg { dest, pkt })
}

/// A transmit path that takes small datagrams as a header and a data slice and copies them
/// before returning ([`Rpc::poll_transmit_direct`]; the event loop's is the transport's
/// [`tx_post_parts`](crate::erpc::datagram::DatagramTransport::tx_post_parts)), so that the
/// core need not render them into a buffer first.
pub trait TxSink<A> {
    /// Largest datagram in bytes (header included) [`post`](Self::post) takes now; 0 if none.
    fn max_len(&self) -> usize;
    /// Takes the datagram `hdr` + `data` (at most [`max_len`](Self::max_len) bytes) to
    /// `dest`. `true` if it was consumed (sent, or dropped by the sink); `false` if not (the
    /// core then renders it into the caller's buffer as usual).
    fn post(&mut self, dest: A, hdr: &[u8; PKTHDR_SIZE], data: &[u8]) -> bool;
}

/// The sink that takes nothing ([`Rpc::poll_transmit_gather`]).
struct NoSink;

impl<A> TxSink<A> for NoSink {
    #[inline(always)]
    fn max_len(&self) -> usize {
        0
    }
    #[inline(always)]
    fn post(&mut self, _: A, _: &[u8; PKTHDR_SIZE], _: &[u8]) -> bool {
        false
    }
}

/// What [`Rpc::poll_transmit_direct`] did with the next datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxNext<A> {
    /// The sink took it (`len` bytes, header included).
    Posted {
        /// Length in bytes.
        len: usize,
    },
    /// As [`Rpc::poll_transmit_gather`]'s result.
    Out(TxOut<A>),
}

/// A datagram produced by [`Rpc::poll_transmit_gather`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxOut<A> {
    /// A control or session-management packet, rendered into the caller's buffer
    /// (`len` bytes).
    Rendered {
        /// Destination.
        dest: A,
        /// Length in bytes.
        len: usize,
    },
    /// A request or response packet, sent in place from its message buffer.
    Msg {
        /// Destination.
        dest: A,
        /// Where its bytes are ([`Rpc::msg_pkt`]).
        pkt: MsgPkt,
    },
}

/// A packet waiting in the transmit queue, rendered by `poll_transmit`.
#[derive(Debug, Clone, Copy)]
enum Tx<A> {
    /// A header-only packet (CR, RFR).
    Ctrl { dest: A, hdr: [u8; PKTHDR_SIZE] },
    /// Client request packet `pkt` of slot `slot` (skipped if the slot moved on).
    ReqPkt {
        session: SessionId,
        generation: u64,
        req_num: u64,
        pkt: usize,
    },
    /// Client RFR with `pkt_num = pkt` (skipped if the slot moved on).
    Rfr {
        session: SessionId,
        generation: u64,
        req_num: u64,
        pkt: usize,
    },
    /// Server response packet `j` of the slot of `req_num` (skipped if the slot moved on).
    RespPkt {
        session: SessionId,
        generation: u64,
        req_num: u64,
        j: usize,
    },
    /// A session-management packet.
    Sm { dest: A, out: sm::SmOut },
}

/// An eRPC endpoint: the protocol state of all its sessions (module docs describe the API).
pub struct Rpc<A> {
    cfg: Config,
    data_per_pkt: usize,
    sessions: Vec<Option<Session<A>>>,
    /// Freed session numbers, reused oldest first (so stale packets rarely hit a new owner).
    free_nums: VecDeque<u16>,
    next_generation: u64,
    /// Source of connect and session tokens: ChaCha12 (`rand::rngs::StdRng`) seeded from the
    /// OS per endpoint.
    token_rng: rand::rngs::StdRng,
    /// Per session number, the session token its last owner chose (a new owner picks
    /// another, so a stale packet of the previous owner never matches).
    last_rx_token: Vec<u16>,
    /// Live sessions (both roles), for admission control.
    live_sessions: usize,
    /// Server: (client address, connect token) -> server session.
    conn_tokens: HashMap<(A, u64), SessionId>,
    /// Server: server sessions per source; only sources holding a session have an entry, so
    /// it has at most `max_sessions` entries (`admit.rs`).
    src_sessions: HashMap<A, usize>,
    /// Server: the fixed table of per-source rate buckets for session-management requests.
    sm_limiter: admit::SmLimiter,
    /// [`Config::source_session_limit`], computed once.
    src_limit: usize,
    txq: Fifo<Tx<A>>,
    events: VecDeque<Event>,
    stats: Stats,
    /// Free list of message buffers (see [`Rpc::recycle`]).
    pool: BufPool,
    /// The timing wheel of paced packets (None without `cc_pacing`).
    wheel: Option<TimingWheel<WheelEnt>>,
    /// Reused output buffer of wheel reaps.
    wheel_out: Vec<WheelEnt>,
    /// A lower bound of every armed deadline (`Time::MAX` if none): see "Timers".
    timer_lb: Time,
    /// The latest time passed to any input; the time `poll_transmit` uses.
    last_now: Time,
    /// A time at which the driver's receive path was last known drained
    /// ([`Rpc::note_rx_drained`]; 0 until then): a datagram handled later arrived after it,
    /// which bounds an RTT sample from below (`cc.rs`, Sampling).
    rx_drained_at: Time,
    /// When this endpoint's link has finished serializing every packet handed out so far, at
    /// `link_bandwidth_bps` (`cc.rs`, "Sampling"): the departure time RTT samples count from.
    link_free_at: Time,
    /// Wire time of one byte at `link_bandwidth_bps`, in picoseconds.
    link_ps_per_byte: u64,
    /// Calls of `check_invariants` (tests only).
    #[cfg(test)]
    check_calls: std::cell::Cell<u64>,
}

impl<A: Copy + Eq + Hash + std::fmt::Debug> Rpc<A> {
    /// A new endpoint.
    ///
    /// # Errors
    /// A [`ConfigError`] for inconsistent settings.
    pub fn new(cfg: Config) -> Result<Rpc<A>, ConfigError> {
        if cfg.mtu <= sm::SM_PKT_LEN {
            return Err(ConfigError::MtuTooSmall(cfg.mtu));
        }
        let dpp = cfg.mtu - PKTHDR_SIZE;
        if cfg.session_credits == 0 || cfg.session_credits > usize::from(MAX_PKT_NUM) {
            return Err(ConfigError::BadCredits(cfg.session_credits));
        }
        let max_pkts = sslot::pkts_for(cfg.max_msg_size, dpp);
        if cfg.max_msg_size > MAX_MSG_SIZE as usize
            || 2 * max_pkts - 1 > usize::from(MAX_PKT_NUM) + 1
        {
            return Err(ConfigError::MsgTooLarge(cfg.max_msg_size));
        }
        if cfg.max_sessions == 0 || cfg.max_sessions > usize::from(sm::SM_SESSION_NUM) {
            return Err(ConfigError::BadMaxSessions(cfg.max_sessions));
        }
        if cfg.rto == 0
            || cfg.sm_rto == 0
            || cfg.keepalive == 0
            || cfg.keepalive >= cfg.failure_timeout
        {
            return Err(ConfigError::BadTimeouts);
        }
        if (cfg.link_bandwidth_bps as f64) < MIN_RATE_BPS {
            return Err(ConfigError::BadLinkBandwidth(cfg.link_bandwidth_bps));
        }
        for (name, v) in [
            (
                "max_sessions_per_source",
                cfg.max_sessions_per_source.unwrap_or(1) as u64,
            ),
            ("sm_rate_per_source", cfg.sm_rate_per_source),
            ("sm_burst_per_source", cfg.sm_burst_per_source),
            ("sm_rate_table_entries", cfg.sm_rate_table_entries as u64),
            ("idle_session_timeout", cfg.idle_session_timeout),
        ] {
            if v == 0 {
                return Err(ConfigError::BadSourceLimit(name));
            }
        }
        let sm_limiter = admit::SmLimiter::new(
            cfg.sm_rate_table_entries,
            cfg.sm_rate_per_source,
            cfg.sm_burst_per_source,
        );
        let src_limit = cfg.source_session_limit();
        let cfg_pacing = cfg.cc_pacing;
        // At least MIN_RATE_BPS (checked above), so nonzero.
        let link_bps = cfg.link_bandwidth_bps.max(1);
        Ok(Rpc {
            data_per_pkt: dpp,
            cfg,
            sessions: Vec::new(),
            free_nums: VecDeque::new(),
            next_generation: 1,
            token_rng: rand::make_rng(),
            last_rx_token: Vec::new(),
            live_sessions: 0,
            conn_tokens: HashMap::new(),
            src_sessions: HashMap::new(),
            sm_limiter,
            src_limit,
            // A filler for the free slots: no packet is read from them.
            txq: Fifo::with_capacity_of(
                64,
                Tx::ReqPkt {
                    session: SessionId(0),
                    generation: 0,
                    req_num: 0,
                    pkt: 0,
                },
            ),
            events: VecDeque::new(),
            stats: Stats::default(),
            pool: BufPool::new(dpp),
            wheel: cfg_pacing.then(|| {
                TimingWheel::with_capacity(
                    cc::WHEEL_SLOT_WIDTH_NS,
                    cc::WHEEL_NUM_SLOTS,
                    0,
                    cc::WHEEL_INITIAL_ENTRIES,
                )
            }),
            wheel_out: Vec::with_capacity(cc::WHEEL_INITIAL_ENTRIES),
            timer_lb: Time::MAX,
            last_now: 0,
            rx_drained_at: 0,
            link_free_at: 0,
            link_ps_per_byte: 8_000_000_000_000 / link_bps,
            #[cfg(test)]
            check_calls: std::cell::Cell::new(0),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Data bytes per packet (`mtu - 16`).
    pub fn data_per_pkt(&self) -> usize {
        self.data_per_pkt
    }

    /// Number of live sessions (both roles).
    pub fn num_sessions(&self) -> usize {
        self.sessions.iter().filter(|s| s.is_some()).count()
    }

    /// Whether `session` is a connected client session.
    pub fn is_connected(&self, session: SessionId) -> bool {
        matches!(self.session(session), Some(s) if s.role.is_client() && s.state == SessionState::Connected)
    }

    /// The Timely rate of client session `session` in bits per second (the link bandwidth
    /// while uncongested), or None if it is not a client session.
    pub fn session_rate_bps(&self, session: SessionId) -> Option<f64> {
        Some(self.session(session)?.role.client()?.timely.rate())
    }

    /// Whether client session `session` is uncongested (its Timely rate is the link rate, so
    /// its packets bypass the wheel), or None if it is not a client session.
    pub fn session_uncongested(&self, session: SessionId) -> Option<bool> {
        Some(
            self.session(session)?
                .role
                .client()?
                .timely
                .is_uncongested(),
        )
    }

    /// Packets waiting in the timing wheel (paced packets of congested sessions).
    pub fn wheel_len(&self) -> usize {
        self.wheel.as_ref().map_or(0, TimingWheel::len)
    }

    /// Returns a buffer handed out in an [`Event::Request`] or [`Event::Response`] to the
    /// core's free list, so that later messages reuse it instead of mapping new memory.
    /// Optional: buffers not returned are simply dropped (unmapped), and the core maps new
    /// ones as needed ([`Stats::msgbufs_allocated`]). The free list keeps at most
    /// [`POOL_MAX_BUFS`] buffers and [`POOL_MAX_BYTES`] bytes; beyond that `buf` is dropped.
    pub fn recycle(&mut self, buf: MsgBuffer) {
        self.pool.put(buf);
    }

    /// Processes one received datagram from `from`, copying a complete message into an
    /// [`Event`]. This is [`Rpc::handle_datagram_zc`] followed by a copy of the zero-copy
    /// message, if any, into a one-packet buffer from the free list. Invalid datagrams are
    /// dropped and counted in [`Stats`]; this never panics on any input. When the free list
    /// has no one-packet buffer and none can be mapped, the datagram is dropped before it is
    /// processed (as if lost; [`Stats::drop_no_buffer`]), so no message is consumed without
    /// being delivered.
    pub fn handle_datagram(&mut self, now: Time, from: A, bytes: &[u8]) {
        let spare = self.pool.reserve_small();
        if spare.is_err() {
            self.stats.rx_pkts += 1;
            self.stats.drop_no_buffer += 1;
            return;
        }
        let Some(zc) = self.handle_datagram_zc(now, from, bytes) else {
            return;
        };
        let src = &bytes[zc.range()];
        // The reserved one-packet buffer (a message in one datagram fits one packet).
        let Ok(mut data) = self.pool.take(src.len()) else {
            self.stats.drop_no_buffer += 1;
            return;
        };
        data.capacity_mut()[..src.len()].copy_from_slice(src);
        // Within the capacity taken above.
        let _ = data.resize(src.len());
        self.events.push_back(match zc {
            Zc::Request {
                token, req_type, ..
            } => Event::Request {
                token,
                req_type,
                data,
            },
            Zc::Response { session, tag, .. } => Event::Response { session, tag, data },
        });
    }

    /// Processes one received datagram from `from` like [`Rpc::handle_datagram`], except
    /// that a new, complete single-packet request (server) or the complete single-packet
    /// response of a request (client) is neither copied nor queued as an event: it is
    /// returned as a [`Zc`] naming its bytes within `bytes`, and the caller owns handling it
    /// (a request must be answered with [`Rpc::reply`] / [`Rpc::reply_with`]; until then
    /// duplicates of it are dropped). All protocol effects (at-most-once bookkeeping,
    /// credits, RTT samples, `requests_dispatched`) are the same as `handle_datagram`'s.
    /// Everything else (multi-packet messages, session management, failures) still produces
    /// events. Invalid datagrams are dropped and counted in [`Stats`]; this never panics on
    /// any input. Source: seeds/002 §7.2 (zero-copy dispatch of single-packet requests).
    pub fn handle_datagram_zc(&mut self, now: Time, from: A, bytes: &[u8]) -> Option<Zc> {
        self.note_now(now);
        self.stats.rx_pkts += 1;
        let hdr = match PktHdr::decode(bytes) {
            Ok(h) => h,
            Err(super::pkthdr::HdrError::TooShort(_)) => {
                self.stats.drop_truncated += 1;
                return None;
            }
            Err(_) => {
                self.stats.drop_bad_hdr += 1;
                return None;
            }
        };
        let payload = &bytes[PKTHDR_SIZE..];
        if hdr.dest_session_num() == sm::SM_SESSION_NUM {
            self.handle_sm(now, from, &hdr, payload);
            return None;
        }
        if hdr.msg_size() as usize > self.cfg.max_msg_size {
            self.stats.drop_msg_too_large += 1;
            return None;
        }
        let sid = SessionId(hdr.dest_session_num());
        let Some(s) = self.session_mut(sid) else {
            self.stats.drop_unknown_session += 1;
            return None;
        };
        if s.peer != from || s.state != SessionState::Connected {
            self.stats.drop_unknown_session += 1;
            return None;
        }
        if hdr.token() != s.rx_token {
            self.stats.drop_stale_token += 1;
            return None;
        }
        match (s.role.is_client(), hdr.pkt_type()) {
            (false, PktType::Req) => self.server_rx_req(now, sid, &hdr, payload),
            (false, PktType::Rfr) => {
                self.server_rx_rfr(now, sid, &hdr);
                None
            }
            (true, PktType::ExplCr) => {
                self.client_rx_cr(now, sid, &hdr);
                None
            }
            (true, PktType::Resp) => self.client_rx_resp(now, sid, &hdr, payload),
            _ => {
                self.stats.drop_unknown_session += 1;
                None
            }
        }
    }

    /// Runs every timer due at `now`: retransmissions, session-management re-sends,
    /// keepalives, failure detection, and the release of due paced packets. Cheap (O(1))
    /// while `now` is before [`Rpc::next_timeout`]; otherwise scans the sessions once.
    pub fn handle_timeout(&mut self, now: Time) {
        self.note_now(now);
        self.release_wheel(now);
        if now < self.timer_lb {
            return;
        }
        for n in 0..self.sessions.len() {
            let sid = SessionId(n as u16);
            if self.session(sid).is_none() {
                continue;
            }
            if self.check_failure(now, sid) || self.check_idle(now, sid) {
                continue;
            }
            self.sm_timers(now, sid);
            self.rto_timers(now, sid);
        }
        self.release_wheel(now);
        self.timer_lb = self.exact_next_timeout().unwrap_or(Time::MAX);
    }

    /// When `handle_timeout` may next have work to do, if ever: a lower bound of every armed
    /// deadline, including the timing wheel's next due packet (see "Timers" in the module
    /// docs). Calling `handle_timeout` earlier does nothing; calling it at this time either
    /// runs due timers or moves this bound to the exact next deadline, so it always advances.
    pub fn next_timeout(&self) -> Option<Time> {
        (self.timer_lb != Time::MAX).then_some(self.timer_lb)
    }

    /// The earliest armed deadline, computed by scanning every session.
    fn exact_next_timeout(&self) -> Option<Time> {
        let mut best: Option<Time> = self.wheel.as_ref().and_then(TimingWheel::next_due);
        let mut add = |t: Time| best = Some(best.map_or(t, |b| b.min(t)));
        for s in self.sessions.iter().flatten() {
            add(s.last_rx.saturating_add(self.cfg.failure_timeout));
            if let Some(t) = self.idle_deadline(s) {
                add(t);
            }
            if let Some(t) = self.sm_deadline(s) {
                add(t);
            }
            if let Some(c) = s.role.client() {
                for slot in &c.slots {
                    if let Some(t) = slot.rto_deadline {
                        add(t);
                    }
                }
            }
        }
        best
    }

    /// Lowers the timer bound to cover a deadline at `t`.
    #[inline]
    fn arm(&mut self, t: Time) {
        self.timer_lb = self.timer_lb.min(t);
    }

    /// Tells the core that the receive path held no datagram at time `t` (a receive poll that
    /// found it empty, or returned fewer datagrams than it asked for, i.e. drained the socket
    /// or completion queue; `t` a clock reading taken before that poll; the
    /// [`Endpoint`](crate::erpc::event_loop::Endpoint) event loop reports its empty polls). Datagrams handed to
    /// [`Rpc::handle_datagram`] later arrived after `t`, so an RTT sample they give is at
    /// least `t` minus the packet's departure: the client's RTT samples use that bound
    /// instead of the time the datagram was handled, so that time this endpoint's own event
    /// loop did not run (a descheduled thread, an application that polls late) is not read
    /// as queueing in the network (`cc.rs`, Sampling). Call it after handling the poll's
    /// datagrams. Times that go backwards are ignored. A driver that never calls it keeps
    /// eRPC's samples (up to the handling time).
    #[inline]
    pub fn note_rx_drained(&mut self, t: Time) {
        self.rx_drained_at = self.rx_drained_at.max(t);
    }

    /// Records the latest input time (the clock `poll_transmit` uses).
    #[inline]
    fn note_now(&mut self, now: Time) {
        self.last_now = self.last_now.max(now);
    }

    /// Whether [`Rpc::poll_transmit_gather`] may have a datagram to send: packets are queued,
    /// or paced packets wait in the timing wheel. When `false` it returns `None` whatever
    /// `now` is, so a caller may skip reading its clock for it and calling it.
    #[inline]
    pub fn may_transmit(&self) -> bool {
        !self.txq.is_empty() || self.wheel.as_ref().is_some_and(|w| !w.is_empty())
    }

    /// Writes the next datagram to send into `buf` and returns its destination and length,
    /// at the latest time passed to any input (see [`Rpc::poll_transmit_at`]).
    ///
    /// # Panics
    /// If `buf` is shorter than the configured MTU (a caller bug).
    pub fn poll_transmit(&mut self, buf: &mut [u8]) -> Option<(A, usize)> {
        self.poll_transmit_at(self.last_now, buf)
    }

    /// Writes the next datagram to send at time `now` into `buf` and returns its destination
    /// and length: [`Rpc::poll_transmit_gather`] followed by a copy of a message packet's
    /// header and data into `buf` (the copying variant, for simulated wires and tests).
    ///
    /// # Panics
    /// If `buf` is shorter than the configured MTU (a caller bug).
    pub fn poll_transmit_at(&mut self, now: Time, buf: &mut [u8]) -> Option<(A, usize)> {
        loop {
            match self.poll_transmit_gather(now, buf)? {
                TxOut::Rendered { dest, len } => return Some((dest, len)),
                TxOut::Msg { dest, pkt } => {
                    // Just rendered, so present; a vanished packet is skipped.
                    if let Some((h, d)) = self.msg_pkt(&pkt) {
                        buf[..h.len()].copy_from_slice(h);
                        buf[h.len()..h.len() + d.len()].copy_from_slice(d);
                        return Some((dest, h.len() + d.len()));
                    }
                }
            }
        }
    }

    /// The next datagram to send at time `now` (ns), without copying message data: a
    /// control or session-management packet is rendered into `buf` ([`TxOut::Rendered`]);
    /// a request or response packet gets its header written into its place in the slot's
    /// [`MsgBuffer`] (seeds/000 §3) and is named by a [`MsgPkt`] ([`TxOut::Msg`]), whose
    /// header and data slices [`Rpc::msg_pkt`] returns for the transport's gather list.
    /// Paced packets are released from the timing wheel only once their time has come; the
    /// send time of client packets is recorded for RTT samples.
    ///
    /// The slices of a [`MsgPkt`] stay valid (and [`Rpc::msg_pkt`] keeps returning them)
    /// while the packet's exchange is current; once the slot moved on (call completed,
    /// session freed, newer request on a server slot) `msg_pkt` returns `None` and the
    /// packet is simply not sent (the protocol no longer needs it).
    ///
    /// # Panics
    /// If `buf` is shorter than the configured MTU (a caller bug).
    pub fn poll_transmit_gather(&mut self, now: Time, buf: &mut [u8]) -> Option<TxOut<A>> {
        match self.poll_transmit_direct(now, buf, &mut NoSink)? {
            TxNext::Out(out) => Some(out),
            // `NoSink` takes nothing.
            TxNext::Posted { .. } => None,
        }
    }

    /// [`Rpc::poll_transmit_gather`], offering control packets and message packets of at
    /// most `sink.max_len()` bytes to `sink` first ([`TxNext::Posted`] if it took the
    /// datagram; else it is rendered into `buf` or named as usual). The packet counts as
    /// sent either way (stats, send time).
    ///
    /// # Panics
    /// If `buf` is shorter than the configured MTU (a caller bug).
    #[inline]
    pub fn poll_transmit_direct<S: TxSink<A>>(
        &mut self,
        now: Time,
        buf: &mut [u8],
        sink: &mut S,
    ) -> Option<TxNext<A>> {
        assert!(buf.len() >= self.cfg.mtu, "poll_transmit buffer below mtu");
        self.note_now(now);
        let now = self.last_now;
        self.release_wheel(now);
        while let Some(tx) = self.txq.pop_front() {
            if let Some(out) = self.render(tx, buf, sink) {
                self.stats.tx_pkts += 1;
                if self.cfg.cc_rate_comp {
                    let bytes = match &out {
                        TxNext::Posted { len } => *len,
                        TxNext::Out(TxOut::Rendered { len, .. }) => *len,
                        TxNext::Out(TxOut::Msg { pkt, .. }) => pkt.wire_len(),
                    };
                    let departed = self.link_departure(now, bytes);
                    self.stamp_tx(now, departed, tx);
                }
                return Some(out);
            }
        }
        None
    }

    /// The header and data of a message packet named by [`Rpc::poll_transmit_gather`], in
    /// place in its message buffer (header: 16 bytes; data: up to `mtu - 16` bytes), or
    /// `None` if its exchange is over (see there).
    pub fn msg_pkt(&self, p: &MsgPkt) -> Option<(&[u8], &[u8])> {
        self.msg_pkt_in(p).map(|(hdr, data, _)| (hdr, data))
    }

    /// As [`Rpc::msg_pkt`], with the message buffer that holds the packet, for a transport
    /// that sends it in place ([`TxPkt::mem`](crate::erpc::datagram::TxPkt::mem)). The core
    /// keeps the rule that makes this safe: it does not rewrite the data of a buffer that is
    /// [in flight](MsgBuffer::in_flight), nor a header slot of one with different bytes
    /// (a retransmitted packet's header is identical and is not rewritten).
    #[inline]
    pub fn msg_pkt_in(&self, p: &MsgPkt) -> Option<(&[u8], &[u8], &MsgBuffer)> {
        let i = usize::from(p.pkt);
        if p.resp {
            self.resp_pkt_parts(p.session, p.generation, p.req_num, i)
        } else {
            self.req_pkt_parts(p.session, p.generation, p.req_num, i)
        }
    }

    /// Whether the core has something to do without a new datagram or timer: packets queued
    /// to send (not counting paced packets waiting in the timing wheel, which
    /// [`Rpc::next_timeout`] covers) or events the application has not taken yet.
    pub fn has_ready_work(&self) -> bool {
        !self.txq.is_empty() || !self.events.is_empty()
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    #[inline(always)]
    fn render<S: TxSink<A>>(
        &mut self,
        tx: Tx<A>,
        buf: &mut [u8],
        sink: &mut S,
    ) -> Option<TxNext<A>> {
        match tx {
            Tx::Ctrl { dest, hdr } => {
                if PKTHDR_SIZE <= sink.max_len() && sink.post(dest, &hdr, &[]) {
                    return Some(TxNext::Posted { len: PKTHDR_SIZE });
                }
                buf[..PKTHDR_SIZE].copy_from_slice(&hdr);
                Some(TxNext::Out(TxOut::Rendered {
                    dest,
                    len: PKTHDR_SIZE,
                }))
            }
            Tx::Sm { dest, out } => Some(TxNext::Out(TxOut::Rendered {
                dest,
                len: self.render_sm(&out, buf),
            })),
            Tx::ReqPkt {
                session,
                generation,
                req_num,
                pkt,
            } => self.render_req_pkt(session, generation, req_num, pkt, buf, sink),
            Tx::Rfr {
                session,
                generation,
                req_num,
                pkt,
            } => self
                .render_rfr(session, generation, req_num, pkt, buf)
                .map(|(dest, len)| TxNext::Out(TxOut::Rendered { dest, len })),
            Tx::RespPkt {
                session,
                generation,
                req_num,
                j,
            } => self.render_resp_pkt(session, generation, req_num, j, buf, sink),
        }
    }

    fn session(&self, sid: SessionId) -> Option<&Session<A>> {
        self.sessions.get(usize::from(sid.0))?.as_ref()
    }

    fn session_mut(&mut self, sid: SessionId) -> Option<&mut Session<A>> {
        self.sessions.get_mut(usize::from(sid.0))?.as_mut()
    }

    /// Allocates a session number and stores `make(generation)` there.
    fn alloc_session(&mut self, s: Session<A>) -> Option<SessionId> {
        let n = if let Some(n) = self.free_nums.pop_front() {
            n
        } else if self.sessions.len() < self.cfg.max_sessions {
            self.sessions.push(None);
            (self.sessions.len() - 1) as u16
        } else {
            return None;
        };
        self.sessions[usize::from(n)] = Some(s);
        self.live_sessions += 1;
        // The session token: random, and not its number's previous owner's.
        let i = usize::from(n);
        if self.last_rx_token.len() <= i {
            self.last_rx_token.resize(i + 1, 0);
        }
        let mut tok = self.random() as u16;
        while tok == self.last_rx_token[i] {
            tok = self.random() as u16;
        }
        self.last_rx_token[i] = tok;
        if let Some(s) = self.sessions[i].as_mut() {
            s.rx_token = tok;
        }
        Some(SessionId(n))
    }

    /// A random 64-bit value for connect and session tokens: the next output of this
    /// endpoint's OS-seeded ChaCha12 generator, XORed with `token_nonce` (unpredictable to
    /// peers).
    fn random(&mut self) -> u64 {
        rand::Rng::next_u64(&mut self.token_rng) ^ self.cfg.token_nonce
    }

    /// Admission control ([`Config::rx_ring_entries`]): `Err((ring, sessions, credits))` if
    /// one more session could overrun the receive ring.
    fn ring_room(&self) -> Result<(), (u64, u64, u64)> {
        let ring = self.cfg.rx_ring_entries.unwrap_or(usize::MAX);
        let credits = self.cfg.session_credits;
        let need = (self.live_sessions + 1).saturating_mul(credits);
        if need > ring {
            return Err((ring as u64, self.live_sessions as u64, credits as u64));
        }
        Ok(())
    }

    fn free_session(&mut self, sid: SessionId) -> Option<Session<A>> {
        let mut s = self.sessions.get_mut(usize::from(sid.0))?.take()?;
        // The slots' message buffers go back to the free list.
        match &mut s.role {
            session::Role::Client(c) => {
                for sl in c.slots.iter_mut() {
                    for b in [sl.req.take(), sl.resp.take()].into_iter().flatten() {
                        self.pool.put(b);
                    }
                }
            }
            session::Role::Server(srv) => {
                for sl in srv.slots.iter_mut() {
                    for b in [sl.req.take(), sl.resp.take()].into_iter().flatten() {
                        self.pool.put(b);
                    }
                }
            }
        }
        self.free_nums.push_back(sid.0);
        self.live_sessions -= 1;
        match s.role.client() {
            None => {
                self.conn_tokens.remove(&(s.peer, s.token));
                if let Some(n) = self.src_sessions.get_mut(&s.peer) {
                    *n -= 1;
                    if *n == 0 {
                        self.src_sessions.remove(&s.peer);
                    }
                }
            }
            Some(c) => {
                if c.slots.iter().any(|sl| sl.in_wheel > 0) {
                    self.purge_wheel(|e| e.session == sid && e.generation == s.generation);
                }
            }
        }
        Some(s)
    }

    /// Allocates the session number for a new session and arms its failure timer (a new
    /// client session's first SM timer is armed by the connect request it sends).
    fn alloc_session_armed(&mut self, s: Session<A>) -> Option<SessionId> {
        let deadline = s.last_rx.saturating_add(self.cfg.failure_timeout);
        let sid = self.alloc_session(s)?;
        self.arm(deadline);
        Some(sid)
    }

    fn new_generation(&mut self) -> u64 {
        let g = self.next_generation;
        self.next_generation += 1;
        g
    }

    /// Header for a packet to the peer of a session: `dest` is the peer's session number,
    /// `token` the peer's session token.
    fn hdr(
        req_type: u8,
        msg_size: usize,
        dest: u16,
        token: u16,
        t: PktType,
        pkt_num: usize,
        req_num: u64,
    ) -> [u8; PKTHDR_SIZE] {
        // The fields were validated when the message was accepted (sizes below the 24-bit
        // limit, packet numbers below 2^14, req_num below 2^44 for 2^41 requests per slot),
        // so the unchecked encoder applies.
        crate::erpc::pkthdr::encode_fields(
            req_type,
            msg_size as u32,
            dest,
            token,
            t,
            pkt_num as u16,
            req_num,
        )
    }

    /// Test-only consistency checks. The full census of the timing wheel (every entry belongs
    /// to a live slot's current exchange, and each slot's `in_wheel` is exact) walks every
    /// wheel slot, so it runs on every 16th call; the total count is checked on every call.
    #[cfg(test)]
    fn check_invariants(&self) {
        let census = self.check_calls.get().is_multiple_of(16);
        self.check_calls.set(self.check_calls.get() + 1);
        // Wheel entries per (session, generation, req_num); all of live, active exchanges.
        let mut queued: HashMap<(u16, u64, u64), u32> = HashMap::new();
        if let Some(w) = self.wheel.as_ref().filter(|_| census) {
            for e in w.iter() {
                let s = self
                    .session(e.session)
                    .expect("wheel entry of a freed session");
                assert_eq!(s.generation, e.generation, "wheel entry of a freed session");
                let c = s.role.client().expect("client session");
                let sl = &c.slots[sslot::slot_of(e.req_num)];
                assert!(sl.active && sl.req_num == e.req_num, "stale wheel entry");
                *queued
                    .entry((e.session.0, e.generation, e.req_num))
                    .or_default() += 1;
            }
        }
        let mut in_wheel = 0;
        for (n, s) in self.sessions.iter().enumerate() {
            let Some(s) = s else { continue };
            if let Some(c) = s.role.client() {
                let used: usize = c.slots.iter().map(|sl| sl.num_tx - sl.num_rx).sum();
                assert_eq!(
                    c.credits + used,
                    self.cfg.session_credits,
                    "credit accounting"
                );
                for sl in &c.slots {
                    assert!(sl.num_rx <= sl.num_tx);
                    assert!(
                        sl.active || sl.in_wheel == 0,
                        "idle slot with wheel packets"
                    );
                    in_wheel += sl.in_wheel as usize;
                    if census {
                        // I1: exactly `in_wheel` wheel entries belong to the slot's exchange.
                        let q = queued
                            .get(&(n as u16, s.generation, sl.req_num))
                            .copied()
                            .unwrap_or(0);
                        assert_eq!(q, sl.in_wheel, "wheel count");
                    }
                }
            }
        }
        assert_eq!(in_wheel, self.wheel_len(), "wheel entries without a slot");
        // Per-source session counts (issue 14): exactly the server sessions per peer, and no
        // entry for a source without one.
        let mut per_src: HashMap<A, usize> = HashMap::new();
        for s in self
            .sessions
            .iter()
            .flatten()
            .filter(|s| !s.role.is_client())
        {
            *per_src.entry(s.peer).or_default() += 1;
        }
        assert_eq!(per_src, self.src_sessions, "per-source session counts");
        assert!(per_src.values().all(|&n| n <= self.src_limit));
        if let Some(t) = self.exact_next_timeout() {
            assert!(
                self.timer_lb <= t,
                "timer bound {} above a deadline {t}",
                self.timer_lb
            );
        }
    }
}

/// `sessions[sid]`, borrowing only the session table (so other fields stay usable).
fn sess_mut<A>(sessions: &mut [Option<Session<A>>], sid: SessionId) -> Option<&mut Session<A>> {
    sessions.get_mut(usize::from(sid.0))?.as_mut()
}

impl<A> Rpc<A> {
    /// A snapshot of the counters. [`Stats::msgbufs_allocated`] and
    /// [`Stats::msgbufs_in_flight_skipped`] are read from the buffer pool here rather than
    /// copied into the counters on every buffer request (the core's own copy leaves them 0).
    pub fn stats(&self) -> Stats {
        Stats {
            msgbufs_allocated: self.pool.allocated,
            msgbufs_in_flight_skipped: self.pool.in_flight_skips,
            ..self.stats.clone()
        }
    }
}

impl<A> std::fmt::Debug for Rpc<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rpc")
            .field("cfg", &self.cfg)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_validation() {
        assert!(Rpc::<u32>::new(Config::default()).is_ok());
        let bad = |f: fn(&mut Config)| {
            let mut c = Config::default();
            f(&mut c);
            Rpc::<u32>::new(c).is_err()
        };
        assert!(bad(|c| c.mtu = 20));
        assert!(bad(|c| c.session_credits = 0));
        assert!(bad(|c| c.max_sessions = 70000));
        assert!(bad(|c| c.keepalive = c.failure_timeout));
        assert!(bad(|c| {
            c.mtu = 1024;
            c.max_msg_size = 8 << 20
        }));
    }

    #[test]
    fn garbage_is_counted_not_fatal() {
        let mut rpc = Rpc::<u32>::new(Config::default()).unwrap();
        rpc.handle_datagram(0, 1, &[1, 2, 3]);
        rpc.handle_datagram(0, 1, &[0xff; 40]);
        let h = PktHdr::new(0, 1, 3, PktType::Req, 0, 0).unwrap().encode();
        rpc.handle_datagram(0, 1, &h);
        let h = PktHdr::new(0, MAX_MSG_SIZE, 3, PktType::Req, 0, 0)
            .unwrap()
            .encode();
        rpc.handle_datagram(0, 1, &h);
        let st = rpc.stats();
        assert_eq!(st.drop_truncated, 1);
        assert_eq!(st.drop_bad_hdr, 1);
        assert_eq!(st.drop_unknown_session, 1);
        assert_eq!(st.drop_msg_too_large, 1);
        assert!(rpc.poll_event().is_none());
        assert!(rpc.poll_transmit(&mut [0; 4096]).is_none());
    }
}
