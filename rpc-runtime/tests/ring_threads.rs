//! Multi-threaded delegation ring tests: many client threads against one server thread, with a
//! normal ring and with a two-slot ring (constant backpressure). Every response is matched to
//! its request; none is lost or duplicated.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;
use rpc_runtime::delegation::{RingCallError, RingClient, RingConfig, RingServer, RingStats};

fn unique_name(tag: &str) -> String {
    format!("rt-{}-{tag}", std::process::id())
}

/// Request: client tag (u32) + sequence number (u64) + filler up to `len` bytes.
fn request(tag: u32, seq: u64, len: usize, buf: &mut [u8]) -> usize {
    buf[..4].copy_from_slice(&tag.to_le_bytes());
    buf[4..12].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in buf[12..len].iter_mut().enumerate() {
        *b = (seq as u8).wrapping_add(i as u8);
    }
    len
}

/// Server transformation: every byte xor 0xA5, then bytes reversed.
fn transform(req: &[u8], out: &mut [u8]) -> usize {
    for (o, b) in out.iter_mut().zip(req.iter().rev()) {
        *o = b ^ 0xA5;
    }
    req.len()
}

/// Serves until `stop` is set and the ring is drained.
fn serve(mut server: RingServer, stop: Arc<AtomicBool>) -> RingStats {
    let backoff = Backoff::new();
    let mut buf = [0u8; 256];
    loop {
        if server.poll() == 0 {
            if stop.load(Ordering::Acquire) {
                return server.stats().clone();
            }
            backoff.snooze();
            continue;
        }
        backoff.reset();
        while let Some(e) = server.recv() {
            let token = e.token;
            let n = transform(e.payload, &mut buf);
            server.reply(token, &buf[..n]).expect("reply");
        }
        server.advance_tail();
    }
}

/// One client thread: `calls` calls with up to `resp_depth` in flight, each response checked
/// against its request. Returns the number of responses.
fn run_client(name: &str, calls: u64, len: usize) -> u64 {
    let mut c = RingClient::attach(name).expect("attach");
    // These tests check throughput and matching, not timeouts: a loaded machine may keep a
    // thread off the CPU for long.
    c.set_send_timeout(Duration::from_secs(60));
    let depth = c.info().resp_depth as usize;
    let tag = c.client_id() ^ 0xC0DE_0000;
    let mut slot_seq = vec![u64::MAX; depth];
    let mut seen = vec![false; calls as usize];
    let (mut next, mut done) = (0u64, 0u64);
    let backoff = Backoff::new();
    let mut req = [0u8; 256];
    let mut expect = [0u8; 256];
    while done < calls {
        while next < calls {
            match c.try_call_with(|buf| request(tag, next, len, buf)) {
                Ok(idx) => {
                    assert_eq!(
                        slot_seq[idx as usize],
                        u64::MAX,
                        "slot reused while outstanding"
                    );
                    slot_seq[idx as usize] = next;
                    next += 1;
                }
                Err(RingCallError::WouldBlock) => break,
                // This thread stalled for longer than the stall timeout between reserving and
                // committing: the request was not delivered; send it again.
                Err(RingCallError::Skipped) => {}
                Err(e) => panic!("try_call: {e}"),
            }
        }
        let n = c
            .poll(|idx, resp| {
                let seq = std::mem::replace(&mut slot_seq[idx as usize], u64::MAX);
                assert_ne!(seq, u64::MAX, "response on a slot with no call");
                let n = request(tag, seq, len, &mut req);
                let m = transform(&req[..n], &mut expect);
                assert_eq!(resp, &expect[..m], "response does not match request {seq}");
                assert!(
                    !std::mem::replace(&mut seen[seq as usize], true),
                    "duplicate {seq}"
                );
                done += 1;
            })
            .expect("poll");
        if n == 0 {
            backoff.snooze();
        } else {
            backoff.reset();
        }
    }
    assert!(seen.iter().all(|&s| s));
    assert_eq!(c.in_flight(), 0);
    done
}

