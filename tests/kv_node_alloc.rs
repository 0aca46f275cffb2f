//! The routing daemons' variable-length path allocates nothing per request once warm
//! (issue 15): `KvVar` puts and gets from a typed ipc client to one rank's two daemons
//! (`NodeDaemon::run_once_raw` with the generated `dispatch_raw`, a router reading the key
//! in place, half the keys served by the other daemon over Flux), their responses read with
//! `poll_ref` (a get's value checked in the receive buffer), all run on the test thread, make
//! no heap allocation on that thread. The scenario is `examples/kv_daemon_path.rs`, whose
//! counting global allocator counts per thread, only on a thread that switched counting on
//! (the pattern of `rpc-runtime/tests/copyrpc_alloc.rs`, with the count itself per thread so
//! that the tests of this binary, which count at the same time, do not see each other's
//! allocations). The remote path (copyrpc between two ranks) is checked too.

#[path = "../examples/kv_daemon_path.rs"]
#[allow(dead_code)]
mod path;

use std::cell::Cell;

use idl::kv::KvVarService;
use path::{Bench, Mode, allocations};
use rpc::Service;

fn warm(mode: Mode, tag: &str) -> Bench {
    let mut b = Bench::new(&format!("kvalloc-{}-{tag}", std::process::id()), mode);
    // Warm-up: every key stored (with its final length), queues at their working sizes.
    for _ in 0..3000 {
        b.step();
    }
    assert_eq!(b.bad, 0, "bad responses in the warm-up");
    b
}

#[test]
fn kv_var_puts_and_gets_through_the_daemons_allocate_nothing_once_warm() {
    let mut b = warm(Mode::Raw, "raw");
    let (puts0, hits0) = (b.puts, b.hits);
    let n = allocations(|| {
        for _ in 0..3000 {
            b.step();
        }
    });
    let (puts, hits) = (b.puts - puts0, b.hits - hits0);
    assert_eq!(b.bad, 0, "bad responses");
    assert!(puts > 2000 && hits > 2000, "puts {puts}, gets {hits}");
    let s = b.stats();
    assert!(
        s[1].flux_served > 1000,
        "the other shard over Flux: {:?}",
        s[1]
    );
    assert_eq!(
        (
            s[0].bad_requests,
            s[0].oversized_responses,
            s[0].dropped_replies
        ),
        (0, 0, 0)
    );
    assert_eq!(n, 0, "allocations in {puts} puts and {hits} gets");
}

/// The counter sees allocations: the owned path (`run_once` + `poll_with`) of the same
/// scenario allocates a key `String` per request, a value `Vec` per put and per get
/// answered.
#[test]
fn the_owned_path_allocates_per_call() {
    let mut b = warm(Mode::Owned, "owned");
    let c0 = b.calls();
    let n = allocations(|| {
        for _ in 0..300 {
            b.step();
        }
    });
    let calls = b.calls() - c0;
    assert_eq!(b.bad, 0);
    assert!(calls > 200, "{calls} calls");
    assert!(n >= 2 * calls, "{n} allocations in {calls} calls");
    // Decoding one put into its owned request: a `String` and a `Vec`.
    let mut buf = vec![0u64; 64];
    let out = rpc::__private::zerocopy::IntoBytes::as_mut_bytes(&mut buf[..]);
    let len = KvVarService::__rpc_put_req_write(out, 0, "k0001", b"some value");
    let msg = &out[..len];
    let mut req = None;
    let allocs = allocations(|| req = Some(KvVarService::decode_request(msg).unwrap()));
    assert_eq!(allocs, 2, "a String and a Vec");
    drop(req);
}

