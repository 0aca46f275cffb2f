//! Flux (seeds/004 §1.3, §4.3): N-to-N request/response channels between daemon threads.
//! Limits, stale responses after `cancel`, a property test against a model, and all-to-all
//! traffic across threads.

use std::collections::{BTreeMap, VecDeque};

use proptest::prelude::*;
use rpc_runtime::flux::{self, FluxConfig, FluxError};

fn small(capacity: usize, max_inflight: usize) -> FluxConfig {
    FluxConfig {
        capacity,
        max_inflight,
    }
}

/// The seed's exchange: node 0 forwards to the shard owners, each answers, node 0 gets every
/// answer back with its own token.
#[test]
fn forward_and_answer() {
    let mut nodes = flux::network::<u64, usize>(3, FluxConfig::default()).unwrap();
    for (i, n) in nodes.iter().enumerate() {
        assert_eq!((n.id(), n.nodes(), n.in_flight()), (i, 3, 0));
    }
    for idx in 0..10usize {
        nodes[0]
            .call(1 + idx % 2, 100 + idx as u64, idx)
            .expect("call");
    }
    assert_eq!(nodes[0].in_flight(), 10);
    for n in nodes.iter_mut().skip(1) {
        while let Some((from, token, req)) = n.try_recv_raw() {
            assert_eq!((from, token.from()), (0, 0));
            n.reply(token, req * 2).unwrap();
        }
    }
    let mut got = BTreeMap::new();
    assert_eq!(
        nodes[0].poll(|idx, resp| assert!(got.insert(idx, resp).is_none())),
        10
    );
    assert_eq!(got, (0..10).map(|i| (i, 2 * (100 + i as u64))).collect());
    assert_eq!(nodes[0].in_flight(), 0);
    let s = nodes[0].stats();
    assert_eq!((s.calls, s.responses, s.stale_responses), (10, 10, 0));
    assert_eq!(nodes[1].stats().replies + nodes[2].stats().replies, 10);
}

