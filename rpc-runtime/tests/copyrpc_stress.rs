//! copyrpc stress tests on the device model, in the spirit of a hardware suite (issue 4 §7).
//!
//! Each workload test makes [`CALLS`] calls: 1 000 000 in release builds, 100 000 in debug
//! builds (where the model and the checks are several times slower). CI runs this file with
//! `cargo test --release -p rpc-runtime --test copyrpc_stress` for the full count (about
//! 8 s of tests on a 2-core machine, 12 s with `--test-threads 1`; `-- --nocapture` prints
//! each workload's counters).
//!
//! Every request and every response is verified byte for byte: a request of 16 bytes or
//! more carries its sequence number, the response length the caller chose and a check
//! word, then bytes derived from the sequence number, all verified by the server; a
//! shorter request is derived from its sequence number and its response from its bytes.
//! The caller knows what each response must be (seed and length, kept as the call's user
//! data), verifies it and counts every call exactly once. Workloads are seeded (xorshift),
//! so every run is the same. A run that stops making progress for a long time panics
//! (deadlock detection).
//!
//! Workloads: (a) a 4 KiB ring with responses near the largest its credit allows; (b) 256
//! calls wanted in flight on a 4 KiB ring, replies deferred and sent in random order;
//! (c) bidirectional traffic, in one thread and in two; (d) mixed sizes, 0 B to 4 KiB,
//! random per call; a client and a server in two threads; 64 endpoints of one server
//! context, each with its own client context, interleaved. Plus ring wraps at every offset
//! where a wrap can happen, for requests and for responses.

mod copyrpc_common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use copyrpc_common::{Rng, connect, fill, pattern, verify};
use mlx5::sim::{Fabric, SimConfig};
use rpc_runtime::copyrpc::{
    CallError, CallErrorKind, Context, ContextConfig, EndpointConfig, EndpointId, RecvHandle, Stats,
};

/// Calls per workload test (see the module docs).
const CALLS: u64 = if cfg!(debug_assertions) {
    100_000
} else {
    1_000_000
};

/// Steps without any progress after which a run is declared deadlocked.
const STALL_STEPS: u64 = 100_000;

/// Requests shorter than this carry no header.
const HEADER: usize = 16;

/// What a call's response must be: kept as the call's user data.
#[derive(Clone, Copy, Debug)]
struct Expect {
    seq: u64,
    ep: EndpointId,
    seed: u64,
    len: u32,
}

/// One call to make: request length, response length, response allowance.
#[derive(Clone, Copy, Debug)]
struct Plan {
    len: u32,
    resp_len: u32,
    allowance: u32,
}

fn check_word(seq: u64, resp_len: u32) -> u32 {
    let h = (seq ^ (resp_len as u64) << 40).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h >> 32) as u32
}

fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Response length of a request shorter than [`HEADER`].
fn tiny_resp_len(len: usize) -> u32 {
    (len * 37 % 61) as u32
}

/// Writes request `seq` (its length is `buf.len()`) asking for `resp_len` response bytes.
fn write_request(seq: u64, resp_len: u32, buf: &mut [u8]) {
    if buf.len() < HEADER {
        fill(seq, buf);
        return;
    }
    buf[0..8].copy_from_slice(&seq.to_le_bytes());
    buf[8..12].copy_from_slice(&resp_len.to_le_bytes());
    buf[12..16].copy_from_slice(&check_word(seq, resp_len).to_le_bytes());
    fill(seq.rotate_left(17), &mut buf[HEADER..]);
}

/// The response (seed, length) a request must get; verifies the request.
fn answer(req: &[u8]) -> (u64, u32) {
    if req.len() < HEADER {
        return (
            fnv(req) ^ (req.len() as u64) << 56,
            tiny_resp_len(req.len()),
        );
    }
    let seq = u64::from_le_bytes(req[0..8].try_into().unwrap());
    let resp_len = u32::from_le_bytes(req[8..12].try_into().unwrap());
    let check = u32::from_le_bytes(req[12..16].try_into().unwrap());
    assert_eq!(check, check_word(seq, resp_len), "request header corrupt");
    assert!(
        verify(seq.rotate_left(17), req.len() - HEADER, &req[HEADER..]),
        "request {seq} ({} B) corrupt",
        req.len()
    );
    (!seq, resp_len)
}

