//! copyrpc bad input on the device model (issue 4 §6): corrupt batches written by a forging
//! peer, and error completions.
//!
//! The forging peer is a raw RC QP driven through the mlx5 driver directly (no copyrpc
//! core; `mlx5::sim::testkit::RawRcPeer`): it advertises a receive ring and initial credit like an endpoint, receives the
//! context's requests (WRITE+IMM into its ring), and writes whatever bytes and immediates a
//! test asks for into the context endpoint's receive ring. Every corruption must be
//! rejected with `stats().corrupt_batches` incremented, the endpoint marked
//! `EndpointState::Failed(Protocol(..))` with the expected [`ProtocolError`], every pending
//! call failed through the poll callback with that error, later calls refused, and another
//! endpoint of the same context (connected to an honest context) unaffected. A well-formed
//! batch from the same forger is accepted first, so the forging itself is known to work.
//!
//! Error completions: a peer announcing a wrong rkey (remote access error on our WRITE) and
//! a peer whose context was dropped (transport retry exceeded) fail that endpoint's pending
//! calls with `EndpointFailure::Completion`; the other endpoint keeps working.

mod copyrpc_common;

use std::collections::HashMap;

use copyrpc_common::{connect, pattern, response_seed, verify};
use mlx5::cqe::{CqeErrorKind, Syndrome};
use mlx5::sim::testkit::{RawRcPeer, RegBuf};
use mlx5::sim::{Fabric, SimConfig};
use mlx5::verbs::{Access, RcRemote};
use rpc_runtime::copyrpc::encoding::{
    FlowMetadata, HEADER_SIZE, MsgHeader, WRAP_MESSAGE_COUNT, encode_imm, internal_allowance,
    to_response_id,
};
use rpc_runtime::copyrpc::{
    CallError, CallErrorKind, Context, ContextConfig, EndpointConfig, EndpointFailure, EndpointId,
    EndpointInfo, EndpointState, ProtocolError,
};

const RING: usize = 4096;

/// A raw RC peer that forges batches (module docs), on [`RawRcPeer`]. Field order is drop
/// order: the buffers are deregistered before the peer's protection domain goes.
struct Forger {
    /// Our receive ring (REMOTE_WRITE), where the context's batches land.
    ring: RegBuf,
    /// Our consumer word (REMOTE_READ), which the context reads.
    word: RegBuf,
    raw: RawRcPeer,
    /// The context endpoint's information.
    peer: Option<EndpointInfo>,
    /// Virtual position of the next batch in the peer's receive ring.
    pos: u64,
}

