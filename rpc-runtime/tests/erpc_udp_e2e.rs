//! End-to-end eRPC over UDP loopback: [`Endpoint`] (core + event loop) on both sides, the
//! server in its own thread. Small echo RPCs, large messages, many sessions, 30% loss with
//! duplication and reordering (every RPC completes exactly once), and server failure (every
//! pending call fails within the failure timeout).

mod erpc_common;

use erpc_common::{connect, run_calls, spawn_server};

use std::net::SocketAddr;
use std::time::Instant;

use rpc_runtime::erpc::core::{Config, Event, MS};
use rpc_runtime::erpc::datagram::DatagramTransport;
use rpc_runtime::erpc::datagram::lossy::{LossConfig, LossyTransport};
use rpc_runtime::erpc::datagram::udp::{DEFAULT_MTU_V4, UdpConfig, UdpMtu, UdpTransport};
use rpc_runtime::erpc::event_loop::Endpoint;

/// A loopback transport with 4 MiB socket buffers and the IPv4 Ethernet datagram (1472 B),
/// not the derived loopback default (8972 B): these tests cut messages of a few KB into
/// several packets, and `many_sessions` needs room for 64 sessions (a 4 MiB buffer admits
/// 62 at 8972 B).
fn udp() -> UdpTransport {
    UdpTransport::bind(UdpConfig {
        mtu: UdpMtu::Fixed(DEFAULT_MTU_V4),
        socket_buf_bytes: Some(4 << 20),
        ..UdpConfig::default()
    })
    .expect("bind")
}

/// The default core configuration with a failure timeout long enough that a loop starved by
/// a loaded machine (parallel tests on 2 cores, debug build) is not mistaken for a dead peer,
/// and without congestion control: on a loaded loopback the RTT is CPU scheduling delay (often
/// above Timely's 1 ms `T_HIGH`), which drives rates to the 15 Mbit/s minimum and makes these
/// throughput-bound tests take many times longer. Congestion control stays on (the default) in
/// the loss and failure tests here, in `erpc_udp.rs`, and is tested in the core's simulator.
fn patient() -> Config {
    Config {
        failure_timeout: 5_000 * MS,
        cc_rate_comp: false,
        cc_pacing: false,
        ..Config::default()
    }
}

#[test]
fn small_echo_10k() {
    let server = spawn_server(udp(), patient(), None);
    let mut client = Endpoint::new(udp(), patient()).unwrap();
    let s = connect(&mut client, server.addr, 1);
    let calls: Vec<_> = (0..10_000).map(|i| (0, 16 + i % 48)).collect();
    let t = Instant::now();
    run_calls(&mut client, 1, &s, &calls, 32);
    eprintln!("10k small echoes in {:?}", t.elapsed());
    let (_, counts) = server.finish();
    assert_eq!(counts.len(), 10_000);
    assert!(counts.values().all(|&c| c == 1));
}

#[test]
fn large_messages() {
    // 8 MiB (the core's maximum) at a 1472-byte MTU is ~5760 packets each way; fast enough
    // in debug builds too (~0.4 s per echo), so not sized down.
    let max = 8 << 20;
    // Copying 8 MiB messages in a debug build, with parallel tests sharing 2 cores, can keep
    // a loop busy for a while: a generous failure timeout keeps that from failing sessions.
    // Without congestion control, as in `patient()`: at Timely's minimum rate an 8 MiB
    // request alone would take 4.5 s.
    let cfg = Config {
        failure_timeout: 2_000 * MS,
        cc_rate_comp: false,
        cc_pacing: false,
        ..Config::default()
    };
    let server = spawn_server(udp(), cfg.clone(), None);
    let mut client = Endpoint::new(udp(), cfg).unwrap();
    let s = connect(&mut client, server.addr, 2);
    let dpp = client.rpc().data_per_pkt();
    let calls = [
        (0, dpp),
        (1, dpp + 1),
        (0, 100_000),
        (1, max - 1),
        (0, max),
        (1, 3 * dpp - 1),
    ];
    let t = Instant::now();
    run_calls(&mut client, 2, &s, &calls, 2);
    eprintln!("large messages (max {max} B) in {:?}", t.elapsed());
    let (_, counts) = server.finish();
    assert_eq!(counts.len(), calls.len());
}

#[test]
fn many_sessions() {
    let server = spawn_server(udp(), patient(), None);
    let mut client = Endpoint::new(udp(), patient()).unwrap();
    let s = connect(&mut client, server.addr, 64);
    let calls: Vec<_> = (0..64 * 30)
        .map(|i| (i % 64, 16 + (i * 37) % 3000))
        .collect();
    let t = Instant::now();
    run_calls(&mut client, 4, &s, &calls, 256);
    eprintln!("64 sessions x 30 calls in {:?}", t.elapsed());
    let (ep, counts) = server.finish();
    assert_eq!(ep.rpc().num_sessions(), 64);
    assert_eq!(counts.len(), calls.len());
    assert!(counts.values().all(|&c| c == 1));
}