/// The response a caller expects for `plan` and `seq`.
fn expect(seq: u64, ep: EndpointId, plan: &Plan) -> Expect {
    if (plan.len as usize) < HEADER {
        let req = pattern(seq, plan.len as usize);
        let (seed, len) = answer(&req);
        Expect { seq, ep, seed, len }
    } else {
        Expect {
            seq,
            ep,
            seed: !seq,
            len: plan.resp_len,
        }
    }
}

/// A context acting as a client (calls on `eps`) and/or a server (answers what arrives).
struct Node {
    ctx: Context<Expect>,
    eps: Vec<EndpointId>,
    /// Calls to keep in flight per endpoint.
    depth: usize,
    outstanding: Vec<usize>,
    /// A plan refused (retryable) and to be retried, per endpoint.
    retry: Vec<Option<Plan>>,
    issued: u64,
    total: u64,
    completed: u64,
    /// Sequence numbers of this node's calls are `seq_base + i`.
    seq_base: u64,
    answered: Vec<bool>,
    refused: u64,
    /// Most calls in flight at once (all endpoints).
    peak: usize,
    /// Server side: replies held back (answered later, in random order).
    deferred: Vec<(RecvHandle, u64, u32)>,
    defer: bool,
    served: u64,
    rng: Rng,
}

impl Node {
    fn new(
        ctx: Context<Expect>,
        eps: Vec<EndpointId>,
        depth: usize,
        total: u64,
        seed: u64,
    ) -> Node {
        let n = eps.len();
        Node {
            ctx,
            eps,
            depth,
            outstanding: vec![0; n],
            retry: vec![None; n],
            issued: 0,
            total,
            completed: 0,
            seq_base: seed << 40,
            answered: vec![false; total as usize],
            refused: 0,
            peak: 0,
            deferred: Vec::new(),
            defer: false,
            served: 0,
            rng: Rng(seed | 1),
        }
    }

    /// Issues calls until every endpoint has `depth` in flight, the total is reached or the
    /// transport refuses (retryable: the same plan is retried at the next step).
    fn issue(&mut self, plan: &mut impl FnMut(&mut Rng) -> Plan) {
        for i in 0..self.eps.len() {
            while self.outstanding[i] < self.depth && self.issued < self.total {
                let p = self.retry[i].take().unwrap_or_else(|| plan(&mut self.rng));
                let seq = self.seq_base + self.issued;
                let e = expect(seq, self.eps[i], &p);
                // Short requests get a response of their own length (up to 60 B).
                let allowance = p.allowance.max(e.len);
                let r = self.ctx.call_with(self.eps[i], p.len, e, allowance, |b| {
                    write_request(seq, p.resp_len, b);
                    b.len()
                });
                match r {
                    Ok(_) => {
                        self.outstanding[i] += 1;
                        self.issued += 1;
                        self.peak = self.peak.max(self.outstanding.iter().sum());
                    }
                    Err(CallError {
                        kind: CallErrorKind::RingFull | CallErrorKind::InsufficientCredit,
                        ..
                    }) => {
                        self.retry[i] = Some(p);
                        self.refused += 1;
                        break;
                    }
                    Err(err) => panic!("call {seq} ({p:?}) failed: {err}"),
                }
            }
        }
    }

    /// Polls: verifies every response. Returns the number of responses.
    fn poll(&mut self) -> u64 {
        let before = self.completed;
        let Node {
            ctx,
            eps,
            outstanding,
            answered,
            completed,
            seq_base,
            ..
        } = self;
        ctx.poll(|e, r| {
            let bytes = r.unwrap_or_else(|f| panic!("call {} failed: {f}", e.seq));
            assert!(
                verify(e.seed, e.len as usize, bytes),
                "response to call {} corrupt: {} B, expected {}",
                e.seq,
                bytes.len(),
                e.len
            );
            let i = (e.seq - *seq_base) as usize;
            assert!(!answered[i], "call {} answered twice", e.seq);
            answered[i] = true;
            let k = eps.iter().position(|&x| x == e.ep).unwrap();
            outstanding[k] -= 1;
            *completed += 1;
        });
        self.completed - before
    }

