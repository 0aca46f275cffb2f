//! Device model, UD through the driver: several destinations, GRH area, Q_Key and QPN checks,
//! silent drops, MTU, SRQ with UD, and fault-injection determinism.

mod sim_common;

use mlx5::cqe::{CqeOpcode, Syndrome};
use mlx5::sim::{Fabric, SimConfig, SimStats, UdFaults};
use mlx5::verbs::{Access, Cq, Qp, QpCaps, QpType};
use mlx5::wqe::{CQ_UPDATE, DgramSeg, Opcode, WqeDesc};
use sim_common::*;

const QKEY: u32 = 0x1111_0000;
const GRH: usize = 40;

struct UdNode {
    node: Node,
    cq: Cq,
    qp: Qp,
    buf: Buf,
}

impl UdNode {
    fn new(f: &Fabric, qkey: u32) -> UdNode {
        let node = Node::new(f);
        let cq = node.cq(256);
        let caps = QpCaps {
            max_recv_wr: 64,
            ..QpCaps::default()
        };
        let mut qp = node.qp(QpType::Ud, &cq, &cq, None, caps);
        qp.activate_ud(qkey).unwrap();
        let buf = node.buf(64 * 8192, Access::LOCAL_WRITE);
        UdNode { node, cq, qp, buf }
    }

    /// Posts a receive of `len` bytes in slot `slot`.
    fn recv(&mut self, slot: usize, len: u32) {
        let s = self.buf.sge(slot * 8192, len);
        post_recv(&mut self.qp, &[s]);
    }

    fn av(&self, qkey: u32) -> DgramSeg {
        self.node.ah(&self.node.ud_dest(&self.qp, qkey))
    }
}

fn send<'a>(av: DgramSeg, payload: &'a [u8], imm: Option<u32>) -> WqeDesc<'a> {
    WqeDesc {
        opcode: if imm.is_some() {
            Opcode::SendImm
        } else {
            Opcode::Send
        },
        imm: imm.unwrap_or(0),
        ud: Some(av),
        inline: payload,
        ..desc(Opcode::Send)
    }
}

#[test]
fn ud_to_several_destinations() {
    let f = Fabric::new(SimConfig::deterministic());
    let mut s = UdNode::new(&f, QKEY);
    let mut dests: Vec<UdNode> = (0..3).map(|_| UdNode::new(&f, QKEY)).collect();
    let src = s.node.buf(4096, Access::empty());
    src.write(0, &(0..=255u8).cycle().take(4096).collect::<Vec<_>>());
    for (k, d) in dests.iter_mut().enumerate() {
        for slot in 0..4 {
            d.recv(slot, 8192);
        }
        // Pre-fill the GRH area to see it cleared.
        d.buf.write(0, &[0xee; GRH]);
        let _ = k;
    }
    for round in 0..4u32 {
        for (k, d) in dests.iter().enumerate() {
            let av = d.av(QKEY);
            let payload = vec![k as u8 + 1; 10 + round as usize];
            let imm = (round % 2 == 1).then_some(round * 100 + k as u32);
            let idx = post(&mut s.qp, &send(av, &payload, imm));
            let c = poll(&f, &mut s.cq.cq);
            expect_ok(&c, CqeOpcode::Req);
            assert_eq!(c.wqe_counter, idx);
            s.qp.sq.retire(c.wqe_counter);
        }
        for (k, d) in dests.iter_mut().enumerate() {
            let r = poll(&f, &mut d.cq.cq);
            let len = 10 + round as usize;
            if round % 2 == 1 {
                expect_ok(&r, CqeOpcode::RespSendImm);
                assert_eq!(r.imm, round * 100 + k as u32);
            } else {
                expect_ok(&r, CqeOpcode::RespSend);
            }
            assert_eq!(r.byte_cnt as usize, GRH + len);
            assert_eq!(
                (r.src_qpn, r.qpn, r.wqe_counter, r.grh),
                (s.qp.qpn(), d.qp.qpn(), round as u16, 0)
            );
            let base = round as usize * 8192;
            assert_eq!(
                d.buf.read(base, GRH),
                [0; GRH],
                "GRH area zeroed without a GRH"
            );
            assert_eq!(d.buf.read(base + GRH, len), vec![k as u8 + 1; len]);
            d.qp.rq.as_mut().unwrap().complete();
        }
    }
    // A gathered payload of exactly the MTU.
    let sges = [src.sge(0, 4096)];
    let d = &mut dests[0];
    d.recv(4, 8192);
    post(
        &mut s.qp,
        &WqeDesc {
            ud: Some(d.av(QKEY)),
            sges: &sges,
            ..desc(Opcode::Send)
        },
    );
    let r = poll(&f, &mut d.cq.cq);
    assert_eq!(r.byte_cnt as usize, GRH + 4096);
    assert_eq!(d.buf.read(4 * 8192 + GRH, 4096), src.read(0, 4096));
    let st = f.stats();
    assert_eq!((st.ud_sent, st.ud_delivered), (13, 13));
    assert_eq!(st.wqes.send + st.wqes.send_imm, 13);
}