#[test]
fn loss_dup_reorder_exactly_once() {
    let cfg = Config {
        failure_timeout: 5_000 * MS,
        keepalive: 20 * MS,
        ..Config::default()
    };
    let loss = |seed| LossConfig {
        seed,
        ..LossConfig::default()
    };
    let server = spawn_server(LossyTransport::new(udp(), loss(11)), cfg.clone(), None);
    let mut client = Endpoint::new(LossyTransport::new(udp(), loss(22)), cfg).unwrap();
    let s = connect(&mut client, server.addr, 4);
    let calls: Vec<_> = (0..400)
        .map(|i| (i % 4, if i % 10 == 0 { 10_000 } else { 16 + i % 200 }))
        .collect();
    let t = Instant::now();
    run_calls(&mut client, 5, &s, &calls, 32);
    let ls = client.transport().loss_stats();
    eprintln!(
        "400 calls at 30% loss in {:?}; client faults {ls:?}; core {:?}",
        t.elapsed(),
        client.core_stats()
    );
    assert!(ls.tx_dropped > 0 && ls.rx_dropped > 0 && ls.tx_duplicated > 0);
    assert!(ls.tx_delayed > 0 && ls.rx_shuffled > 0);
    let (sep, counts) = server.finish();
    assert_eq!(counts.len(), calls.len());
    for (k, c) in &counts {
        assert_eq!(*c, 1, "handler for {k:?} ran {c} times");
    }
    assert!(sep.core_stats().dup_req_answered > 0);
    assert!(client.core_stats().rollbacks > 0);
}

#[test]
fn server_failure_fails_pending_calls() {
    erpc_common::server_failure_fails_pending_calls(udp(), udp());
}

#[test]
fn endpoint_sets_core_mtu_from_transport() {
    let t = udp();
    let mtu = t.mtu();
    let ep = Endpoint::new(t, Config::default()).unwrap();
    assert_eq!(ep.rpc().config().mtu, mtu);
    assert_eq!(ep.rpc().data_per_pkt(), mtu - 16);
    let _: SocketAddr = ep.local_addr();
}

/// Runs `a` and `b` (one thread) until `a` yields an event `pick` accepts; `b` answers every
/// request with an echo. Panics after 10 s.
fn alternate_until<T>(
    a: &mut Endpoint<UdpTransport>,
    b: &mut Endpoint<UdpTransport>,
    mut pick: impl FnMut(Event) -> Option<T>,
) -> T {
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "no event within 10 s");
        a.run_event_loop_once();
        b.run_event_loop_once();
        while let Some(ev) = b.poll_event() {
            if let Event::Request { token, data, .. } = ev {
                b.reply(token, &data).expect("reply");
            }
        }
        while let Some(ev) = a.poll_event() {
            if let Some(t) = pick(ev) {
                return t;
            }
        }
    }
}

/// `Endpoint::idle_wait` (the spin-then-block policy, `erpc::idle`) never blocks while the
/// next iteration has work without a datagram (a queued session request, a queued call),
/// blocks when there is none, at most until its bound, and returns at once when a datagram
/// waits. Both endpoints run in this thread, so which datagrams exist is known at each step.
#[test]
fn idle_wait_blocks_only_with_nothing_to_do_and_wakes_for_a_datagram() {
    // Timers far away (a slow or loaded machine must not make one due between the steps,
    // which would rightly keep `idle_wait` from blocking), scanned every iteration (so the
    // core's timer bound is exact when the test blocks).
    let cfg = Config {
        rto: 60_000 * MS,
        sm_rto: 60_000 * MS,
        keepalive: 60_000 * MS,
        failure_timeout: 120_000 * MS,
        ..patient()
    };
    let mut server = Endpoint::new(udp(), cfg.clone()).unwrap();
    let mut client = Endpoint::new(udp(), cfg).unwrap();
    client.set_timer_scan_interval(0);
    let s = client.create_session(server.local_addr()).unwrap();
    assert!(!client.idle_wait(0), "the connect request is queued");
    alternate_until(&mut client, &mut server, |ev| {
        matches!(ev, Event::SessionConnected(_)).then_some(())
    });
    // Drain what the handshake left (the server's last iteration may have sent nothing).
    while client.run_event_loop_once() + server.run_event_loop_once() > 0 {}
    assert_eq!(client.idle_stats().blocks, 0);

    client.enqueue_request(s, 1, b"ping", 7).unwrap();
    assert!(!client.idle_wait(0), "the request is queued");
    assert_eq!(client.idle_stats().blocks, 0);
    assert!(client.run_event_loop_once() > 0, "the request leaves");

    // Nothing to receive until the server runs: the block ends at its bound (max_block,
    // 1 ms, below the 5 ms retransmission timer).
    let t = Instant::now();
    assert!(client.idle_wait(0), "idle with window 0: blocks");
    assert!(t.elapsed() >= std::time::Duration::from_micros(900));
    assert!(t.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(client.idle_stats().blocks, 1);
    assert_eq!(client.idle_stats().timeouts, 1);

    // The server answers; the response waits in the client's socket: the wait returns at
    // once (well before its 1 ms bound on any machine that ran the block above).
    while server.run_event_loop_once() == 0 {}
    while let Some(ev) = server.poll_event() {
        if let Event::Request { token, data, .. } = ev {
            server.reply(token, &data).expect("reply");
        }
    }
    while server.run_event_loop_once() > 0 {}
    assert!(client.idle_wait(0));
    assert_eq!(client.idle_stats().blocks, 2);
    assert_eq!(client.idle_stats().timeouts, 1, "ended for the datagram");
    assert!(client.run_event_loop_once() > 0);
    match client.poll_event() {
        Some(Event::Response { tag: 7, data, .. }) => assert_eq!(data, b"ping"),
        other => panic!("expected the response, got {other:?}"),
    }

    // Work reported: the policy's episode ends, nothing blocks.
    assert!(!client.idle_wait(1));
    assert_eq!(client.idle_stats().blocks, 2);

    // Policy off: always polls.
    client.set_idle(None);
    assert!(!client.idle_wait(0));
    assert_eq!(client.idle_stats(), Default::default());
}