    /// Answers what arrived: at once, or (with `defer`) later and in random order.
    fn serve(&mut self) -> u64 {
        let before = self.served;
        while let Some((h, req)) = self.ctx.recv() {
            let (seed, len) = answer(req);
            assert!(len as usize <= h.max_response());
            if self.defer {
                self.deferred.push((h, seed, len));
            } else {
                reply(&mut self.ctx, h, seed, len);
                self.served += 1;
            }
        }
        if self.defer && !self.deferred.is_empty() {
            // Some of the held replies, picked at random; all of them now and then.
            let n = if self.rng.below(8) == 0 {
                self.deferred.len()
            } else {
                1 + self.rng.below(self.deferred.len() as u64) as usize / 2
            };
            for _ in 0..n {
                let k = self.rng.below(self.deferred.len() as u64) as usize;
                let (h, seed, len) = self.deferred.swap_remove(k);
                reply(&mut self.ctx, h, seed, len);
                self.served += 1;
            }
        }
        self.served - before
    }

    /// One step: issue, poll (flush, receive), serve. Returns the progress made.
    fn step(&mut self, plan: &mut impl FnMut(&mut Rng) -> Plan) -> u64 {
        self.issue(plan);
        self.poll() + self.serve()
    }

    fn done(&self) -> bool {
        self.completed == self.total
    }

    fn finish(&self, what: &str) {
        assert_eq!(self.issued, self.total);
        assert_eq!(self.completed, self.total);
        assert!(
            self.answered.iter().all(|&a| a),
            "{what}: a call was not answered"
        );
        assert!(self.outstanding.iter().all(|&o| o == 0));
        let s = self.ctx.stats();
        assert_eq!(s.corrupt_batches, 0);
        assert_eq!(s.failed_endpoints, 0);
        assert_eq!(s.error_cqes, 0);
        assert_eq!(s.backlogged_replies, 0, "{what}: a reply lacked space");
    }
}

fn reply(ctx: &mut Context<Expect>, h: RecvHandle, seed: u64, len: u32) {
    ctx.reply_with(h, len, |b| {
        fill(seed, &mut b[..len as usize]);
        len as usize
    })
    .unwrap_or_else(|e| panic!("reply: {e}"));
}

fn report(what: &str, t: Instant, calls: u64, s: &Stats, refused: u64) {
    eprintln!(
        "{what}: {calls} calls in {:.2?} ({:.0} calls/s); client: batches {} (mean {:.2} \
         msgs), wraps {}, flow updates {}, consumer reads {}, ring full {}, insufficient \
         credit {}, refused {refused}",
        t.elapsed(),
        calls as f64 / t.elapsed().as_secs_f64(),
        s.batches_sent,
        s.mean_batch(),
        s.wrap_markers,
        s.flow_updates,
        s.consumer_reads,
        s.ring_full,
        s.insufficient_credit,
    );
}

/// Steps `nodes` round-robin in this thread until every node's calls are answered.
fn run(what: &str, nodes: &mut [Node], plan: &mut impl FnMut(&mut Rng) -> Plan) {
    let mut idle = 0u64;
    while !nodes.iter().all(Node::done) {
        let mut progress = 0;
        for n in nodes.iter_mut() {
            progress += n.step(plan);
        }
        if progress == 0 {
            idle += 1;
            assert!(
                idle < STALL_STEPS,
                "{what}: no progress for {STALL_STEPS} steps: {:?}",
                nodes
                    .iter()
                    .map(|n| (n.issued, n.completed, n.deferred.len(), n.ctx.stats()))
                    .collect::<Vec<_>>()
            );
        } else {
            idle = 0;
        }
    }
    // Let the last replies and credit updates settle.
    for _ in 0..4 {
        for n in nodes.iter_mut() {
            n.step(plan);
        }
    }
    for n in nodes.iter() {
        n.finish(what);
    }
}