#[test]
fn limits_hand_the_payload_back() {
    let mut nodes = flux::network::<String, u32>(2, small(3, 2)).unwrap();
    let e = nodes[0].call(2, "x".into(), 0).unwrap_err();
    assert!(
        matches!(
            &e,
            FluxError::NoSuchNode {
                node: 2,
                nodes: 2,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(e.into_payload(), "x");
    nodes[0].call(1, "a".into(), 1).unwrap();
    nodes[0].call(1, "b".into(), 2).unwrap();
    let e = nodes[0].call(1, "c".into(), 3).unwrap_err();
    assert!(
        matches!(
            &e,
            FluxError::TooManyInFlight {
                max_inflight: 2,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(e.into_payload(), "c");
    assert_eq!(nodes[0].stats().calls, 2);

    // A full request queue: two calls cancelled before node 1 read them still fill queue
    // 0 -> 1 (capacity 2), though node 0 has free call slots.
    let mut f = flux::network::<u8, u8>(2, small(2, 2)).unwrap();
    let a = f[0].call(1, 1, 1).unwrap();
    f[0].cancel(a).unwrap();
    let b = f[0].call(1, 2, 2).unwrap();
    f[0].cancel(b).unwrap();
    assert_eq!(
        f[0].call(1, 3, 3).unwrap_err(),
        FluxError::Full {
            node: 1,
            payload: 3
        }
    );
    let (_, t, _) = f[1].try_recv_raw().unwrap();
    f[1].reply(t, 10).unwrap();
    let (_, t2, _) = f[1].try_recv_raw().unwrap();
    f[1].reply(t2, 20).unwrap();
    // Both calls were cancelled: their responses are dropped and counted.
    assert_eq!(f[0].poll(|_, _| panic!("delivered a stale response")), 0);
    assert_eq!(f[0].stats().stale_responses, 2);
    // The response queue back (capacity 2) fills when responses to cancelled calls are
    // still queued: `reply` then hands the payload back.
    let c = f[0].call(1, 4, 4).unwrap();
    f[0].cancel(c).unwrap();
    f[0].call(1, 5, 5).unwrap();
    let (_, t4, _) = f[1].try_recv_raw().unwrap();
    let (_, t5, _) = f[1].try_recv_raw().unwrap();
    f[1].reply(t4, 40).unwrap();
    f[1].reply(t4, 41).unwrap(); // a duplicate: fills the queue
    assert_eq!(
        f[1].reply(t5, 50),
        Err(FluxError::Full {
            node: 0,
            payload: 50
        })
    );
    assert_eq!(f[0].poll(|_, _| panic!("stale")), 0);
    f[1].reply(t5, 50).unwrap();
    assert_eq!(f[0].poll(|tok, r| assert_eq!((tok, r), (5, 50))), 1);
}

#[test]
fn config_is_validated() {
    assert!(flux::network::<u8, u8>(0, FluxConfig::default()).is_err());
    assert!(flux::network::<u8, u8>(2, small(4, 8)).is_err());
    assert!(flux::network::<u8, u8>(2, small(4, 0)).is_err());
    let e = small(4, 8).validate().unwrap_err().to_string();
    assert!(
        e.contains("capacity = 4") && e.contains("max_inflight = 8"),
        "{e}"
    );
}

/// A cancelled call's late response is dropped and counted; the slot's next call gets only
/// its own response.
#[test]
fn cancelled_call_late_response_is_dropped() {
    let mut nodes = flux::network::<u32, &str>(2, small(4, 1)).unwrap();
    let old = nodes[0].call(1, 1, "old").unwrap();
    assert_eq!(nodes[0].cancel(old), Some("old"));
    assert_eq!(nodes[0].cancel(old), None);
    let new = nodes[0].call(1, 2, "new").unwrap();
    assert_ne!(old, new);
    // Node 1 answers both, the cancelled one first.
    for _ in 0..2 {
        let (_, t, req) = nodes[1].try_recv_raw().unwrap();
        nodes[1].reply(t, req * 10).unwrap();
    }
    let mut got = Vec::new();
    assert_eq!(nodes[0].poll(|tok, r| got.push((tok, r))), 1);
    assert_eq!(got, vec![("new", 20)]);
    let s = nodes[0].stats();
    assert_eq!((s.cancelled, s.stale_responses, s.responses), (1, 1, 1));
    assert_eq!(nodes[0].in_flight(), 0);
}

/// `cancel_where` gives up exactly the calls its predicate picks; their late answers are
/// stale, the others are delivered.
#[test]
fn cancel_where_sweeps_only_the_expired_calls() {
    let mut nodes = flux::network::<u32, u32>(2, small(8, 4)).unwrap();
    for t in 0..4 {
        nodes[0].call(1, t, t).unwrap();
    }
    let mut given_up = Vec::new();
    assert_eq!(
        nodes[0].cancel_where(|&t| t % 2 == 0, |t| given_up.push(t)),
        2
    );
    given_up.sort_unstable();
    assert_eq!(given_up, vec![0, 2]);
    assert_eq!(nodes[0].in_flight(), 2);
    while let Some((_, tok, req)) = nodes[1].try_recv_raw() {
        nodes[1].reply(tok, req + 100).unwrap();
    }
    let mut got = Vec::new();
    nodes[0].poll(|tok, r| got.push((tok, r)));
    got.sort_unstable();
    assert_eq!(got, vec![(1, 101), (3, 103)]);
    let s = nodes[0].stats();
    assert_eq!((s.cancelled, s.stale_responses), (2, 2));
    // Freed slots are reusable.
    for t in 10..12 {
        nodes[0].call(1, t, t).unwrap();
    }
    assert_eq!(nodes[0].in_flight(), 2);
}

#[derive(Clone, Debug)]
enum Op {
    Call { from: usize, to: usize },
    Serve { node: usize, max: usize },
    Poll { node: usize },
    Cancel { node: usize, pick: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..3, 0usize..3).prop_map(|(from, to)| Op::Call { from, to }),
        3 => (0usize..3, 1usize..5).prop_map(|(node, max)| Op::Serve { node, max }),
        3 => (0usize..3).prop_map(|node| Op::Poll { node }),
        1 => (0usize..3, any::<usize>()).prop_map(|(node, pick)| Op::Cancel { node, pick }),
    ]
}

proptest! {
    /// Random interleavings of calls, serving, polling and cancelling on 3 nodes with small
    /// queues: every call that is not cancelled gets exactly its own response, once; a
    /// cancelled call's response is never delivered (it is counted as stale if it arrives);
    /// refusals (`TooManyInFlight`, `Full`) happen exactly when the model says so.
    #[test]
    fn flux_matches_a_model(ops in proptest::collection::vec(op(), 1..200)) {
        let (cap, max) = (4usize, 3usize);
        let mut nodes = flux::network::<u64, u64>(3, small(cap, max)).unwrap();
        let mut next = 0u64;
        // Model: per node, outstanding calls (user token -> (id, request)); per ordered pair,
        // queued request count; answered-but-not-polled responses per node.
        let mut outstanding: Vec<BTreeMap<u64, (flux::CallId, u64)>> = vec![BTreeMap::new(); 3];
        let mut queued = [[0usize; 3]; 3];
        let mut cancelled_pending = [0u64; 3]; // cancelled calls whose reply may still come
        // Responses a node could not send yet (the queue back was full), retried first.
        let mut unsent: Vec<VecDeque<(flux::FluxToken, u64)>> = vec![VecDeque::new(); 3];
        for op in ops {
            match op {
                Op::Call { from, to } => {
                    next += 1;
                    let r = nodes[from].call(to, next, next);
                    let want_inflight = outstanding[from].len() >= max;
                    match r {
                        Ok(id) => {
                            prop_assert!(outstanding[from].len() < max);
                            prop_assert!(queued[from][to] < cap);
                            queued[from][to] += 1;
                            outstanding[from].insert(next, (id, next));
                        }
                        Err(FluxError::TooManyInFlight { payload, .. }) => {
                            prop_assert!(want_inflight);
                            prop_assert_eq!(payload, next);
                        }
                        Err(FluxError::Full { payload, .. }) => {
                            prop_assert_eq!(queued[from][to], cap);
                            prop_assert_eq!(payload, next);
                        }
                        Err(e) => prop_assert!(false, "{e}"),
                    }
                }
                Op::Serve { node, max: m } => {
                    for _ in 0..unsent[node].len() {
                        let (t, resp) = unsent[node].pop_front().unwrap();
                        if let Err(e) = nodes[node].reply(t, resp) {
                            prop_assert!(matches!(e, FluxError::Full { .. }), "{}", e);
                            unsent[node].push_back((t, e.into_payload()));
                        }
                    }
                    for _ in 0..m {
                        let Some((from, t, req)) = nodes[node].try_recv_raw() else { break };
                        prop_assert!(queued[from][node] > 0);
                        queued[from][node] -= 1;
                        if let Err(e) = nodes[node].reply(t, req ^ 0xabcd) {
                            // Only when responses to cancelled calls still fill the queue back.
                            prop_assert!(matches!(e, FluxError::Full { .. }), "{}", e);
                            prop_assert!(cancelled_pending[from] > 0);
                            unsent[node].push_back((t, e.into_payload()));
                        }
                    }
                }
                Op::Poll { node } => {
                    let before = nodes[node].stats().stale_responses;
                    let mut got = Vec::new();
                    nodes[node].poll(|tok, resp| got.push((tok, resp)));
                    for (tok, resp) in got {
                        let (_, req) = outstanding[node].remove(&tok).ok_or_else(|| TestCaseError::fail("response to no outstanding call"))?;
                        prop_assert_eq!(resp, req ^ 0xabcd);
                    }
                    let stale = nodes[node].stats().stale_responses - before;
                    prop_assert!(stale <= cancelled_pending[node]);
                    cancelled_pending[node] -= stale;
                }
                Op::Cancel { node, pick } => {
                    if outstanding[node].is_empty() { continue; }
                    let k = *outstanding[node].keys().nth(pick % outstanding[node].len()).unwrap();
                    let (id, _) = outstanding[node].remove(&k).unwrap();
                    prop_assert_eq!(nodes[node].cancel(id), Some(k));
                    cancelled_pending[node] += 1;
                }
            }
            for (i, n) in nodes.iter().enumerate() {
                prop_assert_eq!(n.in_flight(), outstanding[i].len());
            }
        }
    }
}

/// Four daemon threads, each calling every other one 20 000 times with up to 64 calls in
/// flight while serving the others: every response matches its request, none is lost or
/// duplicated.
#[test]
fn all_to_all_across_threads() {
    const N: usize = 4;
    const CALLS: u64 = 20_000;
    let nodes = flux::network::<(u64, u64), u64>(N, small(128, 64)).unwrap();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let handles: Vec<_> = nodes
        .into_iter()
        .map(|mut node| {
            let done = done.clone();
            std::thread::spawn(move || {
                let me = node.id() as u64;
                let (mut sent, mut answered) = (0u64, 0u64);
                let mut seen = vec![false; CALLS as usize];
                let t0 = std::time::Instant::now();
                let mut finished = false;
                while done.load(std::sync::atomic::Ordering::Acquire) < N || !finished {
                    assert!(t0.elapsed() < std::time::Duration::from_secs(60), "stuck");
                    while sent < CALLS {
                        let to = ((me + 1 + sent % (N as u64 - 1)) % N as u64) as usize;
                        match node.call(to, (me, sent), sent) {
                            Ok(_) => sent += 1,
                            Err(FluxError::TooManyInFlight { .. } | FluxError::Full { .. }) => {
                                break;
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                    while let Some((_, t, (from, seq))) = node.try_recv_raw() {
                        node.reply(t, (from * 1_000_000 + seq, me)).unwrap();
                    }
                    node.poll(|tok, (v, by)| {
                        assert_eq!(
                            v,
                            me * 1_000_000 + tok,
                            "response to call {tok} from node {by}"
                        );
                        assert!(
                            !std::mem::replace(&mut seen[tok as usize], true),
                            "duplicate {tok}"
                        );
                        answered += 1;
                    });
                    if answered == CALLS && !finished {
                        finished = true;
                        done.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                    }
                    std::thread::yield_now();
                }
                assert!(seen.iter().all(|&s| s));
                node.stats()
            })
        })
        .collect();
    for h in handles {
        let s = h.join().expect("node thread");
        assert_eq!((s.calls, s.responses, s.stale_responses), (CALLS, CALLS, 0));
        assert_eq!(s.requests_received, s.replies);
    }
}
