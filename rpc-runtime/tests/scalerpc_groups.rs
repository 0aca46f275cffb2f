//! ScaleRPC across group switches on the device model (issue 6 §6): no request is lost or
//! served twice when the server switches groups, defers replies across switches, answers by
//! READ, accepts connections mid-run, loses a client context, or evicts a client that stops
//! acknowledging; two threads; 1024 connections.
//!
//! Every request carries (server connection, sequence number). The server counts executions
//! per (connection, sequence) and fails the test on a second one; each client checks every
//! response against its call and fails the test on a second completion. At the end every
//! call of every live client completed exactly once and was executed exactly once.
//!
//! Single-threaded tests poll the clients and the server alternately (as `scalerpc_echo`);
//! the slices are real time, so how many switches happen mid-batch depends on the machine,
//! and the assertions only require "many". Larger counts run in release builds.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use mlx5::sim::{Fabric, SimConfig};
use rpc_runtime::scalerpc::{
    CallFailure, ClientConfig, ConnState, GroupSize, ResponseMode, ScaleCallError,
    ScaleCallErrorKind, ScaleClient, ScaleError, ScaleServer, ScaleToken, ServerConfig,
};

const REQ: usize = 16;
const RESP: usize = 24;
const DEADLINE: Duration = Duration::from_secs(60);

/// Tag of a call: client connection index (high) and sequence number (low 40 bits).
fn tag(c: u32, seq: u64) -> u64 {
    (c as u64) << 40 | seq
}

fn untag(t: u64) -> (u32, u64) {
    ((t >> 40) as u32, t & ((1 << 40) - 1))
}

/// A small xorshift (deterministic per test).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Clone, Copy)]
struct Params {
    max_conns: u32,
    group: u32,
    k: u32,
    slot: u32,
    slice: Duration,
    warmup: Duration,
    ack_timeout: Duration,
    mode: ResponseMode,
    calls_per_conn: u64,
    /// Hold replies and answer them later in shuffled order.
    defer: bool,
    max_send_wr: u32,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            max_conns: 64,
            group: 4,
            k: 4,
            slot: 128,
            slice: Duration::from_micros(5),
            warmup: Duration::from_micros(1),
            ack_timeout: Duration::from_millis(500),
            mode: ResponseMode::Write,
            calls_per_conn: 100,
            defer: false,
            max_send_wr: 64,
        }
    }
}

/// One client context and the calls it made.
struct Client {
    sc: ScaleClient<u64>,
    /// Server connection id of each client connection.
    sconn: Vec<u32>,
    issued: Vec<u64>,
    /// Per connection, per sequence: completed.
    done: Vec<Vec<bool>>,
    ok: u64,
    failed: u64,
    /// Calls and polls (false: the client went silent).
    polling: bool,
    /// Connection failures are expected (the test kills or silences this client).
    doomed: bool,
}

impl Client {
    fn completed(&self) -> u64 {
        self.ok + self.failed
    }
}

struct World {
    fabric: Fabric,
    server: ScaleServer,
    clients: Vec<Option<Client>>,
    /// Per server connection, per sequence: executions.
    exec: Vec<Vec<u8>>,
    /// Server connections whose failure is expected.
    doomed: HashSet<u32>,
    held: Vec<(ScaleToken, [u8; RESP])>,
    /// Deferred replies given while their connection was stopping (held across a switch).
    replies_after_stop: u64,
    rng: Rng,
    p: Params,
    started: Instant,
}

impl World {
    fn new(p: Params) -> World {
        let fabric = Fabric::new(SimConfig::deterministic());
        let server = ScaleServer::new(
            &fabric.open(),
            ServerConfig {
                max_conns: p.max_conns,
                group_size: GroupSize::Fixed(p.group),
                slots_per_conn: p.k,
                slot_size: Some(p.slot),
                slice: p.slice,
                warmup: p.warmup,
                ack_timeout: p.ack_timeout,
                response_mode: p.mode,
                max_send_wr: p.max_send_wr,
                ..ServerConfig::default()
            },
        )
        .unwrap();
        World {
            fabric,
            server,
            clients: Vec::new(),
            exec: Vec::new(),
            doomed: HashSet::new(),
            held: Vec::new(),
            replies_after_stop: 0,
            rng: Rng(0x9e37_79b9_7f4a_7c15),
            p,
            started: Instant::now(),
        }
    }

