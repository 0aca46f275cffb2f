//! End-to-end eRPC over mlx5 UD on the device model: [`Endpoint`] (core + event loop) over
//! [`UdTransport`] on both sides of one [`Fabric`], the server in its own thread. The same
//! scenarios as `erpc_udp_e2e.rs`: small echo RPCs, large messages (up to the core's 8 MiB
//! maximum) both ways, many sessions, 30% loss with duplication and reordering (by the model's
//! UD fault injection, and by `LossyTransport` around the UD transport) with every RPC
//! executed exactly once, server failure (every pending call fails within the failure
//! timeout), and the per-source session limit with the remote QP as the source (issue 14).
//!
//! What the tests rely on from the model: a UD SEND is executed inside the sender's doorbell
//! (`tx_burst`), so a datagram is in the receiver's ring when `tx_burst` returns; datagrams
//! that fault injection delays or reorders are delivered at later progress steps, which every
//! doorbell on the fabric makes. While RPCs are outstanding, eRPC's retransmission timer
//! keeps ringing doorbells, so no progress thread is needed.
//!
//! Every loop here yields its thread after an iteration that found no work ([`spin`]): the
//! model moves a datagram in the sender's thread, so a round trip needs the server's and the
//! client's busy-polling threads to run in turn, and on a loaded 2-core machine (parallel
//! tests, other builds) two spinning threads sharing a core otherwise take turns only once
//! per scheduler time slice (milliseconds), far above eRPC's 5 ms retransmission timeout.

mod erpc_common;

use erpc_common::{DEADLINE, connect, run_calls, spawn_server, spin};

use std::time::{Duration, Instant};

use mlx5::sim::{Fabric, SimConfig, UdFaults};
use rpc_runtime::erpc::core::{Config, ErpcCallError, Event, MS, SessionError};
use rpc_runtime::erpc::datagram::lossy::{LossConfig, LossyTransport};
use rpc_runtime::erpc::datagram::ud::{DEFAULT_MTU, UdAddr, UdConfig, UdTransport};
use rpc_runtime::erpc::datagram::{DatagramTransport, RxWait};
use rpc_runtime::erpc::event_loop::Endpoint;

fn fabric() -> Fabric {
    Fabric::new(SimConfig::deterministic())
}

/// A UD transport with eRPC's defaults on a new simulated NIC of `f`.
fn ud(f: &Fabric) -> UdTransport {
    UdTransport::new(&f.open(), UdConfig::default()).expect("UD transport")
}

/// The default core configuration with a failure timeout long enough that a loop starved by
/// a loaded machine (parallel tests on 2 cores, debug build) is not mistaken for a dead peer.
fn patient() -> Config {
    Config {
        failure_timeout: 5_000 * MS,
        ..Config::default()
    }
}

/// Transport counters of a run without loss: nothing dropped or refused anywhere.
fn assert_clean(name: &str, t: &UdTransport) {
    let s = t.stats();
    assert_eq!(
        (s.tx_errors, s.rx_errors, s.rx_oversized, s.rx_short),
        (0, 0, 0, 0),
        "{name}: {s:?}"
    );
    assert!(t.qp_error().is_none(), "{name}");
}

#[test]
fn small_echo_10k() {
    let f = fabric();
    let server = spawn_server(ud(&f), patient(), None);
    let mut client = Endpoint::new(ud(&f), patient()).unwrap();
    let s = connect(&mut client, server.addr, 1);
    let calls: Vec<_> = (0..10_000).map(|i| (0, 16 + i % 48)).collect();
    let t = Instant::now();
    run_calls(&mut client, 1, &s, &calls, 32);
    eprintln!(
        "10k small echoes over UD in {:?}; client transport {:?}",
        t.elapsed(),
        client.transport().stats()
    );
    let (sep, counts) = server.finish();
    assert_eq!(counts.len(), 10_000);
    assert!(counts.values().all(|&c| c == 1));
    assert_clean("client", client.transport());
    assert_clean("server", sep.transport());
    // Requests of 16..64 bytes plus the 16-byte header: some inline (<= 60 B), some not;
    // one doorbell carries several datagrams on average only if batching works at all.
    let cs = client.transport().stats();
    assert!(cs.tx_pkts >= 10_000 && cs.tx_calls <= cs.tx_pkts);
    let fs = f.stats();
    assert_eq!(fs.ud_sent, fs.ud_delivered + fs.ud_no_recv);
}

