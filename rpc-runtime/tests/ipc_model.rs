//! Property tests of the ipc ring protocol.
//!
//! * `rings_follow_the_model`: random interleavings of client sends, server polls, receives,
//!   replies (in any order, plus duplicate replies), releases and client polls on two clients
//!   are checked step by step against a simple model of the protocol: which sends are refused
//!   (back-pressure), what each poll makes available (flat combining with the idle skip
//!   counter), the per-client order of received requests, and which response each client
//!   poll delivers to which call (a second reply to a call is refused by the server and
//!   counted; the client never sees a response it did not ask for).
//! * `corrupt_fields_never_panic`: the same operations with random writes of random values
//!   into the shared counters, owner words and slot headers: no operation panics or hangs,
//!   every call still ends (a fault, a refusal or a delivered message), and the segment stays
//!   usable for new clients after the corrupted ones detach.

mod ipc_common;

use std::collections::VecDeque;

use ipc_common::*;
use proptest::prelude::*;
use rpc_runtime::RpcError;
use rpc_runtime::ipc::layout::*;
use rpc_runtime::ipc::{IDLE_SKIP_POLLS, Ipc, IpcToken};

const DEPTH: u32 = 4;
const CLIENTS: usize = 2;

#[derive(Clone, Debug)]
enum Op {
    Send { c: usize, len: usize, byte: u8 },
    Poll,
    Recv,
    Reply { idx: usize },
    DupReply { idx: usize },
    Release,
    ClientPoll { c: usize, max: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..CLIENTS, 0..=CAP, any::<u8>()).prop_map(|(c, len, byte)| Op::Send { c, len, byte }),
        3 => Just(Op::Poll),
        4 => Just(Op::Recv),
        3 => any::<usize>().prop_map(|idx| Op::Reply { idx }),
        1 => any::<usize>().prop_map(|idx| Op::DupReply { idx }),
        2 => Just(Op::Release),
        3 => (0..CLIENTS, 1..=4usize).prop_map(|(c, max)| Op::ClientPoll { c, max }),
    ]
}

/// A response in a client's response ring: for a call (`Some(token)`) or stale (`None`).
type RespEntry = (Option<u32>, Vec<u8>);

#[derive(Default)]
struct ModelClient {
    /// Payload and token of every request sent, by position.
    sent: Vec<(u32, Vec<u8>)>,
    /// Token -> request payload of the calls in flight.
    in_flight: std::collections::HashMap<u32, Vec<u8>>,
    cursor: usize,
    released: usize,
    limit: usize,
    skip: u8,
    outstanding: usize,
    resp: VecDeque<RespEntry>,
}