    /// A client context with room for `max` connections (none yet).
    fn add_client(&mut self, max: u32) -> usize {
        let sc = ScaleClient::new(
            &self.fabric.open(),
            ClientConfig {
                max_conns: max,
                slots_per_conn: self.p.k,
                slot_size: Some(self.p.slot),
                max_send_wr: self.p.max_send_wr,
                ..ClientConfig::default()
            },
        )
        .unwrap();
        self.clients.push(Some(Client {
            sc,
            sconn: Vec::new(),
            issued: Vec::new(),
            done: Vec::new(),
            ok: 0,
            failed: 0,
            polling: true,
            doomed: false,
        }));
        self.clients.len() - 1
    }

    /// Connects one more connection of client `i` (works while traffic runs).
    fn add_conn(&mut self, i: usize) -> u32 {
        let cl = self.clients[i].as_mut().unwrap();
        let (c, info) = cl.sc.create_conn().unwrap();
        let s = self.server.accept(&info).unwrap();
        cl.sc.connect(c, &s).unwrap();
        cl.sconn.push(s.conn_id);
        cl.issued.push(0);
        cl.done.push(vec![false; self.p.calls_per_conn as usize]);
        if self.exec.len() <= s.conn_id as usize {
            self.exec.resize(s.conn_id as usize + 1, Vec::new());
        }
        self.exec[s.conn_id as usize] = vec![0; self.p.calls_per_conn as usize];
        s.conn_id
    }

    /// Clients with `n` connections each, accepted round robin (so that every group mixes
    /// connections of different clients).
    fn with_clients(p: Params, clients: usize, n: u32) -> World {
        let mut w = World::new(p);
        for _ in 0..clients {
            w.add_client(n);
        }
        for _ in 0..n {
            for i in 0..clients {
                w.add_conn(i);
            }
        }
        w
    }

    fn doom(&mut self, i: usize) {
        let cl = self.clients[i].as_mut().unwrap();
        cl.doomed = true;
        self.doomed.extend(cl.sconn.iter().copied());
    }

    /// Issues calls on every active connection of the polling clients.
    fn issue(&mut self) {
        let calls = self.p.calls_per_conn;
        for cl in self.clients.iter_mut().flatten() {
            if !cl.polling {
                continue;
            }
            for c in 0..cl.sconn.len() {
                while cl.issued[c] < calls {
                    let seq = cl.issued[c];
                    let sconn = cl.sconn[c];
                    match cl.sc.call(c as u32, 1, REQ, tag(c as u32, seq), |b| {
                        b[..4].copy_from_slice(&sconn.to_le_bytes());
                        b[4..8].fill(0);
                        b[8..16].copy_from_slice(&seq.to_le_bytes());
                        REQ
                    }) {
                        Ok(_) => cl.issued[c] += 1,
                        Err(ScaleCallError {
                            kind: ScaleCallErrorKind::NotActive | ScaleCallErrorKind::SlotsBusy,
                            ..
                        }) => break,
                        Err(ScaleCallError {
                            kind: ScaleCallErrorKind::Failed,
                            ..
                        }) if cl.doomed => break,
                        Err(e) => panic!("call on connection {c} (server {sconn}): {e}"),
                    }
                }
            }
            cl.sc.flush();
        }
    }

    /// Polls the server, executes what arrived, replies (now or later).
    fn serve(&mut self) {
        self.server.poll();
        while let Some((tok, req)) = self.server.recv() {
            assert_eq!(req.len(), REQ);
            let sconn = u32::from_le_bytes(req[..4].try_into().unwrap());
            let seq = u64::from_le_bytes(req[8..16].try_into().unwrap());
            assert_eq!(tok.conn(), sconn, "request served on the wrong connection");
            let n = &mut self.exec[sconn as usize][seq as usize];
            *n += 1;
            assert_eq!(*n, 1, "request ({sconn}, {seq}) executed twice");
            let mut r = [0u8; RESP];
            r[..16].copy_from_slice(req);
            r[16..].copy_from_slice(&(!seq).to_le_bytes());
            if self.p.defer && self.rng.below(4) != 0 {
                self.held.push((tok, r));
            } else {
                self.answer(tok, r);
            }
        }
        if self.p.defer && !self.held.is_empty() && self.rng.below(3) == 0 {
            // Shuffle, answer a random part.
            let n = self.held.len();
            for i in (1..n).rev() {
                let j = self.rng.below(i as u64 + 1) as usize;
                self.held.swap(i, j);
            }
            let k = 1 + self.rng.below(n as u64) as usize;
            for (tok, r) in self.held.split_off(n - k) {
                if matches!(
                    self.server.conn_state(tok.conn()),
                    Some(ConnState::Stopping { .. })
                ) {
                    self.replies_after_stop += 1;
                }
                self.answer(tok, r);
            }
        }
        self.server.flush();
    }