impl Forger {
    fn new(fabric: &Fabric) -> Forger {
        let raw = RawRcPeer::new(fabric, 2 * RING);
        let ring = raw.reg(RING, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        let word = raw.reg(16, Access::LOCAL_WRITE | Access::REMOTE_READ);
        Forger {
            ring,
            word,
            raw,
            peer: None,
            pos: 0,
        }
    }

    /// What the context needs to connect to us: a 4 KiB ring and `credit` bytes of credit.
    fn info(&self, credit: u64) -> EndpointInfo {
        let port = self.raw.port();
        EndpointInfo {
            qpn: self.raw.qpn(),
            lid: port.lid,
            gid: port.gid,
            psn: 0,
            recv_ring_addr: self.ring.mr.addr,
            recv_ring_rkey: self.ring.mr.rkey,
            recv_ring_size: RING as u64,
            consumer_addr: self.word.mr.addr,
            consumer_rkey: self.word.mr.rkey,
            initial_credit: credit,
            fingerprint: 0,
            max_large_message: 0,
        }
    }

    fn connect(&mut self, peer: EndpointInfo) {
        self.raw.connect(
            &RcRemote {
                qpn: peer.qpn,
                lid: peer.lid,
                gid: peer.gid,
                psn: peer.psn,
            },
            &ContextConfig::default().rc,
        );
        self.peer = Some(peer);
    }

    /// Writes `bytes` at our position in the peer's ring with immediate `imm`, advances the
    /// position by `imm * 32` (what the peer will believe) and waits for the completion.
    fn send(&mut self, bytes: &[u8], imm: u32) {
        let peer = self.peer.unwrap();
        let off = self.pos % peer.recv_ring_size;
        self.raw.write(
            peer.recv_ring_addr + off,
            peer.recv_ring_rkey,
            bytes,
            Some(imm),
        );
        self.pos += imm as u64 * 32;
    }

    /// Sends a batch whose immediate matches its length.
    fn batch(&mut self, b: &Batch) {
        self.send(&b.0, encode_imm(b.0.len() as u64));
    }

    /// Handles our completions (reposting the receive WQEs of batches from the context).
    fn poll(&mut self) {
        self.raw.poll();
    }

    /// Batches (WRITE+IMMs) received from the context.
    fn received(&self) -> usize {
        self.raw.received().len()
    }
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

    /// Appends a header and `body` (padded to 32 B), whatever `payload_len` claims.
    fn msg(mut self, call_id: u32, piggyback: u32, payload_len: u32, body: &[u8]) -> Batch {
        let mut h = [0u8; HEADER_SIZE];
        MsgHeader {
            call_id,
            piggyback,
            payload_len,
        }
        .write(&mut h);
        self.0.extend_from_slice(&h);
        self.0.extend_from_slice(body);
        let l = self.0.len().next_multiple_of(32);
        self.0.resize(l, 0);
        self
    }
}

type Outcome = Result<Vec<u8>, EndpointFailure>;

/// Context A with endpoint `bad` (to the forger) and endpoint `good` (to context B).
struct Rig {
    a: Context<u64>,
    b: Context<()>,
    bad: EndpointId,
    good: EndpointId,
    forger: Forger,
    /// Outcomes delivered by A's poll callback, by user tag.
    got: HashMap<u64, Outcome>,
    _fabric: Fabric,
}

impl Rig {
    fn new() -> Rig {
        let fabric = Fabric::new(SimConfig::deterministic());
        let mut a = Context::<u64>::new(&fabric.open(), ContextConfig::default()).unwrap();
        let mut b = Context::<()>::new(&fabric.open(), ContextConfig::default()).unwrap();
        let cfg = EndpointConfig {
            ring_size: RING,
            ..Default::default()
        };
        let (good, _) = connect(&mut a, &mut b, &cfg);
        let bad = a.create_endpoint(&cfg).unwrap();
        let mut forger = Forger::new(&fabric);
        a.connect(bad, &forger.info(1024)).unwrap();
        forger.connect(a.local_info(bad).unwrap());
        Rig {
            a,
            b,
            bad,
            good,
            forger,
            got: HashMap::new(),
            _fabric: fabric,
        }
    }

    fn poll_a(&mut self) {
        let got = &mut self.got;
        self.a.poll(|u, r| {
            let old = got.insert(u, r.map(<[u8]>::to_vec));
            assert!(old.is_none(), "call {u} completed twice");
        });
    }

    /// Calls on the forger's endpoint (allowance 100) and flushes; returns the call id.
    fn call_bad(&mut self, tag: u64) -> u32 {
        let id = self
            .a
            .call(self.bad, &pattern(tag, 10), tag, 100)
            .unwrap_or_else(|e| panic!("call: {e}"));
        let before = self.forger.received();
        self.poll_a();
        self.forger.poll();
        assert_eq!(
            self.forger.received(),
            before + 1,
            "the forger got the request"
        );
        id
    }

    /// A full round trip on the good endpoint.
    fn round_trip_good(&mut self, tag: u64) {
        self.a.call(self.good, &pattern(tag, 33), tag, 64).unwrap();
        for _ in 0..10 {
            self.poll_a();
            self.b.poll(|_, _| {});
            while let Some((h, req)) = self.b.recv() {
                assert!(verify(tag, 33, req));
                self.b.reply(h, &pattern(response_seed(tag), 40)).unwrap();
            }
            self.b.poll(|_, _| {});
            if self.got.contains_key(&tag) {
                break;
            }
        }
        let r = self.got.remove(&tag).expect("good endpoint answered");
        assert!(verify(response_seed(tag), 40, &r.unwrap()));
    }