#[test]
fn ud_with_grh_fills_the_grh_area() {
    let f = Fabric::new(SimConfig::deterministic());
    let mut s = UdNode::new(&f, QKEY);
    let mut d = UdNode::new(&f, QKEY);
    d.recv(0, 256);
    let mut dest = d.node.ud_dest(&d.qp, QKEY);
    dest.gid = d.node.ctx.port().gid;
    let av = d.node.ah(&dest);
    assert!(av.grh);
    post(&mut s.qp, &send(av, b"with grh", None));
    let r = poll(&f, &mut d.cq.cq);
    assert_eq!(r.grh, 1);
    let g = d.buf.read(0, GRH);
    assert_eq!(g[0] >> 4, 6);
    assert_eq!(&g[8..24], s.node.ctx.port().gid);
    assert_eq!(&g[24..40], d.node.ctx.port().gid);
    assert_eq!(d.buf.read(GRH, 8), b"with grh");
}

#[test]
fn ud_silent_drops_and_length_errors() {
    let f = Fabric::new(SimConfig::deterministic());
    let mut s = UdNode::new(&f, QKEY);
    let mut d = UdNode::new(&f, QKEY);
    d.recv(0, 8192);
    let good = d.av(QKEY);
    // Wrong Q_Key, unknown QPN, wrong LID: dropped, counted, the sender completes normally.
    let mut wrong_lid = good;
    wrong_lid.rlid ^= 0x40;
    let mut unknown = good;
    unknown.dqpn = 0xabcdef;
    for av in [d.av(QKEY + 1), unknown, wrong_lid] {
        post(&mut s.qp, &send(av, b"lost", None));
        expect_ok(&poll(&f, &mut s.cq.cq), CqeOpcode::Req);
    }
    assert_empty(&mut d.cq.cq);
    let st = f.stats();
    assert_eq!((st.ud_bad_qkey, st.ud_no_dest, st.ud_delivered), (1, 2, 0));
    // No receive WQE: dropped (no RNR on UD).
    post(&mut s.qp, &send(good, b"1", None));
    post(&mut s.qp, &send(good, b"2", None));
    assert_eq!(f.stats().ud_no_recv, 1);
    expect_ok(&poll(&f, &mut d.cq.cq), CqeOpcode::RespSend);
    for _ in 0..2 {
        expect_ok(&poll(&f, &mut s.cq.cq), CqeOpcode::Req);
    }
    // Payload over the MTU: requester LOCAL_LENGTH.
    let big = s.node.buf(8192, Access::empty());
    let sges = [big.sge(0, 4097)];
    post(
        &mut s.qp,
        &WqeDesc {
            ud: Some(good),
            sges: &sges,
            ..desc(Opcode::Send)
        },
    );
    expect_err(
        &poll(&f, &mut s.cq.cq),
        CqeOpcode::ReqErr,
        Syndrome::LocalLength,
    );

    // A receive buffer shorter than GRH + payload: responder LOCAL_LENGTH.
    let mut s2 = UdNode::new(&f, QKEY);
    d.recv(1, 40 + 3);
    post(&mut s2.qp, &send(good, b"four", None));
    expect_err(
        &poll(&f, &mut d.cq.cq),
        CqeOpcode::RespErr,
        Syndrome::LocalLength,
    );
    // RDMA opcodes are invalid on UD.
    post(
        &mut s2.qp,
        &WqeDesc {
            ud: Some(good),
            remote: Some(d.buf.raddr(0)),
            inline: b"x",
            ..desc(Opcode::RdmaWrite)
        },
    );
    let c = poll(&f, &mut s2.cq.cq);
    expect_ok(&c, CqeOpcode::Req); // the SEND
    expect_err(
        &poll(&f, &mut s2.cq.cq),
        CqeOpcode::ReqErr,
        Syndrome::LocalQpOp,
    );
}

#[test]
fn ud_into_an_srq() {
    let f = Fabric::new(SimConfig::deterministic());
    let mut s = UdNode::new(&f, QKEY);
    let node = Node::new(&f);
    let mut cq = node.cq(64);
    let mut srq = node.srq(8, 1);
    let mut qps: Vec<Qp> = (0..2)
        .map(|_| {
            let mut q = node.qp(QpType::Ud, &cq, &cq, Some(&srq), QpCaps::default());
            q.activate_ud(QKEY).unwrap();
            q
        })
        .collect();
    let buf = node.buf(8 * 256, Access::LOCAL_WRITE);
    for _ in 0..8 {
        let i = srq.srq.head() as usize;
        // SAFETY: `buf` outlives the QPs and is read only by copies after the completions.
        unsafe { srq.srq.post(&[buf.sge(i * 256, 256)]) }.unwrap();
    }
    srq.srq.ring_doorbell();
    for i in 0..6u8 {
        let q = &qps[usize::from(i % 2)];
        let av = node.ah(&node.ud_dest(q, QKEY));
        post(&mut s.qp, &send(av, &[i; 5], None));
    }
    for i in 0..6u8 {
        let r = poll(&f, &mut cq.cq);
        expect_ok(&r, CqeOpcode::RespSend);
        assert_eq!(r.qpn, qps[usize::from(i % 2)].qpn());
        assert_eq!(r.srqn, srq.srqn());
        assert_eq!(buf.read(r.wqe_counter as usize * 256 + GRH, 5), [i; 5]);
        srq.srq.release(r.wqe_counter).unwrap();
    }
    qps.clear();
}