fn stress(tag: &str, cfg: RingConfig, clients: usize, calls: u64, len: usize) -> RingStats {
    let name = unique_name(tag);
    let server = RingServer::create(&name, &cfg).expect("create");
    let stop = Arc::new(AtomicBool::new(false));
    let srv = {
        let stop = stop.clone();
        thread::spawn(move || serve(server, stop))
    };
    let start = Instant::now();
    let handles: Vec<_> = (0..clients)
        .map(|_| {
            let name = name.clone();
            thread::spawn(move || run_client(&name, calls, len))
        })
        .collect();
    let total: u64 = handles.into_iter().map(|h| h.join().expect("client")).sum();
    stop.store(true, Ordering::Release);
    let stats = srv.join().expect("server");
    eprintln!(
        "{tag}: {clients} clients x {calls} calls ({len} B) in {:?}: {stats:?}",
        start.elapsed()
    );
    assert_eq!(total, clients as u64 * calls);
    assert_eq!(stats.received, total);
    assert_eq!(stats.replied, total);
    assert_eq!(stats.invalid_entries(), 0);
    assert_eq!(stats.holes_skipped, 0);
    stats
}

#[test]
fn ring_eight_clients_100k_calls() {
    let cfg = RingConfig {
        max_clients: 8,
        ring_depth: 64,
        resp_depth: 8,
        req_payload_cap: 32,
        resp_payload_cap: 32,
        ..RingConfig::default()
    };
    let start = Instant::now();
    stress("8x100k", cfg, 8, 100_000, 20);
    assert!(start.elapsed() < Duration::from_secs(30));
}

#[test]
fn ring_depth_two_backpressure() {
    let cfg = RingConfig {
        max_clients: 8,
        ring_depth: 2,
        resp_depth: 4,
        req_payload_cap: 200,
        resp_payload_cap: 200,
        ..RingConfig::default()
    };
    stress("depth2", cfg, 5, 5_000, 200);
}

#[test]
fn ring_depth_one_single_response_slot() {
    let cfg = RingConfig {
        max_clients: 4,
        ring_depth: 1,
        resp_depth: 1,
        req_payload_cap: 12,
        resp_payload_cap: 12,
        ..RingConfig::default()
    };
    stress("depth1", cfg, 3, 3_000, 12);
}

/// One call at a time until `keep_going()` is false (at least `min_calls`); a call whose
/// closure `stall(seq)` returns true waits inside its payload write (slot checked, nothing
/// committed) until the server has skipped its position (`skips` moved) and then received 8
/// more requests (`served`: two laps of a 4-slot ring past the held slot). Returns
/// `(answered, refused, lost, stalled)`; a call is `lost` if it was sent but not answered
/// within 10 s (only a commit that lands after its position was skipped can be).
fn run_stalling_client(
    name: &str,
    min_calls: u64,
    keep_going: impl Fn() -> bool,
    (skips, served): (&AtomicU64, &AtomicU64),
    stall: impl Fn(u64) -> bool,
) -> (u64, u64, u64, u64) {
    let mut c = RingClient::attach(name).expect("attach");
    c.set_send_timeout(Duration::from_secs(60));
    let tag = c.client_id() ^ 0x57A1_0000;
    let (mut answered, mut refused, mut lost, mut stalled) = (0, 0, 0, 0);
    let (mut req, mut expect) = ([0u8; 64], [0u8; 64]);
    let mut seq = 0u64;
    while seq < min_calls || keep_going() {
        let mut stall_now = stall(seq);
        loop {
            let r = c.try_call_with(|buf| {
                let n = request(tag, seq, 24, buf);
                if stall_now {
                    let before = skips.load(Ordering::Acquire);
                    let t = Instant::now();
                    while skips.load(Ordering::Acquire) == before {
                        assert!(t.elapsed() < Duration::from_secs(10), "never skipped");
                        thread::yield_now();
                    }
                    let at_skip = served.load(Ordering::Acquire);
                    while served.load(Ordering::Acquire) < at_skip + 8 {
                        assert!(t.elapsed() < Duration::from_secs(10), "others stopped");
                        thread::yield_now();
                    }
                }
                n
            });
            match r {
                Ok(idx) => {
                    let t = Instant::now();
                    let mut got = None;
                    while got.is_none() && t.elapsed() < Duration::from_secs(10) {
                        c.poll(|i, resp| got = Some((i, resp.to_vec())))
                            .expect("poll");
                        thread::yield_now();
                    }
                    match got {
                        Some((i, resp)) => {
                            assert_eq!(i, idx);
                            let n = request(tag, seq, 24, &mut req);
                            let m = transform(&req[..n], &mut expect);
                            assert_eq!(resp, &expect[..m], "response does not match {seq}");
                            answered += 1;
                        }
                        None => lost += 1,
                    }
                    break;
                }
                Err(RingCallError::Skipped) => {
                    refused += 1;
                    if stall_now {
                        stalled += 1;
                        stall_now = false;
                    }
                }
                Err(e) => panic!("try_call: {e}"),
            }
        }
        seq += 1;
    }
    (answered, refused, lost, stalled)
}

