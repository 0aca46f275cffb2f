//! Session slots: the per-RPC state, [`SLOTS_PER_SESSION`] per session.
//!
//! Client slot `i` carries request numbers `b + i, b + i + 8, b + i + 16, ..`, where `b` is
//! the session's random request-number base (a multiple of 8, sent in the connect request;
//! issue 14): completing an RPC advances the slot's `req_num` by the window, so the server
//! can tell a new request on a slot (exactly the held `req_num` + 8) from a duplicate
//! (equal) or a stale or forged packet (anything else). The client counts packets sent (`num_tx`) and answers accepted (`num_rx`) over
//! the whole exchange: `num_req_pkts` request packets, then one RFR per response packet
//! after the first, `wire_pkts = num_req_pkts + num_resp_pkts - 1` in all.

use super::Time;
use crate::erpc::msgbuf::MsgBuffer;

/// Slots (concurrent RPCs) per session; also the `req_num` stride of a slot.
pub const SLOTS_PER_SESSION: usize = 8;

/// Packets for a message of `size` bytes: at least one. A single-packet message (the
/// common case) costs a compare, not a division.
#[inline]
pub(super) fn pkts_for(size: usize, dpp: usize) -> usize {
    if size <= dpp { 1 } else { size.div_ceil(dpp) }
}

/// Byte range of packet `i` of a `size`-byte message (empty past the end).
#[inline]
pub(super) fn pkt_range(size: usize, dpp: usize, i: usize) -> std::ops::Range<usize> {
    let start = (i * dpp).min(size);
    start..(start + dpp).min(size)
}

/// Slot index of a request number.
#[inline]
pub(super) fn slot_of(req_num: u64) -> usize {
    (req_num % SLOTS_PER_SESSION as u64) as usize
}

/// Client-side RPC state.
#[derive(Debug)]
pub(super) struct ClientSlot {
    /// An RPC occupies the slot.
    pub active: bool,
    /// The RPC's request number (the next one's while idle).
    pub req_num: u64,
    pub req_type: u8,
    pub tag: u64,
    /// Request message buffer (seeds/000 §3): data plus the packets' headers, from which
    /// packets are sent in place; taken from the core's free list on first use and reused
    /// across RPCs (replaced only by a larger one, or by a backlogged request's).
    pub req: Option<MsgBuffer>,
    pub num_req_pkts: usize,
    /// Packets sent in this exchange (request packets, then RFRs).
    pub num_tx: usize,
    /// Answers accepted (CRs, then response packets), always `<= num_tx`.
    pub num_rx: usize,
    /// Response size once response packet 0 arrived.
    pub resp_size: Option<usize>,
    pub num_resp_pkts: usize,
    /// Reassembly buffer of a multi-packet response (moved into the `Response` event when
    /// complete; single-packet responses are never copied here).
    pub resp: Option<MsgBuffer>,
    /// Retransmission deadline while `num_tx > num_rx`.
    pub rto_deadline: Option<Time>,
    /// The slot sits in the session's stall queue.
    pub in_stall: bool,
    /// When packet `k` of the exchange was last handed out by `poll_transmit`, and when it
    /// left the endpoint's link, at index `k % session_credits` (eRPC's per-slot `tx_ts`,
    /// seeds/000 §4.2); [`NO_TS`] if unknown. At most `session_credits` packets of a slot
    /// are outstanding, so indices do not collide.
    pub tx_ts: Box<[TxStamp]>,
    /// Packets of this exchange handed out at least once (`0..tx_high`): a packet below it is
    /// a retransmission, whose answer gives no RTT sample (Karn's rule; see `cc.rs`).
    pub tx_high: usize,
    /// Packets of this slot waiting in the timing wheel (eRPC's `wheel_count`, seeds/000
    /// §12.8); while non-zero, new packets of the slot also go through the wheel, so that they
    /// cannot overtake the paced ones.
    pub in_wheel: u32,
    /// Latest time a packet of the current exchange was scheduled to leave the wheel (0 if
    /// none); the retransmission timeout counts from there, not from queueing.
    pub paced_until: Time,
}

/// The send times of one client packet, ns (`cc.rs`, "Sampling").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TxStamp {
    /// When `poll_transmit` handed the packet out.
    pub handed_out: Time,
    /// When the endpoint's link finished serializing it, at the configured link rate: at
    /// least `handed_out` plus the packet's own wire time.
    pub departed: Time,
}

/// `tx_ts` value of a packet not (yet) sent, or whose answer gives no RTT sample.
pub(super) const NO_TS: TxStamp = TxStamp {
    handed_out: Time::MAX,
    departed: Time::MAX,
};