    /// Checks the aftermath of a corrupt batch: counted once, the endpoint failed with
    /// `want`, the pending calls `tags` failed with it, new calls refused, and the good
    /// endpoint still working.
    fn expect_failed(&mut self, want: ProtocolError, tags: &[u64]) {
        let why = EndpointFailure::Protocol(want);
        assert_eq!(self.a.stats().corrupt_batches, 1);
        assert_eq!(self.a.stats().failed_endpoints, 1);
        assert_eq!(
            self.a.endpoint_state(self.bad),
            Some(EndpointState::Failed(why))
        );
        for t in tags {
            assert_eq!(self.got.remove(t), Some(Err(why)), "pending call {t}");
        }
        assert_eq!(self.a.endpoint(self.bad).unwrap().pending_calls(), 0);
        assert!(matches!(
            self.a.call(self.bad, b"x", 999, 0),
            Err(CallError {
                kind: CallErrorKind::Failed,
                user: 999
            })
        ));
        assert!(
            self.a.recv().is_none(),
            "requests of a failed endpoint are dropped"
        );
        self.poll_a();
        assert_eq!(self.a.stats().corrupt_batches, 1);
        self.round_trip_good(1000);
        self.round_trip_good(1001);
        assert_eq!(
            self.a.endpoint_state(self.good),
            Some(EndpointState::Connected)
        );
    }
}

/// Sends `b` (with immediate `imm`, default its length) after one pending call (tag 1,
/// allowance 100) and a well-formed response to another (tag 0, accepted first), and
/// expects `want`.
fn corrupt(make: impl FnOnce(u32) -> (Batch, Option<u32>), want: ProtocolError) {
    let mut rig = Rig::new();
    let id0 = rig.call_bad(0);
    let id1 = rig.call_bad(1);
    // A well-formed response to call 0 (returning the 128 B received, no grant).
    let ok = Batch::new(128, 0, 1).msg(to_response_id(id0), 0, 7, &pattern(response_seed(0), 7));
    rig.forger.batch(&ok);
    rig.poll_a();
    let r = rig.got.remove(&0).expect("response delivered");
    assert!(verify(response_seed(0), 7, &r.unwrap()));
    assert_eq!(rig.a.stats().corrupt_batches, 0);
    // The corruption.
    assert_eq!((id0, id1), (0, 1));
    let (b, imm) = make(id1);
    let imm = imm.unwrap_or(encode_imm(b.0.len() as u64));
    rig.forger.send(&b.0, imm);
    rig.poll_a();
    rig.expect_failed(want, &[1]);
}

#[test]
fn message_count_beyond_the_bytes_received() {
    corrupt(
        |_| (Batch::new(0, 0, 3).msg(5, 2, 10, &[1; 10]), None),
        ProtocolError::BadCount,
    );
    // More messages than announced: trailing bytes.
    corrupt(
        |_| {
            let b = Batch::new(0, 0, 1).msg(5, 2, 1, &[1]).msg(6, 2, 1, &[1]);
            (b, None)
        },
        ProtocolError::BadCount,
    );
}

#[test]
fn payload_len_beyond_the_batch() {
    for len in [21, 5000, 0x7fff_ffff] {
        corrupt(
            |_| (Batch::new(0, 0, 1).msg(5, 2, len, &[1; 10]), None),
            ProtocolError::BadLength,
        );
    }
    // The top bit marks a rendezvous descriptor (issue 15), whose length field must be
    // exactly the flag plus 16.
    corrupt(
        |_| (Batch::new(0, 0, 1).msg(5, 2, u32::MAX, &[1; 10]), None),
        ProtocolError::BadDescriptor("length field is not the flag plus 16"),
    );
}

/// A well-formed rendezvous descriptor from a peer that announced no large messages
/// (`max_large_message: 0` in its endpoint info) is refused before any READ (issue 15).
#[test]
fn descriptor_from_a_peer_without_large_messages() {
    let mut d = [0u8; 16];
    d[12..16].copy_from_slice(&4096u32.to_le_bytes());
    corrupt(
        |_| (Batch::new(0, 0, 1).msg(5, 2, 0x8000_0010, &d), None),
        ProtocolError::BadDescriptor("length above the large-message limit"),
    );
}

#[test]
fn response_to_an_unknown_call() {
    corrupt(
        |id| {
            (
                Batch::new(0, 0, 1).msg(to_response_id(id + 5), 0, 1, &[1]),
                None,
            )
        },
        ProtocolError::UnknownCallId(to_response_id(1 + 5)),
    );
}

/// The allowance (100) travels in 32 B units, so a response may fill the padded message
/// (116 B, `RecvHandle::max_response`); 117 B is too large.
#[test]
fn response_larger_than_its_allowance() {
    corrupt(
        |id| {
            (
                Batch::new(0, 0, 1).msg(to_response_id(id), 0, 117, &[1; 117]),
                None,
            )
        },
        ProtocolError::ResponseTooLarge,
    );
}

/// Regression: a response of exactly `RecvHandle::max_response` bytes (more than the
/// caller's allowance, within its padded message) is accepted: it used to fail the caller's
/// endpoint as corrupt although the responder could not know better.
#[test]
fn response_filling_the_padded_allowance_is_accepted() {
    let mut rig = Rig::new();
    let id = rig.call_bad(4);
    let body = pattern(response_seed(4), 116);
    rig.forger
        .batch(&Batch::new(64, 0, 1).msg(to_response_id(id), 0, 116, &body));
    rig.poll_a();
    let r = rig.got.remove(&4).expect("response delivered");
    assert!(verify(response_seed(4), 116, &r.unwrap()));
    assert_eq!(rig.a.stats().corrupt_batches, 0);
}

/// The response to call 0 again (it was answered by the well-formed batch).
#[test]
fn duplicate_response_in_a_later_batch() {
    corrupt(
        |id| {
            (
                Batch::new(0, 0, 1).msg(to_response_id(id - 1), 0, 1, &[1]),
                None,
            )
        },
        ProtocolError::UnknownCallId(to_response_id(0)),
    );
}

/// Two responses to call 1 in one batch: the first is delivered, the second fails the
/// endpoint (and nothing else is pending).
#[test]
fn duplicate_response_in_one_batch() {
    let mut rig = Rig::new();
    let id = rig.call_bad(7);
    let body = pattern(response_seed(7), 3);
    let b = Batch::new(64, 0, 2)
        .msg(to_response_id(id), 0, 3, &body)
        .msg(to_response_id(id), 0, 3, &body);
    rig.forger.batch(&b);
    rig.poll_a();
    let r = rig.got.remove(&7).expect("first response delivered");
    assert!(verify(response_seed(7), 3, &r.unwrap()));
    rig.expect_failed(ProtocolError::UnknownCallId(to_response_id(id)), &[]);
}

#[test]
fn short_and_oversized_immediates() {
    // imm 0: a batch shorter than its metadata.
    corrupt(|_| (Batch::new(0, 0, 0), Some(0)), ProtocolError::BadLength);
    // A delta crossing the ring end (the ring is 4 KiB; 64 B are used).
    corrupt(
        |_| (Batch::new(0, 0, 0), Some(encode_imm(RING as u64))),
        ProtocolError::BadLength,
    );
    corrupt(
        |_| (Batch::new(0, 0, 0), Some(u32::MAX)),
        ProtocolError::BadLength,
    );
}

#[test]
fn wrap_marker_not_at_the_ring_end() {
    corrupt(
        |_| (Batch::new(0, 0, WRAP_MESSAGE_COUNT), None),
        ProtocolError::BadWrap,
    );
    corrupt(
        |_| {
            (
                Batch::new(0, 0, WRAP_MESSAGE_COUNT),
                Some(encode_imm(RING as u64 - 96)),
            )
        },
        ProtocolError::BadWrap,
    );
}

#[test]
fn credit_return_beyond_what_was_sent() {
    // 128 B were sent and already returned by the well-formed batch.
    corrupt(|_| (Batch::new(32, 0, 0), None), ProtocolError::BadConsumer);
    corrupt(
        |_| (Batch::new(u64::MAX, 0, 0), None),
        ProtocolError::BadConsumer,
    );
}

#[test]
fn bad_grants() {
    corrupt(|_| (Batch::new(0, 31, 0), None), ProtocolError::BadCredit);
    corrupt(
        |_| (Batch::new(0, 1 << 20, 0), None),
        ProtocolError::BadCredit,
    );
    corrupt(
        |_| (Batch::new(0, u64::MAX - 31, 0), None),
        ProtocolError::BadCredit,
    );
}

/// Requests spending more credit than the endpoint granted (a quarter of its 4 KiB ring).
#[test]
fn requests_spending_more_credit_than_granted() {
    let units = (RING / 4 / 32) as u32;
    corrupt(
        |_| (Batch::new(0, 0, 1).msg(0, units + 1, 0, &[]), None),
        ProtocolError::BadCredit,
    );
    corrupt(
        |_| {
            let b = Batch::new(0, 0, 2)
                .msg(0, units / 2, 0, &[])
                .msg(1, units / 2 + 1, 0, &[]);
            (b, None)
        },
        ProtocolError::BadCredit,
    );
}

/// A request filling the receive ring that the application never takes, then one more
/// batch: it would overwrite unreleased bytes.
#[test]
fn batch_overrunning_unreleased_bytes() {
    let mut rig = Rig::new();
    rig.call_bad(3);
    // 64 B of the ring were used by the response... none yet: the ring is empty; fill it.
    let len = (RING - 32 - HEADER_SIZE) as u32;
    let b = Batch::new(64, 0, 1).msg(9, 2, len, &vec![7; len as usize]);
    assert_eq!(b.0.len(), RING);
    rig.forger.batch(&b);
    rig.poll_a();
    assert_eq!(rig.a.pending_requests(), 1);
    assert_eq!(rig.a.stats().corrupt_batches, 0);
    rig.forger.batch(&Batch::new(0, 0, 0));
    rig.poll_a();
    rig.expect_failed(ProtocolError::Overrun, &[3]);
}

/// A well-formed request from the forger is served by the application, and its response
/// reaches the forger's ring byte for byte: the forging peer speaks the protocol.
#[test]
fn the_forger_is_understood() {
    let mut rig = Rig::new();
    let piggy = (internal_allowance(50) / 32) as u32;
    let req = pattern(42, 20);
    rig.forger
        .batch(&Batch::new(0, 0, 1).msg(11, piggy, 20, &req));
    rig.poll_a();
    let (h, got) = rig.a.recv().expect("request");
    assert_eq!(got, &req[..]);
    assert_eq!((h.call_id, h.allowance), (11, internal_allowance(50)));
    rig.a.reply(h, &pattern(43, 50)).unwrap();
    rig.poll_a();
    rig.forger.poll();
    assert_eq!(rig.forger.received(), 1);
    // The reply batch at the start of the forger's ring: metadata, then the response.
    // Written by the completed WRITE+IMM.
    let ring = rig.forger.ring.read(0, 128);
    let meta = FlowMetadata::read(ring[..32].try_into().unwrap());
    assert_eq!(meta.message_count, 1);
    assert_eq!(meta.ring_credit_return, 64);
    let h = MsgHeader::read(ring[32..44].try_into().unwrap());
    assert_eq!((h.call_id, h.payload_len), (to_response_id(11), 50));
    assert_eq!(&ring[44..94], &pattern(43, 50)[..]);
    assert_eq!(rig.a.stats().corrupt_batches, 0);
}

// ---------------------------------------------------------------------------------------
// Error completions.

/// Context A with endpoint 0 to `b0` (connected through `info0`, possibly tampered) and
/// endpoint 1 to `b1`.
fn two_peers(
    fabric: &Fabric,
    tamper: impl FnOnce(&mut EndpointInfo),
) -> (Context<u64>, Context<()>, Context<()>, [EndpointId; 2]) {
    let cfg = EndpointConfig {
        ring_size: RING,
        ..Default::default()
    };
    let mut a = Context::<u64>::new(&fabric.open(), ContextConfig::default()).unwrap();
    let mut b0 = Context::<()>::new(&fabric.open(), ContextConfig::default()).unwrap();
    let mut b1 = Context::<()>::new(&fabric.open(), ContextConfig::default()).unwrap();
    let e0 = a.create_endpoint(&cfg).unwrap();
    let p0 = b0.create_endpoint(&cfg).unwrap();
    let mut i0 = b0.local_info(p0).unwrap();
    tamper(&mut i0);
    a.connect(e0, &i0).unwrap();
    b0.connect(p0, &a.local_info(e0).unwrap()).unwrap();
    let (e1, _) = connect(&mut a, &mut b1, &cfg);
    (a, b0, b1, [e0, e1])
}

/// Serves every request of `b` (echo) and polls it.
fn serve(b: &mut Context<()>) {
    b.poll(|_, _| {});
    while let Some((h, req)) = b.recv() {
        let v = req.to_vec();
        b.reply(h, &v).unwrap();
    }
    b.poll(|_, _| {});
}

/// Makes `n` echo round trips on `ep` (to `b`), checking the bytes.
fn echo(fabric: &Fabric, a: &mut Context<u64>, b: &mut Context<()>, ep: EndpointId, n: u64) {
    for t in 0..n {
        let tag = 5000 + t;
        a.call(ep, &pattern(tag, 77), tag, 100).unwrap();
        let mut got = None;
        for _ in 0..20 {
            a.poll(|u, r| {
                assert_eq!(u, tag);
                got = Some(r.map(<[u8]>::to_vec));
            });
            serve(b);
            fabric.progress();
            if got.is_some() {
                break;
            }
        }
        let r = got.expect("echo answered").unwrap();
        assert!(verify(tag, 77, &r));
    }
}

fn expect_completion_failure(a: &Context<u64>, ep: EndpointId, want: Syndrome) {
    match a.endpoint_state(ep) {
        Some(EndpointState::Failed(EndpointFailure::Completion(e))) => {
            assert_eq!(e.kind, CqeErrorKind::Known(want), "{e:?}");
        }
        s => panic!("endpoint {ep}: {s:?}"),
    }
    assert!(a.stats().error_cqes >= 1);
    assert_eq!(a.stats().failed_endpoints, 1);
    assert_eq!(a.stats().corrupt_batches, 0);
}

/// A peer announcing a wrong rkey: our WRITE+IMM fails with a remote access error; both
/// pending calls on that endpoint fail with it; the other endpoint keeps working.
#[test]
fn wrong_rkey_fails_the_endpoint_with_remote_access_error() {
    let fabric = Fabric::new(SimConfig::deterministic());
    let (mut a, mut b0, mut b1, [e0, e1]) = two_peers(&fabric, |i| i.recv_ring_rkey ^= 0x100);
    echo(&fabric, &mut a, &mut b1, e1, 3);
    a.call(e0, b"first", 1, 64).unwrap();
    a.call(e0, b"second", 2, 64).unwrap();
    let mut got = HashMap::new();
    for _ in 0..10 {
        a.poll(|u, r| {
            assert!(got.insert(u, r.map(<[u8]>::to_vec)).is_none());
        });
        serve(&mut b0);
    }
    assert_eq!(got.len(), 2, "both pending calls completed");
    for u in [1, 2] {
        match &got[&u] {
            Err(EndpointFailure::Completion(e)) => {
                assert_eq!(e.kind, CqeErrorKind::Known(Syndrome::RemoteAccess))
            }
            r => panic!("call {u}: {r:?}"),
        }
    }
    expect_completion_failure(&a, e0, Syndrome::RemoteAccess);
    assert!(matches!(
        a.call(e0, b"x", 3, 0),
        Err(CallError {
            kind: CallErrorKind::Failed,
            user: 3
        })
    ));
    echo(&fabric, &mut a, &mut b1, e1, 3);
    assert_eq!(a.endpoint_state(e1), Some(EndpointState::Connected));
}

/// The peer context is dropped (its QP destroyed): our WRITE+IMM is retried until the
/// transport retry count is exceeded; the pending call fails with that error; the other
/// endpoint keeps working.
#[test]
fn dropped_peer_fails_the_endpoint_with_retry_exceeded() {
    let fabric = Fabric::new(SimConfig::deterministic());
    let (mut a, b0, mut b1, [e0, e1]) = two_peers(&fabric, |_| {});
    echo(&fabric, &mut a, &mut b1, e1, 2);
    drop(b0);
    a.call(e0, b"anyone?", 1, 64).unwrap();
    let mut got = None;
    for _ in 0..100 {
        a.poll(|u, r| {
            assert_eq!(u, 1);
            assert!(got.is_none());
            got = Some(r.map(<[u8]>::to_vec));
        });
        fabric.progress();
        if got.is_some() {
            break;
        }
    }
    match got.expect("the call failed") {
        Err(EndpointFailure::Completion(e)) => {
            assert_eq!(e.kind, CqeErrorKind::Known(Syndrome::TransportRetryExc))
        }
        r => panic!("{r:?}"),
    }
    expect_completion_failure(&a, e0, Syndrome::TransportRetryExc);
    echo(&fabric, &mut a, &mut b1, e1, 3);
}

/// A failure while many calls are pending on several endpoints: only the failed
/// endpoint's calls complete with an error, each exactly once.
#[test]
fn failure_only_touches_its_endpoint() {
    let fabric = Fabric::new(SimConfig::deterministic());
    let (mut a, mut b0, mut b1, [e0, e1]) = two_peers(&fabric, |_| {});
    for t in 0..8u64 {
        a.call(e0, &pattern(t, 10), t, 32).unwrap();
        a.call(e1, &pattern(100 + t, 10), 100 + t, 32).unwrap();
    }
    a.poll(|_, _| panic!("nothing answered yet"));
    b0.poll(|_, _| {});
    assert_eq!(b0.pending_requests(), 8);
    // b0 goes away with 8 requests unanswered; a's next WRITE to it (a credit update or a
    // new call) fails.
    drop(b0);
    let mut got: HashMap<u64, Outcome> = HashMap::new();
    a.call(e0, b"late", 50, 0).unwrap();
    for _ in 0..100 {
        a.poll(|u, r| {
            assert!(
                got.insert(u, r.map(<[u8]>::to_vec)).is_none(),
                "call {u} twice"
            );
        });
        serve(&mut b1);
        fabric.progress();
        if got.len() == 17 {
            break;
        }
    }
    assert_eq!(got.len(), 17);
    for t in 0..8u64 {
        assert!(matches!(got[&t], Err(EndpointFailure::Completion(_))));
        // Echoed: the response carries the request's bytes.
        assert!(verify(100 + t, 10, got[&(100 + t)].as_ref().unwrap()));
    }
    assert!(matches!(got[&50], Err(EndpointFailure::Completion(_))));
    expect_completion_failure(&a, e0, Syndrome::TransportRetryExc);
}

/// A client context and a server context on `fabric`, connected by one endpoint each with
/// `cfg` on `RING`-byte rings; the client's endpoint.
fn client_and_server(
    fabric: &Fabric,
    cfg: EndpointConfig,
) -> (Context<u64>, Context<()>, EndpointId) {
    let (dc, ds) = (fabric.open(), fabric.open());
    let mut c = Context::<u64>::new(&dc, ContextConfig::default()).unwrap();
    let mut s = Context::<()>::new(&ds, ContextConfig::default()).unwrap();
    let cfg = EndpointConfig {
        ring_size: RING,
        ..cfg
    };
    let (ec, _) = connect(&mut c, &mut s, &cfg);
    (c, s, ec)
}

/// A `RecvHandle` is `Copy`: a second reply with it, or a reply with a handle whose request
/// was answered and whose slot now holds a newer request with the same call id, is refused
/// with `ReplyError::Stale` and counted; the caller sees exactly one response per call.
#[test]
fn second_reply_with_one_handle_is_refused() {
    use rpc_runtime::copyrpc::ReplyError;
    let fabric = Fabric::new(SimConfig::deterministic());
    let (mut c, mut s, ec) = client_and_server(&fabric, EndpointConfig::default());
    let mut responses = Vec::new();
    for round in 0..3u64 {
        c.call(ec, &round.to_le_bytes(), round, 16).unwrap();
        c.poll(|_, _| {});
        s.poll(|_, _| {});
        let (h, _) = s.recv().expect("request");
        s.reply(h, b"first").unwrap();
        assert_eq!(s.reply(h, b"again"), Err(ReplyError::Stale));
        s.poll(|_, _| {});
        c.poll(|u, r| responses.push((u, r.unwrap().to_vec())));
        // The next round's request reuses call id 0 and handle slot 0: the old handle
        // must still be refused.
        c.call(ec, b"next", 100 + round, 16).unwrap();
        c.poll(|_, _| {});
        s.poll(|_, _| {});
        let (h2, _) = s.recv().expect("request");
        assert_eq!(h2.call_id, h.call_id);
        assert_eq!(s.reply(h, b"stale"), Err(ReplyError::Stale));
        s.reply(h2, b"second").unwrap();
        s.poll(|_, _| {});
        c.poll(|u, r| responses.push((u, r.unwrap().to_vec())));
    }
    assert_eq!(s.stats().stale_replies, 6);
    assert_eq!(responses.len(), 6);
    for round in 0..3u64 {
        assert!(responses.contains(&(round, b"first".to_vec())));
        assert!(responses.contains(&(100 + round, b"second".to_vec())));
    }
    assert_eq!(c.endpoint_state(ec), Some(EndpointState::Connected));
    assert_eq!(c.stats().corrupt_batches, 0);
}

/// A reply larger than the caller's allowance is refused with `ReplyError::TooLarge` before
/// anything is sent, and the handle stays valid: a reply that fits (an error status, as the
/// delegation forwarder sends) still reaches the caller, once.
#[test]
fn too_large_reply_leaves_the_handle_answerable() {
    use rpc_runtime::copyrpc::ReplyError;
    let fabric = Fabric::new(SimConfig::deterministic());
    let no_large = EndpointConfig {
        max_large_message: 0,
        ..EndpointConfig::default()
    };
    let (mut c, mut s, ec) = client_and_server(&fabric, no_large);
    let mut responses = Vec::new();
    for round in 0..3u64 {
        c.call(ec, &round.to_le_bytes(), round, 16).unwrap();
        c.poll(|_, _| {});
        s.poll(|_, _| {});
        let (h, _) = s.recv().expect("request");
        assert!(matches!(
            s.reply(h, &[7u8; 200]),
            Err(ReplyError::TooLarge { .. })
        ));
        s.reply(h, b"status").unwrap();
        assert_eq!(s.reply(h, b"again"), Err(ReplyError::Stale));
        s.poll(|_, _| {});
        c.poll(|u, r| responses.push((u, r.unwrap().to_vec())));
    }
    let want: Vec<_> = (0..3u64).map(|r| (r, b"status".to_vec())).collect();
    assert_eq!(responses, want);
    assert_eq!(s.stats().stale_replies, 3);
    assert_eq!(c.endpoint_state(ec), Some(EndpointState::Connected));
}

mod props {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(proptest::test_runner::Config {
            // Each case builds a fabric and two contexts: 64 by default, more with
            // PROPTEST_CASES (this override applies only when the variable is unset).
            cases: if std::env::var_os("PROPTEST_CASES").is_none() {
                64
            } else {
                proptest::test_runner::Config::default().cases
            },
            ..proptest::test_runner::Config::default()
        })]

