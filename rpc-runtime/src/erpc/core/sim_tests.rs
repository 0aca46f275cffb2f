//! Deterministic end-to-end tests: client and server cores over a simulated wire that drops,
//! duplicates and reorders datagrams from a seeded RNG, in virtual time.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::*;

/// xorshift64* — small, deterministic.
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub(super) fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

pub(super) struct Node {
    pub rpc: Rpc<u32>,
    pub addr: u32,
    pub now: Time,
    /// Client-side events collected by the simulator.
    pub events: Vec<Event>,
    /// A dead node neither sends nor receives.
    pub dead: bool,
}

impl Node {
    pub(super) fn new(addr: u32, cfg: Config) -> Self {
        Node {
            rpc: Rpc::new(cfg).unwrap(),
            addr,
            now: 0,
            events: Vec::new(),
            dead: false,
        }
    }

    /// Delivers packets between `a` and `b` instantly and losslessly until both are quiet;
    /// requests at either are answered with `handler` (client events stay queued).
    pub(super) fn run_reliable(a: &mut Node, b: &mut Node, handler: impl Fn(u8, &[u8]) -> Vec<u8>) {
        let mut buf = vec![0u8; 65536];
        loop {
            let mut moved = false;
            fn xfer(src: &mut Node, dst: &mut Node, buf: &mut [u8]) -> bool {
                let mut moved = false;
                while let Some((dest, len)) = src.rpc.poll_transmit(buf) {
                    assert_eq!(dest, dst.addr);
                    dst.rpc.handle_datagram(dst.now, src.addr, &buf[..len]);
                    moved = true;
                }
                moved
            }
            moved |= xfer(a, b, &mut buf);
            moved |= xfer(b, a, &mut buf);
            for n in [&mut *a, &mut *b] {
                let mut keep = Vec::new();
                while let Some(ev) = n.rpc.poll_event() {
                    match ev {
                        Event::Request {
                            token,
                            req_type,
                            data,
                        } => {
                            n.rpc
                                .reply(n.now, token, &handler(req_type, &data))
                                .unwrap();
                            n.rpc.recycle(data);
                            moved = true;
                        }
                        other => keep.push(other),
                    }
                }
                // Put client events back in order.
                for e in keep {
                    n.rpc.events.push_back(e);
                }
            }
            if !moved {
                return;
            }
        }
    }
}

/// A client (addr 1) with one connected session to a server (addr 2).
pub(super) fn connect_pair(fingerprint: u64) -> (Node, Node, SessionId) {
    let cfg = Config {
        schema_fingerprint: fingerprint,
        ..Config::default()
    };
    let mut cl = Node::new(1, cfg.clone());
    let mut sv = Node::new(2, cfg);
    let sid = cl.rpc.create_session(0, 2).unwrap();
    Node::run_reliable(&mut cl, &mut sv, |_, d| d.to_vec());
    assert_eq!(cl.rpc.poll_event(), Some(Event::SessionConnected(sid)));
    (cl, sv, sid)
}

pub(super) type Handler = Box<dyn FnMut(u8, &[u8]) -> Vec<u8>>;

struct InFlight {
    at: Time,
    seq: u64,
    src: u32,
    dest: u32,
    bytes: Vec<u8>,
}

/// Nodes addressed by their index, a lossy wire, virtual time.
pub(super) struct Sim {
    pub nodes: Vec<Node>,
    pub now: Time,
    rng: Rng,
    pub loss: f64,
    pub dup: f64,
    /// Base one-way latency and extra random jitter (reordering).
    pub latency: Time,
    pub jitter: Time,
    wire: BinaryHeap<Reverse<(Time, u64)>>,
    pkts: HashMap<u64, InFlight>,
    seq: u64,
    handler: Handler,
    /// Server executions per request payload prefix (first 8 bytes, or whole payload).
    pub executions: HashMap<Vec<u8>, u32>,
    /// Replies are held back for this long (0 = immediately).
    pub reply_delay: Time,
    pending_replies: Vec<(Time, usize, ReqToken, Vec<u8>)>,
    /// If positive, every node's ingress link is a FIFO bottleneck of this many bits per
    /// second: datagrams queue behind each other (a slow, queueing link).
    pub bottleneck_bps: f64,
    /// Per destination: when its bottleneck link is free again.
    link_free: Vec<Time>,
}

impl Sim {
    pub(super) fn new(n: usize, cfg: Config, seed: u64, handler: Handler) -> Self {
        Sim {
            nodes: (0..n).map(|i| Node::new(i as u32, cfg.clone())).collect(),
            now: 0,
            rng: Rng::new(seed),
            loss: 0.0,
            dup: 0.0,
            latency: 10_000,
            jitter: 0,
            wire: BinaryHeap::new(),
            pkts: HashMap::new(),
            seq: 0,
            handler,
            executions: HashMap::new(),
            reply_delay: 0,
            pending_replies: Vec::new(),
            bottleneck_bps: 0.0,
            link_free: vec![0; n],
        }
    }