    fn answer(&mut self, tok: ScaleToken, r: [u8; RESP]) {
        match self.server.reply(tok, RESP, |b| {
            b[..RESP].copy_from_slice(&r);
            RESP
        }) {
            Ok(()) => {}
            Err(ScaleError::ConnFailed) if self.doomed.contains(&tok.conn()) => {}
            Err(e) => panic!("reply on connection {}: {e}", tok.conn()),
        }
    }

    /// Polls every polling client and checks what completed.
    fn poll_clients(&mut self) -> usize {
        let mut total = 0;
        for cl in self.clients.iter_mut().flatten() {
            if !cl.polling {
                continue;
            }
            total += Self::poll_client(cl);
        }
        total
    }

    fn poll_client(cl: &mut Client) -> usize {
        let Client {
            sc,
            sconn,
            done,
            ok,
            failed,
            doomed,
            ..
        } = cl;
        sc.poll(|t, r| {
            let (c, seq) = untag(t);
            let d = &mut done[c as usize][seq as usize];
            assert!(!*d, "call ({c}, {seq}) completed twice");
            *d = true;
            match r {
                Ok(r) => {
                    assert_eq!(r.len(), RESP);
                    assert_eq!(
                        u32::from_le_bytes(r[..4].try_into().unwrap()),
                        sconn[c as usize]
                    );
                    assert_eq!(u64::from_le_bytes(r[8..16].try_into().unwrap()), seq);
                    assert_eq!(u64::from_le_bytes(r[16..24].try_into().unwrap()), !seq);
                    *ok += 1;
                }
                Err(CallFailure::ConnFailed) if *doomed => *failed += 1,
                Err(e) => panic!("call ({c}, {seq}) failed: {e}"),
            }
        })
    }

    fn step(&mut self) {
        self.issue();
        self.serve();
        self.poll_clients();
    }

    /// Steps until `cond`; panics after the deadline.
    fn run_until(&mut self, what: &str, mut cond: impl FnMut(&World) -> bool) {
        let start = Instant::now();
        while !cond(self) {
            self.step();
            if start.elapsed() > DEADLINE {
                panic!(
                    "{what}: no end after {DEADLINE:?}; server {:?}; scheduler {:?}; held {}; clients {:?}",
                    self.server.stats(),
                    self.server.scheduler().stats(),
                    self.held.len(),
                    self.clients
                        .iter()
                        .flatten()
                        .map(|c| (c.completed(), c.issued.iter().sum::<u64>()))
                        .collect::<Vec<_>>()
                );
            }
        }
    }

    /// Calls completed by live (not doomed) clients, and how many they make in all.
    fn progress(&self) -> (u64, u64) {
        let mut done = 0;
        let mut all = 0;
        for cl in self.clients.iter().flatten().filter(|c| !c.doomed) {
            done += cl.completed();
            all += cl.sconn.len() as u64 * self.p.calls_per_conn;
        }
        (done, all)
    }

    fn live_done(&self) -> bool {
        let (d, a) = self.progress();
        d == a
    }

