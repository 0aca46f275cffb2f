//! ScaleRPC with worker threads (seeds/003 §6): a dispatch thread owns the server and feeds
//! a [`WorkerPool`]; a client thread checks every response. Handler times vary, so responses
//! come back out of order across workers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mlx5::sim::{Fabric, SimConfig};
use rpc_runtime::scalerpc::{
    ClientConfig, GroupSize, ScaleCallError, ScaleCallErrorKind, ScaleClient, ScaleServer,
    ServerConfig, WorkerConfig, WorkerPool,
};

/// The response to request `(conn, seq)`: `16 + seq % 48` bytes derived from both.
fn response(conn: u32, seq: u64, out: &mut [u8]) -> usize {
    let n = 16 + (seq % 48) as usize;
    out[..4].copy_from_slice(&conn.to_le_bytes());
    out[4..8].copy_from_slice(&(n as u32).to_le_bytes());
    out[8..16].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in out[16..n].iter_mut().enumerate() {
        *b = (seq as u8).wrapping_mul(31).wrapping_add(i as u8) ^ conn as u8;
    }
    n
}

fn handler(req: &[u8], out: &mut [u8]) -> usize {
    let conn = u32::from_le_bytes(req[..4].try_into().unwrap());
    let seq = u64::from_le_bytes(req[8..16].try_into().unwrap());
    // Every 8th request takes much longer: later requests on other workers overtake it.
    if seq % 8 == 3 {
        std::thread::sleep(Duration::from_micros(200));
    }
    response(conn, seq, out)
}

#[test]
fn four_workers_sixteen_connections() {
    const CONNS: u32 = 16;
    let per_conn: u64 = if cfg!(debug_assertions) { 400 } else { 4000 };
    let fabric = Fabric::new(SimConfig::default());
    let mut server = ScaleServer::new(
        &fabric.open(),
        ServerConfig {
            max_conns: CONNS,
            group_size: GroupSize::Fixed(8),
            slots_per_conn: 4,
            slot_size: Some(256),
            slice: Duration::from_micros(100),
            warmup: Duration::from_micros(20),
            ..ServerConfig::default()
        },
    )
    .unwrap();
    let mut client = ScaleClient::<u64>::new(
        &fabric.open(),
        ClientConfig {
            max_conns: CONNS,
            slots_per_conn: 4,
            slot_size: Some(256),
            ..ClientConfig::default()
        },
    )
    .unwrap();
    let mut sconn = Vec::new();
    for _ in 0..CONNS {
        let (c, info) = client.create_conn().unwrap();
        let s = server.accept(&info).unwrap();
        client.connect(c, &s).unwrap();
        sconn.push(s.conn_id);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let dispatch = std::thread::spawn(move || {
        let mut pool = WorkerPool::with_config(
            &server,
            WorkerConfig {
                workers: 4,
                depth: 32,
            },
            handler,
        )
        .unwrap();
        assert_eq!(pool.workers(), 4);
        while !(st.load(Ordering::Acquire) && pool.in_flight() == 0) {
            if pool.poll(&mut server) == 0 {
                std::thread::yield_now();
            }
        }
        (server, *pool.stats(), pool.handled_per_worker())
    });

    let started = Instant::now();
    let mut issued = vec![0u64; CONNS as usize];
    let mut done = vec![vec![false; per_conn as usize]; CONNS as usize];
    let mut last = vec![None::<u64>; CONNS as usize];
    let mut overtaken = 0u64;
    let mut completed = 0u64;
    let mut buf = [0u8; 64];
    while completed < per_conn * CONNS as u64 {
        for c in 0..CONNS {
            while issued[c as usize] < per_conn {
                let seq = issued[c as usize];
                let tag = (c as u64) << 32 | seq;
                let s = sconn[c as usize];
                match client.call(c, 0, 16, tag, |b| {
                    b[..4].copy_from_slice(&s.to_le_bytes());
                    b[4..8].fill(0);
                    b[8..16].copy_from_slice(&seq.to_le_bytes());
                    16
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
        let n = client.poll(|tag, r| {
            let (c, seq) = ((tag >> 32) as u32, tag & 0xffff_ffff);
            let r = r.expect("call failed");
            let len = response(sconn[c as usize], seq, &mut buf);
            assert_eq!(r, &buf[..len], "response to ({c}, {seq})");
            assert!(!done[c as usize][seq as usize], "({c}, {seq}) twice");
            done[c as usize][seq as usize] = true;
            if last[c as usize].is_some_and(|l| l > seq) {
                overtaken += 1;
            }
            last[c as usize] = Some(last[c as usize].map_or(seq, |l| l.max(seq)));
        });
        if n == 0 {
            std::thread::yield_now();
        }
        completed += n as u64;
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "stuck at {completed}"
        );
    }
    stop.store(true, Ordering::Release);
    let (server, stats, per_worker) = dispatch.join().unwrap();
    eprintln!(
        "{:.2?}: {stats:?}, per worker {per_worker:?}, overtaken {overtaken}, {:?}",
        started.elapsed(),
        server.scheduler().stats()
    );
    let total = per_conn * CONNS as u64;
    assert!(done.iter().flatten().all(|&d| d));
    assert_eq!(stats.dispatched, total);
    assert_eq!(stats.replied, total);
    assert_eq!(stats.reply_errors, 0);
    assert_eq!(per_worker.iter().sum::<u64>(), total);
    assert!(per_worker.iter().all(|&n| n > 0), "every worker served");
    assert!(overtaken > 0, "responses came back out of issue order");
    assert_eq!(server.stats().requests, total);
    assert!(server.scheduler().stats().switches > 0);
}

#[test]
fn a_panicking_handler_is_reported_on_the_dispatch_thread() {
    let fabric = Fabric::new(SimConfig::default());
    let mut server = ScaleServer::new(
        &fabric.open(),
        ServerConfig {
            max_conns: 1,
            slot_size: Some(256),
            ..ServerConfig::default()
        },
    )
    .unwrap();
    let mut client = ScaleClient::<u64>::new(&fabric.open(), ClientConfig::default()).unwrap();
    let (c, info) = client.create_conn().unwrap();
    let s = server.accept(&info).unwrap();
    client.connect(c, &s).unwrap();
    let mut pool = WorkerPool::spawn(&server, 2, |req: &[u8], _: &mut [u8]| {
        assert!(req != b"boom", "handler failure");
        0
    })
    .unwrap();
    client
        .call(c, 0, 4, 1, |b| {
            b[..4].copy_from_slice(b"boom");
            4
        })
        .unwrap();
    client.flush();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            pool.poll(&mut server);
        }
    }));
    assert!(
        r.is_err(),
        "the handler's panic surfaced on the dispatch thread"
    );
    assert!(WorkerPool::spawn(&server, 0, |_: &[u8], _: &mut [u8]| 0).is_err());
}