    fn send(&mut self, src: u32, dest: u32, bytes: &[u8]) {
        if self.rng.chance(self.loss) {
            return;
        }
        let copies = if self.rng.chance(self.dup) { 2 } else { 1 };
        for _ in 0..copies {
            let jitter = if self.jitter > 0 {
                self.rng.below(self.jitter)
            } else {
                0
            };
            let mut depart = self.now;
            if self.bottleneck_bps > 0.0 {
                let free = &mut self.link_free[dest as usize];
                let start = (*free).max(self.now);
                *free = start + (bytes.len() as f64 * 8.0 * 1e9 / self.bottleneck_bps) as Time;
                depart = *free;
            }
            let at = depart + self.latency + jitter;
            self.seq += 1;
            self.wire.push(Reverse((at, self.seq)));
            self.pkts.insert(
                self.seq,
                InFlight {
                    at,
                    seq: self.seq,
                    src,
                    dest,
                    bytes: bytes.to_vec(),
                },
            );
        }
    }

    /// Moves outputs of every node onto the wire / into logs.
    fn pump(&mut self) {
        let mut buf = vec![0u8; 65536];
        for i in 0..self.nodes.len() {
            while let Some(ev) = self.nodes[i].rpc.poll_event() {
                match ev {
                    Event::Request {
                        token,
                        req_type,
                        data,
                    } => {
                        let key = data[..data.len().min(8)].to_vec();
                        *self.executions.entry(key).or_default() += 1;
                        let resp = (self.handler)(req_type, &data);
                        if self.reply_delay == 0 {
                            let now = self.now;
                            self.nodes[i].rpc.reply(now, token, &resp).unwrap();
                        } else {
                            self.pending_replies.push((
                                self.now + self.reply_delay,
                                i,
                                token,
                                resp,
                            ));
                        }
                    }
                    other => self.nodes[i].events.push(other),
                }
            }
            // After the events: replies queue packets that must leave now.
            while let Some((dest, len)) = self.nodes[i].rpc.poll_transmit(&mut buf) {
                if !self.nodes[i].dead {
                    self.send(i as u32, dest, &buf[..len]);
                }
            }
        }
    }

    /// Runs until `done` holds or virtual time passes `limit`; returns whether `done` held.
    pub(super) fn run(&mut self, limit: Time, mut done: impl FnMut(&Sim) -> bool) -> bool {
        loop {
            self.pump();
            if done(self) {
                return true;
            }
            let mut next = self.wire.peek().map(|Reverse((t, _))| *t);
            for n in &self.nodes {
                if let Some(t) = n.rpc.next_timeout() {
                    next = Some(next.map_or(t, |x| x.min(t)));
                }
            }
            for (t, ..) in &self.pending_replies {
                next = Some(next.map_or(*t, |x| x.min(*t)));
            }
            let Some(t) = next else { return false };
            if t > limit {
                return false;
            }
            self.now = self.now.max(t);
            let now = self.now;
            for n in &mut self.nodes {
                n.now = now;
            }
            let due: Vec<_> = self
                .pending_replies
                .extract_if(.., |(t, ..)| *t <= now)
                .collect();
            for (_, i, token, resp) in due {
                // The session may be gone (failure tests).
                let _ = self.nodes[i].rpc.reply(now, token, &resp);
            }
            while let Some(Reverse((t, seq))) = self.wire.peek().copied() {
                if t > now {
                    break;
                }
                self.wire.pop();
                let p = self.pkts.remove(&seq).unwrap();
                debug_assert_eq!((p.at, p.seq), (t, seq));
                let dst = &mut self.nodes[p.dest as usize];
                if !dst.dead {
                    dst.rpc.handle_datagram(now, p.src, &p.bytes);
                }
            }
            for n in &mut self.nodes {
                if n.rpc.next_timeout().is_some_and(|t| t <= now) {
                    n.rpc.handle_timeout(now);
                }
                n.rpc.check_invariants();
            }
        }
    }

    /// Responses per (node, tag).
    pub(super) fn responses(&self) -> HashMap<(usize, u64), Vec<&MsgBuffer>> {
        let mut m: HashMap<(usize, u64), Vec<&MsgBuffer>> = HashMap::new();
        for (i, n) in self.nodes.iter().enumerate() {
            for e in &n.events {
                if let Event::Response { tag, data, .. } = e {
                    m.entry((i, *tag)).or_default().push(data);
                }
            }
        }
        m
    }

    pub(super) fn count(&self, node: usize, f: impl Fn(&Event) -> bool) -> usize {
        self.nodes[node].events.iter().filter(|e| f(e)).count()
    }
}

pub(super) fn echo() -> Handler {
    Box::new(|_, d| d.to_vec())
}

/// Payload for request `id` of `len` bytes: the id, then a pattern.
pub(super) fn payload(id: u64, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len).map(|i| (i as u64 * 31 + id) as u8).collect();
    let idb = id.to_le_bytes();
    let n = len.min(8);
    v[..n].copy_from_slice(&idb[..n]);
    v
}

