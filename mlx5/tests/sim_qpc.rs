//! Device model, QPC cache: per-device LRU of QP contexts, hits and misses on the requester
//! and responder NICs, thrashing, the miss penalty, eviction of destroyed QPs, the disabled
//! cache.

mod sim_common;

use std::time::{Duration, Instant};

use mlx5::sim::{Fabric, QpcCacheConfig, QpcStats, SimConfig};
use mlx5::verbs::{Access, Cq, Qp, QpCaps, QpType, RcParams};
use mlx5::wqe::{Opcode, WqeDesc};
use sim_common::*;

fn fabric(entries: usize, penalty: Duration) -> Fabric {
    Fabric::new(SimConfig {
        qpc_cache: Some(QpcCacheConfig {
            entries,
            miss_penalty: penalty,
        }),
        ..SimConfig::deterministic()
    })
}

/// A client node and a server node with `n` connected RC QP pairs (client QP i ↔ server QP
/// i). Field order = drop order: QPs before the CQs and MR they use.
struct Rig {
    pairs: Vec<(Qp, Qp)>,
    dst: Buf,
    cqa: Cq,
    cqb: Cq,
    client: Node,
    server: Node,
    fabric: Fabric,
}

impl Rig {
    fn new(fabric: &Fabric, n: usize) -> Rig {
        let client = Node::new(fabric);
        let server = Node::new(fabric);
        let cqa = client.cq(64);
        let cqb = server.cq(64);
        let dst = server.buf(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        let mut rig = Rig {
            pairs: Vec::new(),
            dst,
            cqa,
            cqb,
            client,
            server,
            fabric: fabric.clone(),
        };
        for _ in 0..n {
            rig.add_pair();
        }
        rig
    }

    fn add_pair(&mut self) {
        let mut qa = self
            .client
            .qp(QpType::Rc, &self.cqa, &self.cqa, None, QpCaps::default());
        let mut qb = self
            .server
            .qp(QpType::Rc, &self.cqb, &self.cqb, None, QpCaps::default());
        connect(
            &self.client,
            &mut qa,
            &self.server,
            &mut qb,
            &RcParams::default(),
        );
        self.pairs.push((qa, qb));
    }

    /// One signaled 8-byte inline RDMA WRITE on client QP `i`, completed.
    fn write(&mut self, i: usize) {
        let (qa, _) = &mut self.pairs[i];
        let d = WqeDesc {
            remote: Some(self.dst.raddr(8 * (i % 512))),
            inline: &(i as u64).to_le_bytes(),
            ..desc(Opcode::RdmaWrite)
        };
        post(qa, &d);
        let c = poll(&self.fabric, &mut self.cqa.cq);
        expect_ok(&c, mlx5::cqe::CqeOpcode::Req);
        qa.sq.retire(c.wqe_counter);
    }

    fn client_stats(&self) -> QpcStats {
        self.fabric.qpc_stats(self.client.ctx.port().lid).unwrap()
    }

    fn server_stats(&self) -> QpcStats {
        self.fabric.qpc_stats(self.server.ctx.port().lid).unwrap()
    }
}

#[test]
fn default_config_is_a_cx5_cache_with_500ns_penalty() {
    let c = SimConfig::default().qpc_cache.expect("enabled by default");
    assert_eq!(c.entries, 1000);
    assert_eq!(c.entries, QpcCacheConfig::CX5_ENTRIES);
    assert_eq!(QpcCacheConfig::CX3_ENTRIES, 400);
    assert_eq!(c.miss_penalty, Duration::from_nanos(500));
    assert_eq!(c, QpcCacheConfig::default());
}

#[test]
fn working_set_within_cache_misses_only_on_first_touch() {
    let f = fabric(4, Duration::ZERO);
    let mut rig = Rig::new(&f, 3);
    // Creating and connecting QPs loads no context.
    assert_eq!(rig.client_stats(), QpcStats::default());
    const ROUNDS: u64 = 50;
    for _ in 0..ROUNDS {
        for i in 0..3 {
            rig.write(i);
        }
    }
    let want = QpcStats {
        hits: 3 * ROUNDS - 3,
        misses: 3,
        evictions: 0,
        resident: 3,
    };
    // Requester lookups on the client NIC, responder lookups on the server NIC.
    assert_eq!(rig.client_stats(), want);
    assert_eq!(rig.server_stats(), want);
    let s = f.stats();
    assert_eq!(s.qpc_misses, 6);
    assert_eq!(s.qpc_hits, 2 * (3 * ROUNDS - 3));
    assert_eq!(s.wqes.rdma_write, 3 * ROUNDS);
}

#[test]
fn round_robin_over_more_qps_than_entries_thrashes() {
    let f = fabric(4, Duration::ZERO);
    let mut rig = Rig::new(&f, 8);
    const ROUNDS: u64 = 20;
    for _ in 0..ROUNDS {
        for i in 0..8 {
            rig.write(i);
        }
    }
    // LRU with a cyclic working set of 8 > 4: every access misses.
    let want = QpcStats {
        hits: 0,
        misses: 8 * ROUNDS,
        evictions: 8 * ROUNDS - 4,
        resident: 4,
    };
    assert_eq!(rig.client_stats(), want);
    assert_eq!(rig.server_stats(), want);
    assert_eq!(rig.client_stats().miss_ratio(), 1.0);
    assert_eq!(f.stats().qpc_misses, 2 * 8 * ROUNDS);
    assert_eq!(f.stats().qpc_hits, 0);
}

#[test]
fn lru_keeps_the_recently_used() {
    let f = fabric(4, Duration::ZERO);
    let mut rig = Rig::new(&f, 5);
    for i in 0..4 {
        rig.write(i);
    }
    rig.write(0); // 0 becomes most recent; 1 is the LRU
    let before = rig.client_stats();
    rig.write(4); // evicts 1
    rig.write(0);
    rig.write(2);
    rig.write(3);
    let d = rig.client_stats().since(&before);
    assert_eq!((d.hits, d.misses, d.evictions), (3, 1, 1));
    rig.write(1); // was evicted
    assert_eq!(rig.client_stats().since(&before).misses, 2);
}

#[test]
fn miss_penalty_slows_execution() {
    let penalty = Duration::from_micros(20);
    let f = fabric(4, penalty);
    let mut rig = Rig::new(&f, 8);
    // 100 WRITEs over 8 QPs round robin: 100 client + 100 server misses.
    let start = Instant::now();
    for k in 0..100 {
        rig.write(k % 8);
    }
    let el = start.elapsed();
    let misses = f.stats().qpc_misses;
    assert_eq!(misses, 200);
    assert!(
        el >= penalty * misses as u32,
        "{misses} misses of {penalty:?} took only {el:?}"
    );
}

#[test]
fn destroyed_qp_leaves_the_cache() {
    let f = fabric(4, Duration::ZERO);
    let mut rig = Rig::new(&f, 4);
    for i in 0..4 {
        rig.write(i);
    }
    assert_eq!(rig.client_stats().resident, 4);
    // Destroy the most recently used pair: its entries leave both NICs' caches.
    drop(rig.pairs.pop());
    assert_eq!(rig.client_stats().resident, 3);
    assert_eq!(rig.server_stats().resident, 3);
    // A new pair takes the free entry: nothing live is evicted, so after its first touch
    // every access over the four live pairs hits.
    rig.add_pair();
    let before = (rig.client_stats(), rig.server_stats());
    for _ in 0..5 {
        for i in 0..4 {
            rig.write(i);
        }
    }
    for (now, then) in [
        (rig.client_stats(), before.0),
        (rig.server_stats(), before.1),
    ] {
        let d = now.since(&then);
        assert_eq!((d.misses, d.hits, d.evictions, d.resident), (1, 19, 0, 4));
    }
}

#[test]
fn disabled_cache_counts_nothing() {
    let f = Fabric::new(SimConfig {
        qpc_cache: None,
        ..SimConfig::deterministic()
    });
    let mut rig = Rig::new(&f, 8);
    for k in 0..64 {
        rig.write(k % 8);
    }
    assert_eq!(f.stats().wqes.rdma_write, 64);
    assert_eq!((f.stats().qpc_hits, f.stats().qpc_misses), (0, 0));
    assert_eq!(rig.client_stats(), QpcStats::default());
    assert_eq!(rig.server_stats(), QpcStats::default());
}

#[test]
fn send_and_read_look_up_both_sides() {
    let f = fabric(4, Duration::ZERO);
    let mut p = RcPair::new(&f, QpCaps::default(), &RcParams::default());
    let lid = |n: &Node| n.ctx.port().lid;
    let buf_a = p.a.buf(64, all_access());
    let buf_b = p.b.buf(64, all_access());
    // SEND: consumes a receive WQE at B.
    post_recv(&mut p.qb, &[buf_b.sge(0, 16)]);
    post(
        &mut p.qa,
        &WqeDesc {
            inline: b"hello",
            ..desc(Opcode::Send)
        },
    );
    let c = poll(&f, &mut p.cqa.cq);
    p.qa.sq.retire(c.wqe_counter);
    poll(&f, &mut p.cqb.cq);
    // READ from B into A.
    let sge = [buf_a.sge(0, 8)];
    post(
        &mut p.qa,
        &WqeDesc {
            remote: Some(buf_b.raddr(0)),
            sges: &sge,
            ..desc(Opcode::RdmaRead)
        },
    );
    let c = poll(&f, &mut p.cqa.cq);
    p.qa.sq.retire(c.wqe_counter);
    let a = f.qpc_stats(lid(&p.a)).unwrap();
    let b = f.qpc_stats(lid(&p.b)).unwrap();
    assert_eq!((a.misses, a.hits), (1, 1));
    assert_eq!((b.misses, b.hits), (1, 1));
    // No device with LID 0.
    assert_eq!(f.qpc_stats(0), None);
}

#[test]
fn ud_delivery_looks_up_the_destination_qp() {
    let f = fabric(4, Duration::ZERO);
    let (a, b) = (Node::new(&f), Node::new(&f));
    let (cqa, mut cqb) = (a.cq(64), b.cq(64));
    let mut qa = a.qp(QpType::Ud, &cqa, &cqa, None, QpCaps::default());
    let mut qb = b.qp(QpType::Ud, &cqb, &cqb, None, QpCaps::default());
    qa.activate_ud(7).unwrap();
    qb.activate_ud(7).unwrap();
    let rbuf = b.buf(4096, Access::LOCAL_WRITE);
    let av = a.ah(&b.ud_dest(&qb, 7));
    for k in 0..3 {
        post_recv(&mut qb, &[rbuf.sge(0, 1024)]);
        post(
            &mut qa,
            &WqeDesc {
                flags: 0,
                ud: Some(av),
                inline: &[k as u8; 16],
                ..desc(Opcode::Send)
            },
        );
        poll(&f, &mut cqb.cq);
    }
    // A packet to a QPN that does not exist is dropped before any lookup.
    let bad = a.ah(&mlx5::verbs::UdDest {
        qpn: 0xabcdef,
        ..b.ud_dest(&qb, 7)
    });
    post(
        &mut qa,
        &WqeDesc {
            flags: 0,
            ud: Some(bad),
            inline: &[0; 16],
            ..desc(Opcode::Send)
        },
    );
    assert_eq!(f.stats().ud_no_dest, 1);
    let sa = f.qpc_stats(a.ctx.port().lid).unwrap();
    let sb = f.qpc_stats(b.ctx.port().lid).unwrap();
    assert_eq!((sa.misses, sa.hits), (1, 3));
    assert_eq!((sb.misses, sb.hits), (1, 2));
    drop((qa, qb));
}

#[test]
#[should_panic(expected = "qpc_cache entries must be >= 1")]
fn zero_entries_is_rejected() {
    fabric(0, Duration::ZERO);
}