fn contexts(fabric: &Fabric) -> (Context<Expect>, Context<Expect>) {
    (
        Context::new(&fabric.open(), ContextConfig::default()).unwrap(),
        Context::new(&fabric.open(), ContextConfig::default()).unwrap(),
    )
}

fn ring(size: usize) -> EndpointConfig {
    EndpointConfig {
        ring_size: size,
        ..Default::default()
    }
}

/// A client/server pair on one endpoint each.
fn client_server(size: usize, depth: usize, seed: u64) -> (Fabric, Node, Node) {
    let fabric = Fabric::new(SimConfig::default());
    let (mut a, mut b) = contexts(&fabric);
    let (ea, _) = connect(&mut a, &mut b, &ring(size));
    let client = Node::new(a, vec![ea], depth, CALLS, seed);
    let server = Node::new(b, vec![], 0, 0, seed + 1);
    (fabric, client, server)
}

/// (a) A 4 KiB ring with responses near the largest its credit allows: the server grants
/// at most a quarter of its ring (1 KiB), so the largest allowance is 1024 - 32 - 12 = 980
/// bytes; responses are 900-980 B (a third exactly 980), requests 0-64 B.
#[test]
fn tiny_ring_large_responses() {
    let t = Instant::now();
    let (_f, client, server) = client_server(4096, 4, 0xa);
    let max = client.ctx.endpoint(0).unwrap().max_response_allowance();
    let credit = client.ctx.endpoint(0).unwrap().peer_credit();
    assert_eq!(credit, 1024);
    let largest = (credit - 32 - 12) as u32;
    assert!(largest <= max);
    let mut nodes = [client, server];
    run(
        "tiny ring, large responses",
        &mut nodes,
        &mut |r: &mut Rng| {
            let resp_len = if r.below(3) == 0 {
                largest
            } else {
                900 + r.below(81) as u32
            };
            Plan {
                len: r.below(65) as u32,
                resp_len,
                allowance: largest,
            }
        },
    );
    let s = nodes[1].ctx.stats();
    assert!(
        s.wrap_markers > CALLS / 8,
        "responses wrap constantly: {}",
        s.wrap_markers
    );
    assert_eq!(s.backlogged_replies, 0);
    report(
        "tiny ring, large responses",
        t,
        CALLS,
        nodes[0].ctx.stats(),
        nodes[0].refused,
    );
}

/// (b) 256 calls wanted in flight on a 4 KiB ring: far more than the credit admits (each
/// call reserves at least 64 B of the server's grant, at most 1 KiB, so at most 16 are in
/// flight), so the transport pushes back (InsufficientCredit) and the client retries at
/// every step; the server holds replies back and answers in random order.
#[test]
fn deep_queue_tiny_ring() {
    let t = Instant::now();
    let (_f, client, mut server) = client_server(4096, 256, 0xb);
    server.defer = true;
    let mut nodes = [client, server];
    run("deep queue, tiny ring", &mut nodes, &mut |r: &mut Rng| {
        Plan {
            len: 16 + r.below(33) as u32,
            resp_len: r.below(21) as u32,
            allowance: 20,
        }
    });
    let s = nodes[0].ctx.stats();
    assert!(
        s.insufficient_credit + s.ring_full > 0,
        "back-pressure was exercised"
    );
    assert!(nodes[0].refused > 0);
    assert_eq!(
        nodes[0].peak, 16,
        "the credit admits exactly 16 calls of 64 B"
    );
    assert!(s.wrap_markers > 0);
    report("deep queue, tiny ring", t, CALLS, s, nodes[0].refused);
}

fn bidirectional_plan(r: &mut Rng) -> Plan {
    let resp_len = r.below(400) as u32;
    Plan {
        len: r.below(500) as u32,
        resp_len,
        allowance: resp_len + r.below(64) as u32,
    }
}