pub(super) fn connect_all(sim: &mut Sim, client: usize, server: u32, n: usize) -> Vec<SessionId> {
    let now = sim.now;
    let sids: Vec<_> = (0..n)
        .map(|_| sim.nodes[client].rpc.create_session(now, server).unwrap())
        .collect();
    let ok = sim.run(now + 10_000 * MS, |s| {
        s.count(client, |e| matches!(e, Event::SessionConnected(_))) >= n
    });
    assert!(ok, "sessions did not connect");
    sids
}

#[test]
fn message_sizes_echo() {
    let cfg = Config::default();
    let dpp = cfg.mtu - 16;
    let mut sim = Sim::new(2, cfg, 1, echo());
    let sid = connect_all(&mut sim, 0, 1, 1)[0];
    let sizes = [0, 1, dpp - 1, dpp, dpp + 1, 3 * dpp, 3 * dpp - 5, 1 << 20];
    for (tag, &len) in sizes.iter().enumerate() {
        let now = sim.now;
        sim.nodes[0]
            .rpc
            .enqueue_request(now, sid, 3, &payload(tag as u64 + 100, len), tag as u64)
            .unwrap();
    }
    assert!(sim.run(10_000 * MS, |s| s.responses().len() == sizes.len()));
    let resp = sim.responses();
    for (tag, &len) in sizes.iter().enumerate() {
        let r = &resp[&(0, tag as u64)];
        assert_eq!(r.len(), 1);
        assert_eq!(*r[0], payload(tag as u64 + 100, len), "size {len}");
    }
    let st = sim.nodes[1].rpc.stats();
    assert_eq!(st.requests_dispatched, sizes.len() as u64);
    assert_eq!(
        sim.nodes[0].rpc.stats().rollbacks,
        0,
        "no loss, no rollback: {:?} {:?}",
        sim.nodes[0].rpc.stats(),
        st
    );
    // A 1 MiB request sends 257 packets, so the server sent 256 explicit CRs for it.
    assert!(st.cr_tx >= 256);
    assert!(sim.nodes[0].rpc.stats().rfr_tx >= 256);
}

#[test]
fn response_size_differs_from_request() {
    let cfg = Config::default();
    let dpp = cfg.mtu - 16;
    let handler: Handler = Box::new(move |_, d| vec![d.len() as u8; 5 * dpp + 3]);
    let mut sim = Sim::new(2, cfg, 2, handler);
    let sid = connect_all(&mut sim, 0, 1, 1)[0];
    sim.nodes[0]
        .rpc
        .enqueue_request(0, sid, 1, &[9; 3], 1)
        .unwrap();
    assert!(sim.run(1000 * MS, |s| s.responses().len() == 1));
    assert_eq!(*sim.responses()[&(0, 1)][0], vec![3u8; 5 * dpp + 3]);
}

/// 30% loss both ways, 10% duplication, reordering; 3 clients x 4 sessions x 30 RPCs of
/// mixed sizes. Every RPC completes exactly once with the right data and runs once.
#[test]
fn lossy_wire_exactly_once() {
    for seed in [7, 8, 9] {
        let cfg = Config {
            mtu: 1024,
            max_msg_size: 64 << 10,
            ..Config::default()
        };
        let dpp = cfg.mtu - 16;
        let mut sim = Sim::new(4, cfg, seed, echo());
        let mut sids = Vec::new();
        for c in 1..4 {
            sids.push((c, connect_all(&mut sim, c, 0, 4)));
        }
        sim.loss = 0.3;
        sim.dup = 0.1;
        sim.jitter = 30_000;
        let mut expect = HashMap::new();
        let mut id = 1000u64;
        let mut rng = Rng::new(seed);
        for (c, ss) in &sids {
            for &sid in ss {
                for _ in 0..30 {
                    id += 1;
                    let len = match rng.below(4) {
                        0 => 8,
                        1 => dpp,
                        2 => 3 * dpp - 7,
                        _ => 8 + rng.below(12 * dpp as u64) as usize,
                    };
                    let p = payload(id, len);
                    let now = sim.now;
                    sim.nodes[*c]
                        .rpc
                        .enqueue_request(now, sid, 2, &p, id)
                        .unwrap();
                    expect.insert((*c, id), p);
                }
            }
        }
        let total = expect.len();
        let t0 = std::time::Instant::now();
        let ok = sim.run(600_000 * MS, |s| s.responses().len() == total);
        eprintln!(
            "seed {seed}: {:?} real, {} ms virtual; client 1 {:?}",
            t0.elapsed(),
            sim.now / MS,
            sim.nodes[1].rpc.stats()
        );
        assert!(ok, "seed {seed}: {} of {total} done", sim.responses().len());
        // Let stray duplicates drain, then check nothing completed twice.
        let until = sim.now + 50 * MS;
        sim.run(until, |_| false);
        let resp = sim.responses();
        for ((c, tag), p) in &expect {
            let r = &resp[&(*c, *tag)];
            assert_eq!(r.len(), 1, "completed once");
            assert_eq!(r[0], p);
            assert_eq!(sim.executions[&p[..8]], 1, "executed once");
        }
        assert_eq!(sim.executions.len(), total);
        assert_eq!(sim.nodes[0].rpc.stats().requests_dispatched, total as u64);
        for c in 1..4 {
            for e in &sim.nodes[c].events {
                if !matches!(e, Event::Response { .. } | Event::SessionConnected(_)) {
                    eprintln!("seed {seed} node {c}: {e:?} at {}", sim.now);
                }
            }
            assert_eq!(
                sim.count(c, |e| matches!(
                    e,
                    Event::RequestFailed { .. } | Event::SessionFailed { .. }
                )),
                0
            );
            assert!(sim.nodes[c].rpc.stats().rollbacks > 0);
        }
        assert!(sim.nodes[0].rpc.stats().dup_req_answered > 0);
    }
}