#[test]
fn large_messages() {
    // 8 MiB (the core's maximum) at the 3840-byte UD MTU is ~2200 packets each way.
    let max = 8 << 20;
    let cfg = Config {
        failure_timeout: 5_000 * MS,
        ..Config::default()
    };
    let f = fabric();
    let server = spawn_server(ud(&f), cfg.clone(), None);
    let mut client = Endpoint::new(ud(&f), cfg).unwrap();
    let s = connect(&mut client, server.addr, 2);
    let dpp = client.rpc().data_per_pkt();
    assert_eq!(dpp, DEFAULT_MTU - 16);
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
    eprintln!("large messages (max {max} B) over UD in {:?}", t.elapsed());
    let (sep, counts) = server.finish();
    assert_eq!(counts.len(), calls.len());
    assert_clean("client", client.transport());
    assert_clean("server", sep.transport());
    // Both directions carried the 8 MiB message: well over 2 x 8 MiB of datagrams each way.
    assert!(client.transport().stats().tx_bytes > 16 << 20);
    assert!(sep.transport().stats().tx_bytes > 16 << 20);
    // Message packets went out in place from the message buffers (seeds/000 §3: header and
    // data gathered by the NIC), not copied: the two largest messages alone are ~4400
    // packets each way. Registration is once per buffer, not per message.
    for (name, s) in [
        ("client", client.transport().stats()),
        ("server", sep.transport().stats()),
    ] {
        assert!(s.tx_in_place > 4_000, "{name}: {s:?}");
        assert!(s.tx_registrations <= 32, "{name}: {s:?}");
    }
    assert_eq!(
        client.transport().pinned_buffers(),
        0,
        "every in-place send retired"
    );
}

#[test]
fn many_sessions() {
    let f = fabric();
    // One client takes every session the server's RQ admits: no per-source share (the
    // default would be half, issue 14).
    let cfg = Config {
        max_sessions_per_source: Some(64),
        ..patient()
    };
    let server = spawn_server(ud(&f), cfg, None);
    let mut client = Endpoint::new(ud(&f), patient()).unwrap();
    let s = connect(&mut client, server.addr, 64);
    let calls: Vec<_> = (0..64 * 30)
        .map(|i| (i % 64, 16 + (i * 37) % 3000))
        .collect();
    let t = Instant::now();
    run_calls(&mut client, 4, &s, &calls, 256);
    eprintln!("64 sessions x 30 calls over UD in {:?}", t.elapsed());
    let (ep, counts) = server.finish();
    assert_eq!(ep.rpc().num_sessions(), 64);
    assert_eq!(counts.len(), calls.len());
    assert!(counts.values().all(|&c| c == 1));
    // One address handle per peer endpoint, however many sessions.
    assert_eq!(client.transport().known_destinations(), 1);
    assert_eq!(ep.transport().known_destinations(), 1);
}