    /// Runs to completion (answering any held replies) and checks exactly-once everywhere.
    fn finish(&mut self) {
        self.run_until("live clients complete", |w| w.live_done());
        for cl in self.clients.iter().flatten().filter(|c| !c.doomed) {
            assert_eq!(cl.failed, 0);
            for (c, d) in cl.done.iter().enumerate() {
                assert!(
                    d.iter().all(|&x| x),
                    "connection {c}: a call never completed"
                );
                let e = &self.exec[cl.sconn[c] as usize];
                assert!(
                    e.iter().all(|&x| x == 1),
                    "server connection {}: a request not executed exactly once",
                    cl.sconn[c]
                );
            }
        }
        let (sched, st) = (self.server.scheduler().stats(), self.server.stats());
        eprintln!(
            "{:.2?}: {} conns, {} groups; scheduler {sched:?}; server requests {} stale {} bad_control {} failed {}",
            self.started.elapsed(),
            self.server.num_conns(),
            self.server.scheduler().num_groups(),
            st.requests,
            st.stale_replies,
            st.bad_control,
            st.failed_conns
        );
    }
}

fn scaled(debug: u64, release: u64) -> u64 {
    if cfg!(debug_assertions) {
        debug
    } else {
        release
    }
}

/// 5 µs slices: nearly every round of the loop switches groups, so switches land in the
/// middle of batches (requests in flight in the draining bank, prefetched ones in the
/// warming bank).
#[test]
fn tiny_slices_lose_nothing() {
    let mut w = World::with_clients(
        Params {
            calls_per_conn: scaled(200, 2000),
            ..Params::default()
        },
        4,
        8,
    );
    w.finish();
    let s = *w.server.scheduler().stats();
    assert!(s.switches > 50, "{s:?}");
    assert_eq!(s.evictions, 0);
    assert_eq!(s.bad_acks, 0, "acknowledgements all matched a stop");
    assert_eq!(w.server.stats().bad_control, 0);
    assert_eq!(w.server.stats().failed_conns, 0);
}

/// Replies held across switches and given later in shuffled order.
#[test]
fn deferred_shuffled_replies_across_switches() {
    let mut w = World::with_clients(
        Params {
            calls_per_conn: scaled(200, 2000),
            slice: Duration::from_micros(20),
            warmup: Duration::from_micros(5),
            defer: true,
            ..Params::default()
        },
        4,
        8,
    );
    w.finish();
    let s = *w.server.scheduler().stats();
    assert!(s.switches > 20, "{s:?}");
    assert!(
        w.replies_after_stop > 0,
        "some replies were held across a switch"
    );
    assert_eq!((s.evictions, s.bad_acks), (0, 0));
}

/// Responses fetched by RDMA READ, deferred, tiny slices.
#[test]
fn read_mode_deferred_across_switches() {
    let mut w = World::with_clients(
        Params {
            calls_per_conn: scaled(100, 1000),
            mode: ResponseMode::Read,
            defer: true,
            ..Params::default()
        },
        3,
        8,
    );
    w.finish();
    let s = *w.server.scheduler().stats();
    assert!(s.switches > 20, "{s:?}");
    assert_eq!((s.evictions, s.bad_acks), (0, 0));
    let reads: u64 = w.clients.iter().flatten().map(|c| c.sc.stats().reads).sum();
    assert!(reads > 0);
}

/// Connections accepted while traffic runs land in the partial group, then in new groups,
/// and are served; one client context gains connections mid-run too.
#[test]
fn connections_join_while_traffic_runs() {
    let mut w = World::new(Params {
        calls_per_conn: scaled(100, 1000),
        slice: Duration::from_micros(20),
        warmup: Duration::from_micros(5),
        ..Params::default()
    });
    let a = w.add_client(16);
    for _ in 0..6 {
        w.add_conn(a); // groups 0 (4) and 1 (2 of 4)
    }
    let late = w.add_client(16);
    let mut joined = 0;
    let mut groups_seen = vec![w.server.scheduler().num_groups()];
    // Add one connection every few rounds, to whichever client, while the others run.
    let mut round = 0u64;
    while joined < 14 {
        w.step();
        round += 1;
        if round.is_multiple_of(7) {
            let i = if joined % 2 == 0 { a } else { late };
            w.add_conn(i);
            joined += 1;
            groups_seen.push(w.server.scheduler().num_groups());
        }
    }
    assert_eq!(w.server.num_conns(), 20);
    assert_eq!(w.server.scheduler().num_groups(), 5);
    assert!(
        groups_seen.windows(2).any(|g| g[1] > g[0]),
        "new groups formed"
    );
    w.finish();
    assert!(w.server.scheduler().stats().switches > 10);
    assert_eq!(w.server.stats().failed_conns, 0);
}

