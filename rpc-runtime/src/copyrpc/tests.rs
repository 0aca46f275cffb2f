//! Property tests of the copyrpc protocol core (issue 4 §3, §6): two [`EndpointCore`]s
//! connected back to back without any NIC.
//!
//! The harness moves each [`Emit`] as the device would: `len` bytes from the sender's send
//! ring to the receiver's receive ring at the sender's `remote_offset(start)`, then
//! `ingest(delta)` on the receiver, in order. Emits are taken from the core right after the
//! operation that produced them (as the context posts them) and may sit on the "wire" for a
//! while; the bytes are copied at delivery time and compared with a snapshot taken at
//! emission, which also checks that the sender never rewrites bytes in flight. The RDMA READ
//! fallback is modeled too: a flush with `needs_read` set reads the peer's published
//! consumer word, and the value is applied at a later step.
//!
//! After every step the accounting is checked on both sides (see [`Pair::check`]):
//! - `in_flight + 2R <= C`;
//! - conservation of credit, per direction (X calls, Y answers):
//!   `Y.unused_grant == X.peer_credit + grants on the wire Y→X + allowances of X's requests
//!   not yet parsed by Y`, so once the wire is empty `X.peer_credit == Y.unused_grant`;
//! - `Y.R == Y.unused_grant + allowances of requests Y parsed and has not answered`;
//! - positions: `X.remote_consumer <= Y.released <= X.producer`;
//! - no reply is ever backlogged (a reply never lacks space with an honest peer);
//! - every response arrives exactly once, with the bytes the responder wrote; every request
//!   carries the bytes the caller wrote.
//!
//! Credits are `u64` and the core uses plain subtraction, so an underflow panics here
//! (tests build with overflow checks). At the end every case drains (bounded rounds) and
//! then probes liveness: a call of the largest size the configuration guarantees must
//! eventually be accepted and answered. `COPYRPC_TRACE=1` prints every random operation with
//! both cores' state.

use std::collections::{HashMap, VecDeque};

use proptest::prelude::*;

use super::encoding::{
    ALIGNMENT, FLOW_METADATA_SIZE, FlowMetadata, HEADER_SIZE, LARGE_RESPONSE_FLAG, MsgHeader,
    RENDEZVOUS_FLAG, RESPONSE_FLAG, WRAP_MESSAGE_COUNT, internal_allowance, is_response,
    padded_message_size, to_response_id,
};
use super::endpoint::{ENTRY_LARGE_RESP, Emit, EndpointCore, EndpointState, RecvEntry};
use super::error::{CallError, CallErrorKind, EndpointFailure, ProtocolError};
use super::stats::Stats;
use crate::fifo::Fifo;

const META: u64 = FLOW_METADATA_SIZE;

/// Deterministic bytes for `(seed, len)` (splitmix64 stream).
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed ^ (len as u64).rotate_left(32);
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let n = (len - out.len()).min(8);
        out.extend_from_slice(&z.to_le_bytes()[..n]);
    }
    out
}

/// The response to call `seq`.
fn response_seed(seq: u64) -> u64 {
    seq | 1 << 63
}

/// A call issued and not yet answered.
#[derive(Clone, Copy, Debug)]
struct CallRec {
    seq: u64,
    len: u32,
    allowance: u32,
    resp_len: u32,
}

/// A request the application received and has not answered.
#[derive(Clone, Copy, Debug)]
struct Held {
    call_id: u32,
    allowance: u64,
    seq: u64,
    resp_len: u32,
}

/// An emit on the wire.
#[derive(Debug)]
struct InFlight {
    emit: Emit,
    snapshot: Vec<u8>,
    /// Credit granted by its metadata.
    grant: u64,
    /// Credit its requests spend (sum of their allowances).
    spent: u64,
}

struct Side {
    core: EndpointCore<u64>,
    stats: Stats,
    ring: u64,
    max_r: u64,
    /// Requests parsed, not yet taken by the application (the context's receive queue).
    queue: Fifo<RecvEntry>,
    held: Vec<Held>,
    /// Issued calls by call id, and call id by sequence number.
    calls: HashMap<u32, CallRec>,
    ids: HashMap<u64, u32>,
    wire: VecDeque<InFlight>,
    /// Credit spent by accepted calls whose batch is not on the wire yet.
    unsent_spend: u64,
    /// Where the next emit must start (emits are contiguous).
    next_start: u64,
    /// A consumer READ in flight: the value it read.
    read: Option<u64>,
    responses: u64,
}

impl Side {
    fn new(ring: u64, max_r: u64) -> Side {
        Side {
            core: EndpointCore::new(ring as usize, ring as usize, max_r).unwrap(),
            stats: Stats::default(),
            ring,
            max_r,
            queue: Fifo::new(),
            held: Vec::new(),
            calls: HashMap::new(),
            ids: HashMap::new(),
            wire: VecDeque::new(),
            unsent_spend: 0,
            next_start: 0,
            read: None,
            responses: 0,
        }
    }

    /// Moves the core's emits onto the wire, checking their shape and recording the credit
    /// they carry.
    fn take_emits(&mut self, peer_recv: u64) {
        while let Some(e) = self.core.emits.pop_front() {
            assert_eq!(e.start, self.next_start, "emits are contiguous");
            assert!(e.start.is_multiple_of(ALIGNMENT) && e.delta.is_multiple_of(ALIGNMENT));
            assert!(e.len as u64 >= META && e.len as u64 <= e.delta);
            let off = self.core.remote_offset(e.start);
            assert!(
                off + e.delta <= peer_recv,
                "emit crosses the peer's ring end"
            );
            assert_eq!(off, e.start % self.core.capacity());
            self.next_start = e.start + e.delta;
            // SAFETY: an emitted range.
            let snapshot = unsafe { self.core.send_bytes(e.start, e.len as usize) }.to_vec();
            let meta = FlowMetadata::read(snapshot[..32].try_into().unwrap());
            let mut spent = 0;
            if meta.is_wrap() {
                assert_eq!(e.len as u64, META);
                assert_eq!(
                    (off + e.delta) % self.core.capacity(),
                    0,
                    "wrap to ring end"
                );
            } else {
                assert_eq!(e.len as u64, e.delta);
                let mut cur = META as usize;
                for _ in 0..meta.message_count {
                    let h = MsgHeader::read(snapshot[cur..cur + HEADER_SIZE].try_into().unwrap());
                    if !is_response(h.call_id) {
                        spent += h.piggyback as u64 * ALIGNMENT;
                    }
                    cur += padded_message_size(h.payload_len as u64) as usize;
                }
                assert_eq!(cur, snapshot.len(), "message_count matches the batch");
                self.unsent_spend -= spent;
            }
            self.wire.push_back(InFlight {
                emit: e,
                snapshot,
                grant: meta.credit_grant,
                spent,
            });
        }
    }

    /// The consumer position this side published (what a peer's RDMA READ returns).
    fn published(&self) -> u64 {
        let mut b = [0u8; 8];
        // SAFETY: the 16 B consumer word; single-threaded.
        unsafe {
            std::ptr::copy_nonoverlapping(self.core.consumer_word.as_ptr(), b.as_mut_ptr(), 8)
        };
        u64::from_le_bytes(b)
    }

    /// Largest payload a call is guaranteed to get through eventually: its worst placement
    /// (a wrap wasting up to one message plus metadata) plus `2R` with `R` at its maximum
    /// fits in `C`.
    fn guaranteed_len(&self) -> u32 {
        let m = (self.core.capacity() / 2 - self.max_r - META) & !(ALIGNMENT - 1);
        (m - HEADER_SIZE as u64) as u32
    }
}

/// Picks a size from a selector: `kind` chooses the regime, `raw` the value within it.
#[derive(Clone, Copy, Debug)]
struct Sel {
    kind: u8,
    raw: u32,
}

impl Sel {
    /// `max`: the endpoint's `max_payload`; `limit`: the regime's natural limit (the
    /// guaranteed length for payloads, the largest grantable allowance for responses).
    fn pick(self, max: u32, limit: u32) -> u32 {
        match self.kind {
            0 => self.raw % 40,
            1 => self.raw % (max + 1),
            2 => max.saturating_sub(self.raw % 64),
            3 => limit.saturating_sub(self.raw % 64),
            4 => limit,
            5 => self.raw % (limit / 4 + 1),
            _ => max + 1 + self.raw % 64,
        }
    }
}

/// Payload sizes: small, any, near the maximum, near the guaranteed limit, too large.
fn len_sel() -> impl Strategy<Value = Sel> {
    (
        prop_oneof![3 => Just(0u8), 3 => Just(1), 1 => Just(2), 3 => Just(3), 2 => Just(4), 3 => Just(5), 1 => Just(6)],
        any::<u32>(),
    )
        .prop_map(|(kind, raw)| Sel { kind, raw })
}

/// Response allowances: mostly within what the peer can grant (small, up to a quarter of
/// it, near it), sometimes beyond (never granted) or too large.
fn resp_sel() -> impl Strategy<Value = Sel> {
    (
        prop_oneof![6 => Just(0u8), 1 => Just(1), 1 => Just(2), 2 => Just(3), 2 => Just(4), 6 => Just(5), 1 => Just(6)],
        any::<u32>(),
    )
        .prop_map(|(kind, raw)| Sel { kind, raw })
}

