//! The eRPC datapath allocates nothing per RPC in the steady state (issue 5), checked with a
//! counting global allocator (per thread, so parallel tests do not disturb each other):
//!
//! - two protocol cores ([`Rpc`]) driven through memory: single-packet echo on the
//!   zero-copy path (seeds/002 §7.2), pipelined beyond the 8 slots (backlog);
//! - the copying path with event buffers returned through [`Rpc::recycle`], single- and
//!   multi-packet messages;
//! - a congested session whose packets go through the timing wheel (Timely + pacing);
//! - two [`Endpoint`]s over UDP loopback using `rx_burst_zc` / `reply_zc` /
//!   `finish_iteration`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

use rpc_runtime::erpc::core::{Config, Event, MS, Rpc, SessionId, Time, Zc};
use rpc_runtime::erpc::datagram::udp::{UdpConfig, UdpTransport};
use rpc_runtime::erpc::event_loop::Endpoint;

/// Counts allocations made by the current thread.
struct CountingAlloc;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn bump() {
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
}

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

// SAFETY: forwards every call to the system allocator unchanged; the counter is a const-
// initialized thread-local without destructor, whose access does not allocate.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        bump();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// Asserts that the counter sees this thread's allocations at all.
fn probe_counter() {
    let before = allocs();
    drop(std::hint::black_box(vec![1u8; 64]));
    assert_eq!(allocs(), before + 1, "the counting allocator is active");
}

const CLIENT: u32 = 1;
const SERVER: u32 = 2;

/// Message buffers the two cores have mapped so far (issue 15: constant in a steady state,
/// the message-buffer counterpart of the allocation counter; `DmaBuf`s are `mmap`s, which
/// the counting allocator does not see).
fn mapped(cl: &Rpc<u32>, sv: &Rpc<u32>) -> u64 {
    cl.stats().msgbufs_allocated + sv.stats().msgbufs_allocated
}

/// A client and a server core connected through memory; returns the session.
fn core_pair(cfg: Config) -> (Rpc<u32>, Rpc<u32>, SessionId) {
    let mut cl = Rpc::new(cfg.clone()).unwrap();
    let mut sv = Rpc::new(cfg).unwrap();
    let sid = cl.create_session(0, SERVER).unwrap();
    let mut buf = vec![0u8; 4096];
    for _ in 0..4 {
        while let Some((_, n)) = cl.poll_transmit(&mut buf) {
            sv.handle_datagram(0, CLIENT, &buf[..n]);
        }
        while let Some((_, n)) = sv.poll_transmit(&mut buf) {
            cl.handle_datagram(0, SERVER, &buf[..n]);
        }
    }
    assert_eq!(cl.poll_event(), Some(Event::SessionConnected(sid)));
    (cl, sv, sid)
}

/// One round of the zero-copy echo: the server answers zero-copy requests in place with
/// `reply_with`, the client checks zero-copy responses in place. The client's packets are
/// received by the server at `t`, the server's by the client at `t + rtt`. Returns the
/// responses received.
fn zc_round(
    cl: &mut Rpc<u32>,
    sv: &mut Rpc<u32>,
    buf: &mut [u8],
    t: Time,
    rtt: Time,
    expect: &[u8],
) -> usize {
    let mut got = 0;
    while let Some((_, n)) = cl.poll_transmit_at(t, buf) {
        let pkt = &buf[..n];
        if let Some(zc) = sv.handle_datagram_zc(t, CLIENT, pkt) {
            let Zc::Request { token, .. } = zc else {
                panic!("{zc:?}")
            };
            let req = &pkt[zc.range()];
            sv.reply_with(t, token, req.len(), |resp| {
                resp.copy_from_slice(req);
                req.len()
            })
            .unwrap();
        }
    }
    while let Some((_, n)) = sv.poll_transmit_at(t, buf) {
        if let Some(zc) = cl.handle_datagram_zc(t + rtt, SERVER, &buf[..n]) {
            assert!(matches!(zc, Zc::Response { .. }), "{zc:?}");
            assert_eq!(&buf[..n][zc.range()], expect);
            got += 1;
        }
    }
    assert!(cl.poll_event().is_none() && sv.poll_event().is_none());
    got
}