/// (c) Both contexts call each other (16 in flight each, 0-500 B requests, 0-400 B
/// responses, 8 KiB rings) and answer, one thread.
#[test]
fn bidirectional_one_thread() {
    let t = Instant::now();
    let fabric = Fabric::new(SimConfig::default());
    let (mut a, mut b) = contexts(&fabric);
    let (ea, eb) = connect(&mut a, &mut b, &ring(8192));
    let mut nodes = [
        Node::new(a, vec![ea], 16, CALLS / 2, 0xc0),
        Node::new(b, vec![eb], 16, CALLS / 2, 0xc1),
    ];
    nodes[1].defer = true;
    run("bidirectional", &mut nodes, &mut bidirectional_plan);
    for n in &nodes {
        assert_eq!(n.served, CALLS / 2, "each side served the other's calls");
        assert!(n.ctx.stats().wrap_markers > 0);
    }
    report(
        "bidirectional",
        t,
        CALLS,
        nodes[0].ctx.stats(),
        nodes[0].refused,
    );
}

/// Runs each node in its own thread until all are done (each keeps serving until every
/// node's calls are answered). Returns the nodes (contexts dropped by the caller, after
/// every thread stopped).
fn run_threads(what: &'static str, nodes: Vec<Node>, plan: fn(&mut Rng) -> Plan) -> Vec<Node> {
    let n = nodes.len();
    let done: Arc<Vec<AtomicBool>> = Arc::new((0..n).map(|_| AtomicBool::new(false)).collect());
    let handles: Vec<_> = nodes
        .into_iter()
        .enumerate()
        .map(|(i, mut node)| {
            let done = done.clone();
            std::thread::spawn(move || {
                let mut plan = plan;
                let mut idle = 0u64;
                loop {
                    let progress = node.step(&mut plan);
                    if node.done() && !done[i].load(Ordering::Relaxed) {
                        done[i].store(true, Ordering::Release);
                    }
                    if done.iter().all(|d| d.load(Ordering::Acquire)) {
                        // Everyone has its answers: nothing of ours is pending any more.
                        for _ in 0..4 {
                            node.step(&mut plan);
                        }
                        break;
                    }
                    if progress == 0 {
                        idle += 1;
                        assert!(
                            idle < 100 * STALL_STEPS,
                            "{what}: thread {i} made no progress: issued {}, completed {}",
                            node.issued,
                            node.completed
                        );
                        std::thread::yield_now();
                    } else {
                        idle = 0;
                    }
                }
                node
            })
        })
        .collect();
    let nodes: Vec<Node> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for node in &nodes {
        node.finish(what);
    }
    nodes
}

/// (c) Bidirectional with the two contexts in two threads.
#[test]
fn bidirectional_two_threads() {
    let t = Instant::now();
    let fabric = Fabric::new(SimConfig::default());
    let (mut a, mut b) = contexts(&fabric);
    let (ea, eb) = connect(&mut a, &mut b, &ring(8192));
    let mut nb = Node::new(b, vec![eb], 16, CALLS / 2, 0xc3);
    nb.defer = true;
    let nodes = vec![Node::new(a, vec![ea], 16, CALLS / 2, 0xc2), nb];
    let nodes = run_threads("bidirectional, two threads", nodes, bidirectional_plan);
    for n in &nodes {
        assert_eq!(n.served, CALLS / 2);
    }
    report(
        "bidirectional, two threads",
        t,
        CALLS,
        nodes[0].ctx.stats(),
        nodes[0].refused,
    );
}

/// A client in one thread and a server in another (8 KiB ring, 32 in flight, 16-1024 B
/// requests, 0-256 B responses).
#[test]
fn client_and_server_in_two_threads() {
    let t = Instant::now();
    let (_f, client, server) = client_server(8192, 32, 0xe);
    let nodes = run_threads("client/server, two threads", vec![client, server], |r| {
        let resp_len = r.below(257) as u32;
        Plan {
            len: 16 + r.below(1009) as u32,
            resp_len,
            allowance: resp_len,
        }
    });
    assert_eq!(nodes[1].served, CALLS);
    report(
        "client/server, two threads",
        t,
        CALLS,
        nodes[0].ctx.stats(),
        nodes[0].refused,
    );
}