#[derive(Clone, Debug)]
enum Op {
    Call {
        side: usize,
        len: Sel,
        resp: Sel,
        frac: u8,
    },
    /// The application takes up to `n` parsed requests.
    Recv { side: usize, n: u8 },
    /// The application answers one held request (`pick` modulo the held count).
    Reply { side: usize, pick: u16 },
    /// publish + flush (+ start a consumer READ if the core asks for one).
    Flush { side: usize },
    /// Delivers up to `n` emits from `side` to its peer.
    Deliver { side: usize, n: u8 },
    /// Completes `side`'s consumer READ.
    ReadDone { side: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let side = 0usize..2;
    prop_oneof![
        6 => (side.clone(), len_sel(), resp_sel(), any::<u8>())
            .prop_map(|(side, len, resp, frac)| Op::Call { side, len, resp, frac }),
        3 => (side.clone(), 1u8..8).prop_map(|(side, n)| Op::Recv { side, n }),
        4 => (side.clone(), any::<u16>()).prop_map(|(side, pick)| Op::Reply { side, pick }),
        3 => side.clone().prop_map(|side| Op::Flush { side }),
        4 => (side.clone(), 1u8..6).prop_map(|(side, n)| Op::Deliver { side, n }),
        1 => side.prop_map(|side| Op::ReadDone { side }),
    ]
}

struct Pair {
    s: [Side; 2],
    next_seq: u64,
}

impl Pair {
    /// Two connected cores: side `i` has send and receive rings of `rings[i]` bytes and
    /// grants at most `max_r[i]`. `None` if `connect` refuses the combination.
    fn new(rings: [u64; 2], max_r: [u64; 2]) -> Option<Pair> {
        let mut s = [Side::new(rings[0], max_r[0]), Side::new(rings[1], max_r[1])];
        for x in 0..2 {
            let (ring, credit) = (s[1 - x].ring, s[1 - x].core.initial_credit());
            s[x].core.check_remote(ring, credit).ok()?;
        }
        for x in 0..2 {
            let (ring, credit) = (s[1 - x].ring, s[1 - x].core.initial_credit());
            s[x].core.connect(ring, credit).unwrap();
            // The grant policy's real maximum (the core raises it to the initial credit).
            s[x].max_r = s[x]
                .core
                .resp_reservation()
                .max(s[x].max_r & !(ALIGNMENT - 1));
        }
        Some(Pair { s, next_seq: 1 })
    }

    fn two(&mut self, x: usize) -> (&mut Side, &mut Side) {
        let (a, b) = self.s.split_at_mut(1);
        if x == 0 {
            (&mut a[0], &mut b[0])
        } else {
            (&mut b[0], &mut a[0])
        }
    }

    /// Issues a call from `x`. Returns whether it was accepted.
    fn call(&mut self, x: usize, len: u32, allowance: u32, resp_len: u32) -> bool {
        let seq = self.next_seq;
        self.next_seq += 1;
        let (me, peer) = self.two(x);
        let max = me.core.max_payload();
        let credit_before = me.core.peer_credit();
        let payload = pattern(seq, len as usize);
        let r = me.core.call(
            len,
            allowance,
            seq,
            |b| {
                assert_eq!(b.len(), payload.len());
                b.copy_from_slice(&payload);
                payload.len()
            },
            &mut me.stats,
        );
        let too_large = len > max || allowance > me.core.max_response_allowance();
        let accepted = match r {
            Ok(call_id) => {
                assert!(!too_large, "accepted a call above max_payload");
                assert_eq!(
                    me.core.peer_credit(),
                    credit_before - internal_allowance(allowance as u64)
                );
                let old = me.calls.insert(
                    call_id,
                    CallRec {
                        seq,
                        len,
                        allowance,
                        resp_len,
                    },
                );
                assert!(old.is_none(), "call id {call_id} reused while pending");
                me.ids.insert(seq, call_id);
                me.unsent_spend += internal_allowance(allowance as u64);
                true
            }
            Err(CallError {
                kind: CallErrorKind::MessageTooLarge,
                user: u,
            }) => {
                assert_eq!(u, seq);
                assert!(
                    too_large,
                    "MessageTooLarge for {len}/{allowance} (max {max})"
                );
                false
            }
            Err(CallError {
                kind: CallErrorKind::InsufficientCredit,
                user: u,
            }) => {
                assert_eq!(u, seq);
                assert!(!too_large);
                assert!(credit_before < internal_allowance(allowance as u64));
                assert_eq!(me.core.peer_credit(), credit_before);
                false
            }
            Err(CallError {
                kind: CallErrorKind::RingFull,
                user: u,
            }) => {
                assert_eq!(u, seq);
                assert!(!too_large);
                assert!(credit_before >= internal_allowance(allowance as u64));
                assert_eq!(me.core.peer_credit(), credit_before);
                false
            }
            Err(e) => panic!("unexpected call error {e:?}"),
        };
        me.take_emits(peer.ring);
        accepted
    }

    fn recv(&mut self, x: usize, n: usize) {
        let (me, peer) = self.two(x);
        for _ in 0..n {
            let Some(e) = me.queue.pop_front() else {
                return;
            };
            // SAFETY: from this core's ingest, not yet received (the bytes are read before the
            // release, as `Context::recv` does, and no flush happens in between).
            let bytes = unsafe { me.core.request_bytes(&e) }.to_vec();
            me.core.received(&e);
            let rec = *peer
                .calls
                .get(&e.call_id)
                .unwrap_or_else(|| panic!("request for no call {}", e.call_id));
            assert_eq!(bytes, pattern(rec.seq, rec.len as usize), "request bytes");
            assert_eq!(e.allowance, internal_allowance(rec.allowance as u64));
            assert!(
                !me.held.iter().any(|h| h.call_id == e.call_id),
                "request {} received twice",
                e.call_id
            );
            me.held.push(Held {
                call_id: e.call_id,
                allowance: e.allowance,
                seq: rec.seq,
                resp_len: rec.resp_len,
            });
        }
    }

    fn reply(&mut self, x: usize, pick: usize) {
        let (me, peer) = self.two(x);
        if me.held.is_empty() {
            return;
        }
        let h = me.held.swap_remove(pick % me.held.len());
        let data = pattern(response_seed(h.seq), h.resp_len as usize);
        let backlogged = me.stats.backlogged_replies;
        me.core
            .reply(
                h.call_id,
                h.allowance,
                h.resp_len,
                |b| {
                    b[..data.len()].copy_from_slice(&data);
                    data.len()
                },
                &mut me.stats,
            )
            .expect("reply");
        assert_eq!(me.stats.backlogged_replies, backlogged, "reply backlogged");
        me.take_emits(peer.ring);
    }

    fn flush(&mut self, x: usize) {
        let (me, peer) = self.two(x);
        me.core.publish();
        me.core.flush(&mut me.stats);
        me.take_emits(peer.ring);
        // The context posts the READ after the emits, if none is outstanding.
        if me.core.needs_read() && me.read.is_none() {
            me.read = Some(peer.published());
        }
    }

    fn read_done(&mut self, x: usize) {
        let me = &mut self.s[x];
        if let Some(v) = me.read.take() {
            me.core
                .on_consumer_read(v)
                .expect("consumer read within the bytes sent");
        }
    }