/// A typed worker handler gets each request's `rpc_type`.
#[test]
fn workers_see_the_rpc_type() {
    let fabric = Fabric::new(SimConfig::default());
    let mut server = ScaleServer::new(
        &fabric.open(),
        ServerConfig {
            max_conns: 1,
            slot_size: Some(256),
            ..ServerConfig::default()
        },
    )
    .unwrap();
    let mut client = ScaleClient::<u64>::new(&fabric.open(), ClientConfig::default()).unwrap();
    let (c, info) = client.create_conn().unwrap();
    let s = server.accept(&info).unwrap();
    client.connect(c, &s).unwrap();
    let mut pool = WorkerPool::with_config_typed(
        &server,
        WorkerConfig {
            workers: 2,
            depth: 0,
        },
        |ty: u16, _: &[u8], out: &mut [u8]| {
            out[..2].copy_from_slice(&ty.to_le_bytes());
            2
        },
    )
    .unwrap();
    let types = [0u16, 3, 0x1234, u16::MAX];
    for (i, &ty) in types.iter().enumerate() {
        client.call(c, ty, 0, i as u64, |_| 0).unwrap();
    }
    client.flush();
    let mut got = vec![None; types.len()];
    let t = Instant::now();
    while got.iter().any(Option::is_none) {
        assert!(t.elapsed() < Duration::from_secs(30), "{got:?}");
        pool.poll(&mut server);
        client.poll(|i, r| {
            got[i as usize] = Some(u16::from_le_bytes(r.unwrap().try_into().unwrap()));
        });
    }
    let got: Vec<u16> = got.into_iter().map(Option::unwrap).collect();
    assert_eq!(got, types);
}