#[test]
fn core_zc_single_packet_echo_allocates_nothing() {
    let (mut cl, mut sv, sid) = core_pair(Config::default());
    let mut buf = vec![0u8; 4096];
    let payload = [0x5au8; 32];
    let mut t: Time = MS;
    // QD 1, then QD 24 (8 slots + 16 backlogged), `n` RPCs each.
    let mut run = |cl: &mut Rpc<u32>, sv: &mut Rpc<u32>, n: u64, qd: u64| {
        let mut done = 0;
        let mut issued = 0;
        while done < n {
            while issued < n && issued - done < qd {
                cl.enqueue_request(t, sid, 3, &payload, issued).unwrap();
                issued += 1;
            }
            done += zc_round(cl, sv, &mut buf, t, 10_000, &payload) as u64;
            t += 20_000;
            for r in [&mut *cl, &mut *sv] {
                if r.next_timeout().is_some_and(|d| d <= t) {
                    r.handle_timeout(t);
                }
            }
        }
    };
    run(&mut cl, &mut sv, 200, 1);
    run(&mut cl, &mut sv, 200, 24);
    probe_counter();
    let bufs = mapped(&cl, &sv);
    let before = allocs();
    run(&mut cl, &mut sv, 5000, 1);
    run(&mut cl, &mut sv, 5000, 24);
    let n = allocs() - before;
    assert_eq!(n, 0, "allocations during 10000 zero-copy RPCs");
    assert_eq!(mapped(&cl, &sv), bufs, "message buffers mapped");
    assert_eq!(sv.stats().requests_dispatched, 10_400);
    assert_eq!(cl.stats().wheel_paced, 0, "uncongested");
}

#[test]
fn core_copy_path_with_recycle_allocates_nothing() {
    let (mut cl, mut sv, sid) = core_pair(Config::default());
    let dpp = cl.data_per_pkt();
    let mut buf = vec![0u8; 4096];
    // Single-packet and 3-packet requests with 2-packet responses, 16 in flight.
    let small = vec![1u8; 40];
    let large = vec![2u8; 3 * dpp - 10];
    let resp_large = vec![3u8; dpp + 10];
    let mut t: Time = MS;
    let mut run = |cl: &mut Rpc<u32>, sv: &mut Rpc<u32>, n: u64| {
        let mut done = 0;
        let mut issued = 0;
        while done < n {
            while issued < n && issued - done < 16 {
                let p = if issued % 2 == 0 { &small } else { &large };
                cl.enqueue_request(t, sid, 1, p, issued).unwrap();
                issued += 1;
            }
            while let Some((_, len)) = cl.poll_transmit_at(t, &mut buf) {
                sv.handle_datagram(t, CLIENT, &buf[..len]);
            }
            while let Some(ev) = sv.poll_event() {
                let Event::Request { token, data, .. } = ev else {
                    panic!("{ev:?}")
                };
                let r: &[u8] = if data.len() == small.len() {
                    &data
                } else {
                    &resp_large
                };
                sv.reply(t, token, r).unwrap();
                sv.recycle(data);
            }
            while let Some((_, len)) = sv.poll_transmit_at(t, &mut buf) {
                cl.handle_datagram(t + 10_000, SERVER, &buf[..len]);
            }
            while let Some(ev) = cl.poll_event() {
                let Event::Response { tag, data, .. } = ev else {
                    panic!("{ev:?}")
                };
                assert_eq!(data.len(), if tag % 2 == 0 { 40 } else { dpp + 10 });
                cl.recycle(data);
                done += 1;
            }
            t += 20_000;
            for r in [&mut *cl, &mut *sv] {
                if r.next_timeout().is_some_and(|d| d <= t) {
                    r.handle_timeout(t);
                }
            }
        }
    };
    run(&mut cl, &mut sv, 400);
    probe_counter();
    let bufs = mapped(&cl, &sv);
    let before = allocs();
    run(&mut cl, &mut sv, 4000);
    let n = allocs() - before;
    assert_eq!(
        mapped(&cl, &sv),
        bufs,
        "message buffers mapped during 4000 copied RPCs"
    );
    assert_eq!(
        n, 0,
        "allocations during 4000 copied RPCs (recycled buffers)"
    );
    assert!(
        sv.stats().cr_tx >= 4000,
        "multi-packet requests were exercised"
    );
}

