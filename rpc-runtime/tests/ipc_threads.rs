//! Many client threads, many pipelined calls over one ipc server thread: every response is
//! delivered exactly once, to the call that sent its request (the payload names the client and
//! the call), and per-client request order is kept.

mod ipc_common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use ipc_common::*;
use rpc_runtime::RpcError;
use rpc_runtime::ipc::Ipc;

const CLIENTS: u32 = 6;
const CALLS: u64 = 3000;
const DEPTH: u32 = 8;

#[test]
fn many_clients_every_response_matched() {
    let n = unique_name("threads");
    let mut s = server(&n, CLIENTS, DEPTH);
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let srv = thread::spawn(move || {
        // Per client: the next call number expected (requests arrive in per-client order).
        let mut next = vec![0u64; CLIENTS as usize];
        while !st.load(Ordering::Relaxed) {
            s.poll();
            while let Some((token, req)) = s.recv() {
                let client = u32::from_ne_bytes(req[..4].try_into().unwrap());
                let call = u64::from_ne_bytes(req[4..12].try_into().unwrap());
                assert_eq!(call, next[client as usize], "client {client}: out of order");
                next[client as usize] += 1;
                let resp = transform(req);
                s.reply_with(token, |buf| {
                    buf[..resp.len()].copy_from_slice(&resp);
                    resp.len()
                })
                .unwrap();
            }
            s.release();
        }
        s
    });
    let t0 = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|id| {
            let n = n.clone();
            thread::spawn(move || {
                let mut c = Ipc::attach(&n).unwrap();
                let mut in_flight: Vec<Option<Vec<u8>>> = vec![None; DEPTH as usize];
                let (mut sent, mut done) = (0u64, 0u64);
                let deadline = Instant::now() + Duration::from_secs(60);
                while done < CALLS {
                    assert!(Instant::now() < deadline, "client {id} stuck at {done}");
                    while sent < CALLS {
                        let mut msg = id.to_ne_bytes().to_vec();
                        msg.extend_from_slice(&sent.to_ne_bytes());
                        msg.extend(std::iter::repeat_n(sent as u8, (sent % 30) as usize));
                        match c.try_send(|buf| {
                            buf[..msg.len()].copy_from_slice(&msg);
                            msg.len()
                        }) {
                            Ok(t) => {
                                assert!(in_flight[t as usize].is_none(), "token reused");
                                in_flight[t as usize] = Some(msg);
                                sent += 1;
                            }
                            Err(RpcError::WouldBlock) => break,
                            Err(e) => panic!("{e}"),
                        }
                    }
                    done += c
                        .poll_up_to(DEPTH as usize, |t, resp| {
                            let req = in_flight[t as usize].take().expect("response to no call");
                            assert_eq!(resp, transform(&req), "client {id}: wrong response");
                        })
                        .unwrap() as u64;
                }
                assert_eq!(c.stats().stale_responses, 0);
                c.stats().delivered
            })
        })
        .collect();
    for h in clients {
        assert_eq!(h.join().unwrap(), CALLS);
    }
    let took = t0.elapsed();
    eprintln!(
        "ipc: {CLIENTS} clients x {CALLS} calls (depth {DEPTH}) in {took:?}: {:.2} Mcalls/s",
        (CALLS * u64::from(CLIENTS)) as f64 / took.as_secs_f64() / 1e6
    );
    stop.store(true, Ordering::Relaxed);
    let s = srv.join().unwrap();
    assert_eq!(s.stats().received, CALLS * u64::from(CLIENTS));
    assert_eq!(s.stats().replied, CALLS * u64::from(CLIENTS));
}