impl ClientSlot {
    /// An idle slot whose first RPC uses `first_req_num`, for a session with `credits`
    /// credits.
    pub(super) fn new(first_req_num: u64, credits: usize) -> Self {
        ClientSlot {
            active: false,
            req_num: first_req_num,
            req_type: 0,
            tag: 0,
            req: None,
            num_req_pkts: 0,
            num_tx: 0,
            num_rx: 0,
            resp_size: None,
            num_resp_pkts: 0,
            resp: None,
            rto_deadline: None,
            in_stall: false,
            tx_ts: vec![NO_TS; credits.max(1)].into_boxed_slice(),
            tx_high: 0,
            in_wheel: 0,
            paced_until: 0,
        }
    }

    /// All packets of the exchange, once the response size is known.
    pub(super) fn wire_pkts(&self) -> Option<usize> {
        self.resp_size
            .map(|_| self.num_req_pkts + self.num_resp_pkts - 1)
    }

    /// Whether the slot has a packet it could send now given a credit.
    pub(super) fn wants_tx(&self) -> bool {
        self.active
            && (self.num_tx < self.num_req_pkts
                || self.wire_pkts().is_some_and(|w| self.num_tx < w))
    }

    /// Request data size in bytes (0 without a buffer).
    #[inline]
    pub(super) fn req_len(&self) -> usize {
        self.req.as_ref().map_or(0, MsgBuffer::data_size)
    }

    /// Starts an RPC (the request data is already in `req`, whose buffer has the core's
    /// packet size).
    pub(super) fn start(&mut self, req_type: u8, tag: u64) {
        self.active = true;
        self.req_type = req_type;
        self.tag = tag;
        self.num_req_pkts = self.req.as_ref().map_or(1, MsgBuffer::num_pkts);
        self.num_tx = 0;
        self.num_rx = 0;
        self.tx_high = 0;
        self.resp_size = None;
        self.num_resp_pkts = 0;
        self.rto_deadline = None;
        self.paced_until = 0;
    }

    /// Ends the RPC and moves on to the next request number of the slot.
    pub(super) fn finish(&mut self) {
        self.active = false;
        self.req_num += SLOTS_PER_SESSION as u64;
        self.rto_deadline = None;
        self.num_tx = 0;
        self.num_rx = 0;
    }
}

/// Server-side progress of the slot's current request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum SrvState {
    /// Nothing received yet.
    #[default]
    Idle,
    /// Request packets arriving (`num_rx` of `num_req_pkts`).
    Receiving,
    /// Handed to the application; waiting for `reply`.
    AwaitingReply,
    /// The response is cached in `resp`.
    Replied,
}

/// Server-side at-most-once state of a slot: the last request number and its response.
#[derive(Debug, Default)]
pub(super) struct ServerSlot {
    /// The request number the slot holds (None before the first request).
    pub req_num: Option<u64>,
    /// The only request number a new request on the slot may carry: the session's first
    /// for the slot (`req_base + i`, from the connect request), then the held one plus
    /// [`SLOTS_PER_SESSION`]. The client moves a slot on only after the previous response
    /// completed, so it never skips one; anything else is stale or forged (issue 14).
    pub next_req: u64,
    pub state: SrvState,
    pub req_type: u8,
    pub req_size: usize,
    pub num_req_pkts: usize,
    pub num_rx: usize,
    /// Reassembly buffer of a multi-packet request (seeds/000 §3; moved into the `Request`
    /// event when complete; single-packet requests are never copied here).
    pub req: Option<MsgBuffer>,
    /// Cached response message buffer, from which response packets (and their re-sends to
    /// duplicates) are sent in place; reused across requests.
    pub resp: Option<MsgBuffer>,
    pub num_resp_pkts: usize,
}

impl ServerSlot {
    /// An idle slot whose first request is `first_req_num`.
    pub(super) fn new(first_req_num: u64) -> Self {
        ServerSlot {
            next_req: first_req_num,
            ..ServerSlot::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packet_math() {
        assert_eq!(pkts_for(0, 100), 1);
        assert_eq!(pkts_for(1, 100), 1);
        assert_eq!(pkts_for(100, 100), 1);
        assert_eq!(pkts_for(101, 100), 2);
        assert_eq!(pkt_range(250, 100, 0), 0..100);
        assert_eq!(pkt_range(250, 100, 2), 200..250);
        assert_eq!(pkt_range(0, 100, 0), 0..0);
        assert_eq!(slot_of(17), 1);
    }

    #[test]
    fn client_slot_lifecycle() {
        let mut s = ClientSlot::new(3, 8);
        assert!(!s.wants_tx());
        let mut b = MsgBuffer::new(250, 100).unwrap();
        b.resize(250).unwrap();
        s.req = Some(b);
        s.start(7, 99);
        assert_eq!(s.num_req_pkts, 3);
        assert!(s.wants_tx());
        s.num_tx = 3;
        assert!(!s.wants_tx(), "waits for response packet 0");
        s.resp_size = Some(150);
        s.num_resp_pkts = 2;
        assert_eq!(s.wire_pkts(), Some(4));
        assert!(s.wants_tx(), "one RFR to send");
        s.finish();
        assert_eq!(s.req_num, 3 + SLOTS_PER_SESSION as u64);
        assert!(!s.active);
    }
}
