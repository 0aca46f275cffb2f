//! ScaleRPC liveness on the device model (issue 12 §4): group stops survive a paused server
//! loop, an evicted client is told, connection ids are reclaimed under churn, the group size
//! follows the NIC's QP-context cache, and `rpc_type` reaches the server application.
//!
//! The pauses are on purpose: the test stops calling `ScaleServer::poll` for longer than
//! `ack_timeout` at a chosen point of a group stop. Client and server run in the test's
//! thread, and the device model executes each WQE inside its doorbell, so what is in a CQ
//! when the server resumes is fixed by the test, not by timing.

use std::time::{Duration, Instant};

use mlx5::sim::{Fabric, QpcCacheConfig, SimConfig};
use rpc_runtime::scalerpc::{
    CallFailure, ClientConfig, ConnState, GroupSize, ScaleCallError, ScaleCallErrorKind,
    ScaleClient, ScaleServer, ServerConfig,
};

const SLOT: u32 = 128;
const K: u32 = 2;
const ACK_TIMEOUT: Duration = Duration::from_millis(20);
const DEADLINE: Duration = Duration::from_secs(60);

fn server_cfg(max_conns: u32, group: u32) -> ServerConfig {
    ServerConfig {
        max_conns,
        group_size: GroupSize::Fixed(group),
        slots_per_conn: K,
        slot_size: Some(SLOT),
        slice: Duration::from_micros(200),
        warmup: Duration::from_micros(50),
        ack_timeout: ACK_TIMEOUT,
        ..ServerConfig::default()
    }
}

fn client_cfg(max_conns: u32) -> ClientConfig {
    ClientConfig {
        max_conns,
        slots_per_conn: K,
        slot_size: Some(SLOT),
        ..ClientConfig::default()
    }
}

/// A server with `n` connections from one client context, in groups of `group`.
fn world(n: u32, group: u32) -> (Fabric, ScaleServer, ScaleClient<u64>) {
    let fabric = Fabric::new(SimConfig::default());
    let mut server = ScaleServer::new(&fabric.open(), server_cfg(n, group)).unwrap();
    let mut client = ScaleClient::new(&fabric.open(), client_cfg(n)).unwrap();
    for _ in 0..n {
        let (c, info) = client.create_conn().unwrap();
        let s = server.accept(&info).unwrap();
        client.connect(c, &s).unwrap();
    }
    (fabric, server, client)
}

/// Answers every ready request with its first 8 bytes.
fn serve(server: &mut ScaleServer) {
    server.poll();
    while let Some((tok, req)) = server.recv() {
        let mut r = [0u8; 8];
        r.copy_from_slice(&req[..8]);
        server
            .reply(tok, 8, |b| {
                b[..8].copy_from_slice(&r);
                8
            })
            .unwrap();
    }
    server.flush();
}

/// Polls the server (without serving) until connections `conns` are stopping: the stop
/// notices are posted, the clients have not seen them yet.
fn poll_until_stopping(server: &mut ScaleServer, conns: &[u32]) {
    let start = Instant::now();
    while !conns
        .iter()
        .all(|&c| matches!(server.conn_state(c), Some(ConnState::Stopping { .. })))
    {
        server.poll();
        assert!(start.elapsed() < DEADLINE, "no stop");
    }
}