/// Sends `n` numbered datagrams from one sender to two receivers under fault injection and
/// returns what each receiver got, in order, plus the counters.
fn faulty_run(seed: u64, n: u32) -> (Vec<Vec<u32>>, SimStats) {
    let f = Fabric::new(SimConfig {
        ud_faults: Some(UdFaults {
            seed,
            drop: 0.1,
            duplicate: 0.1,
            reorder: 0.1,
            delay: 0.1,
            max_delay: 5,
        }),
        ..SimConfig::deterministic()
    });
    let mut s = UdNode::new(&f, QKEY);
    let mut ds: Vec<UdNode> = (0..2).map(|_| UdNode::new(&f, QKEY)).collect();
    let avs: Vec<DgramSeg> = ds.iter().map(|d| d.av(QKEY)).collect();
    let mut got = vec![Vec::new(), Vec::new()];
    let drain = |ds: &mut Vec<UdNode>, got: &mut Vec<Vec<u32>>| {
        for (k, d) in ds.iter_mut().enumerate() {
            while let Some(r) = try_poll(&mut d.cq.cq) {
                expect_ok(&r, CqeOpcode::RespSend);
                let slot = r.wqe_counter as usize % 32;
                let v = u32::from_le_bytes(d.buf.read(slot * 8192 + GRH, 4).try_into().unwrap());
                got[k].push(v);
                d.qp.rq.as_mut().unwrap().complete();
                d.recv(slot, 8192);
            }
        }
    };
    for d in ds.iter_mut() {
        for slot in 0..32 {
            d.recv(slot, 8192);
        }
    }
    for i in 0..n {
        let k = (i % 2) as usize;
        let flags = if i % 8 == 7 { CQ_UPDATE } else { 0 };
        s.qp.sq
            .post(&WqeDesc {
                flags,
                ..send(avs[k], &i.to_le_bytes(), None)
            })
            .unwrap();
        if i % 3 != 0 {
            s.qp.sq.ring_doorbell();
        }
        while let Some(c) = try_poll(&mut s.cq.cq) {
            s.qp.sq.retire(c.wqe_counter);
        }
        drain(&mut ds, &mut got);
    }
    s.qp.sq.ring_doorbell();
    for _ in 0..10 {
        f.progress();
        drain(&mut ds, &mut got);
    }
    (got, f.stats())
}

#[test]
fn fault_injection_is_deterministic() {
    let n = 2000;
    let (a, sa) = faulty_run(7, n);
    let (b, sb) = faulty_run(7, n);
    assert_eq!(a, b, "same seed, same deliveries in the same order");
    assert_eq!(sa, sb, "same seed, same counters");
    let (c, sc) = faulty_run(8, n);
    assert_ne!(a, c, "another seed, another run");
    assert_ne!(
        (sa.ud_drops, sa.ud_dups, sa.ud_reorders, sa.ud_delays),
        (sc.ud_drops, sc.ud_dups, sc.ud_reorders, sc.ud_delays)
    );
    // Every fault kind happened, roughly at its rate, and the books balance.
    for (name, v) in [
        ("drops", sa.ud_drops),
        ("dups", sa.ud_dups),
        ("reorders", sa.ud_reorders),
        ("delays", sa.ud_delays),
    ] {
        assert!((120..=280).contains(&v), "{name}: {v} of {n}");
    }
    assert_eq!(sa.ud_sent, u64::from(n));
    assert_eq!(sa.ud_no_recv + sa.ud_no_dest + sa.ud_bad_qkey, 0);
    let received: usize = a.iter().map(Vec::len).sum();
    assert_eq!(received as u64, sa.ud_delivered);
    assert_eq!(sa.ud_delivered, sa.ud_sent - sa.ud_drops + sa.ud_dups);
    // Each receiver got only its own datagrams; some out of order, some twice.
    let mut out_of_order = 0;
    for (k, seq) in a.iter().enumerate() {
        assert!(seq.iter().all(|v| v % 2 == k as u32));
        out_of_order += seq.windows(2).filter(|w| w[1] < w[0]).count();
    }
    assert!(out_of_order > 0);
    let mut all: Vec<u32> = a.concat();
    all.sort();
    let dups = all.windows(2).filter(|w| w[0] == w[1]).count();
    assert_eq!(dups as u64, sa.ud_dups);
}