/// More outstanding requests than slots, multi-packet requests competing for credits,
/// many sessions.
#[test]
fn backlog_stall_and_many_sessions() {
    let cfg = Config {
        session_credits: 3,
        ..Config::default()
    };
    let dpp = cfg.mtu - 16;
    let mut sim = Sim::new(2, cfg, 3, echo());
    let sids = connect_all(&mut sim, 0, 1, 40);
    let mut n = 0u64;
    for &sid in &sids {
        for k in 0..20 {
            n += 1;
            let len = if k % 3 == 0 { 4 * dpp + 1 } else { 10 };
            sim.nodes[0]
                .rpc
                .enqueue_request(0, sid, 0, &payload(n, len), n)
                .unwrap();
        }
    }
    assert!(sim.run(100_000 * MS, |s| s.responses().len() == n as usize));
    assert_eq!(sim.nodes[1].rpc.num_sessions(), 40);
    assert!(sim.executions.values().all(|&c| c == 1));
}

/// Connect and disconnect with half of all packets lost: every session connects once, the
/// server holds exactly one session per client session, and disconnects free both sides.
#[test]
fn session_management_under_loss() {
    let mut sim = Sim::new(2, Config::default(), 4, echo());
    sim.loss = 0.5;
    sim.dup = 0.2;
    sim.jitter = 50_000;
    let sids = connect_all(&mut sim, 0, 1, 20);
    let connected = sim.count(0, |e| matches!(e, Event::SessionConnected(_)));
    assert_eq!(connected, 20);
    assert_eq!(
        sim.nodes[1].rpc.num_sessions(),
        20,
        "duplicate connects are idempotent"
    );
    for &sid in &sids {
        sim.nodes[0]
            .rpc
            .enqueue_request(sim.now, sid, 0, b"x", u64::from(sid.num()))
            .unwrap();
    }
    assert!(sim.run(sim.now + 100_000 * MS, |s| s.responses().len() == 20));
    assert_eq!(
        sim.nodes[0].rpc.destroy_session(sim.now, SessionId(60000)),
        Err(ErpcCallError::BadSession)
    );
    for &sid in &sids {
        let now = sim.now;
        sim.nodes[0].rpc.destroy_session(now, sid).unwrap();
    }
    assert!(sim.run(sim.now + 100_000 * MS, |s| {
        s.count(0, |e| matches!(e, Event::SessionDisconnected(_))) == 20
    }));
    assert_eq!(sim.nodes[0].rpc.num_sessions(), 0);
    assert_eq!(sim.nodes[1].rpc.num_sessions(), 0);
    assert_eq!(
        sim.count(0, |e| matches!(e, Event::SessionFailed { .. })),
        0
    );
}

#[test]
fn destroy_busy_session_refused() {
    let (mut cl, _sv, sid) = connect_pair(0);
    cl.rpc.enqueue_request(0, sid, 0, b"abc", 1).unwrap();
    assert_eq!(cl.rpc.destroy_session(0, sid), Err(ErpcCallError::Busy));
}

#[test]
fn schema_mismatch_refused() {
    let mut cl = Node::new(
        1,
        Config {
            schema_fingerprint: 1,
            ..Config::default()
        },
    );
    let mut sv = Node::new(
        2,
        Config {
            schema_fingerprint: 2,
            ..Config::default()
        },
    );
    let sid = cl.rpc.create_session(0, 2).unwrap();
    cl.rpc.enqueue_request(0, sid, 0, b"q", 77).unwrap();
    Node::run_reliable(&mut cl, &mut sv, |_, d| d.to_vec());
    assert_eq!(
        cl.rpc.poll_event(),
        Some(Event::RequestFailed {
            session: sid,
            tag: 77,
            error: SessionError::SchemaMismatch { server: 2 }
        })
    );
    assert_eq!(
        cl.rpc.poll_event(),
        Some(Event::SessionFailed {
            session: sid,
            error: SessionError::SchemaMismatch { server: 2 }
        })
    );
    assert_eq!(sv.rpc.num_sessions(), 0);
    assert_eq!(cl.rpc.num_sessions(), 0);
}