#[test]
fn back_pressure_at_depth_and_until_release() {
    let n = unique_name("bp");
    let mut s = server(&n, 1, 4);
    let mut c = Ipc::attach(&n).unwrap();
    for i in 0..4u8 {
        send(&mut c, &[i]);
    }
    // Four calls in flight: the fifth waits for a response.
    assert!(matches!(c.try_send(|_| 0), Err(RpcError::WouldBlock)));
    // Answer two without `release`: the reply publishes the request tail, so the answered
    // calls' request slots are free as soon as their responses are seen.
    s.poll();
    for _ in 0..2 {
        let (t, _) = s.recv().unwrap();
        s.reply_with(t, |_| 0).unwrap();
    }
    let mut got = 0;
    while got < 2 {
        got += c.poll_up_to(4, |_, _| ()).unwrap();
    }
    send(&mut c, b"a");
    send(&mut c, b"b");
    assert!(matches!(c.try_send(|_| 0), Err(RpcError::WouldBlock)));
    // Requests received but not answered: slots stay taken until `release`, tokens until the
    // replies. Answer the two old ones after a release; the two new ones stay in flight.
    s.poll();
    let old: Vec<_> = std::iter::from_fn(|| s.recv().map(|(t, _)| t)).collect();
    assert_eq!(old.len(), 4);
    s.release();
    for t in &old[..2] {
        s.reply_with(*t, |_| 0).unwrap();
    }
    let mut got = 0;
    while got < 2 {
        got += c.poll_up_to(4, |_, _| ()).unwrap();
    }
    // Over-long message: nothing sent, token kept free.
    assert!(matches!(
        c.try_send(|_| CAP + 1),
        Err(RpcError::MessageTooLarge { .. })
    ));
    assert_eq!(c.in_flight(), 2);
    send(&mut c, b"c");
    send(&mut c, b"d");
    assert!(matches!(c.try_send(|_| 0), Err(RpcError::WouldBlock)));
}

#[test]
fn idle_client_is_skipped_for_a_few_polls_then_seen() {
    let n = unique_name("skip");
    let mut s = server(&n, 2, 4);
    let mut c = Ipc::attach(&n).unwrap();
    // The empty ring is found idle: the next IDLE_SKIP_POLLS polls do not read it.
    assert_eq!(s.poll(), 0);
    send(&mut c, b"x");
    for _ in 0..rpc_runtime::ipc::IDLE_SKIP_POLLS {
        assert_eq!(s.poll(), 0, "an idle client is skipped");
    }
    assert_eq!(s.poll(), 1);
    // A client that had work is read on every poll.
    assert!(s.recv().is_some());
    send(&mut c, b"y");
    assert_eq!(s.poll(), 1);
}

/// One thread drives both ends (no scheduling effects): batches of `depth` calls, each
/// response checked against its call; prints the cost per call.
#[test]
fn one_thread_batches_all_matched() {
    const ROUNDS: u64 = 20_000;
    let n = unique_name("onethread");
    let mut s = server(&n, 4, DEPTH);
    let mut c = Ipc::attach(&n).unwrap();
    let mut calls: Vec<u64> = vec![u64::MAX; DEPTH as usize];
    let t0 = Instant::now();
    for r in 0..ROUNDS {
        for i in 0..u64::from(DEPTH) {
            let v = r * 100 + i;
            let t = c
                .try_send(|buf| {
                    buf[..8].copy_from_slice(&v.to_ne_bytes());
                    8
                })
                .unwrap();
            calls[t as usize] = v;
        }
        assert_eq!(serve_once(&mut s), DEPTH as usize);
        let k = c
            .poll_up_to(DEPTH as usize, |t, b| {
                assert_eq!(b, transform(&calls[t as usize].to_ne_bytes()));
            })
            .unwrap();
        assert_eq!(k, DEPTH as usize);
    }
    let took = t0.elapsed();
    eprintln!(
        "ipc: one thread, {} calls in batches of {DEPTH}: {:.0} ns per call",
        ROUNDS * u64::from(DEPTH),
        took.as_nanos() as f64 / (ROUNDS * u64::from(DEPTH)) as f64
    );
}