/// Every connection of `client` makes `calls` echo calls; all must succeed (no eviction, no
/// failure, no connection left "stopped" for ever). `idle` clients (nothing outstanding) are
/// polled meanwhile, so that they acknowledge their stops.
fn run_calls(
    server: &mut ScaleServer,
    client: &mut ScaleClient<u64>,
    calls: u64,
    idle: &mut [&mut ScaleClient<u64>],
) {
    let n = client.num_conns();
    let mut issued = vec![0u64; n as usize];
    let mut done = 0u64;
    let start = Instant::now();
    while done < calls * n as u64 {
        for c in 0..n {
            while issued[c as usize] < calls {
                let tag = (c as u64) << 32 | issued[c as usize];
                match client.call(c, 1, 8, tag, |b| {
                    b[..8].copy_from_slice(&tag.to_le_bytes());
                    8
                }) {
                    Ok(_) => issued[c as usize] += 1,
                    Err(ScaleCallError {
                        kind: ScaleCallErrorKind::NotActive | ScaleCallErrorKind::SlotsBusy,
                        ..
                    }) => break,
                    Err(e) => panic!("call on {c}: {e}"),
                }
            }
        }
        client.flush();
        serve(server);
        done += client.poll(|tag, r| {
            assert_eq!(r.expect("call failed"), &tag.to_le_bytes()[..]);
        }) as u64;
        for cl in idle.iter_mut() {
            cl.poll(|_, _| panic!("an idle client got a response"));
        }
        assert!(
            start.elapsed() < DEADLINE,
            "no progress: {done}/{}; {:?}",
            calls * n as u64,
            server.scheduler().stats()
        );
    }
}

/// Both members of the stopped group acknowledged (their acknowledgements are in the
/// server's CQ), then the server loop pauses for twice `ack_timeout` before it polls
/// again. Before the fix its scheduler ran first and evicted both although they had
/// acknowledged (and the evicted clients were never told: "stopped" for ever).
#[test]
fn acknowledged_stop_survives_a_server_pause_longer_than_ack_timeout() {
    let (_f, mut server, mut client) = world(4, 2);
    run_calls(&mut server, &mut client, 20, &mut []);
    let g = server.scheduler().active_group().unwrap();
    let members: Vec<u32> = (g * 2..g * 2 + 2).collect();
    poll_until_stopping(&mut server, &members);
    // The clients see the stop with nothing outstanding and acknowledge at once.
    let acks = client.stats().acks;
    client.poll(|_, _| panic!("nothing outstanding"));
    assert_eq!(client.stats().acks, acks + 2);
    std::thread::sleep(2 * ACK_TIMEOUT); // the paused server loop
    server.poll();
    let st = *server.scheduler().stats();
    assert_eq!((st.evictions, st.bad_acks), (0, 0), "{st:?}");
    for &c in &members {
        // Acknowledged (idle), or already warmed up again (the slice of the other group
        // ended during the pause).
        assert!(
            matches!(
                server.conn_state(c),
                Some(ConnState::Idle | ConnState::Active { .. })
            ),
            "{:?}",
            server.conn_state(c)
        );
        assert!(!server.conn_failed(c));
    }
    run_calls(&mut server, &mut client, 50, &mut []);
    assert_eq!(server.scheduler().stats().evictions, 0);
}

/// The stopped group still has calls outstanding (the server took the requests but had
/// not answered) when the server loop pauses for twice `ack_timeout`: the clients could not
/// acknowledge while it was paused. The pause is not charged to them: once the server runs
/// again it answers, they acknowledge, nobody is evicted. Before the fix the first tick
/// after the pause evicted both.
#[test]
fn a_server_pause_with_calls_outstanding_evicts_nobody() {
    let (_f, mut server, mut client) = world(4, 2);
    run_calls(&mut server, &mut client, 20, &mut []);
    let g = server.scheduler().active_group().unwrap();
    let members: Vec<u32> = (g * 2..g * 2 + 2).collect();
    for &c in &members {
        client
            .call(c, 1, 8, 1000 + c as u64, |b| {
                b[..8].copy_from_slice(&(1000 + c as u64).to_le_bytes());
                8
            })
            .unwrap();
    }
    client.flush();
    // Taken by the scan, not answered, until the stop is out.
    poll_until_stopping(&mut server, &members);
    client.poll(|_, _| panic!("not answered yet"));
    assert_eq!(client.outstanding(members[0]), 1);
    std::thread::sleep(2 * ACK_TIMEOUT); // the paused server loop
    let mut got = Vec::new();
    let start = Instant::now();
    while got.len() < 2 {
        serve(&mut server);
        client.poll(|t, r| got.push((t, r.map(<[u8]>::to_vec))));
        assert!(start.elapsed() < DEADLINE);
    }
    got.sort_by_key(|g| g.0);
    for (i, &c) in members.iter().enumerate() {
        let t = 1000 + c as u64;
        assert_eq!(got[i], (t, Ok(t.to_le_bytes().to_vec())));
    }
    serve(&mut server); // reads the acknowledgements
    let st = *server.scheduler().stats();
    assert_eq!((st.evictions, st.bad_acks), (0, 0), "{st:?}");
    run_calls(&mut server, &mut client, 50, &mut []);
    assert_eq!(server.scheduler().stats().evictions, 0);
}