    /// Delivers up to `n` emits from `x` to its peer.
    fn deliver(&mut self, x: usize, n: usize) {
        let (me, peer) = self.two(x);
        for _ in 0..n {
            let Some(f) = me.wire.pop_front() else {
                return;
            };
            let e = f.emit;
            // SAFETY: an emitted range, not yet consumed by the peer.
            let now = unsafe { me.core.send_bytes(e.start, e.len as usize) };
            assert_eq!(now, &f.snapshot[..], "sender rewrote bytes in flight");
            let off = me.core.remote_offset(e.start) as usize;
            // SAFETY: `off + len <= peer's receive ring` (checked when taken).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    f.snapshot.as_ptr(),
                    peer.core.recv.buf.as_mut_ptr().add(off),
                    f.snapshot.len(),
                )
            };
            let mut got: Vec<(u64, Result<Vec<u8>, EndpointFailure>)> = Vec::new();
            peer.core
                .ingest(e.delta, 0, &mut peer.queue, &mut peer.stats, &mut |u, r| {
                    got.push((u, r.map(<[u8]>::to_vec)))
                })
                .unwrap_or_else(|err| panic!("honest batch {e:?} rejected: {err}"));
            for (seq, r) in got {
                let bytes = r.expect("response ok");
                let id = peer
                    .ids
                    .remove(&seq)
                    .unwrap_or_else(|| panic!("response to call {seq} that is not pending"));
                let rec = peer.calls.remove(&id).unwrap();
                assert_eq!(rec.seq, seq);
                assert_eq!(
                    bytes,
                    pattern(response_seed(seq), rec.resp_len as usize),
                    "response bytes of call {seq}"
                );
                peer.responses += 1;
            }
        }
    }

    /// The accounting invariants (module docs).
    fn check(&self) {
        for x in 0..2 {
            let (me, peer) = (&self.s[x], &self.s[1 - x]);
            let c = &me.core;
            assert_eq!(c.state(), EndpointState::Connected);
            assert!(
                c.in_flight() + 2 * c.resp_reservation() <= c.capacity(),
                "side {x}: in_flight {} + 2R {} > C {}",
                c.in_flight(),
                2 * c.resp_reservation(),
                c.capacity()
            );
            assert!(
                c.resp_reservation() <= me.max_r,
                "side {x}: R above the policy"
            );
            // Conservation, direction x calls -> peer answers.
            let granted: u64 = peer.wire.iter().map(|f| f.grant).sum();
            let spent: u64 = me.wire.iter().map(|f| f.spent).sum::<u64>() + me.unsent_spend;
            assert_eq!(
                peer.core.unused_grant(),
                c.peer_credit() + granted + spent,
                "side {x}: credit not conserved: peer unused {}, peer grants on wire {granted}, \
                 our credit {}, spent on wire {spent} (unsent {})\n{:?}\n{:?}",
                peer.core.unused_grant(),
                c.peer_credit(),
                me.unsent_spend,
                me.wire,
                peer.wire,
            );
            // R = unused grant + allowances of requests parsed and not answered.
            let owed: u64 = me.queue.iter().map(|e| e.allowance).sum::<u64>()
                + me.held.iter().map(|h| h.allowance).sum::<u64>();
            assert_eq!(
                c.resp_reservation(),
                c.unused_grant() + owed,
                "side {x}: R != unused grant + owed"
            );
            let (producer, remote_consumer, _, _) = c.positions();
            let (_, _, peer_released, _) = peer.core.positions();
            assert!(remote_consumer <= peer_released, "side {x}: consumer ahead");
            assert!(
                peer_released <= producer,
                "side {x}: peer released unsent bytes"
            );
            assert_eq!(c.pending_calls(), me.calls.len());
            assert_eq!(me.stats.backlogged_replies, 0);
            assert_eq!(me.stats.corrupt_batches, 0);
        }
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Call {
                side,
                len,
                resp,
                frac,
            } => {
                let me = &self.s[side];
                let peer = &self.s[1 - side];
                let len = len.pick(me.core.max_payload(), me.guaranteed_len());
                let credit_limit = (peer.max_r - META - HEADER_SIZE as u64) as u32;
                let allowance = resp.pick(me.core.max_response_allowance(), credit_limit);
                // 255: the most the responder may send (the allowance is carried in 32 B
                // units: `RecvHandle::max_response`).
                let resp_len = if frac == 255 {
                    (padded_message_size(allowance as u64) - HEADER_SIZE as u64) as u32
                } else {
                    (allowance as u64 * frac as u64 / 255) as u32
                };
                self.call(side, len, allowance, resp_len);
            }
            Op::Recv { side, n } => self.recv(side, n as usize),
            Op::Reply { side, pick } => self.reply(side, pick as usize),
            Op::Flush { side } => self.flush(side),
            Op::Deliver { side, n } => self.deliver(side, n as usize),
            Op::ReadDone { side } => self.read_done(side),
        }
        if std::env::var_os("COPYRPC_TRACE").is_some() {
            eprintln!(
                "{op:?}\n  0: {:?}\n  1: {:?}",
                self.s[0].core, self.s[1].core
            );
        }
        self.check();
    }

    /// One round of everything: receive and answer all, flush, deliver all, finish READs.
    /// Returns whether anything moved.
    fn round(&mut self) -> bool {
        let before = self.progress_mark();
        for x in 0..2 {
            self.recv(x, usize::MAX);
            self.check();
            while !self.s[x].held.is_empty() {
                self.reply(x, 0);
                self.check();
            }
            self.flush(x);
            self.check();
        }
        for x in 0..2 {
            self.deliver(x, usize::MAX);
            self.check();
        }
        for x in 0..2 {
            self.read_done(x);
            self.check();
        }
        before != self.progress_mark()
    }

    fn progress_mark(&self) -> [u64; 6] {
        let p = |x: usize| self.s[x].core.positions();
        [p(0).0, p(0).1, p(0).2, p(1).0, p(1).1, p(1).2]
    }

    fn idle(&self) -> bool {
        self.s.iter().all(|s| {
            s.calls.is_empty()
                && s.wire.is_empty()
                && s.queue.is_empty()
                && s.held.is_empty()
                && s.read.is_none()
                && s.core.emits.is_empty()
                && !s.core.is_dirty()
        })
    }

    /// Runs rounds until everything is answered and the endpoints stop exchanging anything.
    fn drain(&mut self, what: &str) {
        for _ in 0..200 {
            let moved = self.round();
            if self.idle() && !moved {
                return;
            }
        }
        panic!(
            "{what}: no progress after 200 rounds: pending {} / {}, held {} / {}, {:?} / {:?}",
            self.s[0].calls.len(),
            self.s[1].calls.len(),
            self.s[0].held.len(),
            self.s[1].held.len(),
            self.s[0].core,
            self.s[1].core,
        );
    }

    /// After draining: credit is conserved exactly, and a call of the largest guaranteed
    /// size with the largest grantable response is accepted (after polling) and answered.
    fn finish(&mut self) {
        self.drain("drain");
        for x in 0..2 {
            let (me, peer) = (&self.s[x], &self.s[1 - x]);
            assert_eq!(me.core.peer_credit(), peer.core.unused_grant());
            assert_eq!(peer.core.resp_reservation(), peer.core.unused_grant());
        }
        for x in 0..2 {
            let len = self.s[x].guaranteed_len();
            let allowance = (self.s[1 - x].max_r - META - HEADER_SIZE as u64) as u32;
            let mut ok = false;
            for _ in 0..50 {
                if self.call(x, len, allowance, allowance) {
                    ok = true;
                    break;
                }
                self.check();
                self.round();
            }
            assert!(
                ok,
                "side {x}: probe call ({len} B, allowance {allowance}) never accepted: {:?}",
                self.s[x].core
            );
            let answered = self.s[x].responses;
            self.drain("probe");
            assert_eq!(self.s[x].responses, answered + 1);
        }
    }
}