/// A client context dropped mid-run: its connections fail on the server as the server
/// notices (replies and notices to its destroyed QPs fail after the transport retries);
/// the rotation goes on and the other clients complete.
#[test]
fn dropped_client_fails_its_connections_and_the_rest_complete() {
    let mut w = World::with_clients(
        Params {
            calls_per_conn: scaled(150, 1500),
            group: 2,
            slice: Duration::from_micros(20),
            warmup: Duration::from_micros(5),
            defer: true,
            ..Params::default()
        },
        4,
        4,
    );
    w.run_until("a third done", |w| {
        let (d, a) = w.progress();
        d * 3 >= a
    });
    w.doom(1);
    let dead: Vec<u32> = w.clients[1].as_ref().unwrap().sconn.clone();
    w.clients[1] = None; // drops the context: its QPs are destroyed
    let switches = w.server.scheduler().stats().switches;
    w.finish();
    w.run_until("the dead client's connections fail", |w| {
        dead.iter().all(|&c| w.server.conn_failed(c))
    });
    assert!(w.server.scheduler().stats().switches > switches + 10);
    let st = w.server.stats();
    assert_eq!(st.failed_conns, dead.len() as u64, "{st:?}");
    assert!(st.error_cqes > 0);
    for cl in w.clients.iter().flatten() {
        for &c in &cl.sconn {
            assert!(!w.server.conn_failed(c));
        }
    }
}

/// A client that stops polling never acknowledges its stop: it is evicted after
/// `ack_timeout` and the rotation continues. When it polls again, its connections fail
/// (the server destroyed their QPs), and every call it made completes exactly once.
#[test]
fn silent_client_is_evicted_and_learns_it() {
    let mut w = World::with_clients(
        Params {
            calls_per_conn: scaled(150, 1500),
            slice: Duration::from_micros(20),
            warmup: Duration::from_micros(5),
            ack_timeout: Duration::from_millis(50),
            ..Params::default()
        },
        4,
        4,
    );
    w.run_until("a third done", |w| {
        let (d, a) = w.progress();
        d * 3 >= a
    });
    w.doom(2);
    let silent: Vec<u32> = w.clients[2].as_ref().unwrap().sconn.clone();
    w.clients[2].as_mut().unwrap().polling = false;
    w.finish();
    w.run_until("the silent client's connections are evicted", |w| {
        silent.iter().all(|&c| w.server.conn_failed(c))
    });
    let s = *w.server.scheduler().stats();
    assert_eq!(s.evictions, silent.len() as u64, "{s:?}");
    assert_eq!(w.server.stats().failed_conns, silent.len() as u64);
    // The rotation goes on after the evictions.
    let before = s.switches;
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(20) {
        w.serve();
    }
    assert!(w.server.scheduler().stats().switches > before);
    // It wakes up: acknowledgements and requests to destroyed QPs fail, so it learns.
    let cl = w.clients[2].as_mut().unwrap();
    let start = Instant::now();
    while !(0..cl.sconn.len() as u32).all(|c| cl.sc.is_failed(c)) {
        World::poll_client(cl);
        // Requests it may still issue on a connection it believes active.
        for c in 0..cl.sconn.len() {
            let (seq, sconn) = (cl.issued[c], cl.sconn[c]);
            if seq < w.p.calls_per_conn
                && let Ok(_) = cl.sc.call(c as u32, 1, REQ, tag(c as u32, seq), |b| {
                    b[..4].copy_from_slice(&sconn.to_le_bytes());
                    b[8..16].copy_from_slice(&seq.to_le_bytes());
                    REQ
                })
            {
                cl.issued[c] += 1;
            }
        }
        w.fabric.progress();
        assert!(
            start.elapsed() < DEADLINE,
            "the evicted client never learned"
        );
    }
    World::poll_client(cl);
    let issued: u64 = cl.issued.iter().sum();
    assert_eq!(cl.completed(), issued, "every call completed exactly once");
    assert!(cl.failed > 0 || cl.ok == issued);
}