/// Issue 14: over UD a source is the remote QP (LID, QPN). One client endpoint that asks for
/// 40 sessions from a server whose RQ admits 64 gets the default per-source share, 32; the
/// rest are refused with `SourceLimit`, and another endpoint (another QP) still connects and
/// is served. Before, the first endpoint could take all 64.
#[test]
fn per_source_session_limit_over_ud() {
    let f = fabric();
    let server = spawn_server(ud(&f), patient(), None);
    let mut greedy = Endpoint::new(ud(&f), patient()).unwrap();
    let asked: Vec<_> = (0..40)
        .map(|_| greedy.create_session(server.addr).unwrap())
        .collect();
    let (mut connected, mut limited) = (0, 0);
    let start = Instant::now();
    while connected + limited < asked.len() {
        assert!(start.elapsed() < DEADLINE, "connects not answered");
        spin(&mut greedy);
        while let Some(ev) = greedy.poll_event() {
            match ev {
                Event::SessionConnected(_) => connected += 1,
                Event::SessionFailed {
                    error: SessionError::SourceLimit { limit: 32 },
                    ..
                } => limited += 1,
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    assert_eq!((connected, limited), (32, 8));
    let mut other = Endpoint::new(ud(&f), patient()).unwrap();
    let s = connect(&mut other, server.addr, 1);
    let calls: Vec<_> = (0..20).map(|i| (0, 16 + i)).collect();
    run_calls(&mut other, 2, &s, &calls, 4);
    let (ep, counts) = server.finish();
    assert_eq!(ep.rpc().num_sessions(), 33);
    assert_eq!(ep.core_stats().connects_refused_source_limit, 8);
    assert_eq!(counts.len(), 20);
}

/// Runs 400 calls over 4 sessions at 30% loss and checks exactly-once execution.
fn lossy_run<T>(server_t: T, client_t: T) -> (Endpoint<T>, Endpoint<T>)
where
    T: DatagramTransport + Send + 'static,
    T::Addr: Send,
{
    let cfg = Config {
        failure_timeout: 5_000 * MS,
        keepalive: 20 * MS,
        ..Config::default()
    };
    let server = spawn_server(server_t, cfg.clone(), None);
    let mut client = Endpoint::new(client_t, cfg).unwrap();
    let s = connect(&mut client, server.addr, 4);
    let calls: Vec<_> = (0..400)
        .map(|i| (i % 4, if i % 10 == 0 { 10_000 } else { 16 + i % 200 }))
        .collect();
    let t = Instant::now();
    run_calls(&mut client, 5, &s, &calls, 32);
    eprintln!(
        "400 calls at 30% loss in {:?}; core {:?}",
        t.elapsed(),
        client.core_stats()
    );
    let (sep, counts) = server.finish();
    assert_eq!(counts.len(), calls.len());
    for (k, c) in &counts {
        assert_eq!(*c, 1, "handler for {k:?} ran {c} times");
    }
    assert!(sep.core_stats().dup_req_answered > 0);
    assert!(client.core_stats().rollbacks > 0);
    (sep, client)
}

/// The NIC model loses 30% of all UD datagrams (both directions share the fabric), and
/// duplicates, reorders and delays others.
#[test]
fn model_loss_dup_reorder_exactly_once() {
    let f = Fabric::new(SimConfig {
        ud_faults: Some(UdFaults {
            seed: 0x5eed,
            drop: 0.3,
            duplicate: 0.05,
            reorder: 0.1,
            delay: 0.1,
            max_delay: 8,
        }),
        ..SimConfig::deterministic()
    });
    let (sep, client) = lossy_run(ud(&f), ud(&f));
    let fs = f.stats();
    eprintln!("fabric faults {fs:?}");
    assert!(fs.ud_drops > 0 && fs.ud_dups > 0 && fs.ud_reorders > 0 && fs.ud_delays > 0);
    // Drops happened in both directions: each side received fewer datagrams than the other
    // sent, although duplicates add some.
    let (cs, ss) = (client.transport().stats(), sep.transport().stats());
    assert!(
        ss.rx_pkts < cs.tx_pkts && cs.rx_pkts < ss.tx_pkts,
        "{cs:?} {ss:?}"
    );
    // Retransmissions of the 10 kB messages went out in place too (the core does not rewrite
    // a header of a packet that may still be queued, nor reuse a buffer in flight).
    assert!(cs.tx_in_place > 0 && ss.tx_in_place > 0, "{cs:?} {ss:?}");
}

/// `LossyTransport` around the UD transport: 30% loss each way on transmit and receive,
/// duplication, hold-back reordering and shuffled receive bursts.
#[test]
fn lossy_wrapper_loss_dup_reorder_exactly_once() {
    let f = fabric();
    let loss = |seed| LossConfig {
        seed,
        ..LossConfig::default()
    };
    let (_sep, client) = lossy_run(
        LossyTransport::new(ud(&f), loss(11)),
        LossyTransport::new(ud(&f), loss(22)),
    );
    let ls = client.transport().loss_stats();
    eprintln!("client faults {ls:?}");
    assert!(ls.tx_dropped > 0 && ls.rx_dropped > 0 && ls.tx_duplicated > 0);
    assert!(ls.tx_delayed > 0 && ls.rx_shuffled > 0);
}

#[test]
fn server_failure_fails_pending_calls() {
    let f = fabric();
    erpc_common::server_failure_fails_pending_calls(ud(&f), ud(&f));
}

#[test]
fn endpoint_sets_core_mtu_from_transport() {
    let f = fabric();
    let t = ud(&f);
    let mtu = t.mtu();
    assert_eq!(mtu, DEFAULT_MTU);
    let ep = Endpoint::new(t, Config::default()).unwrap();
    assert_eq!(ep.rpc().config().mtu, mtu);
    assert_eq!(ep.rpc().data_per_pkt(), mtu - 16);
    let _: UdAddr = ep.local_addr();
}

/// Admission control on the receive queue (issue 12; eRPC admits a session only if its RQ can
/// absorb every session's credits): a server whose RQ has 16 receive WQEs admits two sessions
/// of 8 credits and refuses a third at the client's connect with `NoRingEntries`, instead of
/// letting 24 packets in flight overrun 16 WQEs; a client endpoint with a 16-WQE RQ refuses
/// to create a third session.
#[test]
fn rq_depth_limits_sessions() {
    let f = fabric();
    let small = UdConfig {
        rq_depth: 16,
        rx_batch: 16,
        ..UdConfig::default()
    };
    let sud = UdTransport::new(&f.open(), small).expect("UD transport");
    assert_eq!(sud.rx_ring_entries(), 16);
    // One client takes every session: no per-source share (issue 14).
    let cfg = Config {
        max_sessions_per_source: Some(16),
        ..patient()
    };
    let server = spawn_server(sud, cfg, None);
    let mut client = Endpoint::new(ud(&f), patient()).unwrap();
    let admitted = connect(&mut client, server.addr, 2);
    let third = client.create_session(server.addr).unwrap();
    let start = Instant::now();
    let error = loop {
        assert!(start.elapsed() < DEADLINE, "no answer to the third connect");
        spin(&mut client);
        if let Some(ev) = client.poll_event() {
            match ev {
                Event::SessionFailed { session, error } if session == third => break error,
                other => panic!("unexpected {other:?}"),
            }
        }
    };
    assert_eq!(
        error,
        SessionError::NoRingEntries {
            ring_entries: 16,
            sessions: 2,
            credits: 8
        }
    );
    // The admitted sessions carry calls.
    let calls: Vec<_> = (0..200).map(|i| (i % 2, 100)).collect();
    run_calls(&mut client, 1, &admitted, &calls, 16);
    let (sep, counts) = server.finish();
    assert_eq!(counts.len(), 200);
    assert_eq!(sep.rpc().num_sessions(), 2);
    assert_eq!(sep.core_stats().connects_refused, 1);
    assert_clean("server", sep.transport());
    // Client side: its own RQ of 16 WQEs holds two sessions.
    let mut c = Endpoint::new(UdTransport::new(&f.open(), small).unwrap(), patient()).unwrap();
    let peer = UdAddr::new(1, 1);
    c.create_session(peer).unwrap();
    c.create_session(peer).unwrap();
    assert_eq!(
        c.create_session(peer),
        Err(ErpcCallError::NoRingEntries {
            ring_entries: 16,
            sessions: 2,
            credits: 8
        })
    );
}

/// The UD transport cannot sleep until a datagram arrives (the model has no completion
/// channel): `Endpoint::idle_wait` turns its policy off at the first try and polls.
#[test]
fn idle_wait_on_ud_polls() {
    let f = fabric();
    let mut t = ud(&f);
    let start = Instant::now();
    assert_eq!(t.rx_wait(Duration::from_secs(60)), RxWait::Unsupported);
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "returned at once"
    );
    let mut ep = Endpoint::new(t, patient()).unwrap();
    for _ in 0..3 {
        assert_eq!(ep.run_event_loop_once(), 0);
        assert!(!ep.idle_wait(0), "never blocks");
    }
    assert_eq!(ep.idle_stats(), Default::default());
}