/// The remote path too: two ranks of two Meta daemons (`Placement::Distributed`: rank 0's
/// endpoint towards rank 1 on its daemon 1, rank 1's towards rank 0 on its daemon 0) on the
/// device model, run synchronously on the test thread (`SimConfig::deterministic`). Rank 0's
/// client calls its daemon 0 for keys of both ranks: a call for rank 1 is passed over Flux to
/// daemon 1, sent over copyrpc, served by rank 1's daemon 0 (copied out of the receive ring)
/// or passed on over Flux to its daemon 1, and the answer relayed back the same way. Once
/// warm, none of it allocates on this thread.
#[test]
fn remote_calls_over_copyrpc_and_flux_allocate_nothing_once_warm() {
    use idl::kv::{KvVarClient, KvVarResponseRef};
    use mlx5::sim::{Fabric, SimConfig};
    use rpc::RpcError;
    use rpc::copyrpc::{Context, ContextConfig, EndpointConfig};
    use rpc::delegation::node::{NodeConfig, NodeDaemon, Placement};
    use rpc::flux::{self, FluxConfig};
    use rpc::ipc::{Ipc, IpcConfig, IpcServer};

    type Daemon = NodeDaemon<KvVarService, IpcServer, path::RawRouter, { path::MSG_CAP }>;
    let fabric = Fabric::new(SimConfig::deterministic());
    let base = format!("kvalloc-{}-remote", std::process::id());
    let cfg = IpcConfig {
        max_clients: 2,
        depth: 16,
        ..IpcConfig::default()
    };
    let ecfg = EndpointConfig {
        ring_size: 1 << 16,
        fingerprint: KvVarService::DESCRIPTOR.fingerprint,
        ..EndpointConfig::default()
    };
    // nodes[rank][daemon]
    let mut nodes: Vec<Vec<Daemon>> = Vec::new();
    for rank in 0..2u32 {
        let dev = fabric.open();
        let fluxes = flux::network(path::DAEMONS as usize, FluxConfig::default()).unwrap();
        let mut ds = Vec::new();
        for (d, f) in (0..path::DAEMONS).zip(fluxes) {
            let name = format!("{base}-{rank}-{d}");
            let local = IpcServer::create(&name, KvVarService::DESCRIPTOR, cfg).unwrap();
            let ncfg = NodeConfig::new(Placement::Distributed, (rank, 2), (d, path::DAEMONS));
            let mut n = Daemon::new(ncfg, local, f, path::raw_route as path::RawRouter).unwrap();
            if d == Placement::Distributed.holder(1 - rank, path::DAEMONS) {
                n.set_context(Context::new(&dev, ContextConfig::default()).unwrap());
            }
            ds.push(n);
        }
        nodes.push(ds);
    }
    let (h0, h1) = (
        Placement::Distributed.holder(1, path::DAEMONS) as usize,
        Placement::Distributed.holder(0, path::DAEMONS) as usize,
    );
    let e0 = nodes[0][h0]
        .context_mut()
        .unwrap()
        .create_endpoint(&ecfg)
        .unwrap();
    let e1 = nodes[1][h1]
        .context_mut()
        .unwrap()
        .create_endpoint(&ecfg)
        .unwrap();
    let i0 = nodes[0][h0].context().unwrap().local_info(e0).unwrap();
    let i1 = nodes[1][h1].context().unwrap().local_info(e1).unwrap();
    nodes[0][h0]
        .context_mut()
        .unwrap()
        .connect(e0, &i1)
        .unwrap();
    nodes[1][h1]
        .context_mut()
        .unwrap()
        .connect(e1, &i0)
        .unwrap();
    nodes[0][h0].set_peer(1, e0).unwrap();
    nodes[1][h1].set_peer(0, e1).unwrap();
    let mut shards: Vec<Vec<path::Shard>> = (0..2)
        .map(|_| (0..path::DAEMONS).map(|_| path::Shard::default()).collect())
        .collect();
    let mut client = KvVarClient::<Ipc>::connect(&format!("{base}-0-0")).unwrap();
    let depth = client.max_in_flight();
    let mut tags: Vec<Option<(u64, bool)>> = vec![None; depth];
    let mut free: Vec<u64> = (0..depth as u64).collect();
    let mut value = vec![0u8; 4096];
    let mut next = 0u64;
    // Read between steps while `step` holds the rest.
    let (puts, hits, bad) = (Cell::new(0u64), Cell::new(0u64), Cell::new(0u64));
    let mut step = || {
        while let Some(&tag) = free.last() {
            // Keys 0..64 on rank 1, 64..128 on rank 0.
            let id = next % (2 * path::KEYS);
            let rank = u32::from(id < path::KEYS);
            let get = (next / (2 * path::KEYS)) % 2 == 1;
            let mut kb = [0u8; 5];
            let k = path::key(id, &mut kb);
            let r = if get {
                client.issue(tag).get(rank, k)
            } else {
                let n = path::value(id, next, &mut value);
                client.issue(tag).put(rank, k, &value[..n])
            };
            match r {
                Ok(()) => {}
                Err(RpcError::WouldBlock) => break,
                Err(e) => panic!("issue: {e}"),
            }
            free.pop();
            tags[tag as usize] = Some((id, get));
            next += 1;
        }
        for _ in 0..3 {
            for (r, ds) in nodes.iter_mut().enumerate() {
                for (d, n) in ds.iter_mut().enumerate() {
                    let shard = &mut shards[r][d];
                    n.run_once_raw(|msg, out| KvVarService::dispatch_raw(shard, msg, out));
                }
            }
        }
        client
            .poll_ref(|tag, r| {
                match (tags.get_mut(tag as usize).and_then(Option::take), r) {
                    (Some((_, false)), Ok(KvVarResponseRef::Put(()))) => puts.set(puts.get() + 1),
                    (Some((id, true)), Ok(KvVarResponseRef::Get(Some(v))))
                        if path::intact(id, v) =>
                    {
                        hits.set(hits.get() + 1)
                    }
                    _ => bad.set(bad.get() + 1),
                }
                free.push(tag);
            })
            .expect("poll");
    };
    for _ in 0..3000 {
        step();
    }
    assert_eq!(bad.get(), 0, "bad responses in the warm-up");
    let (puts0, hits0) = (puts.get(), hits.get());
    let n = allocations(|| {
        for _ in 0..3000 {
            step();
        }
    });
    let _ = &step;
    let (puts, hits) = (puts.get() - puts0, hits.get() - hits0);
    assert_eq!(bad.get(), 0, "bad responses");
    assert!(puts > 2000 && hits > 2000, "puts {puts}, gets {hits}");
    let copyrpc: u64 = nodes[0].iter().map(|d| d.stats().copyrpc_calls).sum();
    let remote: u64 = nodes[1].iter().map(|d| d.stats().remote_served).sum();
    let via_flux: u64 = nodes[1].iter().map(|d| d.stats().flux_served).sum();
    assert!(
        copyrpc > 2000 && remote > 500 && via_flux > 500,
        "{copyrpc} {remote} {via_flux}"
    );
    for s in nodes.iter().flatten().map(|d| *d.stats()) {
        assert_eq!(
            (
                s.bad_requests,
                s.oversized_responses,
                s.dropped_replies,
                s.wait_timeouts
            ),
            (0, 0, 0, 0),
            "{s:?}"
        );
    }
    assert_eq!(n, 0, "allocations once warm");
}