/// Server and client on two threads, 10^5 calls, groups switching underneath.
#[test]
fn two_threads_hundred_thousand_calls() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    const CONNS: u32 = 32;
    const TOTAL: u64 = 100_000;
    let per_conn = TOTAL / CONNS as u64;
    let fabric = Fabric::new(SimConfig::deterministic());
    let mut server = ScaleServer::new(
        &fabric.open(),
        ServerConfig {
            max_conns: CONNS,
            group_size: GroupSize::Fixed(8),
            slots_per_conn: 4,
            slot_size: Some(128),
            slice: Duration::from_micros(50),
            warmup: Duration::from_micros(10),
            ..ServerConfig::default()
        },
    )
    .unwrap();
    let mut client = ScaleClient::<u64>::new(
        &fabric.open(),
        ClientConfig {
            max_conns: CONNS,
            slots_per_conn: 4,
            slot_size: Some(128),
            ..ClientConfig::default()
        },
    )
    .unwrap();
    for _ in 0..CONNS {
        let (c, info) = client.create_conn().unwrap();
        let s = server.accept(&info).unwrap();
        client.connect(c, &s).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let started = Instant::now();
    let srv = std::thread::spawn(move || {
        let mut exec = vec![vec![0u8; per_conn as usize]; CONNS as usize];
        while !st.load(Ordering::Acquire) {
            if server.poll() == 0 {
                // Nothing ready: let the client thread run if it shares this core.
                std::thread::yield_now();
            }
            while let Some((tok, req)) = server.recv() {
                let seq = u64::from_le_bytes(req[8..16].try_into().unwrap());
                let c = u32::from_le_bytes(req[..4].try_into().unwrap());
                assert_eq!(c, tok.conn());
                let n = &mut exec[c as usize][seq as usize];
                *n += 1;
                assert_eq!(*n, 1, "({c}, {seq}) executed twice");
                let mut r = [0u8; RESP];
                r[..16].copy_from_slice(req);
                r[16..].copy_from_slice(&(!seq).to_le_bytes());
                server
                    .reply(tok, RESP, |b| {
                        b[..RESP].copy_from_slice(&r);
                        RESP
                    })
                    .unwrap();
            }
            server.flush();
        }
        (server, exec)
    });
    let mut issued = vec![0u64; CONNS as usize];
    let mut done = vec![vec![false; per_conn as usize]; CONNS as usize];
    let mut completed = 0u64;
    while completed < per_conn * CONNS as u64 {
        for c in 0..CONNS {
            while issued[c as usize] < per_conn {
                let seq = issued[c as usize];
                match client.call(c, 1, REQ, tag(c, seq), |b| {
                    b[..4].copy_from_slice(&c.to_le_bytes());
                    b[8..16].copy_from_slice(&seq.to_le_bytes());
                    REQ
                }) {
                    Ok(_) => issued[c as usize] += 1,
                    Err(ScaleCallError {
                        kind: ScaleCallErrorKind::NotActive | ScaleCallErrorKind::SlotsBusy,
                        ..
                    }) => break,
                    Err(e) => panic!("{e}"),
                }
            }
        }
        let n = client.poll(|t, r| {
            let (c, seq) = untag(t);
            let r = r.expect("call failed");
            assert_eq!(u64::from_le_bytes(r[8..16].try_into().unwrap()), seq);
            assert_eq!(u64::from_le_bytes(r[16..24].try_into().unwrap()), !seq);
            assert!(
                !done[c as usize][seq as usize],
                "({c}, {seq}) completed twice"
            );
            done[c as usize][seq as usize] = true;
        });
        if n == 0 {
            std::thread::yield_now();
        }
        completed += n as u64;
        assert!(started.elapsed() < DEADLINE, "stuck at {completed}");
    }
    stop.store(true, Ordering::Release);
    let (server, exec) = srv.join().unwrap();
    assert!(exec.iter().flatten().all(|&n| n == 1));
    let s = server.scheduler().stats();
    eprintln!("{:.2?}: {s:?}", started.elapsed());
    assert!(s.switches > 10, "{s:?}");
    assert_eq!((s.evictions, s.bad_acks), (0, 0));
}

