//! Multi-threaded delegation ring tests: many client threads against one server thread, with a
//! normal ring and with a two-slot ring (constant backpressure). Every response is matched to
//! its request; none is lost or duplicated.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;
use rpc_runtime::delegation::{CallError, RingClient, RingConfig, RingServer, RingStats};

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
                Err(CallError::WouldBlock) => break,
                // This thread stalled for longer than the stall timeout between reserving and
                // committing: the request was not delivered; send it again.
                Err(CallError::Skipped) => {}
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