#[test]
fn core_congested_session_paces_without_allocating() {
    let (mut cl, mut sv, sid) = core_pair(Config::default());
    let mut buf = vec![0u8; 4096];
    let payload = [7u8; 100];
    let mut t: Time = MS;
    // A 2 ms RTT (above Timely's T_HIGH) drives the session's rate down; every packet then
    // goes through the timing wheel.
    let rtt = 2 * MS;
    let mut run = |cl: &mut Rpc<u32>, sv: &mut Rpc<u32>, n: u64| {
        let mut done = 0;
        while done < n {
            cl.enqueue_request(t, sid, 1, &payload, done).unwrap();
            let mut got = 0;
            while got == 0 {
                got = zc_round(cl, sv, &mut buf, t, rtt, &payload);
                if got == 0 {
                    // Not yet released by the wheel: wait for it.
                    t = cl.next_timeout().unwrap().max(t);
                    cl.handle_timeout(t);
                }
            }
            done += 1;
            t += rtt;
            for r in [&mut *cl, &mut *sv] {
                if r.next_timeout().is_some_and(|d| d <= t) {
                    r.handle_timeout(t);
                }
            }
        }
    };
    run(&mut cl, &mut sv, 100);
    assert!(!cl.session_uncongested(sid).unwrap());
    let paced = cl.stats().wheel_paced;
    assert!(paced > 0);
    probe_counter();
    let before = allocs();
    run(&mut cl, &mut sv, 2000);
    let n = allocs() - before;
    assert_eq!(n, 0, "allocations during 2000 paced RPCs");
    assert_eq!(cl.stats().wheel_paced, paced + 2000, "every packet paced");
    assert_eq!(cl.stats().rollbacks, 0);
}

fn udp() -> UdpTransport {
    UdpTransport::bind(UdpConfig {
        socket_buf_bytes: Some(1 << 20),
        ..UdpConfig::default()
    })
    .expect("bind")
}

/// Client and server endpoints in one thread over UDP loopback, both using the zero-copy
/// iteration; `qd` 32-byte echo RPCs in flight.
#[test]
fn endpoint_zc_udp_echo_allocates_nothing() {
    let cfg = Config {
        failure_timeout: 5_000 * MS,
        ..Config::default()
    };
    let mut sv = Endpoint::new(udp(), cfg.clone()).unwrap();
    let mut cl = Endpoint::new(udp(), cfg).unwrap();
    let sid = cl.create_session(sv.local_addr()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cl.is_connected(sid) {
        assert!(Instant::now() < deadline, "connect");
        cl.run_event_loop_once();
        sv.run_event_loop_once();
        while cl.poll_event().is_some() {}
        while sv.poll_event().is_some() {}
    }
    let payload = [0xc3u8; 32];
    let qd = 16u64;
    let mut issued = 0u64;
    let mut done = 0u64;
    let mut run = |cl: &mut Endpoint<UdpTransport>, sv: &mut Endpoint<UdpTransport>, n: u64| {
        let target = done + n;
        while done < target {
            assert!(Instant::now() < deadline, "rpcs timed out at {done}");
            while issued < target && issued - done < qd {
                cl.enqueue_request(sid, 1, &payload, issued).unwrap();
                issued += 1;
            }
            for k in 0..sv.rx_burst_zc() {
                sv.reply_zc(k, 4096, |_, req, resp| {
                    resp[..req.len()].copy_from_slice(req);
                    req.len()
                })
                .unwrap();
            }
            sv.finish_iteration();
            assert!(sv.poll_event().is_none());
            for k in 0..cl.rx_burst_zc() {
                let (zc, data) = cl.zc(k);
                assert!(matches!(zc, Zc::Response { .. }));
                assert_eq!(data, payload);
                done += 1;
            }
            cl.finish_iteration();
            assert!(cl.poll_event().is_none());
        }
    };
    run(&mut cl, &mut sv, 2000);
    probe_counter();
    let before = allocs();
    run(&mut cl, &mut sv, 20_000);
    let n = allocs() - before;
    let st = cl.core_stats();
    eprintln!("client {st:?}\nloop {:?}", cl.loop_stats());
    assert_eq!(n, 0, "allocations during 20000 zero-copy RPCs over UDP");
    assert_eq!(sv.core_stats().requests_dispatched, 22_000);
}