/// The server dies with RPCs in flight and backlogged: all fail within the failure
/// timeout, once each.
#[test]
fn peer_silence_fails_pending_calls() {
    let cfg = Config::default();
    let ft = cfg.failure_timeout;
    let mut sim = Sim::new(2, cfg, 5, echo());
    sim.reply_delay = 1000 * MS; // replies never come in time
    let sids = connect_all(&mut sim, 0, 1, 3);
    let t0 = sim.now;
    for (i, &sid) in sids.iter().enumerate() {
        for k in 0..12u64 {
            let tag = i as u64 * 100 + k;
            sim.nodes[0]
                .rpc
                .enqueue_request(t0, sid, 0, &payload(tag, 5000), tag)
                .unwrap();
        }
    }
    sim.run(t0 + MS, |_| false);
    sim.nodes[1].dead = true;
    let dead_at = sim.now;
    let ok = sim.run(dead_at + 10 * ft, |s| {
        s.count(0, |e| matches!(e, Event::SessionFailed { .. })) == 3
    });
    assert!(ok);
    assert!(sim.now <= dead_at + ft, "failed within the failure timeout");
    assert_eq!(
        sim.count(0, |e| matches!(
            e,
            Event::RequestFailed {
                error: SessionError::PeerFailed,
                ..
            }
        )),
        36
    );
    assert_eq!(sim.responses().len(), 0);
    assert_eq!(sim.nodes[0].rpc.num_sessions(), 0);
    assert_eq!(sim.nodes[0].rpc.next_timeout(), None);
}

/// The client dies: the server frees its sessions and a late reply hits a stale token.
#[test]
fn client_silence_frees_server_state() {
    let cfg = Config::default();
    let ft = cfg.failure_timeout;
    let mut sim = Sim::new(2, cfg, 6, echo());
    sim.reply_delay = 2 * ft;
    let sid = connect_all(&mut sim, 0, 1, 1)[0];
    sim.nodes[0]
        .rpc
        .enqueue_request(sim.now, sid, 0, b"hello", 1)
        .unwrap();
    sim.run(sim.now + MS, |_| false);
    assert_eq!(sim.nodes[1].rpc.stats().requests_dispatched, 1);
    sim.nodes[0].dead = true;
    let t = sim.now;
    assert!(sim.run(t + 10 * ft, |s| s.nodes[1].rpc.num_sessions() == 0));
    assert!(sim.now <= t + ft + MS);
    assert_eq!(sim.nodes[1].rpc.stats().server_sessions_reaped, 1);
    assert_eq!(
        sim.count(1, |e| matches!(e, Event::ServerSessionClosed(_))),
        1
    );
    let tok = ReqToken::for_test(SessionId(0), 99, 0);
    assert_eq!(
        sim.nodes[1].rpc.reply(sim.now, tok, b"x"),
        Err(ErpcCallError::StaleToken)
    );
}

/// An idle connected session survives many failure timeouts thanks to keepalives.
#[test]
fn idle_session_kept_alive() {
    let cfg = Config::default();
    let ft = cfg.failure_timeout;
    let mut sim = Sim::new(2, cfg, 7, echo());
    sim.loss = 0.2;
    let sid = connect_all(&mut sim, 0, 1, 1)[0];
    let t = sim.now;
    sim.run(t + 20 * ft, |_| false);
    assert!(sim.nodes[0].rpc.is_connected(sid));
    assert_eq!(sim.nodes[1].rpc.num_sessions(), 1);
    sim.nodes[0]
        .rpc
        .enqueue_request(sim.now, sid, 0, b"still there", 5)
        .unwrap();
    assert!(sim.run(sim.now + 10 * ft, |s| s.responses().len() == 1));
}