fn msg(len: usize, byte: u8) -> Vec<u8> {
    (0..len).map(|i| byte.wrapping_add(i as u8)).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn rings_follow_the_model(ops in proptest::collection::vec(op(), 1..200)) {
        let n = unique_name("model");
        let mut s = server(&n, CLIENTS as u32, DEPTH);
        let mut cs: Vec<Ipc> = (0..CLIENTS).map(|_| Ipc::attach(&n).unwrap()).collect();
        let mut m: Vec<ModelClient> = (0..CLIENTS).map(|_| ModelClient::default()).collect();
        // Received, not yet answered: (token, client, call token, payload).
        let mut taken: Vec<(IpcToken, usize, u32, Vec<u8>)> = Vec::new();
        let mut replied: Vec<IpcToken> = Vec::new();
        let (mut stale, mut dups, mut received) = (0u64, 0u64, 0u64);
        let depth = DEPTH as usize;
        for op in ops {
            match op {
                Op::Send { c, len, byte } => {
                    let payload = msg(len, byte);
                    let mc = &mut m[c];
                    let ok = mc.in_flight.len() < depth && mc.sent.len() - mc.released < depth;
                    match send_msg(&mut cs[c], &payload) {
                        Ok(t) => {
                            prop_assert!(ok, "send accepted beyond back-pressure");
                            prop_assert!(!mc.in_flight.contains_key(&t), "token {t} in use");
                            prop_assert!(t < DEPTH);
                            mc.in_flight.insert(t, payload.clone());
                            mc.sent.push((t, payload));
                        }
                        Err(RpcError::WouldBlock) => prop_assert!(!ok, "send refused with room"),
                        Err(e) => prop_assert!(false, "send: {e}"),
                    }
                }
                Op::Poll => {
                    let mut want = 0;
                    for mc in m.iter_mut() {
                        if mc.skip > 0 {
                            mc.skip -= 1;
                            // Not read: recv offers nothing new from this client.
                            mc.limit = mc.cursor;
                            continue;
                        }
                        let avail = mc.sent.len() - mc.cursor;
                        mc.limit = mc.sent.len();
                        if avail == 0 {
                            mc.skip = IDLE_SKIP_POLLS;
                        }
                        want += avail;
                    }
                    prop_assert_eq!(s.poll(), want);
                }
                Op::Recv => {
                    let expect = m.iter().position(|mc| mc.cursor < mc.limit);
                    match (s.recv(), expect) {
                        (None, None) => {}
                        (Some((token, bytes)), Some(c)) => {
                            let mc = &mut m[c];
                            let (call, payload) = mc.sent[mc.cursor].clone();
                            prop_assert_eq!(token.client as usize, c);
                            prop_assert_eq!(bytes, &payload[..]);
                            mc.cursor += 1;
                            mc.outstanding += 1;
                            received += 1;
                            taken.push((token, c, call, payload));
                        }
                        (got, want) => prop_assert!(false, "recv {:?}, model {want:?}", got.map(|g| g.0)),
                    }
                }
                Op::Reply { idx } if !taken.is_empty() => {
                    let i = idx % taken.len();
                    let (token, c, call, ref payload) = taken[i];
                    let resp = transform(payload);
                    // Never full: one response per call, at most `depth` calls in flight.
                    let ok = true;
                    let r = s.reply_with(token, |buf| {
                        buf[..resp.len()].copy_from_slice(&resp);
                        resp.len()
                    });
                    prop_assert_eq!(r.is_ok(), ok, "reply: {:?}", r);
                    if ok {
                        taken.swap_remove(i);
                        m[c].outstanding -= 1;
                        // A reply publishes the request tail first.
                        m[c].released = m[c].cursor;
                        m[c].resp.push_back((Some(call), resp));
                        replied.push(token);
                    }
                }
                Op::DupReply { idx } if !replied.is_empty() => {
                    let token = replied[idx % replied.len()];
                    let r = s.reply_with(token, |buf| {
                        buf[0] = 0xEE;
                        1
                    });
                    // Each call is answered at most once: a second reply is always refused.
                    prop_assert!(r.is_err());
                    dups += 1;
                }
                Op::Reply { .. } | Op::DupReply { .. } => {}
                Op::Release => {
                    s.release();
                    for mc in m.iter_mut() {
                        mc.released = mc.cursor;
                    }
                }
                Op::ClientPoll { c, max } => {
                    let mut want = Vec::new();
                    let mc = &mut m[c];
                    while want.len() < max {
                        let Some((call, resp)) = mc.resp.pop_front() else { break };
                        match call {
                            Some(t) => {
                                let req = mc.in_flight.remove(&t).expect("model: call in flight");
                                prop_assert_eq!(&resp, &transform(&req));
                                want.push((t, resp));
                            }
                            None => stale += 1,
                        }
                    }
                    let mut got = Vec::new();
                    let k = cs[c].poll_up_to(max, |t, b| got.push((t, b.to_vec()))).unwrap();
                    prop_assert_eq!(k, got.len());
                    prop_assert_eq!(got, want);
                }
            }
        }
        let client_stale: u64 = cs.iter().map(|c| c.stats().stale_responses).sum();
        prop_assert_eq!(client_stale, stale);
        prop_assert_eq!(s.stats().duplicate_replies, dups);
        prop_assert_eq!(s.stats().received, received);
    }

    #[test]
    fn corrupt_fields_never_panic(
        ops in proptest::collection::vec(
            prop_oneof![
                3 => op().prop_map(Ok),
                1 => (0..10usize, 0..2usize, 0..DEPTH as u64, any::<u64>(), 0..3u8)
                    .prop_map(Err),
            ],
            1..150,
        )
    ) {
        let n = unique_name("corrupt");
        let mut s = server(&n, CLIENTS as u32, DEPTH);
        let mut cs: Vec<Ipc> = (0..CLIENTS).map(|_| Ipc::attach(&n).unwrap()).collect();
        let mut raw = Raw::open(&n);
        let l = *s.layout();
        let mut taken: Vec<IpcToken> = Vec::new();
        for op in ops {
            match op {
                Err((field, c, pos, v, size)) => {
                    // Small values land in range often enough to reach the deeper checks.
                    let v = match size { 0 => v % 8, 1 => v % 64, _ => v };
                    let b = l.block(c as u32);
                    let off = [
                        b + CB_OWNER, b + CB_FAULT, b + CB_REQ_HEAD, b + CB_REQ_TAIL,
                        b + CB_RESP_HEAD, b + CB_RESP_TAIL,
                        l.req_slot(c as u32, pos) + SLOT_LEN, l.req_slot(c as u32, pos) + SLOT_TAG,
                        l.resp_slot(c as u32, pos) + SLOT_LEN, l.resp_slot(c as u32, pos) + SLOT_TAG,
                    ][field];
                    if matches!(field, 1 | 6..=9) {
                        raw.put_u32(off, v as u32);
                    } else {
                        raw.put_u64(off, v);
                    }
                }
                Ok(Op::Send { c, len, byte }) => { let _ = send_msg(&mut cs[c], &msg(len, byte)); }
                Ok(Op::Poll) => { s.poll(); }
                Ok(Op::Recv) => {
                    if let Some((t, b)) = s.recv() {
                        prop_assert!(b.len() <= CAP);
                        taken.push(t);
                    }
                }
                Ok(Op::Reply { idx } | Op::DupReply { idx }) if !taken.is_empty() => {
                    let t = taken[idx % taken.len()];
                    let _ = s.reply_with(t, |buf| { buf[0] = 1; 1 });
                }
                Ok(Op::Reply { .. } | Op::DupReply { .. }) => {}
                Ok(Op::Release) => s.release(),
                Ok(Op::ClientPoll { c, max }) => {
                    if let Ok(k) = cs[c].poll_up_to(max, |t, b| {
                        assert!(t < DEPTH && b.len() <= CAP);
                    }) {
                        prop_assert!(k <= max);
                    }
                }
            }
        }
        drop(cs);
        s.scan_clients();
        // Both blocks come back: the segment is usable after any corruption of client blocks.
        let mut c = Ipc::attach(&n).unwrap();
        let t = send_msg(&mut c, b"after").unwrap();
        prop_assert_eq!(wait_one(&mut c, Some(&mut s)), (t, transform(b"after")));
    }
}

fn send_msg(c: &mut Ipc, payload: &[u8]) -> Result<u32, RpcError> {
    c.try_send(|buf| {
        buf[..payload.len()].copy_from_slice(payload);
        payload.len()
    })
}
