//! Device model, RC through the driver: every opcode with inline and gathered payloads, SQ and
//! CQ wraparound, several QPs on one CQ, an SRQ shared by QPs with out-of-order releases.

mod sim_common;

use mlx5::cqe::CqeOpcode;
use mlx5::sim::{Fabric, SimConfig};
use mlx5::verbs::{Access, QpCaps, QpType, RcParams};
use mlx5::wqe::{AtomicSeg, CQ_UPDATE, Opcode, SOLICITED, WqeDesc};
use sim_common::*;

fn fabric() -> Fabric {
    Fabric::new(SimConfig::deterministic())
}

#[test]
fn send_and_send_imm_inline_and_gathered() {
    let f = fabric();
    let caps = QpCaps {
        max_recv_sge: 2,
        ..QpCaps::default()
    };
    let mut p = RcPair::new(&f, caps, &RcParams::default());
    let src = p.a.buf(4096, Access::LOCAL_WRITE);
    let dst = p.b.buf(4096, Access::LOCAL_WRITE);
    src.write(0, &(0..=255u8).collect::<Vec<_>>());

    // 1. SEND, inline payload, into a two-SGE receive.
    post_recv(&mut p.qb, &[dst.sge(0, 4), dst.sge(100, 60)]);
    let idx = post(
        &mut p.qa,
        &WqeDesc {
            inline: b"hello, model!",
            ..desc(Opcode::Send)
        },
    );
    let r = poll(&f, &mut p.cqb.cq);
    expect_ok(&r, CqeOpcode::RespSend);
    assert_eq!(
        (r.byte_cnt, r.qpn, r.wqe_counter, r.src_qpn),
        (13, p.qb.qpn(), 0, p.qa.qpn())
    );
    assert_eq!(dst.read(0, 4), b"hell");
    assert_eq!(dst.read(100, 9), b"o, model!");
    p.qb.rq.as_mut().unwrap().complete();
    let s = poll(&f, &mut p.cqa.cq);
    expect_ok(&s, CqeOpcode::Req);
    assert_eq!(
        (s.wqe_counter, s.wqe_opcode, s.qpn),
        (idx, Opcode::Send as u8, p.qa.qpn())
    );
    assert_eq!(p.qa.sq.retire(s.wqe_counter), 1);

    // 2. SEND_IMM, two gather entries + inline prefix, solicited.
    post_recv(&mut p.qb, &[dst.sge(1000, 1000)]);
    let sges = [src.sge(10, 20), src.sge(200, 30)];
    let idx = post(
        &mut p.qa,
        &WqeDesc {
            imm: 0xdead_beef,
            flags: CQ_UPDATE | SOLICITED,
            inline: b"IN",
            sges: &sges,
            ..desc(Opcode::SendImm)
        },
    );
    let r = poll(&f, &mut p.cqb.cq);
    expect_ok(&r, CqeOpcode::RespSendImm);
    assert_eq!((r.byte_cnt, r.imm, r.wqe_counter), (52, 0xdead_beef, 1));
    let mut want = b"IN".to_vec();
    want.extend(10u8..30);
    want.extend(200u8..230);
    assert_eq!(dst.read(1000, 52), want);
    let s = poll(&f, &mut p.cqa.cq);
    assert_eq!((s.wqe_counter, s.wqe_opcode), (idx, Opcode::SendImm as u8));

    // 3. A zero-length SEND into a zero-length receive.
    post_recv(&mut p.qb, &[]);
    post(&mut p.qa, &desc(Opcode::Send));
    let r = poll(&f, &mut p.cqb.cq);
    expect_ok(&r, CqeOpcode::RespSend);
    assert_eq!(r.byte_cnt, 0);
    poll(&f, &mut p.cqa.cq);

    let st = f.stats();
    assert_eq!((st.wqes.send, st.wqes.send_imm), (2, 1));
    assert_eq!(st.bytes, 13 + 52);
    assert_eq!(st.cqes, 6);
    assert_eq!(st.error_cqes, 0);
}