/// A client that never acknowledges (it stopped polling) is evicted after `ack_timeout` of
/// server running time and told: when it polls again, its outstanding call ends with
/// `CallFailure::Evicted` and later calls are refused with `ScaleCallErrorKind::Evicted`,
/// instead of `NotActive` for ever. The server reclaims its connection id.
#[test]
fn an_evicted_client_is_told_and_fails_its_calls() {
    let fabric = Fabric::new(SimConfig::default());
    let mut server = ScaleServer::new(&fabric.open(), server_cfg(4, 2)).unwrap();
    // The silent client owns connections 0 and 1 (group 0), the live one 2 and 3.
    let mut silent = ScaleClient::<u64>::new(&fabric.open(), client_cfg(2)).unwrap();
    let mut live = ScaleClient::<u64>::new(&fabric.open(), client_cfg(2)).unwrap();
    for cl in [&mut silent, &mut live] {
        for _ in 0..2 {
            let (c, info) = cl.create_conn().unwrap();
            let s = server.accept(&info).unwrap();
            cl.connect(c, &s).unwrap();
        }
    }
    assert!(silent.is_active(0));
    // A call the server takes and answers only once the stop is out; the client does not
    // poll, so it never sees the response or the stop and never acknowledges.
    silent
        .call(0, 1, 8, 7, |b| {
            b[..8].copy_from_slice(&7u64.to_le_bytes());
            8
        })
        .unwrap();
    silent.flush();
    poll_until_stopping(&mut server, &[0, 1]);
    // The server keeps running (serving the live client) past the deadline.
    let start = Instant::now();
    while server.scheduler().stats().evictions < 2 || server.stats().reclaimed < 2 {
        serve(&mut server);
        live.poll(|_, _| {});
        assert!(
            start.elapsed() < DEADLINE,
            "{:?}",
            server.scheduler().stats()
        );
    }
    let st = *server.stats();
    assert_eq!((st.evict_notices, st.reclaimed), (2, 2), "{st:?}");
    assert_eq!(server.num_conns(), 2);
    // The silent client wakes up.
    let mut got = Vec::new();
    silent.poll(|t, r| got.push((t, r.map(<[u8]>::to_vec))));
    // Its call was answered before the eviction (RC order: the response precedes the
    // notice), or it ends with the eviction: either way exactly once, never lost.
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0] == (7, Ok(7u64.to_le_bytes().to_vec())) || got[0] == (7, Err(CallFailure::Evicted)),
        "{got:?}"
    );
    assert!(silent.is_evicted(0) && silent.is_evicted(1));
    assert_eq!(silent.stats().evictions, 2);
    assert!(matches!(
        silent.call(1, 1, 8, 9, |_| 8),
        Err(ScaleCallError {
            kind: ScaleCallErrorKind::Evicted,
            user: 9
        })
    ));
    // The live client goes on, alone in the rotation.
    run_calls(&mut server, &mut live, 30, &mut []);
}