/// Duplicates of the current request get the cached answer; older requests are dropped;
/// the handler runs once.
#[test]
fn at_most_once_duplicates() {
    let (mut cl, mut sv, sid) = connect_pair(0);
    let mut buf = vec![0u8; 4096];
    cl.rpc.enqueue_request(0, sid, 4, b"ping", 1).unwrap();
    let (_, len) = cl.rpc.poll_transmit(&mut buf).unwrap();
    let req = buf[..len].to_vec();
    sv.rpc.handle_datagram(0, 1, &req);
    sv.rpc.handle_datagram(0, 1, &req); // handler still running: dropped
    let Some(Event::Request { token, data, .. }) = sv.rpc.poll_event() else {
        panic!()
    };
    assert_eq!(data, b"ping");
    assert!(sv.rpc.poll_event().is_none());
    assert_eq!(
        sv.rpc.poll_transmit(&mut buf),
        None,
        "I4: nothing before reply"
    );
    sv.rpc.reply(0, token, b"pong").unwrap();
    assert_eq!(
        sv.rpc.reply(0, token, b"again"),
        Err(ErpcCallError::StaleToken)
    );
    let (_, len) = sv.rpc.poll_transmit(&mut buf).unwrap();
    let resp = buf[..len].to_vec();
    sv.rpc.handle_datagram(0, 1, &req); // duplicate after reply: cached response
    let (_, len2) = sv.rpc.poll_transmit(&mut buf).unwrap();
    assert_eq!(&buf[..len2], &resp[..]);
    assert_eq!(sv.rpc.stats().dup_req_answered, 1);
    cl.rpc.handle_datagram(0, 2, &resp);
    cl.rpc.handle_datagram(0, 2, &resp); // duplicate response: dropped
    assert_eq!(
        cl.rpc.poll_event(),
        Some(Event::Response {
            session: sid,
            tag: 1,
            data: MsgBuffer::from_bytes(b"pong", 4080).unwrap()
        })
    );
    assert!(cl.rpc.poll_event().is_none());
    // The slot's next request (req_num 8) supersedes; then the old one is stale.
    for k in 0..SLOTS_PER_SESSION as u64 {
        cl.rpc.enqueue_request(0, sid, 4, b"n", 10 + k).unwrap();
    }
    Node::run_reliable(&mut cl, &mut sv, |_, d| d.to_vec());
    let before = sv.rpc.stats().drop_out_of_window;
    sv.rpc.handle_datagram(0, 1, &req);
    assert_eq!(sv.rpc.stats().drop_out_of_window, before + 1);
    assert_eq!(
        sv.rpc.stats().requests_dispatched,
        1 + SLOTS_PER_SESSION as u64
    );
}

/// Mutated real packets and random bytes never panic either side.
#[test]
fn fuzzed_packets_never_panic() {
    let (mut cl, mut sv, sid) = connect_pair(0);
    let mut buf = vec![0u8; 4096];
    let mut rng = Rng::new(11);
    let mut samples = Vec::new();
    for k in 0..20u64 {
        cl.rpc
            .enqueue_request(0, sid, 1, &payload(k, (k as usize) * 900), k)
            .unwrap();
    }
    // Capture a mix of packets from both sides while running reliably.
    for _ in 0..200 {
        while let Some((_, len)) = cl.rpc.poll_transmit(&mut buf) {
            samples.push((true, buf[..len].to_vec()));
            sv.rpc.handle_datagram(0, 1, &buf[..len]);
        }
        while let Some(Event::Request { token, data, .. }) = sv.rpc.poll_event() {
            sv.rpc.reply(0, token, &data).unwrap();
        }
        while let Some((_, len)) = sv.rpc.poll_transmit(&mut buf) {
            samples.push((false, buf[..len].to_vec()));
            cl.rpc.handle_datagram(0, 2, &buf[..len]);
        }
    }
    assert!(samples.len() > 40);
    for _ in 0..20_000 {
        let (to_server, mut p) = samples[rng.below(samples.len() as u64) as usize].clone();
        match rng.below(3) {
            0 => {
                for _ in 0..1 + rng.below(4) {
                    let i = rng.below(p.len() as u64) as usize;
                    p[i] ^= 1 << rng.below(8);
                }
            }
            1 => p.truncate(rng.below(p.len() as u64 + 1) as usize),
            _ => p = (0..rng.below(64)).map(|_| rng.next() as u8).collect(),
        }
        let now = rng.below(1000 * MS);
        if to_server {
            sv.rpc.handle_datagram(now, 1, &p);
        } else {
            cl.rpc.handle_datagram(now, 2, &p);
        }
        while cl.rpc.poll_transmit(&mut buf).is_some() {}
        while sv.rpc.poll_transmit(&mut buf).is_some() {}
        while let Some(ev) = sv.rpc.poll_event() {
            if let Event::Request { token, .. } = ev {
                let _ = sv.rpc.reply(now, token, b"");
            }
        }
        while cl.rpc.poll_event().is_some() {}
        cl.rpc.check_invariants();
    }
    let st = sv.rpc.stats();
    assert!(st.drop_bad_hdr + st.drop_truncated + st.drop_bad_len + st.drop_out_of_window > 0);
}

