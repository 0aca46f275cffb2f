//! Property test of the delegation ring against a single-threaded model: random interleavings
//! of client calls, server poll/recv/advance_tail, replies and client polls, on rings with
//! small depths, never lose, duplicate, corrupt or reorder a payload, and `try_call` reports
//! `WouldBlock` exactly when all of the client's response slots are outstanding.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use rpc_runtime::delegation::{ReplyToken, RingCallError, RingClient, RingConfig, RingServer};

const CAP: usize = 24;

fn unique_name(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "rt-{}-{tag}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn transform(req: &[u8]) -> Vec<u8> {
    req.iter().rev().map(|b| b ^ 0x5a).collect()
}

#[derive(Clone, Debug)]
enum Op {
    Call { client: usize, payload: Vec<u8> },
    Serve { max: usize, advance: bool },
    Reply { pick: usize },
    Poll { client: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..3, proptest::collection::vec(any::<u8>(), 0..=CAP))
            .prop_map(|(client, payload)| Op::Call { client, payload }),
        2 => (1usize..6, any::<bool>()).prop_map(|(max, advance)| Op::Serve { max, advance }),
        3 => any::<usize>().prop_map(|pick| Op::Reply { pick }),
        3 => (0usize..3).prop_map(|client| Op::Poll { client }),
    ]
}

/// What the model knows about one outstanding call of a client.
#[derive(Debug)]
struct Outstanding {
    request: Vec<u8>,
    response: Option<Vec<u8>>,
}

struct Model {
    ring_depth: u64,
    resp_depth: usize,
    /// Positions reserved (= calls sent), the server cursor and the published tail.
    head: u64,
    cursor: u64,
    tail: u64,
    /// Sent, not yet received: (client index, resp slot, payload), in position order.
    in_ring: VecDeque<(usize, u32, Vec<u8>)>,
    /// Received, not yet replied.
    to_reply: Vec<(ReplyToken, usize, u32, Vec<u8>)>,
    /// Per client: resp slot -> call.
    outstanding: Vec<BTreeMap<u32, Outstanding>>,
    delivered: u64,
}

struct Rig {
    server: RingServer,
    clients: Vec<RingClient>,
}

impl Model {
    fn step(&mut self, rig: &mut Rig, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Call { client, payload } => {
                let client = client % rig.clients.len();
                // try_call spins while the ring is full; in one thread, only call when it is not.
                if self.head - self.tail >= self.ring_depth {
                    return Ok(());
                }
                let full = self.outstanding[client].len() == self.resp_depth;
                let r = rig.clients[client].try_call(&payload);
                if full {
                    prop_assert_eq!(r, Err(RingCallError::WouldBlock));
                } else {
                    let idx = r.map_err(|e| TestCaseError::fail(format!("try_call: {e}")))?;
                    prop_assert!((idx as usize) < self.resp_depth);
                    prop_assert!(!self.outstanding[client].contains_key(&idx), "slot reused");
                    self.outstanding[client].insert(
                        idx,
                        Outstanding {
                            request: payload.clone(),
                            response: None,
                        },
                    );
                    self.in_ring.push_back((client, idx, payload));
                    self.head += 1;
                }
                prop_assert_eq!(
                    rig.clients[client].in_flight(),
                    self.outstanding[client].len()
                );
            }
            Op::Serve { max, advance } => {
                let n = rig.server.poll();
                prop_assert_eq!(n, self.in_ring.len());
                for _ in 0..max {
                    let Some(e) = rig.server.recv() else {
                        prop_assert!(self.in_ring.is_empty());
                        break;
                    };
                    let (client, idx, payload) = self
                        .in_ring
                        .pop_front()
                        .ok_or_else(|| TestCaseError::fail("received more than sent"))?;
                    prop_assert_eq!(e.token.client_id, rig.clients[client].client_id());
                    prop_assert_eq!(e.token.resp_slot_idx, idx);
                    prop_assert_eq!(e.payload, &payload[..]);
                    self.to_reply.push((e.token, client, idx, payload));
                    self.cursor += 1;
                }
                if advance {
                    rig.server.advance_tail();
                    self.tail = self.cursor;
                }
            }
            Op::Reply { pick } => {
                if self.to_reply.is_empty() {
                    return Ok(());
                }
                let (token, client, idx, payload) =
                    self.to_reply.swap_remove(pick % self.to_reply.len());
                let resp = transform(&payload);
                prop_assert_eq!(rig.server.reply(token, &resp), Ok(()));
                let o = self.outstanding[client]
                    .get_mut(&idx)
                    .ok_or_else(|| TestCaseError::fail("reply to a slot not outstanding"))?;
                prop_assert_eq!(&o.request, &payload);
                o.response = Some(resp);
            }
            Op::Poll { client } => {
                let client = client % rig.clients.len();
                let mut got = BTreeMap::new();
                let n = rig.clients[client]
                    .poll(|idx, bytes| {
                        assert!(
                            got.insert(idx, bytes.to_vec()).is_none(),
                            "duplicate delivery"
                        );
                    })
                    .map_err(|e| TestCaseError::fail(format!("poll: {e}")))?;
                prop_assert_eq!(n, got.len());
                let expected: BTreeMap<u32, Vec<u8>> = self.outstanding[client]
                    .iter()
                    .filter_map(|(&i, o)| o.response.clone().map(|r| (i, r)))
                    .collect();
                prop_assert_eq!(&got, &expected);
                for i in got.keys() {
                    self.outstanding[client].remove(i);
                }
                self.delivered += got.len() as u64;
                prop_assert_eq!(
                    rig.clients[client].in_flight(),
                    self.outstanding[client].len()
                );
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn ring_matches_model(
        ring_log2 in 1u32..=3,
        resp_log2 in 0u32..=2,
        nclients in 1usize..=3,
        ops in proptest::collection::vec(op(), 1..160),
    ) {
        let cfg = RingConfig {
            max_clients: 4,
            ring_depth: 1 << ring_log2,
            resp_depth: 1 << resp_log2,
            req_payload_cap: CAP as u32,
            resp_payload_cap: CAP as u32,
            ..RingConfig::default()
        };
        let name = unique_name("model");
        let server = RingServer::create(&name, &cfg).unwrap();
        let clients = (0..nclients).map(|_| RingClient::attach(&name).unwrap()).collect();
        let mut rig = Rig { server, clients };
        let mut m = Model {
            ring_depth: cfg.ring_depth.into(),
            resp_depth: cfg.resp_depth as usize,
            head: 0,
            cursor: 0,
            tail: 0,
            in_ring: VecDeque::new(),
            to_reply: Vec::new(),
            outstanding: (0..nclients).map(|_| BTreeMap::new()).collect(),
            delivered: 0,
        };
        for op in ops {
            m.step(&mut rig, op)?;
        }
        // Drain: everything sent is eventually delivered, exactly once.
        m.step(&mut rig, Op::Serve { max: usize::MAX, advance: true })?;
        while !m.to_reply.is_empty() {
            m.step(&mut rig, Op::Reply { pick: 0 })?;
        }
        for c in 0..nclients {
            m.step(&mut rig, Op::Poll { client: c })?;
            prop_assert!(m.outstanding[c].is_empty());
        }
        prop_assert_eq!(m.delivered, m.head);
        prop_assert_eq!(rig.server.stats().received, m.head);
        prop_assert_eq!(rig.server.stats().replied, m.head);
        prop_assert_eq!(rig.server.stats().invalid_entries(), 0);
    }
}