/// (d) Mixed sizes: requests 0 B to 4 KiB and responses 0 B to 4 KiB, random per call
/// (a quarter of the requests shorter than 16 B), on 64 KiB rings, 32 in flight.
#[test]
fn mixed_sizes() {
    let t = Instant::now();
    let (_f, client, server) = client_server(1 << 16, 32, 0xd);
    let mut nodes = [client, server];
    let mut sizes = [0u64; 3];
    run("mixed sizes", &mut nodes, &mut |r: &mut Rng| {
        let len = if r.below(4) == 0 {
            r.below(16)
        } else {
            r.below(4097)
        } as u32;
        let resp_len = r.below(4097) as u32;
        sizes[(len as usize).min(4096) / 2048] += 1;
        Plan {
            len,
            resp_len,
            // Tiny requests get up to 60 B back.
            allowance: resp_len.max(60) + r.below(100) as u32,
        }
    });
    assert!(sizes.iter().all(|&n| n > 0), "sizes covered: {sizes:?}");
    report(
        "mixed sizes",
        t,
        CALLS,
        nodes[0].ctx.stats(),
        nodes[0].refused,
    );
}

/// 64 endpoints on one server context, each with its own client context (4 KiB rings,
/// 4 in flight each, 0-256 B both ways), all stepped round-robin in one thread.
#[test]
fn many_endpoints_on_one_context() {
    let t = Instant::now();
    let fabric = Fabric::new(SimConfig::default());
    let mut server: Context<Expect> =
        Context::new(&fabric.open(), ContextConfig::default()).unwrap();
    let mut nodes = Vec::new();
    for i in 0..64u64 {
        let mut c: Context<Expect> =
            Context::new(&fabric.open(), ContextConfig::default()).unwrap();
        let (ec, _) = connect(&mut c, &mut server, &ring(4096));
        nodes.push(Node::new(c, vec![ec], 4, CALLS / 64, 0x100 + i));
    }
    assert_eq!(server.num_endpoints(), 64);
    let mut server = Node::new(server, vec![], 0, 0, 0xff);
    server.defer = true;
    nodes.push(server);
    run("64 endpoints", &mut nodes, &mut |r: &mut Rng| {
        let resp_len = r.below(257) as u32;
        Plan {
            len: r.below(257) as u32,
            resp_len,
            allowance: resp_len,
        }
    });
    let served = nodes[64].served;
    assert_eq!(served, 64 * (CALLS / 64));
    report("64 endpoints", t, served, nodes[64].ctx.stats(), 0);
}

// ---------------------------------------------------------------------------------------
// Ring wrap at every offset.

/// For every 32 B offset at which a wrap can happen on a 1 KiB ring, drives the producer
/// there with one-message batches (answered one at a time), then sends a message that does
/// not fit before the ring end: the wrap marker must be written exactly there, and the
/// message and everything after it (20 more calls) must arrive intact. Done for requests
/// (the client's ring) and for responses (the server's ring).
///
/// A closed batch wraps when `offset + 32 + message >= 1024`; the largest message is 416 B
/// (requests: `(512 - 64 - 32) & !31` with a 64 B grant policy; responses: a 448 B grant
/// covers 416 B plus a metadata), so offsets 576 to 992 are where wraps can happen (an
/// open batch needs an even higher offset).
#[test]
fn ring_wraps_at_every_offset() {
    let t = Instant::now();
    let mut cases = 0;
    for responses in [false, true] {
        for off in (576..=992u64).step_by(32) {
            wrap_at(off, responses);
            cases += 1;
        }
    }
    assert_eq!(cases, 28);
    eprintln!(
        "ring wraps at every offset: {cases} cases in {:.2?}",
        t.elapsed()
    );
}