/// Connect, call, disconnect, many more times than `max_conns`: the server reclaims each
/// connection (QP, slots, id) on the goodbye, so every new client is accepted and served.
#[test]
fn churn_beyond_max_conns_keeps_working() {
    const MAX: u32 = 4;
    let fabric = Fabric::new(SimConfig::default());
    let mut server = ScaleServer::new(&fabric.open(), server_cfg(MAX, 2)).unwrap();
    // Two long-lived connections keep the rotation (two groups) going meanwhile.
    let mut resident = ScaleClient::<u64>::new(&fabric.open(), client_cfg(2)).unwrap();
    for _ in 0..2 {
        let (c, info) = resident.create_conn().unwrap();
        let s = server.accept(&info).unwrap();
        resident.connect(c, &s).unwrap();
    }
    let rounds = 5 * MAX as u64;
    for round in 0..rounds {
        let mut cl = ScaleClient::<u64>::new(&fabric.open(), client_cfg(2)).unwrap();
        let mut ids = Vec::new();
        for _ in 0..2 {
            let (c, info) = cl.create_conn().unwrap();
            let s = server
                .accept(&info)
                .unwrap_or_else(|e| panic!("round {round}: accept refused: {e}"));
            assert!(s.conn_id < MAX, "ids stay below max_conns");
            ids.push(s.conn_id);
            cl.connect(c, &s).unwrap();
        }
        run_calls(&mut server, &mut cl, 5, &mut [&mut resident]);
        // Goodbye, with a call outstanding on connection 0 (it ends with ConnFailed).
        let start = Instant::now();
        while cl.call(0, 1, 8, 99, |_| 8).is_err() {
            cl.poll(|_, _| {});
            resident.poll(|_, _| {});
            serve(&mut server);
            assert!(start.elapsed() < DEADLINE);
        }
        cl.flush();
        let mut ended = Vec::new();
        for c in 0..2 {
            cl.disconnect(c, |t, r| ended.push((t, r.map(<[u8]>::to_vec))));
        }
        assert_eq!(ended, vec![(99, Err(CallFailure::ConnFailed))]);
        cl.poll(|_, _| {});
        assert!(cl.goodbye_sent(0) && cl.goodbye_sent(1));
        drop(cl);
        serve(&mut server);
        assert_eq!(server.num_conns(), 2, "round {round}: both reclaimed");
        for id in ids {
            assert!(server.conn_failed(id));
        }
        run_calls(&mut server, &mut resident, 3, &mut []);
    }
    let st = *server.stats();
    assert_eq!(st.disconnects, 2 * rounds, "{st:?}");
    assert_eq!(st.reclaimed, 2 * rounds, "{st:?}");
    assert_eq!(st.failed_conns, 0, "a goodbye is not a failure");
    assert_eq!(server.scheduler().stats().evictions, 0);
}

/// A client context dropped without a goodbye (a crash) is found out when the server next
/// sends to its connections (a stop or activation notice fails) and reclaimed.
#[test]
fn a_vanished_client_is_reclaimed_at_its_next_notice() {
    let fabric = Fabric::new(SimConfig::deterministic());
    let mut server = ScaleServer::new(&fabric.open(), server_cfg(4, 2)).unwrap();
    let mut resident = ScaleClient::<u64>::new(&fabric.open(), client_cfg(2)).unwrap();
    let mut gone = ScaleClient::<u64>::new(&fabric.open(), client_cfg(2)).unwrap();
    for cl in [&mut resident, &mut gone] {
        for _ in 0..2 {
            let (c, info) = cl.create_conn().unwrap();
            let s = server.accept(&info).unwrap();
            cl.connect(c, &s).unwrap();
        }
    }
    serve(&mut server);
    drop(gone);
    let start = Instant::now();
    while server.stats().reclaimed < 2 {
        serve(&mut server);
        resident.poll(|_, _| {});
        fabric.progress();
        assert!(start.elapsed() < DEADLINE, "{:?}", server.stats());
    }
    assert_eq!(server.num_conns(), 2);
    // The freed ids take new clients.
    let mut fresh = ScaleClient::<u64>::new(&fabric.open(), client_cfg(2)).unwrap();
    for _ in 0..2 {
        let (c, info) = fresh.create_conn().unwrap();
        let s = server.accept(&info).unwrap();
        fresh.connect(c, &s).unwrap();
    }
    run_calls(&mut server, &mut fresh, 10, &mut [&mut resident]);
    run_calls(&mut server, &mut resident, 10, &mut [&mut fresh]);
}