/// Issue 12 (seeds/002 §4 invariant I3): session numbers are reused after a session ends.
/// A stale request and a stale response of the ended session, arriving after a new session
/// got the same session numbers at both ends (and uses the same slot and request number),
/// are dropped and counted (their session token is the old session's): the stale request
/// does not run again, and the new call gets its own response.
#[test]
fn stale_packets_of_an_ended_session_are_dropped() {
    let (mut cl, mut sv, sid) = connect_pair(0);
    let mut buf = vec![0u8; 4096];
    // The old session's call (slot 0, req_num 0): capture its request and response.
    cl.rpc.enqueue_request(0, sid, 4, b"old-req", 1).unwrap();
    let (_, len) = cl.rpc.poll_transmit(&mut buf).unwrap();
    let old_req = buf[..len].to_vec();
    sv.rpc.handle_datagram(0, 1, &old_req);
    let Some(Event::Request { token, .. }) = sv.rpc.poll_event() else {
        panic!("request not dispatched")
    };
    sv.rpc.reply(0, token, b"old-resp").unwrap();
    let (_, len) = sv.rpc.poll_transmit(&mut buf).unwrap();
    let old_resp = buf[..len].to_vec();
    cl.rpc.handle_datagram(0, 2, &old_resp);
    assert!(matches!(
        cl.rpc.poll_event(),
        Some(Event::Response { tag: 1, .. })
    ));
    // End the session; a new one gets the same numbers at both ends.
    cl.rpc.destroy_session(0, sid).unwrap();
    Node::run_reliable(&mut cl, &mut sv, |_, d| d.to_vec());
    assert_eq!(cl.rpc.poll_event(), Some(Event::SessionDisconnected(sid)));
    assert_eq!(
        sv.rpc.poll_event(),
        Some(Event::ServerSessionClosed(SessionId(0)))
    );
    let sid2 = cl.rpc.create_session(0, 2).unwrap();
    assert_eq!(sid2, sid, "client session number reused");
    Node::run_reliable(&mut cl, &mut sv, |_, d| d.to_vec());
    assert_eq!(cl.rpc.poll_event(), Some(Event::SessionConnected(sid2)));
    assert_eq!(sv.rpc.num_sessions(), 1);
    assert!(
        sv.rpc.session(SessionId(0)).is_some(),
        "server number reused"
    );
    // The new session's first call uses slot 0 again. Its request number differs from the
    // old one (random bases, issue 14); the worst case is that it does not, so the stale
    // packets are given the new call's request number: the session token alone must stop
    // them.
    cl.rpc.enqueue_request(0, sid2, 4, b"new-req", 2).unwrap();
    let (_, len) = cl.rpc.poll_transmit(&mut buf).unwrap();
    let new_req = buf[..len].to_vec();
    let new_num = PktHdr::decode(&new_req).unwrap().req_num();
    let renumber = |p: &[u8]| {
        let h = PktHdr::decode(p).unwrap();
        let mut out = PktHdr::new(
            h.req_type(),
            h.msg_size(),
            h.dest_session_num(),
            h.pkt_type(),
            h.pkt_num(),
            new_num,
        )
        .unwrap()
        .with_token(h.token())
        .encode()
        .to_vec();
        out.extend_from_slice(&p[PKTHDR_SIZE..]);
        out
    };
    let (old_req, old_resp) = (renumber(&old_req), renumber(&old_resp));
    // The stale request reaches the server first: dropped, not executed.
    let dispatched = sv.rpc.stats().requests_dispatched;
    sv.rpc.handle_datagram(0, 1, &old_req);
    assert_eq!(sv.rpc.stats().drop_stale_token, 1);
    assert_eq!(sv.rpc.stats().requests_dispatched, dispatched);
    assert!(sv.rpc.poll_event().is_none());
    assert!(sv.rpc.poll_transmit(&mut buf).is_none(), "nothing answered");
    // The new request runs.
    sv.rpc.handle_datagram(0, 1, &new_req);
    let Some(Event::Request { token, data, .. }) = sv.rpc.poll_event() else {
        panic!("new request not dispatched")
    };
    assert_eq!(data, b"new-req");
    // The stale response reaches the client while the new call waits: dropped.
    cl.rpc.handle_datagram(0, 2, &old_resp);
    assert_eq!(cl.rpc.stats().drop_stale_token, 1);
    assert!(cl.rpc.poll_event().is_none(), "stale response delivered");
    sv.rpc.reply(0, token, b"new-resp").unwrap();
    let (_, len) = sv.rpc.poll_transmit(&mut buf).unwrap();
    cl.rpc.handle_datagram(0, 2, &buf[..len]);
    assert_eq!(
        cl.rpc.poll_event(),
        Some(Event::Response {
            session: sid2,
            tag: 2,
            data: MsgBuffer::from_bytes(b"new-resp", 4080).unwrap()
        })
    );
    // A stale duplicate after the reply is not answered from the new call's cache either.
    sv.rpc.handle_datagram(0, 1, &old_req);
    assert_eq!(sv.rpc.stats().drop_stale_token, 2);
    assert!(sv.rpc.poll_transmit(&mut buf).is_none());
    assert_eq!(sv.rpc.stats().requests_dispatched, dispatched + 1);
    cl.rpc.check_invariants();
}