fn config() -> impl Strategy<Value = ([u64; 2], [u64; 2])> {
    // Rings of 1-8 KiB; the grant policy from 1/16 to 3/8 of the smaller ring.
    let ring = (0u32..4).prop_map(|k| 1024u64 << k);
    let frac = prop_oneof![Just(2u64), Just(4), Just(6), Just(8), Just(12)];
    (ring.clone(), ring, frac.clone(), frac).prop_map(|(a, b, fa, fb)| {
        let min = a.min(b);
        ([a, b], [min * fa / 32, min * fb / 32])
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Random interleavings of calls (both directions), receipts, out-of-order replies,
    /// flushes, delayed deliveries and consumer READs keep the accounting invariants, and
    /// everything drains.
    #[test]
    fn credit_accounting_holds(
        (rings, max_r) in config(),
        ops in proptest::collection::vec(op(), 1..400),
    ) {
        let pair = Pair::new(rings, max_r);
        prop_assume!(pair.is_some());
        let mut p = pair.unwrap();
        p.check();
        for op in &ops {
            p.apply(op);
        }
        p.finish();
    }

    /// Closed-loop traffic: many calls issued as fast as credit and ring allow, answered in
    /// random order, with every batch delivered late. Covers long runs of wraps.
    #[test]
    fn closed_loop_with_late_delivery(
        (rings, max_r) in config(),
        seed in any::<u64>(),
        steps in 300usize..2000,
    ) {
        let pair = Pair::new(rings, max_r);
        prop_assume!(pair.is_some());
        let mut p = pair.unwrap();
        let mut rng = seed | 1;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for _ in 0..steps {
            let x = (next() % 2) as usize;
            let r = next();
            let max = p.s[x].core.max_payload();
            let lim = p.s[x].guaranteed_len();
            let len = if r % 4 == 0 { lim } else { (r >> 8) as u32 % (lim + 1) };
            let amax = (p.s[1 - x].max_r - META - HEADER_SIZE as u64) as u32;
            let allowance = if r % 3 == 0 { amax } else { (r >> 24) as u32 % (amax + 1) };
            assert_eq!(lim, max);
            p.call(x, len, allowance, allowance / 2 + (r >> 40) as u32 % (allowance / 2 + 1));
            p.check();
            match next() % 6 {
                0 => p.recv(x, 3),
                1 => {
                    let pick = next() as usize;
                    p.reply(1 - x, pick);
                }
                2 => p.flush(x),
                3 => p.deliver(1 - x, 2),
                4 => p.read_done(x),
                _ => {
                    p.recv(1 - x, 2);
                    p.flush(1 - x);
                    p.deliver(x, 1);
                }
            }
            p.check();
        }
        p.finish();
    }
}

/// Regression: a wrap inside `reply` (or `call`) writes a wrap marker whose metadata grants
/// credit; that grant must leave room for the message written after the marker. Here side
/// 0 (`max_R = 64`) has 896 B in flight up to ring offset 960 and owes one response
/// (`R = 64`); the reply frees `R` and wraps (64 B waste + 32 B metadata + 32 B message).
/// The marker may not grant anything (`in_flight` is then 1024 = C); granting 32 B from the
/// in-flight count before the message (960) gave 1024 + 64 > C.
#[test]
fn grant_in_a_wrap_marker_leaves_room_for_the_message() {
    let mut p = Pair::new([1024, 1024], [64, 256]).unwrap();
    assert!(p.call(1, 0, 20, 20)); // all of side 0's grant (64)
    p.flush(1);
    p.deliver(1, 9);
    p.recv(0, 9);
    assert_eq!(p.s[0].core.resp_reservation(), 64);
    // 64 B sent and consumed.
    assert!(p.call(0, 20, 0, 0));
    p.flush(0);
    p.deliver(0, 9);
    p.recv(1, 9);
    p.reply(1, 0);
    p.flush(1);
    p.deliver(1, 9);
    assert_eq!(p.s[0].core.positions().1, 64);
    // 896 B more, not consumed: the producer at 960.
    assert!(p.call(0, 404, 0, 0));
    assert!(p.call(0, 404, 0, 0));
    assert!(p.call(0, 20, 0, 0));
    p.flush(0);
    p.check();
    assert_eq!(p.s[0].core.positions().0, 960);
    assert_eq!(p.s[0].core.in_flight(), 896);
    // The reply wraps.
    let markers = p.s[0].stats.wrap_markers;
    p.reply(0, 0);
    assert_eq!(p.s[0].stats.wrap_markers, markers + 1);
    p.check();
    p.finish();
}

/// Regression: rings of different sizes. Both directions use `C = min` of the two rings; the
/// side with the larger receive ring must parse it with that capacity too (it used its own
/// ring size, so the small side's wrap markers were rejected as not ending at the ring end
/// and batches after a wrap were read at the wrong offset).
#[test]
fn different_ring_sizes_wrap_consistently() {
    for (a, b) in [(1024, 4096), (8192, 2048)] {
        let mut p = Pair::new([a, b], [a.min(b) / 4, a.min(b) / 4]).unwrap();
        for i in 0..200u32 {
            for x in 0..2 {
                let len = (i * 37 + x as u32 * 11) % (p.s[x].core.max_payload() + 1);
                let _ = p.call(x, len, 64, 64);
                p.check();
            }
            p.round();
        }
        p.finish();
        for x in 0..2 {
            assert!(p.s[x].stats.wrap_markers >= 5, "side {x} wrapped");
            assert!(
                p.s[x].responses >= 150,
                "side {x}: {} responses",
                p.s[x].responses
            );
        }
    }
}

/// Every first-wrap alignment: a pair of 1 KiB rings, side 0 first sends `k * 32` bytes in
/// one batch (all consumed), then calls of every size; each wrap must keep the invariants.
#[test]
fn wraps_at_every_offset_keep_the_invariant() {
    for k in 2..31u32 {
        for len in [0u32, 20, 52, 100, 150, 180, 212] {
            let mut p = Pair::new([1024, 1024], [256, 256]).unwrap();
            assert_eq!(p.s[0].core.max_payload(), 212);
            // Batches of one request (64-256 B each) up to offset `k * 32`, all answered.
            let mut rest = k * 32;
            while rest > 0 {
                let b = if rest > 256 {
                    (rest - 64).min(256)
                } else {
                    rest
                };
                assert!(p.call(0, b - 32 - 12, 0, 0));
                p.drain("setup");
                rest -= b;
            }
            assert_eq!(p.s[0].core.positions().0, k as u64 * 32);
            let mut after = 0;
            for _ in 0..100 {
                let _ = p.call(0, len, 100, 100);
                p.check();
                p.round();
                if p.s[0].stats.wrap_markers > 0 {
                    after += 1;
                    if after == 3 {
                        break;
                    }
                }
            }
            assert_eq!(after, 3, "no wrap after 100 calls of {len} B");
            p.finish();
        }
    }
}

// ---------------------------------------------------------------------------------------
// Bad input (issue §6) at the core: every corruption is rejected by `ingest` before anything
// is delivered, and never panics or reads out of bounds.

/// A connected pair with one call from side 0 pending (call id returned), nothing in flight.
fn pair_with_pending_call() -> (Pair, u32) {
    let mut p = Pair::new([4096, 4096], [1024, 1024]).unwrap();
    assert!(p.call(0, 10, 100, 100));
    p.flush(0);
    p.deliver(0, 9);
    let id = *p.s[0].calls.keys().next().unwrap();
    (p, id)
}

/// Writes `bytes` at side `x`'s receive position and ingests `delta` bytes. Returns the
/// result and how many messages were delivered (responses to the callback plus requests
/// queued).
fn forge(p: &mut Pair, x: usize, bytes: &[u8], delta: u64) -> (Result<(), ProtocolError>, usize) {
    let me = &mut p.s[x];
    write_at_recv(me, bytes);
    let queued = me.queue.len();
    let mut delivered = 0;
    let r = me
        .core
        .ingest(delta, 0, &mut me.queue, &mut me.stats, &mut |_, _| {
            delivered += 1
        });
    (r, delivered + me.queue.len() - queued)
}

/// Writes `bytes` (as much as fits before the ring end) at side `me`'s receive position.
fn write_at_recv(me: &mut Side, bytes: &[u8]) {
    let off = me.core.recv_position() % me.core.recv_size();
    let n = bytes.len().min((me.core.recv_size() - off) as usize);
    // SAFETY: inside the receive ring; single-threaded.
    unsafe {
        std::ptr::copy_nonoverlapping(
            bytes.as_ptr(),
            me.core.recv.buf.as_mut_ptr().add(off as usize),
            n,
        )
    };
}

/// A batch under construction.
struct Batch(Vec<u8>);

impl Batch {
    fn new(ret: u64, grant: u64, count: u32) -> Batch {
        let mut b = vec![0u8; 32];
        FlowMetadata {
            ring_credit_return: ret,
            credit_grant: grant,
            message_count: count,
            reads_done: 0,
        }
        .write((&mut b[..32]).try_into().unwrap());
        Batch(b)
    }

    /// Appends a message header and `body` payload bytes (padded to 32 B), whatever
    /// `payload_len` claims.
    fn msg(mut self, call_id: u32, piggyback: u32, payload_len: u32, body: usize) -> Batch {
        let mut h = [0u8; HEADER_SIZE];
        MsgHeader {
            call_id,
            piggyback,
            payload_len,
        }
        .write(&mut h);
        self.0.extend_from_slice(&h);
        self.0.extend(std::iter::repeat_n(0xab, body));
        let l = self.0.len().next_multiple_of(32);
        self.0.resize(l, 0);
        self
    }

    fn delta(&self) -> u64 {
        self.0.len() as u64
    }
}

/// Forges `b` (with `delta`, default its length) into side `x` and expects `want`, with
/// nothing delivered and nothing of the receive state changed.
fn expect_rejected(p: &mut Pair, x: usize, b: &Batch, delta: Option<u64>, want: ProtocolError) {
    let before = (
        p.s[x].core.positions(),
        p.s[x].core.recv_position(),
        p.s[x].core.peer_credit(),
        p.s[x].core.unused_grant(),
        p.s[x].core.pending_calls(),
    );
    let (r, delivered) = forge(p, x, &b.0, delta.unwrap_or(b.delta()));
    assert_eq!(r, Err(want));
    assert_eq!(delivered, 0, "nothing of a rejected batch is delivered");
    let after = (
        p.s[x].core.positions(),
        p.s[x].core.recv_position(),
        p.s[x].core.peer_credit(),
        p.s[x].core.unused_grant(),
        p.s[x].core.pending_calls(),
    );
    assert_eq!(before, after, "a rejected batch changes nothing");
}

#[test]
fn corrupt_counts_and_lengths_are_rejected() {
    let (mut p, _) = pair_with_pending_call();
    // message_count beyond the bytes received.
    let b = Batch::new(0, 0, 3).msg(7, 2, 10, 10);
    expect_rejected(&mut p, 1, &b, None, ProtocolError::BadCount);
    // Fewer messages announced than present (trailing bytes).
    let b = Batch::new(0, 0, 1).msg(7, 2, 10, 10).msg(8, 2, 10, 10);
    expect_rejected(&mut p, 1, &b, None, ProtocolError::BadCount);
    // payload_len beyond the batch.
    for len in [21, 1000, RENDEZVOUS_FLAG - 1] {
        let b = Batch::new(0, 0, 1).msg(7, 2, len, 10);
        expect_rejected(&mut p, 1, &b, None, ProtocolError::BadLength);
    }
    // At the extremes of u32 the rendezvous flag is set: not a descriptor's length field.
    for len in [u32::MAX - 11, u32::MAX] {
        let b = Batch::new(0, 0, 1).msg(7, 2, len, 10);
        expect_rejected(
            &mut p,
            1,
            &b,
            None,
            ProtocolError::BadDescriptor("length field is not the flag plus 16"),
        );
    }
    // A count of u32::MAX - 1 (not a wrap) on an empty batch.
    let b = Batch::new(0, 0, u32::MAX - 1);
    expect_rejected(&mut p, 1, &b, None, ProtocolError::BadCount);
}

/// The receive ring is the peer's to write (it holds the rkey), so a batch may change
/// between validation and delivery. Delivery checks again what memory safety and the
/// credit accounting rest on, on the values it reads: a message now running past the
/// batch, a rendezvous descriptor now longer than the large-message limit (its READ would
/// overrun the landing buffer) and a request now spending more credit than is left each
/// fail the batch, with no panic and no READ queued.
#[test]
fn a_batch_rewritten_after_validation_fails_in_delivery() {
    let (mut p, _) = pair_with_pending_call();
    let me = &mut p.s[1];
    let deliver = |me: &mut Side, b: &Batch, count: u32| {
        write_at_recv(me, &b.0);
        let mut delivered = 0;
        let r = me.core.deliver_as_validated(
            b.delta(),
            count,
            &mut me.queue,
            &mut me.stats,
            &mut |_, _| delivered += 1,
        );
        (r, delivered)
    };
    // The second message's length now runs past the batch.
    let b = Batch::new(0, 0, 2).msg(7, 0, 10, 10).msg(8, 0, 5000, 10);
    assert_eq!(deliver(me, &b, 2).0, Err(ProtocolError::BadLength));
    // A header beyond the batch (the first message's length grew into the second's place).
    let b = Batch::new(0, 0, 2).msg(7, 0, 40, 10);
    assert_eq!(deliver(me, &b, 2).0, Err(ProtocolError::BadLength));
    // A rendezvous descriptor whose length is now above the limit (0 here: none accepted).
    let mut b = Batch::new(0, 0, 1).msg(9, 0, RENDEZVOUS_FLAG | 16, 16);
    super::encoding::Descriptor {
        addr: 0x1000,
        rkey: 1,
        len: u32::MAX,
    }
    .write(&mut b.0[32 + HEADER_SIZE..32 + HEADER_SIZE + 16]);
    assert_eq!(
        deliver(me, &b, 1).0,
        Err(ProtocolError::BadDescriptor(
            "length above the large-message limit"
        ))
    );
    assert!(!me.core.large_work(), "no READ queued");
    // A request whose allowance now exceeds the credit left.
    let queued = me.queue.len();
    let units = (me.core.unused_grant() / ALIGNMENT + 1) as u32;
    let b = Batch::new(0, 0, 1).msg(11, units, 10, 10);
    assert_eq!(deliver(me, &b, 1).0, Err(ProtocolError::BadCredit));
    assert_eq!(me.queue.len(), queued, "not queued");
}

#[test]
fn bad_deltas_are_rejected() {
    let (mut p, _) = pair_with_pending_call();
    let b = Batch::new(0, 0, 0);
    for d in [0, 8, 16, 31, 33, 40, 63] {
        expect_rejected(&mut p, 0, &b, Some(d), ProtocolError::BadLength);
    }
    // Crossing the ring end, and absurd immediates.
    let ring = p.s[0].core.recv_size();
    for d in [ring + 32, crate::copyrpc::encoding::decode_imm(u32::MAX)] {
        expect_rejected(&mut p, 0, &b, Some(d), ProtocolError::BadLength);
    }
}

#[test]
fn bad_wraps_are_rejected() {
    let (mut p, _) = pair_with_pending_call();
    // Side 1 is at receive position 64: a wrap must cover the rest of the ring exactly.
    let b = Batch::new(0, 0, WRAP_MESSAGE_COUNT);
    let rest = p.s[1].core.recv_size() - p.s[1].core.recv_position();
    for d in [32, rest - 32] {
        expect_rejected(&mut p, 1, &b, Some(d), ProtocolError::BadWrap);
    }
    // The right wrap is accepted.
    let (r, n) = forge(&mut p, 1, &b.0, rest);
    assert_eq!((r, n), (Ok(()), 0));
}

#[test]
fn bad_responses_are_rejected() {
    let (mut p, id) = pair_with_pending_call();
    // Unknown call id.
    let b = Batch::new(0, 0, 1).msg(to_response_id(id + 7), 0, 4, 4);
    expect_rejected(
        &mut p,
        0,
        &b,
        None,
        ProtocolError::UnknownCallId(to_response_id(id + 7)),
    );
    let b = Batch::new(0, 0, 1).msg(u32::MAX, 0, 4, 4);
    expect_rejected(&mut p, 0, &b, None, ProtocolError::UnknownCallId(u32::MAX));
    // Larger than the call's allowance (100) rounded up to the padded message (116).
    let b = Batch::new(0, 0, 1).msg(to_response_id(id), 0, 117, 117);
    expect_rejected(&mut p, 0, &b, None, ProtocolError::ResponseTooLarge);
    // Twice in one batch: detected on delivery, after the first was delivered.
    let b = Batch::new(0, 0, 2)
        .msg(to_response_id(id), 0, 4, 4)
        .msg(to_response_id(id), 0, 4, 4);
    let (r, n) = forge(&mut p, 0, &b.0, b.delta());
    assert_eq!(r, Err(ProtocolError::UnknownCallId(to_response_id(id))));
    assert_eq!(n, 1);
    assert_eq!(p.s[0].core.pending_calls(), 0);
}

#[test]
fn duplicate_response_in_a_later_batch_is_rejected() {
    let (mut p, id) = pair_with_pending_call();
    let b = Batch::new(0, 0, 1).msg(to_response_id(id), 0, 4, 4);
    assert_eq!(forge(&mut p, 0, &b.0, b.delta()), (Ok(()), 1));
    assert_eq!(p.s[0].core.pending_calls(), 0);
    expect_rejected(
        &mut p,
        0,
        &b,
        None,
        ProtocolError::UnknownCallId(to_response_id(id)),
    );
}

#[test]
fn bad_credit_returns_and_grants_are_rejected() {
    let (mut p, _) = pair_with_pending_call();
    // Side 0 sent 64 bytes: returning 96 is beyond what was sent; so is a wrapping sum.
    for ret in [96, 1 << 40, u64::MAX, u64::MAX - 31] {
        expect_rejected(
            &mut p,
            0,
            &Batch::new(ret, 0, 0),
            None,
            ProtocolError::BadConsumer,
        );
    }
    // Unaligned, beyond the ring, overflowing grants.
    for grant in [1, 31, 8192, u64::MAX, u64::MAX - 31] {
        expect_rejected(
            &mut p,
            0,
            &Batch::new(0, grant, 0),
            None,
            ProtocolError::BadCredit,
        );
    }
    // Exactly what was sent is accepted.
    assert_eq!(forge(&mut p, 0, &Batch::new(64, 0, 0).0, 32), (Ok(()), 0));
    assert_eq!(p.s[0].core.in_flight(), 0);
}

#[test]
fn requests_spending_more_than_granted_are_rejected() {
    let (mut p, _) = pair_with_pending_call();
    // Side 1 granted 1024 initially; side 0's call spent internal_allowance(100) = 160.
    let unused = p.s[1].core.unused_grant();
    assert_eq!(unused, 1024 - 160);
    let units = (unused / 32) as u32;
    let b = Batch::new(0, 0, 1).msg(3, units + 1, 0, 0);
    expect_rejected(&mut p, 1, &b, None, ProtocolError::BadCredit);
    // Two requests that together overspend.
    let b = Batch::new(0, 0, 2)
        .msg(3, units / 2 + 1, 0, 0)
        .msg(4, units / 2 + 1, 0, 0);
    expect_rejected(&mut p, 1, &b, None, ProtocolError::BadCredit);
    let b = Batch::new(0, 0, 1).msg(3, u32::MAX, 0, 0);
    expect_rejected(&mut p, 1, &b, None, ProtocolError::BadCredit);
    // Spending exactly the grant is fine.
    let b = Batch::new(0, 0, 2).msg(3, units - 2, 0, 0).msg(4, 2, 0, 0);
    assert_eq!(forge(&mut p, 1, &b.0, b.delta()), (Ok(()), 2));
    assert_eq!(p.s[1].core.unused_grant(), 0);
}

#[test]
fn mixed_batches_queue_requests_in_order_or_nothing() {
    let (mut p, id) = pair_with_pending_call();
    let unused = p.s[0].core.unused_grant();
    // A bad message after requests: none of them stays queued.
    let b =
        Batch::new(0, 0, 3)
            .msg(3, 2, 4, 4)
            .msg(4, 2, 4, 4)
            .msg(to_response_id(id + 7), 0, 4, 4);
    expect_rejected(
        &mut p,
        0,
        &b,
        None,
        ProtocolError::UnknownCallId(to_response_id(id + 7)),
    );
    assert_eq!(p.s[0].queue.len(), 0);
    // Requests around a response: the response is delivered, the requests queued in order
    // with their payloads.
    let b = Batch::new(0, 0, 3)
        .msg(3, 2, 4, 4)
        .msg(to_response_id(id), 0, 4, 4)
        .msg(5, 3 | LARGE_RESPONSE_FLAG, 20, 20);
    let pos = p.s[0].core.recv_position();
    assert_eq!(forge(&mut p, 0, &b.0, b.delta()), (Ok(()), 3));
    assert_eq!(p.s[0].core.pending_calls(), 0);
    assert_eq!(p.s[0].core.unused_grant(), unused - 5 * 32);
    let q: Vec<RecvEntry> = p.s[0].queue.iter().copied().collect();
    assert_eq!(q.len(), 2);
    assert_eq!((q[0].call_id, q[0].allowance, q[0].len), (3, 64, 4));
    assert_eq!(q[0].end, pos + 64);
    assert_eq!(
        (q[1].call_id, q[1].allowance, q[1].len),
        (5, 96 | ENTRY_LARGE_RESP, 20)
    );
    assert_eq!(q[1].end, pos + 128);
    let size = p.s[0].core.recv_size();
    assert_eq!(q[1].off as u64, (pos + 96 + HEADER_SIZE as u64) % size);
}

#[test]
fn overrunning_unreleased_bytes_is_rejected() {
    let mut p = Pair::new([4096, 4096], [1024, 1024]).unwrap();
    // One request filling the whole ring, never received by the application.
    let b = Batch::new(0, 0, 1).msg(0, 0, 4096 - 32 - 12, 4096 - 32 - 12);
    assert_eq!(b.delta(), 4096);
    assert_eq!(forge(&mut p, 1, &b.0, b.delta()), (Ok(()), 1));
    expect_rejected(
        &mut p,
        1,
        &Batch::new(0, 0, 0),
        None,
        ProtocolError::Overrun,
    );
    // Once received (released), the next batch fits.
    let e = p.s[1].queue.pop_front().unwrap();
    p.s[1].core.received(&e);
    assert_eq!(forge(&mut p, 1, &Batch::new(0, 0, 0).0, 32), (Ok(()), 0));
}

#[test]
fn failing_an_endpoint_fails_every_pending_call() {
    let (mut p, _) = pair_with_pending_call();
    assert!(p.call(0, 0, 0, 0));
    let mut failed = Vec::new();
    let why = EndpointFailure::Protocol(ProtocolError::BadCount);
    p.s[0]
        .core
        .fail(why, &mut |u, r| failed.push((u, r.map(<[u8]>::to_vec))));
    failed.sort_by_key(|f| f.0);
    assert_eq!(failed.len(), 2);
    assert!(failed.iter().all(|f| f.1 == Err(why)));
    assert_eq!(p.s[0].core.state(), EndpointState::Failed(why));
    assert_eq!(p.s[0].core.pending_calls(), 0);
    assert!(matches!(
        p.s[0].core.call(0, 0, 9, |_| 0, &mut Stats::default()),
        Err(CallError {
            kind: CallErrorKind::Failed,
            user: 9
        })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// Arbitrary bytes and deltas never make `ingest` panic or read out of bounds; what it
    /// accepts lies inside the ring.
    #[test]
    fn arbitrary_batches_never_panic(
        ret in prop_oneof![Just(0u64), 0u64..200, any::<u64>()],
        grant in prop_oneof![Just(0u64), (0u64..64).prop_map(|g| g * 32), any::<u64>()],
        count in prop_oneof![0u32..6, Just(WRAP_MESSAGE_COUNT), any::<u32>()],
        msgs in proptest::collection::vec(
            (
                prop_oneof![0u32..4, (0u32..4).prop_map(|i| i | RESPONSE_FLAG), any::<u32>()],
                prop_oneof![0u32..40, any::<u32>()],
                prop_oneof![0u32..300, any::<u32>()],
                0usize..300,
            ),
            0..5,
        ),
        delta_units in prop_oneof![Just(None), (0u64..200).prop_map(Some)],
        side in 0usize..2,
    ) {
        let (mut p, _) = pair_with_pending_call();
        let mut b = Batch::new(ret, grant, count);
        for (id, piggy, len, body) in msgs {
            b = b.msg(id, piggy, len, body);
        }
        let delta = delta_units.map(|u| u * 32).unwrap_or(b.delta());
        let ring = p.s[side].core.recv_size();
        let (r, _) = forge(&mut p, side, &b.0, delta);
        if r.is_ok() {
            for e in p.s[side].queue.iter() {
                prop_assert!(e.off as u64 + e.len as u64 <= ring);
            }
            prop_assert!(p.s[side].core.peer_credit() <= ring);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    /// The one-pass check of a batch of one message (`validate_one`, the fast path of
    /// `ingest`, issue 16) accepts and refuses exactly what `validate` does, with the same
    /// error, on both sides (one with a call pending, one without), for responses,
    /// requests, rendezvous descriptors and lengths that lie.
    #[test]
    fn one_message_batches_are_checked_as_validate_does(
        id in prop_oneof![0u32..4, (0u32..4).prop_map(|i| i | RESPONSE_FLAG), any::<u32>()],
        piggy in prop_oneof![0u32..40, any::<u32>()],
        len in prop_oneof![0u32..300, (0u32..64).prop_map(|l| l | RENDEZVOUS_FLAG), any::<u32>()],
        body in 0usize..300,
        trailing in prop_oneof![Just(0usize), 1usize..80],
        exact in any::<bool>(),
        side in 0usize..2,
    ) {
        // Half the cases have a length that matches the body, so that many are accepted.
        let len = if exact { body as u32 } else { len };
        let (p, _) = pair_with_pending_call();
        let mut b = Batch::new(0, 0, 1).msg(id, piggy, len, body);
        b.0.resize(b.0.len() + trailing, 0);
        let core = &p.s[side].core;
        let one = core.validate_one(&b.0);
        prop_assert_eq!(one.map(|_| ()), core.validate(&b.0, 1));
        if let Ok(Some(h)) = one {
            prop_assert_eq!(h.payload_len & RENDEZVOUS_FLAG, 0);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Arbitrary ring bytes (issue 14 §4). The peer writes the receive ring and chooses the
// immediate, so `ingest` must take any bytes and any length: every refusal is a typed
// `ProtocolError` with nothing delivered and nothing of the receive state changed (the
// context then fails the endpoint and counts `corrupt_batches`, see
// `tests/copyrpc_bad_input.rs`). 256 cases by default; `PROPTEST_CASES=<n>` runs more
// (proptest reads the variable itself).

/// Everything `ingest` may change on a refusal.
type RecvState = ((u64, u64, u64, u64), u64, u64, u64, usize, usize);

fn recv_state(p: &Pair, x: usize) -> RecvState {
    let c = &p.s[x].core;
    (
        c.positions(),
        c.recv_position(),
        c.peer_credit(),
        c.unused_grant(),
        c.pending_calls(),
        p.s[x].queue.len(),
    )
}

proptest! {
    /// Raw bytes (no batch structure at all, or a metadata block with arbitrary messages
    /// behind it) and any immediate: never a panic or an out-of-bounds read; a refusal is a
    /// typed error and changes nothing; an accepted batch delivers only requests lying
    /// inside the ring and keeps the credit within the ring.
    #[test]
    fn raw_ring_bytes_are_parsed_or_refused(
        bytes in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..700),
            (0u32..4, proptest::collection::vec(any::<u8>(), 0..700)).prop_map(|(n, mut b)| {
                // A plausible metadata block: small counts, no credit, then raw bytes.
                if b.len() >= 32 {
                    b[..20].fill(0);
                    b[16..20].copy_from_slice(&n.to_le_bytes());
                }
                b
            }),
        ],
        imm in prop_oneof![
            (0u32..24),
            any::<u32>(),
        ],
        side in 0usize..2,
    ) {
        let (mut p, _) = pair_with_pending_call();
        let delta = crate::copyrpc::encoding::decode_imm(imm);
        let ring = p.s[side].core.recv_size();
        let before = recv_state(&p, side);
        let queued = p.s[side].queue.len();
        let (r, delivered) = forge(&mut p, side, &bytes, delta);
        match r {
            Err(ProtocolError::UnknownCallId(_)) if delivered > 0 => {
                // The one refusal found on delivery (a second response to one call).
            }
            Err(_) => {
                prop_assert_eq!(delivered, 0);
                prop_assert_eq!(recv_state(&p, side), before);
            }
            Ok(()) => {
                for e in p.s[side].queue.iter().skip(queued) {
                    prop_assert!(e.off as u64 + e.len as u64 <= ring);
                }
                prop_assert!(p.s[side].core.peer_credit() <= ring);
                prop_assert!(delta >= META && delta <= ring);
            }
        }
    }

    /// The consumer word the peer exposes for RDMA READ is any `u64`: a value beyond what
    /// was sent is refused with `BadConsumer` and ignored.
    #[test]
    fn consumer_word_is_bounded(value in any::<u64>()) {
        let (mut p, _) = pair_with_pending_call();
        let (producer, consumer, _, _) = p.s[0].core.positions();
        let r = p.s[0].core.on_consumer_read(value);
        let (_, after, _, _) = p.s[0].core.positions();
        if value > producer {
            prop_assert_eq!(r, Err(ProtocolError::BadConsumer));
            prop_assert_eq!(after, consumer);
        } else {
            prop_assert_eq!(r, Ok(()));
            prop_assert_eq!(after, consumer.max(value));
        }
    }
}

/// Large messages by rendezvous (issue 15): two [`super::Context`]s on the software device
/// model, requests and responses beyond the ring's inline limit RDMA-READ by the receiver,
/// and forged descriptors.
mod large {
    use std::time::{Duration, Instant};

    use mlx5::cqe::{CqeErrorKind, Syndrome};
    use mlx5::mem::DmaBuf;
    use mlx5::sim::{Fabric, SimConfig};
    use mlx5::verbs::Access;

    use super::super::encoding::{Descriptor, LARGE_INLINE_RESPONSE, RENDEZVOUS_MIN};
    use super::super::{
        Context, ContextConfig, EndpointConfig, EndpointFailure, EndpointId, EndpointState,
        ProtocolError, RecvHandle,
    };
    use super::pattern;

    const MIB: usize = 1 << 20;
    /// Upper bound of every wait below (the model needs milliseconds; this only turns a
    /// hang into a failure).
    const LIMIT: Duration = Duration::from_secs(20);

    struct Two {
        a: Context<u64>,
        b: Context<u64>,
        ea: EndpointId,
        eb: EndpointId,
        _fabric: Fabric,
    }

    fn two(cfg: EndpointConfig) -> Two {
        let fabric = Fabric::new(SimConfig::default());
        let (da, db) = (fabric.open(), fabric.open());
        let mut a = Context::new(&da, ContextConfig::default()).unwrap();
        let mut b = Context::new(&db, ContextConfig::default()).unwrap();
        let ea = a.create_endpoint(&cfg).unwrap();
        let eb = b.create_endpoint(&cfg).unwrap();
        let (ia, ib) = (a.local_info(ea).unwrap(), b.local_info(eb).unwrap());
        a.connect(ea, &ib).unwrap();
        b.connect(eb, &ia).unwrap();
        Two {
            a,
            b,
            ea,
            eb,
            _fabric: fabric,
        }
    }

    /// Polls both sides until `x` has a request; returns its handle and bytes.
    fn next_request(x: &mut Context<u64>, y: &mut Context<u64>) -> (RecvHandle, Vec<u8>) {
        let t = Instant::now();
        loop {
            y.poll(|_, _| panic!("no response expected"));
            x.poll(|_, _| panic!("no response expected"));
            if let Some((h, req)) = x.recv() {
                return (h, req.to_vec());
            }
            assert!(t.elapsed() < LIMIT, "no request within {LIMIT:?}");
        }
    }

    /// Polls both sides until `x` (the caller) gets the response to `tag`.
    fn response(x: &mut Context<u64>, y: &mut Context<u64>, tag: u64) -> Vec<u8> {
        let t = Instant::now();
        let mut got = None;
        while got.is_none() {
            y.poll(|_, _| {});
            x.poll(|u, r| {
                assert_eq!(u, tag);
                got = Some(r.expect("response").to_vec());
            });
            assert!(t.elapsed() < LIMIT, "no response within {LIMIT:?}");
        }
        got.unwrap()
    }

    /// One call from `x` to `y`: request of `req` bytes, response of `resp` bytes (the
    /// call's allowance), contents checked on both sides.
    fn round_trip(
        x: &mut Context<u64>,
        ex: EndpointId,
        y: &mut Context<u64>,
        req: usize,
        resp: usize,
        tag: u64,
    ) {
        let payload = pattern(tag, req);
        x.call(ex, &payload, tag, resp as u32).unwrap();
        let (h, got) = next_request(y, x);
        assert!(got == payload, "request of {req} bytes arrives intact");
        assert!(y.max_response(&h) >= resp);
        let answer = pattern(tag ^ 1 << 62, resp);
        y.reply(h, &answer).unwrap();
        assert!(
            response(x, y, tag) == answer,
            "response of {resp} bytes arrives intact"
        );
    }

    /// Sizes at the inline limit, one above, 1 MiB and 8 MiB (the default large limit), in
    /// both directions of the connection, requests and responses; only messages beyond
    /// the inline limit go by rendezvous, each READ once.
    #[test]
    fn inline_limit_and_large_messages_round_trip_both_ways() {
        let mut t = two(EndpointConfig::default());
        let cap = t.a.endpoint(t.ea).unwrap().max_payload() as usize;
        assert_eq!(cap, 262_100, "the inline limit of the default 1 MiB ring");
        assert_eq!(t.a.endpoint(t.ea).unwrap().large_limit(), 8 << 20);
        let mut tag = 0;
        for (req, resp) in [
            (cap, cap),
            (cap + 1, cap + 1),
            (MIB, MIB),
            (8 * MIB, 8 * MIB),
            (10, 8 * MIB),
            (8 * MIB, 10),
        ] {
            for dir in 0..2 {
                tag += 1;
                let (sa, sb) = (t.a.stats().rendezvous_sent, t.b.stats().rendezvous_sent);
                let (ra, rb) = (t.a.stats().rendezvous_read, t.b.stats().rendezvous_read);
                let (x, ex, y) = if dir == 0 {
                    (&mut t.a, t.ea, &mut t.b)
                } else {
                    (&mut t.b, t.eb, &mut t.a)
                };
                round_trip(x, ex, y, req, resp, tag);
                let large_req = u64::from(req > cap);
                let large_resp = u64::from(resp > cap);
                let (x_sent, y_sent, x_read, y_read) = if dir == 0 {
                    (
                        t.a.stats().rendezvous_sent - sa,
                        t.b.stats().rendezvous_sent - sb,
                        t.a.stats().rendezvous_read - ra,
                        t.b.stats().rendezvous_read - rb,
                    )
                } else {
                    (
                        t.b.stats().rendezvous_sent - sb,
                        t.a.stats().rendezvous_sent - sa,
                        t.b.stats().rendezvous_read - rb,
                        t.a.stats().rendezvous_read - ra,
                    )
                };
                assert_eq!(
                    (x_sent, y_read),
                    (large_req, large_req),
                    "request of {req} B"
                );
                assert_eq!(
                    (y_sent, x_read),
                    (large_resp, large_resp),
                    "response of {resp} B"
                );
            }
        }
        for c in [&t.a, &t.b] {
            let s = c.stats();
            assert_eq!(
                s.bad_descriptors + s.rendezvous_read_errors + s.corrupt_batches,
                0
            );
        }
        let per_dir = 2 * (cap + 1) + 2 * MIB + 16 * MIB + 8 * MIB + 8 * MIB;
        assert_eq!(
            t.a.stats().rendezvous_bytes + t.b.stats().rendezvous_bytes,
            2 * per_dir as u64
        );
    }

    /// Buffers are registered once and reused: many large calls in sequence need one send
    /// and one landing buffer per side, freed by the peer's read reports.
    #[test]
    fn large_buffers_are_reused() {
        let mut t = two(EndpointConfig {
            max_large_message: 2 * MIB as u32,
            ..Default::default()
        });
        for i in 0..20u64 {
            round_trip(
                &mut t.a,
                t.ea,
                &mut t.b,
                MIB + i as usize,
                MIB - i as usize,
                i,
            );
        }
        assert_eq!(t.a.stats().rendezvous_sent, 20);
        assert_eq!(t.b.stats().rendezvous_sent, 20);
        // One buffer per direction per side (a send buffer is free again once the peer's
        // read report arrives, which precedes the next message from it).
        assert_eq!(t.a.stats().large_buffers, 2);
        assert_eq!(t.b.stats().large_buffers, 2);
        // Beyond the negotiated limit: refused at the caller, nothing sent.
        let big = vec![0u8; 2 * MIB + 1];
        assert!(matches!(
            t.a.call(t.ea, &big, 99, 64),
            Err(super::CallError {
                kind: super::CallErrorKind::MessageTooLarge,
                user: 99
            })
        ));
        assert!(matches!(
            t.a.call(t.ea, b"x", 99, 2 * MIB as u32 + 1),
            Err(super::CallError {
                kind: super::CallErrorKind::MessageTooLarge,
                user: 99
            })
        ));
    }

    /// `large_buffers` bounds the large requests waiting to be read: with one send buffer,
    /// a second large call is refused as retryable `RingFull` (counted) until the peer read
    /// the first and reported it; nothing else is refused meanwhile.
    #[test]
    fn large_buffers_bound_the_large_calls_in_flight() {
        let mut t = two(EndpointConfig {
            max_large_message: 2 * MIB as u32,
            large_buffers: 1,
            ..Default::default()
        });
        let (p1, p2) = (pattern(11, MIB), pattern(12, MIB));
        t.a.call(t.ea, &p1, 1, 64).unwrap();
        assert!(matches!(
            t.a.call(t.ea, &p2, 2, 64),
            Err(super::CallError {
                kind: super::CallErrorKind::RingFull,
                user: 2
            })
        ));
        assert_eq!(t.a.stats().large_buffers_busy, 1);
        // Small calls are not held up.
        t.a.call(t.ea, b"small", 3, 64).unwrap();
        // The small request is delivered at once; the large one once its READ completed.
        let (h3, got) = next_request(&mut t.b, &mut t.a);
        assert_eq!(got, b"small");
        let (h1, got) = next_request(&mut t.b, &mut t.a);
        assert!(got == p1);
        // The read report rides on b's next batch (here: the replies).
        t.b.reply(h1, b"one").unwrap();
        t.b.reply(h3, b"three").unwrap();
        let start = Instant::now();
        let mut got = std::collections::HashMap::new();
        while got.len() < 2 {
            t.b.poll(|_, _| {});
            t.a.poll(|u, r| {
                got.insert(u, r.expect("response").to_vec());
            });
            assert!(start.elapsed() < LIMIT, "no responses within {LIMIT:?}");
        }
        assert_eq!(got[&1], b"one");
        assert_eq!(got[&3], b"three");
        t.a.call(t.ea, &p2, 2, 64).unwrap();
        let (h2, got) = next_request(&mut t.b, &mut t.a);
        assert!(got == p2);
        t.b.reply(h2, b"two").unwrap();
        assert_eq!(response(&mut t.a, &mut t.b, 2), b"two");
        assert_eq!(t.a.stats().large_buffers, 1, "the one buffer was reused");
    }

    /// A reply that needs a large-message buffer when every one holds an unread response
    /// is refused with `NoLargeBuffer` (counted), and its credit reservation is returned,
    /// so the caller's other calls are not starved; the caller's call stays unanswered.
    #[test]
    fn replies_beyond_the_large_buffers_are_refused_and_release_their_credit() {
        let mut t = two(EndpointConfig {
            max_large_message: 2 * MIB as u32,
            large_buffers: 1,
            ..Default::default()
        });
        t.a.call(t.ea, b"1", 1, MIB as u32).unwrap();
        t.a.call(t.ea, b"2", 2, MIB as u32).unwrap();
        let (h1, _) = next_request(&mut t.b, &mut t.a);
        let (h2, _) = next_request(&mut t.b, &mut t.a);
        let r_before = t.b.endpoint(t.eb).unwrap().resp_reservation();
        t.b.reply(h1, &pattern(1, MIB)).unwrap();
        assert_eq!(
            t.b.reply(h2, &pattern(2, MIB)),
            Err(super::super::ReplyError::NoLargeBuffer)
        );
        assert_eq!(t.b.stats().large_buffers_busy, 1);
        // Both reservations (4 KiB each) went back to the grant pool.
        assert_eq!(
            r_before - t.b.endpoint(t.eb).unwrap().resp_reservation(),
            2 * t.a.endpoint(t.ea).unwrap().large_call_credit()
        );
        assert!(response(&mut t.a, &mut t.b, 1) == pattern(1, MIB));
        assert_eq!(
            t.a.endpoint(t.ea).unwrap().pending_calls(),
            1,
            "call 2 unanswered"
        );
        // Once the caller read the first response, the buffer serves the next reply.
        t.a.call(t.ea, b"3", 3, MIB as u32).unwrap();
        let (h3, _) = next_request(&mut t.b, &mut t.a);
        t.b.reply(h3, &pattern(3, MIB)).unwrap();
        assert!(response(&mut t.a, &mut t.b, 3) == pattern(3, MIB));
        assert_eq!(t.b.stats().large_buffers, 1);
    }

    /// A call that may carry a large request or response but turns out small stays inline:
    /// the request (written in place into a large buffer, then copied into the ring) and a
    /// response up to the call's inline part; a longer response goes by rendezvous.
    #[test]
    fn small_messages_of_large_calls_stay_inline() {
        let mut t = two(EndpointConfig::default());
        let body = pattern(7, 100);
        t.a.call_with(t.ea, 4 * MIB as u32, 1, 8 * MIB as u32, |b| {
            b[..100].copy_from_slice(&body);
            100
        })
        .unwrap();
        let (h, got) = next_request(&mut t.b, &mut t.a);
        assert_eq!(got, body);
        assert_eq!(t.b.max_response(&h), 8 * MIB);
        let small = pattern(8, LARGE_INLINE_RESPONSE as usize);
        t.b.reply(h, &small).unwrap();
        assert_eq!(response(&mut t.a, &mut t.b, 1), small);
        assert_eq!(t.a.stats().rendezvous_sent + t.b.stats().rendezvous_sent, 0);

        t.a.call(t.ea, b"q", 2, 8 * MIB as u32).unwrap();
        let (h, _) = next_request(&mut t.b, &mut t.a);
        let longer = pattern(9, LARGE_INLINE_RESPONSE as usize + 1);
        t.b.reply(h, &longer).unwrap();
        assert_eq!(response(&mut t.a, &mut t.b, 2), longer);
        assert_eq!(t.b.stats().rendezvous_sent, 1);
        // A large call's credit is 4 KiB, not the response's size.
        assert_eq!(
            t.a.endpoint(t.ea).unwrap().large_call_credit(),
            4096,
            "a call accepting an 8 MiB response reserves 4 KiB of credit"
        );
    }

    /// A registered 4 KiB buffer on `a` for forged descriptors, filled with a pattern.
    fn exposed(t: &Two) -> (DmaBuf, mlx5::verbs::Mr) {
        let buf = DmaBuf::with_normal_pages(4096).unwrap();
        // SAFETY: `buf` holds 4096 bytes, and nothing else uses it yet.
        unsafe {
            std::slice::from_raw_parts_mut(buf.as_mut_ptr(), 4096)
                .copy_from_slice(&pattern(3, 4096));
        }
        // SAFETY: 4096 bytes of `buf`, kept alive (returned) as long as the registration.
        let mr = unsafe {
            t.a.reg_mr(
                buf.as_mut_ptr(),
                4096,
                Access::LOCAL_WRITE | Access::REMOTE_READ,
            )
        }
        .unwrap();
        (buf, mr)
    }

    /// Polls both sides until `b`'s endpoint has failed; returns why.
    fn failure_of_b(t: &mut Two) -> EndpointFailure {
        let start = Instant::now();
        loop {
            t.a.poll(|_, _| {});
            t.b.poll(|_, _| {});
            while t.b.recv().is_some() {}
            if let Some(EndpointState::Failed(why)) = t.b.endpoint_state(t.eb) {
                return why;
            }
            assert!(
                start.elapsed() < LIMIT,
                "b's endpoint did not fail within {LIMIT:?}"
            );
        }
    }

    /// A well-formed forged descriptor is read and delivered (the control for the tests
    /// below); the forger, which never registered the message as outstanding, then
    /// receives a read report it cannot match and refuses it.
    #[test]
    fn forged_valid_descriptor_is_read_and_its_report_checked() {
        let mut t = two(EndpointConfig::default());
        let (_buf, mr) = exposed(&t);
        let d = Descriptor {
            addr: mr.addr,
            rkey: mr.rkey,
            len: 4096,
        };
        t.a.forge_rendezvous_call(t.ea, d, 5).unwrap();
        let (h, got) = next_request(&mut t.b, &mut t.a);
        assert_eq!(got, pattern(3, 4096));
        assert_eq!(t.b.stats().rendezvous_read, 1);
        t.b.reply(h, b"ok").unwrap();
        let start = Instant::now();
        while t.a.endpoint_state(t.ea) == Some(EndpointState::Connected) {
            t.b.poll(|_, _| {});
            t.a.poll(|_, _| {});
            assert!(start.elapsed() < LIMIT);
        }
        assert_eq!(
            t.a.endpoint_state(t.ea),
            Some(EndpointState::Failed(EndpointFailure::Protocol(
                ProtocolError::BadReadsDone
            )))
        );
        assert_eq!(t.a.stats().corrupt_batches, 1);
    }

    /// Descriptors whose length is refused before any READ: above the limit, not above the
    /// rendezvous threshold. The receiver fails the endpoint with a clear error and counts it.
    #[test]
    fn descriptor_lengths_out_of_range_are_refused() {
        for (len, what) in [
            ((8 << 20) + 1, "length above the large-message limit"),
            (u32::MAX, "length above the large-message limit"),
            (RENDEZVOUS_MIN, "length not above the rendezvous threshold"),
            (0, "length not above the rendezvous threshold"),
        ] {
            let mut t = two(EndpointConfig::default());
            let (_buf, mr) = exposed(&t);
            let d = Descriptor {
                addr: mr.addr,
                rkey: mr.rkey,
                len,
            };
            t.a.forge_rendezvous_call(t.ea, d, 5).unwrap();
            let why = failure_of_b(&mut t);
            assert_eq!(
                why,
                EndpointFailure::Protocol(ProtocolError::BadDescriptor(what)),
                "len {len}"
            );
            let s = t.b.stats();
            assert_eq!(
                (s.bad_descriptors, s.corrupt_batches, s.rendezvous_read),
                (1, 1, 0)
            );
            assert_eq!(
                s.large_buffers, 0,
                "nothing allocated for a refused descriptor"
            );
        }
    }

    /// Descriptors the receiver can only find bad by reading: a wrong rkey, a length past
    /// the registered buffer, an address before it. The READ completes with a remote access
    /// error, which fails the endpoint (the RC QP is in error) and is counted; nothing is
    /// delivered and nothing is written beyond the landing buffer.
    #[test]
    fn descriptors_the_peer_nic_refuses_fail_the_endpoint() {
        for case in 0..3 {
            let mut t = two(EndpointConfig::default());
            let (_buf, mr) = exposed(&t);
            let d = match case {
                0 => Descriptor {
                    addr: mr.addr,
                    rkey: mr.rkey ^ 0x5a5a,
                    len: 4096,
                },
                1 => Descriptor {
                    addr: mr.addr,
                    rkey: mr.rkey,
                    len: 8192,
                },
                _ => Descriptor {
                    addr: mr.addr - 4096,
                    rkey: mr.rkey,
                    len: 4096,
                },
            };
            t.a.forge_rendezvous_call(t.ea, d, 5).unwrap();
            let why = failure_of_b(&mut t);
            match why {
                EndpointFailure::Completion(e) => {
                    assert_eq!(
                        e.kind,
                        CqeErrorKind::Known(Syndrome::RemoteAccess),
                        "case {case}"
                    )
                }
                other => panic!("case {case}: expected a remote access error, got {other:?}"),
            }
            let s = t.b.stats();
            assert_eq!(
                (s.rendezvous_read_errors, s.rendezvous_read, s.requests),
                (1, 0, 1),
                "case {case}"
            );
            assert_eq!(t.b.pending_requests(), 0);
        }
    }

    /// A rendezvous response to a call that did not accept one, or longer than the call's
    /// allowance, fails the caller's endpoint with a clear error; pending calls end.
    #[test]
    fn rendezvous_responses_beyond_the_call_are_refused() {
        let mut t = two(EndpointConfig::default());
        // The caller accepts up to 300 000 bytes; the responder's handle allows the
        // connection's limit, so it sends a longer one.
        t.a.call(t.ea, b"q", 1, 300_000).unwrap();
        let (h, _) = next_request(&mut t.b, &mut t.a);
        assert_eq!(t.b.max_response(&h), 8 << 20);
        t.b.reply(h, &vec![1u8; 300_001]).unwrap();
        let start = Instant::now();
        let mut ended = None;
        while ended.is_none() {
            t.b.poll(|_, _| {});
            t.a.poll(|u, r| ended = Some((u, r.map(|b| b.len()))));
            assert!(start.elapsed() < LIMIT);
        }
        assert_eq!(
            ended,
            Some((
                1,
                Err(EndpointFailure::Protocol(ProtocolError::ResponseTooLarge))
            ))
        );
        assert_eq!(t.a.stats().rendezvous_read, 0, "refused before reading");
    }

    /// The sender of a large request dies before the receiver read it: the READ fails
    /// (bounded by the RC retry limit), the receiver's endpoint fails and frees its
    /// buffers; the other direction (a caller whose responder dies after sending a
    /// rendezvous response) ends the call with an error.
    #[test]
    fn peer_dying_mid_transfer_ends_in_bounded_time() {
        let mut t = two(EndpointConfig::default());
        t.a.call(t.ea, &pattern(1, MIB), 1, 64).unwrap();
        t.a.poll(|_, _| {}); // the descriptor is on b's ring; nobody polls b yet
        let Two {
            a,
            mut b,
            eb,
            _fabric,
            ..
        } = t;
        drop(a);
        let start = Instant::now();
        while b.endpoint_state(eb) == Some(EndpointState::Connected) {
            b.poll(|_, _| {});
            assert!(b.recv().is_none(), "nothing delivered from a dead peer");
            assert!(
                start.elapsed() < LIMIT,
                "the READ from a dead peer did not end"
            );
        }
        assert!(b.stats().rendezvous_read_errors >= 1 || b.stats().error_cqes >= 1);
        assert_eq!(b.stats().rendezvous_read, 0);

        let mut t = two(EndpointConfig::default());
        t.a.call(t.ea, b"q", 7, 4 * MIB as u32).unwrap();
        let (h, _) = next_request(&mut t.b, &mut t.a);
        t.b.reply(h, &pattern(2, 4 * MIB)).unwrap();
        t.b.poll(|_, _| {}); // the response descriptor is sent
        let Two {
            mut a,
            b,
            ea,
            _fabric,
            ..
        } = t;
        drop(b);
        let start = Instant::now();
        let mut ended = None;
        while ended.is_none() {
            a.poll(|u, r| ended = Some((u, r.is_ok())));
            assert!(
                start.elapsed() < LIMIT,
                "the call to a dead peer did not end"
            );
        }
        assert_eq!(ended, Some((7, false)));
        assert!(matches!(
            a.endpoint_state(ea),
            Some(EndpointState::Failed(_))
        ));
    }
}