/// 1024 connections (8 client contexts of 128) in 16 groups of 64, small slots.
#[test]
fn thousand_connections_in_groups_of_64() {
    let mut w = World::with_clients(
        Params {
            max_conns: 1024,
            group: 64,
            k: 2,
            slot: 64,
            slice: Duration::from_micros(100),
            warmup: Duration::from_micros(20),
            ack_timeout: Duration::from_secs(5),
            calls_per_conn: scaled(6, 60),
            max_send_wr: 16,
            ..Params::default()
        },
        8,
        128,
    );
    assert_eq!(w.server.scheduler().num_groups(), 16);
    w.finish();
    let s = *w.server.scheduler().stats();
    assert!(s.switches >= 16, "every group had a turn: {s:?}");
    assert_eq!((s.evictions, s.bad_acks), (0, 0));
    assert_eq!(w.server.stats().failed_conns, 0);
}

/// The server holds a reply past `ack_timeout`: the stopped connection cannot acknowledge,
/// so it is evicted (told, failed, its QP destroyed) and its bank given to the next group.
/// The slot the held request occupies must serve the bank's new owner, and the late reply
/// must be refused with `ConnFailed` (not written into the new owner's request). The
/// evicted client learns it from the eviction notice: its outstanding call ends with
/// `CallFailure::Evicted` and later calls are refused with `ScaleCallErrorKind::Evicted`
/// (before the notice existed it sat "stopped" for ever, every call `NotActive`).
#[test]
fn reply_held_past_ack_timeout_evicts_and_frees_the_slot() {
    let fabric = Fabric::new(SimConfig::deterministic());
    let mut server = ScaleServer::new(
        &fabric.open(),
        ServerConfig {
            max_conns: 3,
            group_size: GroupSize::Fixed(1),
            slots_per_conn: 1,
            slot_size: Some(128),
            slice: Duration::from_micros(200),
            warmup: Duration::from_micros(50),
            ack_timeout: Duration::from_millis(5),
            ..ServerConfig::default()
        },
    )
    .unwrap();
    let mut client = ScaleClient::<u64>::new(
        &fabric.open(),
        ClientConfig {
            max_conns: 3,
            slots_per_conn: 1,
            slot_size: Some(128),
            ..ClientConfig::default()
        },
    )
    .unwrap();
    for _ in 0..3 {
        let (c, info) = client.create_conn().unwrap();
        let s = server.accept(&info).unwrap();
        client.connect(c, &s).unwrap();
    }
    client
        .call(0, 1, 1, 0, |b| {
            b[0] = 0;
            1
        })
        .unwrap();
    client.flush();
    server.poll();
    let (held, _) = server.recv().unwrap();
    assert_eq!(held.conn(), 0);
    let mut got = Vec::new();
    let start = Instant::now();
    // Connection 2 (group 2) gets bank 0 again, i.e. the held request's slot.
    let mut sent = false;
    let mut answered = None;
    while !got.iter().any(|(t, _)| *t == 2) {
        server.poll();
        if let Some((tok, req)) = server.recv() {
            assert_eq!((tok.conn(), req), (2, &[2u8][..]));
            answered = Some(server.scheduler().stats().evictions);
            server
                .reply(tok, 1, |b| {
                    b[0] = 22;
                    1
                })
                .unwrap();
        }
        server.flush();
        client.poll(|t, r| got.push((t, r.map(<[u8]>::to_vec))));
        if !sent && client.is_active(2) {
            client
                .call(2, 1, 1, 2, |b| {
                    b[0] = 2;
                    1
                })
                .unwrap();
            client.flush();
            sent = true;
        }
        assert!(start.elapsed() < DEADLINE, "connection 2 was never served");
    }
    assert_eq!(got, vec![(0, Err(CallFailure::Evicted)), (2, Ok(vec![22]))]);
    assert_eq!(answered, Some(1), "connection 0 was evicted first");
    assert!(server.conn_failed(0));
    let st = server.stats();
    assert_eq!(
        (st.failed_conns, st.evict_notices, st.reclaimed),
        (1, 1, 1),
        "{st:?}"
    );
    assert!(matches!(
        server.reply(held, 1, |_| 1),
        Err(ScaleError::ConnFailed)
    ));
    assert_eq!(client.outstanding(0), 0, "its call ended with the eviction");
    assert!(client.is_evicted(0) && client.is_failed(0));
    assert_eq!(client.stats().evictions, 1);
    assert!(matches!(
        client.call(0, 1, 1, 9, |_| 1),
        Err(ScaleCallError {
            kind: ScaleCallErrorKind::Evicted,
            user: 9
        })
    ));
}