/// The request's `rpc_type` reaches the server application through the token.
#[test]
fn rpc_type_reaches_the_server() {
    let (_f, mut server, mut client) = world(1, 1);
    for (i, ty) in [0u16, 7, 0xbeef, u16::MAX].into_iter().enumerate() {
        client
            .call(0, ty, 1, i as u64, |b| {
                b[0] = i as u8;
                1
            })
            .unwrap();
        client.flush();
        let start = Instant::now();
        while server.poll() == 0 {
            assert!(start.elapsed() < DEADLINE);
        }
        let (tok, req) = server.recv().unwrap();
        assert_eq!((tok.rpc_type(), req), (ty, &[i as u8][..]));
        server.reply(tok, 0, |_| 0).unwrap();
        server.flush();
        let mut got = None;
        while got.is_none() {
            client.poll(|t, r| got = Some((t, r.is_ok())));
        }
        assert_eq!(got, Some((i as u64, true)));
    }
}

/// The group size follows the NIC's QP-context cache (seeds/003 §3.2): the device model's
/// configured size, the server threads and the safe ratio; a configured cache size (the
/// hardware parameter) replaces the device's; an explicit group size wins over both.
#[test]
fn group_size_is_derived_from_the_qpc_cache_and_the_override_wins() {
    let cx3 = Fabric::new(SimConfig {
        qpc_cache: Some(QpcCacheConfig {
            entries: QpcCacheConfig::CX3_ENTRIES,
            ..QpcCacheConfig::default()
        }),
        ..SimConfig::default()
    });
    let base = ServerConfig {
        max_conns: 10_000,
        slots_per_conn: 1,
        slot_size: Some(64),
        ..ServerConfig::default()
    };
    let size = |fabric: &Fabric, cfg: ServerConfig| {
        ScaleServer::new(&fabric.open(), cfg).unwrap().group_size()
    };
    // Default device model (ConnectX-5 estimate, 1000 entries), one thread: 1000 × 0.8 / 2.
    let cx5 = Fabric::new(SimConfig::default());
    assert_eq!(size(&cx5, base), 400);
    // ConnectX-3 (400 entries): 400 × 0.8 / 2 = 160; with 2 server threads 80; with a 50 %
    // safe ratio and 4 threads 25.
    assert_eq!(size(&cx3, base), 160);
    assert_eq!(
        size(
            &cx3,
            ServerConfig {
                server_threads: 2,
                ..base
            }
        ),
        80
    );
    assert_eq!(
        size(
            &cx3,
            ServerConfig {
                server_threads: 4,
                safe_cache_ratio_pct: 50,
                ..base
            }
        ),
        25
    );
    // Hardware parameter: replaces the device's figure.
    assert_eq!(
        size(
            &cx3,
            ServerConfig {
                qpc_cache_entries: Some(2000),
                ..base
            }
        ),
        800
    );
    // No figure from the device (cache not modelled): the seed's ConnectX-5 estimate.
    let unknown = Fabric::new(SimConfig {
        qpc_cache: None,
        ..SimConfig::default()
    });
    assert_eq!(size(&unknown, base), 400);
    // Capped by max_conns (one group holds them all).
    assert_eq!(
        size(
            &cx3,
            ServerConfig {
                max_conns: 100,
                ..base
            }
        ),
        100
    );
    // The explicit override wins over every derivation input; Off is one group of all.
    let fixed = ServerConfig {
        group_size: GroupSize::Fixed(7),
        qpc_cache_entries: Some(2000),
        server_threads: 3,
        ..base
    };
    assert_eq!(size(&cx3, fixed), 7);
    assert_eq!(
        size(
            &cx3,
            ServerConfig {
                group_size: GroupSize::Off,
                ..base
            }
        ),
        10_000
    );
}