        /// Arbitrary bytes and an arbitrary immediate written into the context endpoint's receive
        /// ring by the forging peer (issue 14 §4), with one call pending: either the batch is
        /// accepted (the endpoint stays connected, nothing counted) or it is counted once in
        /// `corrupt_batches` and the endpoint fails with a protocol error that the pending call
        /// gets (unless an accepted response answered it first); nothing panics, and the other
        /// endpoint keeps working.
        #[test]
        fn arbitrary_ring_bytes_are_accepted_or_counted(
            bytes in proptest::collection::vec(
                prop_oneof![3 => Just(0u8), 1 => any::<u8>()],
                0..600,
            ),
            imm in prop_oneof![
                Just(None),
                (0u32..40).prop_map(Some),
                any::<u32>().prop_map(Some),
            ],
        ) {
            let mut rig = Rig::new();
            rig.call_bad(1);
            let imm = imm.unwrap_or(encode_imm(bytes.len().next_multiple_of(32) as u64));
            rig.forger.send(&bytes, imm);
            rig.poll_a();
            let st = *rig.a.stats();
            match rig.a.endpoint_state(rig.bad) {
                Some(EndpointState::Connected) => {
                    prop_assert_eq!(st.corrupt_batches, 0);
                    prop_assert_eq!(st.failed_endpoints, 0);
                }
                Some(EndpointState::Failed(why)) => {
                    prop_assert!(matches!(why, EndpointFailure::Protocol(_)), "{:?}", why);
                    prop_assert_eq!(st.corrupt_batches, 1);
                    prop_assert_eq!(st.failed_endpoints, 1);
                    match rig.got.remove(&1) {
                        Some(Err(e)) => prop_assert_eq!(e, why),
                        Some(Ok(_)) => {} // answered by the batch before the fault was found
                        None => prop_assert!(false, "the pending call was neither answered nor failed"),
                    }
                }
                s => prop_assert!(false, "endpoint state {:?}", s),
            }
            rig.round_trip_good(77);
        }
    }
}