/// Issue 12: the connect handshake carries MTU, `max_msg_size` and session credits; a client
/// whose value differs from the server's is refused at connect, its queued call fails, and
/// the error names the field, both values and the client setting to change (before, the
/// session connected and its calls were retransmitted forever). The server keeps nothing.
#[test]
fn config_mismatch_refused_at_connect() {
    let base = Config {
        max_msg_size: 1 << 20,
        ..Config::default()
    };
    type Case = (fn(&mut Config), ConfigField, u64, u64);
    let cases: [Case; 3] = [
        (|c| c.mtu = 1024, ConfigField::Mtu, 1024, 4096),
        (
            |c| c.max_msg_size = 1 << 19,
            ConfigField::MaxMsgSize,
            1 << 19,
            1 << 20,
        ),
        (|c| c.session_credits = 4, ConfigField::SessionCredits, 4, 8),
    ];
    for (change, field, client, server) in cases {
        let mut ccfg = base.clone();
        change(&mut ccfg);
        let mut cl = Node::new(1, ccfg);
        let mut sv = Node::new(2, base.clone());
        let sid = cl.rpc.create_session(0, 2).unwrap();
        cl.rpc.enqueue_request(0, sid, 0, b"q", 7).unwrap();
        Node::run_reliable(&mut cl, &mut sv, |_, d| d.to_vec());
        let error = SessionError::ConfigMismatch {
            field,
            client,
            server,
        };
        assert_eq!(
            cl.rpc.poll_event(),
            Some(Event::RequestFailed {
                session: sid,
                tag: 7,
                error
            }),
            "{field}"
        );
        assert_eq!(
            cl.rpc.poll_event(),
            Some(Event::SessionFailed {
                session: sid,
                error
            })
        );
        assert_eq!((cl.rpc.num_sessions(), sv.rpc.num_sessions()), (0, 0));
        assert_eq!(sv.rpc.stats().connects_refused, 1);
        assert_eq!(sv.rpc.stats().requests_dispatched, 0);
        let msg = error.to_string();
        for part in [
            field.name(),
            &format!("client {client} {}", field.unit()),
            &format!("server {server} {}", field.unit()),
            "change the client's setting",
            field.setting(),
        ] {
            assert!(msg.contains(part), "{msg:?} lacks {part:?}");
        }
    }
}

/// Issue 12: admission control as in eRPC. A server whose receive ring holds 31 datagrams
/// admits 3 sessions of 8 credits (24 packets in flight at most) and refuses the 4th at
/// connect with `NoRingEntries` (before: admitted, and a burst of 32 packets could overrun
/// the ring); once a session ends, a new one is admitted. A client endpoint refuses to
/// create more sessions than its own ring absorbs.
#[test]
fn admission_control_by_receive_ring() {
    let mut sim = Sim::new(2, Config::default(), 12, echo());
    sim.nodes[1] = Node::new(
        1,
        Config {
            rx_ring_entries: Some(31),
            // One client holds every session here: no per-source share (issue 14).
            max_sessions_per_source: Some(31),
            ..Config::default()
        },
    );
    let sids = connect_all(&mut sim, 0, 1, 3);
    let now = sim.now;
    let fourth = sim.nodes[0].rpc.create_session(now, 1).unwrap();
    assert!(sim.run(
        now + 1000 * MS,
        |s| s.count(0, |e| matches!(e, Event::SessionFailed { .. })) == 1
    ));
    let error = SessionError::NoRingEntries {
        ring_entries: 31,
        sessions: 3,
        credits: 8,
    };
    assert_eq!(
        sim.nodes[0].events.last(),
        Some(&Event::SessionFailed {
            session: fourth,
            error
        })
    );
    assert!(
        error
            .to_string()
            .contains("receive ring holds 31 datagrams")
    );
    assert_eq!(sim.nodes[1].rpc.num_sessions(), 3);
    assert_eq!(sim.nodes[1].rpc.stats().connects_refused, 1);
    // Calls on the admitted sessions work; after one session ends, a new one is admitted.
    for (k, &sid) in sids.iter().enumerate() {
        let now = sim.now;
        sim.nodes[0]
            .rpc
            .enqueue_request(now, sid, 0, b"x", k as u64)
            .unwrap();
    }
    assert!(sim.run(sim.now + 1000 * MS, |s| s.responses().len() == 3));
    let now = sim.now;
    sim.nodes[0].rpc.destroy_session(now, sids[0]).unwrap();
    assert!(sim.run(now + 1000 * MS, |s| s.nodes[1].rpc.num_sessions() == 2));
    let now = sim.now;
    sim.nodes[0].rpc.create_session(now, 1).unwrap();
    assert!(sim.run(
        now + 1000 * MS,
        |s| s.count(0, |e| matches!(e, Event::SessionConnected(_))) == 4
    ));
    assert_eq!(sim.nodes[1].rpc.num_sessions(), 3);
    // The client side: a ring of 16 datagrams holds two sessions of 8 credits.
    let mut c = Rpc::<u32>::new(Config {
        rx_ring_entries: Some(16),
        ..Config::default()
    })
    .unwrap();
    c.create_session(0, 9).unwrap();
    c.create_session(0, 9).unwrap();
    assert_eq!(
        c.create_session(0, 9),
        Err(ErpcCallError::NoRingEntries {
            ring_entries: 16,
            sessions: 2,
            credits: 8
        })
    );
}