fn wrap_at(off: u64, responses: bool) {
    const LARGEST_M: u64 = 416;
    let fabric = Fabric::new(SimConfig::default());
    let (mut a, mut b) = contexts(&fabric);
    // The client grants little (its R stays small, so its requests may be large); the
    // server grants 448 B when responses are tested (so responses may be large).
    let cfg_a = EndpointConfig {
        max_resp_reservation: Some(64),
        ..ring(1024)
    };
    let cfg_b = EndpointConfig {
        max_resp_reservation: Some(if responses { 448 } else { 64 }),
        ..ring(1024)
    };
    let ea = a.create_endpoint(&cfg_a).unwrap();
    let eb = b.create_endpoint(&cfg_b).unwrap();
    let (ia, ib) = (a.local_info(ea).unwrap(), b.local_info(eb).unwrap());
    a.connect(ea, &ib).unwrap();
    b.connect(eb, &ia).unwrap();
    let mut client = Node::new(a, vec![ea], 1, 1000, 0x77 + off);
    let mut server = Node::new(b, vec![], 0, 0, 0x78);
    assert_eq!(
        client.ctx.endpoint(ea).unwrap().max_payload() as u64,
        LARGEST_M - 12
    );
    // One call whose batch (request or response) is `batch` bytes: a message of
    // `batch - 32`; a response's allowance costs exactly `batch` bytes of credit.
    let one = |client: &mut Node, server: &mut Node, batch: u64| {
        let m = (batch - 32) as u32;
        let p = if responses {
            Plan {
                len: 16,
                resp_len: m - 12,
                allowance: m - 12,
            }
        } else {
            Plan {
                len: m - 12,
                resp_len: 0,
                allowance: 0,
            }
        };
        let before = client.completed;
        client.total = client.issued + 1;
        let mut plan = |_: &mut Rng| p;
        for _ in 0..1000 {
            client.step(&mut plan);
            server.step(&mut plan);
            if client.completed > before {
                // Let the server see the client's credit return and settle.
                for _ in 0..3 {
                    client.step(&mut plan);
                    server.step(&mut plan);
                }
                return;
            }
        }
        panic!("offset {off}: call of batch {batch} B never answered");
    };
    let producer = |client: &Node, server: &Node| {
        if responses {
            server.ctx.endpoint(eb).unwrap().positions().0
        } else {
            client.ctx.endpoint(ea).unwrap().positions().0
        }
    };
    let wraps = |client: &Node, server: &Node| {
        if responses {
            server.ctx.stats().wrap_markers
        } else {
            client.ctx.stats().wrap_markers
        }
    };
    // A response batch may not exceed the client's credit (else the client asks for more
    // with a flow update, which the server answers with a 32 B batch of its own, moving its
    // producer): prefill to `off - 64` with batches within the credit, then one of 64 B,
    // after which the server grants the full 448 B again.
    let credit = |client: &Node| {
        if responses {
            client
                .ctx
                .endpoint(ea)
                .unwrap()
                .peer_credit()
                .min(32 + LARGEST_M)
        } else {
            32 + LARGEST_M
        }
    };
    loop {
        let p = producer(&client, &server);
        assert!(p <= off - 64, "offset {off}: prefill overshot to {p}");
        let rest = off - 64 - p;
        if rest == 0 {
            break;
        }
        let most = credit(&client);
        let b = if rest > most {
            most.min(rest - 64)
        } else {
            rest
        };
        one(&mut client, &mut server, b);
    }
    one(&mut client, &mut server, 64);
    assert_eq!(producer(&client, &server), off, "prefilled to the offset");
    assert_eq!(wraps(&client, &server), 0);
    // A message that does not fit before the ring end (a batch may not end exactly at it).
    let m = (992 - off).clamp(32, LARGEST_M);
    assert!(credit(&client) >= 32 + m);
    one(&mut client, &mut server, 32 + m);
    assert_eq!(wraps(&client, &server), 1, "offset {off}: one wrap");
    assert_eq!(
        producer(&client, &server),
        1024 + 32 + m,
        "offset {off}: the message right after the wrap"
    );
    // Then more, of every size the credit allows.
    for i in 0..20u64 {
        let b = (64 + (i * 96) % (LARGEST_M - 31)).min(credit(&client));
        one(&mut client, &mut server, b);
    }
    for n in [&client, &server] {
        let s = n.ctx.stats();
        assert_eq!(
            (s.corrupt_batches, s.error_cqes, s.failed_endpoints),
            (0, 0, 0)
        );
        assert_eq!(s.backlogged_replies, 0);
    }
    assert_eq!(client.completed, client.issued);
    assert_eq!(
        client.completed,
        client.answered.iter().filter(|&&a| a).count() as u64
    );
}
