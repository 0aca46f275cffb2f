//! ScaleRPC echo across many connections and groups on the device model: every call
//! completes exactly once with its own bytes, across many group switches.

use std::time::Duration;

use mlx5::sim::{Fabric, SimConfig};
use rpc_runtime::scalerpc::{
    ClientConfig, GroupSize, ResponseMode, ScaleCallError, ScaleCallErrorKind, ScaleClient,
    ScaleServer, ServerConfig,
};

fn run(
    conns: u32,
    group: GroupSize,
    calls_per_conn: u64,
    mode: ResponseMode,
) -> (ScaleServer, ScaleClient<u64>) {
    let fabric = Fabric::new(SimConfig::default());
    let mut server = ScaleServer::new(
        &fabric.open(),
        ServerConfig {
            max_conns: conns,
            group_size: group,
            slots_per_conn: 4,
            slot_size: Some(256),
            slice: Duration::from_micros(50),
            warmup: Duration::from_micros(10),
            response_mode: mode,
            ..ServerConfig::default()
        },
    )
    .unwrap();
    let mut client = ScaleClient::<u64>::new(
        &fabric.open(),
        ClientConfig {
            max_conns: conns,
            slots_per_conn: 4,
            slot_size: Some(256),
            ..ClientConfig::default()
        },
    )
    .unwrap();
    for _ in 0..conns {
        let (c, info) = client.create_conn().unwrap();
        let s = server.accept(&info).unwrap();
        client.connect(c, &s).unwrap();
    }
    let total = conns as u64 * calls_per_conn;
    let mut issued = vec![0u64; conns as usize];
    let mut done = vec![false; (total) as usize];
    let mut completed = 0u64;
    let mut idle = 0u64;
    while completed < total {
        for c in 0..conns {
            while issued[c as usize] < calls_per_conn {
                let tag = c as u64 * calls_per_conn + issued[c as usize];
                match client.call(c, 1, 16, tag, |b| {
                    b[..8].copy_from_slice(&tag.to_le_bytes());
                    b[8..16].copy_from_slice(&(!tag).to_le_bytes());
                    16
                }) {
                    Ok(_) => issued[c as usize] += 1,
                    Err(ScaleCallError {
                        kind: ScaleCallErrorKind::NotActive | ScaleCallErrorKind::SlotsBusy,
                        ..
                    }) => break,
                    Err(e) => panic!("call failed: {e}"),
                }
            }
        }
        client.flush();
        server.poll();
        while let Some((tok, req)) = server.recv() {
            let mut r = [0u8; 16];
            r.copy_from_slice(req);
            server
                .reply(tok, 16, |b| {
                    b[..16].copy_from_slice(&r);
                    16
                })
                .unwrap();
        }
        server.flush();
        let n = client.poll(|tag, r| {
            let r = r.expect("call failed");
            assert_eq!(r.len(), 16);
            assert_eq!(u64::from_le_bytes(r[..8].try_into().unwrap()), tag);
            assert_eq!(u64::from_le_bytes(r[8..].try_into().unwrap()), !tag);
            assert!(!done[tag as usize], "call {tag} completed twice");
            done[tag as usize] = true;
        });
        completed += n as u64;
        idle = if n == 0 { idle + 1 } else { 0 };
        assert!(idle < 5_000_000, "no progress: {completed}/{total}");
    }
    assert!(done.iter().all(|&d| d));
    (server, client)
}

#[test]
fn echo_one_group() {
    let (s, _) = run(16, GroupSize::Off, 2000, ResponseMode::Write);
    assert_eq!(s.scheduler().stats().switches, 0);
}

#[test]
fn echo_across_group_switches() {
    let (s, c) = run(16, GroupSize::Fixed(4), 2000, ResponseMode::Write);
    let st = s.scheduler().stats();
    assert!(st.switches > 10, "{st:?}");
    assert_eq!(st.evictions, 0);
    assert_eq!(c.stats().responses, 16 * 2000);
}

#[test]
fn echo_read_mode_across_switches() {
    let (s, c) = run(8, GroupSize::Fixed(2), 1000, ResponseMode::Read);
    assert!(s.scheduler().stats().switches > 4);
    assert!(c.stats().reads > 0);
}