/// A writer that stalls inside its payload write until the server has skipped its position
/// and served two more laps, every 10th call, next to two writers that never stall, on a
/// 4-slot ring: every stalled call is refused (`Skipped`), the others pass its held slot (at
/// least twice per stall) without waiting for it, and no request is lost, duplicated or
/// corrupted. The stalls are synchronized with the server's counters, not timed.
#[test]
fn ring_stalling_writer_is_refused_and_never_corrupts() {
    let name = unique_name("stalling");
    let cfg = RingConfig {
        max_clients: 4,
        ring_depth: 4,
        resp_depth: 2,
        req_payload_cap: 32,
        resp_payload_cap: 32,
        hole_timeout: Duration::from_millis(1),
        stall_timeout: Duration::from_millis(2),
        liveness_interval: Duration::from_millis(1),
        ..RingConfig::default()
    };
    let mut server = RingServer::create(&name, &cfg).expect("create");
    let stop = Arc::new(AtomicBool::new(false));
    // (stalls_skipped, received), published by the server thread after each round.
    let counters = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
    let staller_done = Arc::new(AtomicBool::new(false));
    let srv = {
        let (stop, counters) = (stop.clone(), counters.clone());
        thread::spawn(move || {
            let mut buf = [0u8; 64];
            while !stop.load(Ordering::Acquire) {
                server.poll();
                while let Some(e) = server.recv() {
                    let token = e.token;
                    let n = transform(e.payload, &mut buf);
                    server.reply(token, &buf[..n]).expect("reply");
                }
                server.advance_tail();
                // After `advance_tail`: a writer that sees a count move also sees the tail.
                let st = server.stats();
                counters.0.store(st.stalls_skipped, Ordering::Release);
                counters.1.store(st.received, Ordering::Release);
                thread::yield_now();
            }
            server.stats().clone()
        })
    };
    let spawn_client = |min_calls: u64, stalls: bool| {
        let (name, counters, done) = (name.clone(), counters.clone(), staller_done.clone());
        thread::spawn(move || {
            let c = (&counters.0, &counters.1);
            if stalls {
                let r = run_stalling_client(&name, min_calls, || false, c, |seq| seq % 10 == 5);
                done.store(true, Ordering::Release);
                r
            } else {
                let keep_going = || !done.load(Ordering::Acquire);
                run_stalling_client(&name, min_calls, keep_going, c, |_| false)
            }
        })
    };
    let staller = spawn_client(100, true);
    let others: Vec<_> = (0..2).map(|_| spawn_client(50, false)).collect();
    let s = staller.join().expect("staller");
    let o: Vec<_> = others
        .into_iter()
        .map(|h| h.join().expect("client"))
        .collect();
    stop.store(true, Ordering::Release);
    let stats = srv.join().expect("server");
    eprintln!("staller {s:?}, others {o:?}: {stats:?}");
    assert_eq!(s.3, 10, "every stalled call was refused");
    let all = [s, o[0], o[1]];
    let answered: u64 = all.iter().map(|r| r.0).sum();
    let refused: u64 = all.iter().map(|r| r.1).sum();
    let lost: u64 = all.iter().map(|r| r.2).sum();
    assert_eq!(stats.received, answered, "{stats:?}");
    assert_eq!(lost, stats.late_commits_dropped, "{stats:?}");
    assert_eq!(stats.stalls_skipped, refused + lost, "{stats:?}");
    assert_eq!(
        (stats.invalid_entries(), stats.aborted, stats.holes_skipped),
        (0, 0, 0)
    );
    assert!(stats.held_laps_skipped >= 2 * 10, "{stats:?}");
}