#[test]
fn rdma_write_and_write_imm() {
    let f = fabric();
    let mut p = RcPair::new(&f, QpCaps::default(), &RcParams::default());
    let src = p.a.buf(4096, Access::LOCAL_WRITE);
    let dst = p.b.buf(8192, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    src.write(0, &[0x5a; 4096]);

    // Inline WRITE, unsignaled, then a gathered WRITE, signaled: one CQE retires both.
    post(
        &mut p.qa,
        &WqeDesc {
            flags: 0,
            remote: Some(dst.raddr(7)),
            inline: b"inline write",
            ..desc(Opcode::RdmaWrite)
        },
    );
    let sges = [src.sge(0, 3000)];
    let idx = post(
        &mut p.qa,
        &WqeDesc {
            remote: Some(dst.raddr(100)),
            sges: &sges,
            ..desc(Opcode::RdmaWrite)
        },
    );
    let s = poll(&f, &mut p.cqa.cq);
    expect_ok(&s, CqeOpcode::Req);
    assert_eq!(
        (s.wqe_counter, s.wqe_opcode),
        (idx, Opcode::RdmaWrite as u8)
    );
    assert_eq!(p.qa.sq.retire(s.wqe_counter), 2);
    assert_eq!(dst.read(7, 12), b"inline write");
    assert_eq!(dst.read(100, 3000), vec![0x5a; 3000]);
    assert_eq!(dst.read(3100, 1), [0]);
    assert_empty(&mut p.cqb.cq);

    // WRITE_IMM into a zero-length receive: the data lands at raddr, the CQE carries imm and
    // the byte count written.
    post_recv(&mut p.qb, &[]);
    src.write(0, b"0123456789");
    let sges = [src.sge(0, 10)];
    post(
        &mut p.qa,
        &WqeDesc {
            imm: 77,
            remote: Some(dst.raddr(5000)),
            sges: &sges,
            ..desc(Opcode::RdmaWriteImm)
        },
    );
    let r = poll(&f, &mut p.cqb.cq);
    expect_ok(&r, CqeOpcode::RespWrImm);
    assert_eq!(
        (r.imm, r.byte_cnt, r.qpn, r.wqe_counter),
        (77, 10, p.qb.qpn(), 0)
    );
    assert_eq!(dst.read(5000, 10), b"0123456789");
    // WRITE_IMM with inline data.
    post_recv(&mut p.qb, &[]);
    post(
        &mut p.qa,
        &WqeDesc {
            imm: 78,
            remote: Some(dst.raddr(6000)),
            inline: b"xyz",
            ..desc(Opcode::RdmaWriteImm)
        },
    );
    let r = poll(&f, &mut p.cqb.cq);
    assert_eq!((r.imm, r.byte_cnt, r.wqe_counter), (78, 3, 1));
    assert_eq!(dst.read(6000, 3), b"xyz");
    let st = f.stats();
    assert_eq!((st.wqes.rdma_write, st.wqes.rdma_write_imm), (2, 2));
}

#[test]
fn rdma_read_into_one_and_two_sges() {
    let f = fabric();
    let mut p = RcPair::new(&f, QpCaps::default(), &RcParams::default());
    let local = p.a.buf(4096, Access::LOCAL_WRITE);
    let remote = p.b.buf(4096, Access::REMOTE_READ);
    remote.write(0, &(0..200u8).collect::<Vec<_>>());

    let sges = [local.sge(0, 100)];
    post(
        &mut p.qa,
        &WqeDesc {
            remote: Some(remote.raddr(50)),
            sges: &sges,
            ..desc(Opcode::RdmaRead)
        },
    );
    let s = poll(&f, &mut p.cqa.cq);
    expect_ok(&s, CqeOpcode::Req);
    assert_eq!((s.byte_cnt, s.wqe_opcode), (100, Opcode::RdmaRead as u8));
    assert_eq!(local.read(0, 100), (50..150u8).collect::<Vec<_>>());

    let sges = [local.sge(1000, 3), local.sge(2000, 5)];
    post(
        &mut p.qa,
        &WqeDesc {
            remote: Some(remote.raddr(0)),
            sges: &sges,
            ..desc(Opcode::RdmaRead)
        },
    );
    let s = poll(&f, &mut p.cqa.cq);
    assert_eq!(s.byte_cnt, 8);
    assert_eq!(local.read(1000, 3), [0, 1, 2]);
    assert_eq!(local.read(2000, 5), [3, 4, 5, 6, 7]);
    assert_empty(&mut p.cqb.cq);
    assert_eq!(f.stats().wqes.rdma_read, 2);
}

#[test]
fn atomics_are_big_endian_and_return_the_original() {
    let f = fabric();
    let mut p = RcPair::new(&f, QpCaps::default(), &RcParams::default());
    let local = p.a.buf(64, Access::LOCAL_WRITE);
    let remote = p.b.buf(64, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC);
    remote.write(8, &100u64.to_be_bytes());

    let fa = |add: u64, sges| WqeDesc {
        remote: Some(remote.raddr(8)),
        atomic: Some(AtomicSeg {
            swap_add: add,
            compare: 0,
        }),
        sges,
        ..desc(Opcode::AtomicFa)
    };
    let sges = [local.sge(0, 8)];
    post(&mut p.qa, &fa(5, &sges));
    let s = poll(&f, &mut p.cqa.cq);
    expect_ok(&s, CqeOpcode::Req);
    assert_eq!((s.byte_cnt, s.wqe_opcode), (8, Opcode::AtomicFa as u8));
    assert_eq!(local.read(0, 8), 100u64.to_be_bytes());
    assert_eq!(remote.read(8, 8), 105u64.to_be_bytes());

    let cs = |cmp: u64, swap: u64, sges| WqeDesc {
        remote: Some(remote.raddr(8)),
        atomic: Some(AtomicSeg {
            swap_add: swap,
            compare: cmp,
        }),
        sges,
        ..desc(Opcode::AtomicCs)
    };
    // Compare fails: unchanged, original returned.
    let sges = [local.sge(16, 8)];
    post(&mut p.qa, &cs(1, 999, &sges));
    poll(&f, &mut p.cqa.cq);
    assert_eq!(local.read(16, 8), 105u64.to_be_bytes());
    assert_eq!(remote.read(8, 8), 105u64.to_be_bytes());
    // Compare succeeds: swapped.
    let sges = [local.sge(24, 8)];
    post(&mut p.qa, &cs(105, 999, &sges));
    poll(&f, &mut p.cqa.cq);
    assert_eq!(local.read(24, 8), 105u64.to_be_bytes());
    assert_eq!(remote.read(8, 8), 999u64.to_be_bytes());
    // Wrapping add.
    let sges = [local.sge(32, 8)];
    post(&mut p.qa, &fa(u64::MAX, &sges));
    poll(&f, &mut p.cqa.cq);
    assert_eq!(remote.read(8, 8), 998u64.to_be_bytes());
    let st = f.stats();
    assert_eq!((st.wqes.atomic_fa, st.wqes.atomic_cs), (2, 2));
}

#[test]
fn nop_signaled_completes() {
    let f = fabric();
    let mut p = RcPair::new(&f, QpCaps::default(), &RcParams::default());
    let idx = p.qa.sq.post_nop(true).unwrap();
    p.qa.sq.ring_doorbell();
    let s = poll(&f, &mut p.cqa.cq);
    expect_ok(&s, CqeOpcode::Req);
    assert_eq!((s.wqe_counter, s.wqe_opcode), (idx, Opcode::Nop as u8));
    assert_eq!(f.stats().wqes.nop, 1);
}

/// A small SQ, WQEs of 1..=4 WQEBBs (inline sizes vary), selective signaling: the ring wraps
/// many times, the driver pads the ring end with NOPs, and every byte arrives.
#[test]
fn sq_wraparound_with_mixed_wqe_sizes() {
    let f = fabric();
    let caps = QpCaps {
        max_send_wr: 4,
        max_inline_data: 200,
        ..QpCaps::default()
    };
    let mut p = RcPair::new(&f, caps, &RcParams::default());
    let dst = p.b.buf(1 << 16, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let wqe_cnt = p.qa.sq.wqe_cnt();
    assert!(wqe_cnt <= 32, "a small ring: {wqe_cnt}");
    let mut off = 0usize;
    let mut posted = 0u32;
    for i in 0..500u32 {
        let len = (i as usize * 37) % 201;
        let data: Vec<u8> = (0..len).map(|j| (i as usize + j) as u8).collect();
        let d = WqeDesc {
            flags: if i % 3 == 2 { CQ_UPDATE } else { 0 },
            remote: Some(dst.raddr(off)),
            inline: &data,
            ..desc(Opcode::RdmaWrite)
        };
        while !p.qa.sq.has_room(d.ds()) {
            p.qa.sq.ring_doorbell();
            if let Some(c) = try_poll(&mut p.cqa.cq) {
                expect_ok(&c, CqeOpcode::Req);
                assert!(p.qa.sq.retire(c.wqe_counter) > 0);
            } else {
                // Nothing signaled outstanding: retire with a signaled NOP.
                post(&mut p.qa, &desc(Opcode::Nop));
            }
        }
        p.qa.sq.post(&d).unwrap();
        posted += 1;
        if i % 2 == 1 {
            p.qa.sq.ring_doorbell();
        }
        if !data.is_empty() {
            p.qa.sq.ring_doorbell();
            assert_eq!(dst.read(off, len), data, "WQE {i}");
        }
        off = (off + len + 1) % (1 << 15);
    }
    p.qa.sq.ring_doorbell();
    assert!(p.qa.sq.pad_nops() > 0, "the ring end was padded");
    let st = f.stats();
    assert_eq!(st.wqes.rdma_write, u64::from(posted));
    assert!(st.wqes.nop >= p.qa.sq.pad_nops());
    assert_eq!(st.error_cqes, 0);
}

/// A 4-entry CQ taking 1000 CQEs: the owner bit flips every 4.
#[test]
fn cq_wraparound() {
    let f = fabric();
    let a = Node::new(&f);
    let b = Node::new(&f);
    let mut cqa = a.cq(4);
    let mut cqb = b.cq(4);
    assert_eq!(cqb.cq.cqe_cnt(), 4);
    let mut qa = a.qp(QpType::Rc, &cqa, &cqa, None, QpCaps::default());
    let mut qb = b.qp(QpType::Rc, &cqb, &cqb, None, QpCaps::default());
    connect(&a, &mut qa, &b, &mut qb, &RcParams::default());
    let dst = b.buf(64, Access::LOCAL_WRITE);
    for i in 0..1000u32 {
        post_recv(&mut qb, &[dst.sge(0, 8)]);
        post(
            &mut qa,
            &WqeDesc {
                flags: 0,
                inline: &u64::from(i).to_le_bytes(),
                ..desc(Opcode::Send)
            },
        );
        let r = poll(&f, &mut cqb.cq);
        expect_ok(&r, CqeOpcode::RespSend);
        assert_eq!(r.wqe_counter, i as u16);
        qb.rq.as_mut().unwrap().complete();
        assert_eq!(dst.read(0, 8), u64::from(i).to_le_bytes());
        if i % 64 == 63 {
            // Retire the unsignaled sends.
            qa.sq.post_nop(true).unwrap();
            qa.sq.ring_doorbell();
            let s = poll(&f, &mut cqa.cq);
            assert_eq!(qa.sq.retire(s.wqe_counter), 65);
        }
    }
    assert!(!f.cq_overrun(cqb.cqn()) && !f.cq_overrun(cqa.cqn()));
    assert_eq!(cqb.cq.ci(), 1000);
}

/// Four QP pairs sharing one send CQ and one receive CQ on each side.
#[test]
fn several_qps_on_one_cq() {
    let f = fabric();
    let a = Node::new(&f);
    let b = Node::new(&f);
    let mut scq = a.cq(64);
    let mut rcq = b.cq(64);
    let dst = b.buf(4096, Access::LOCAL_WRITE);
    let mut pairs = Vec::new();
    for _ in 0..4 {
        let mut qa = a.qp(QpType::Rc, &scq, &scq, None, QpCaps::default());
        let mut qb = b.qp(QpType::Rc, &rcq, &rcq, None, QpCaps::default());
        connect(&a, &mut qa, &b, &mut qb, &RcParams::default());
        pairs.push((qa, qb));
    }
    for round in 0..10u8 {
        for (k, (qa, qb)) in pairs.iter_mut().enumerate() {
            post_recv(qb, &[dst.sge(k * 64, 64)]);
            post(
                qa,
                &WqeDesc {
                    inline: &[round, k as u8],
                    ..desc(Opcode::Send)
                },
            );
        }
        let mut seen = Vec::new();
        for _ in 0..4 {
            let r = poll(&f, &mut rcq.cq);
            expect_ok(&r, CqeOpcode::RespSend);
            let k = pairs.iter().position(|(_, qb)| qb.qpn() == r.qpn).unwrap();
            assert_eq!(r.src_qpn, pairs[k].0.qpn());
            assert_eq!(dst.read(k * 64, 2), [round, k as u8]);
            assert_eq!(r.wqe_counter, u16::from(round));
            pairs[k].1.rq.as_mut().unwrap().complete();
            seen.push(k);
            let s = poll(&f, &mut scq.cq);
            let ks = pairs.iter().position(|(qa, _)| qa.qpn() == s.qpn).unwrap();
            pairs[ks].0.sq.retire(s.wqe_counter);
        }
        seen.sort();
        assert_eq!(seen, [0, 1, 2, 3]);
    }
}

/// Three QPs take receives from one SRQ; the consumer releases WQEs out of order (reverse, and
/// holding some back for several rounds), so the free list is relinked in a scrambled order
/// and wraps many times. Every CQE names the SRQ WQE whose buffer holds the payload.
#[test]
fn srq_shared_by_qps_with_out_of_order_release() {
    let f = fabric();
    let a = Node::new(&f);
    let b = Node::new(&f);
    let mut cqa = a.cq(256);
    let mut cqb = b.cq(256);
    let mut srq = b.srq(15, 1);
    let cap = srq.srq.capacity();
    assert_eq!(cap, 15);
    let slot = 64usize;
    let bufs = b.buf(srq.srq.wqe_cnt() as usize * slot, Access::LOCAL_WRITE);
    let mut qps = Vec::new();
    for _ in 0..3 {
        let mut qa = a.qp(QpType::Rc, &cqa, &cqa, None, QpCaps::default());
        let mut qb = b.qp(QpType::Rc, &cqb, &cqb, Some(&srq), QpCaps::default());
        assert!(qb.rq.is_none());
        connect(&a, &mut qa, &b, &mut qb, &RcParams::default());
        qps.push((qa, qb));
    }
    let fill = |srq: &mut mlx5::verbs::Srq| {
        while srq.srq.available() > 0 {
            let idx = srq.srq.head() as usize;
            // SAFETY: `bufs` outlives the QPs and is read only by copies after completions.
            let got = unsafe { srq.srq.post(&[bufs.sge(idx * slot, slot as u32)]) }.unwrap();
            assert_eq!(got as usize, idx);
        }
        srq.srq.ring_doorbell();
    };
    fill(&mut srq);
    let mut held: Vec<u16> = Vec::new();
    let mut msg = 0u32;
    for round in 0..40 {
        let n = 12;
        for i in 0..n {
            let (qa, _) = &mut qps[i % 3];
            post(
                qa,
                &WqeDesc {
                    flags: 0,
                    inline: &msg.wrapping_add(i as u32).to_le_bytes(),
                    ..desc(Opcode::Send)
                },
            );
        }
        let mut got = Vec::new();
        for _ in 0..n {
            let r = poll(&f, &mut cqb.cq);
            expect_ok(&r, CqeOpcode::RespSend);
            assert_eq!(r.srqn, srq.srqn());
            assert!(srq.srq.is_posted(r.wqe_counter));
            let k = qps.iter().position(|(_, qb)| qb.qpn() == r.qpn).unwrap();
            let v = u32::from_le_bytes(
                bufs.read(r.wqe_counter as usize * slot, 4)
                    .try_into()
                    .unwrap(),
            );
            assert_eq!((v - msg) as usize % 3, k, "payload arrived through QP {k}");
            got.push((r.wqe_counter, v));
        }
        let mut vals: Vec<u32> = got.iter().map(|x| x.1).collect();
        vals.sort();
        assert_eq!(vals, (msg..msg + n as u32).collect::<Vec<_>>());
        msg += n as u32;
        // Release in reverse order; keep two back until the next round.
        let release_now: Vec<u16> = got.iter().rev().map(|x| x.0).collect();
        for idx in held.drain(..) {
            srq.srq.release(idx).unwrap();
        }
        for (j, idx) in release_now.into_iter().enumerate() {
            if j < 2 && round % 2 == 0 {
                held.push(idx);
            } else {
                srq.srq.release(idx).unwrap();
            }
        }
        fill(&mut srq);
        for (qa, _) in &mut qps {
            qa.sq.post_nop(true).unwrap();
            qa.sq.ring_doorbell();
        }
        for _ in 0..3 {
            let s = poll(&f, &mut cqa.cq);
            let k = qps.iter().position(|(qa, _)| qa.qpn() == s.qpn).unwrap();
            qps[k].0.sq.retire(s.wqe_counter);
        }
    }
    assert_eq!(f.stats().error_cqes, 0);
}
