//! Device model, error completions through the driver: bad lkey, bad rkey, out of range,
//! unpermitted access, length errors, RNR retry exceeded (and RNR recovery), transport retry
//! exceeded, flush after error, CQ overrun.

mod sim_common;

use mlx5::cqe::{CqeOpcode, Syndrome};
use mlx5::sim::{Fabric, SimConfig, SimQpState};
use mlx5::verbs::{Access, QpCaps, QpType, RcParams};
use mlx5::wqe::{AtomicSeg, Opcode, RaddrSeg, Sge, WqeDesc};
use sim_common::*;

fn pair() -> (Fabric, RcPair) {
    let f = Fabric::new(SimConfig::deterministic());
    let p = RcPair::new(&f, QpCaps::default(), &RcParams::default());
    (f, p)
}

/// Runs one failing WQE on a fresh pair and checks the requester error CQE (even unsignaled),
/// the QP state, and that the next WQE is flushed.
fn requester_fails(
    build: impl Fn(&RcPair, &Buf, &Buf) -> (Opcode, Option<RaddrSeg>, Vec<Sge>),
    want: Syndrome,
) {
    let (f, mut p) = pair();
    let local = p.a.buf(4096, Access::LOCAL_WRITE);
    let remote = p.b.buf(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let (op, raddr, sges) = build(&p, &local, &remote);
    let atomic = op_is_atomic(op).then_some(AtomicSeg {
        swap_add: 1,
        compare: 0,
    });
    let idx = post(
        &mut p.qa,
        &WqeDesc {
            flags: 0,
            remote: raddr,
            atomic,
            sges: &sges,
            ..desc(op)
        },
    );
    let c = poll(&f, &mut p.cqa.cq);
    expect_err(&c, CqeOpcode::ReqErr, want);
    assert_eq!(
        (c.wqe_counter, c.qpn, c.wqe_opcode),
        (idx, p.qa.qpn(), op as u8)
    );
    let e = c.status().unwrap_err();
    assert_eq!(e.side, "requester");
    assert_eq!(f.qp_state(p.qa.qpn()), Some(SimQpState::Error));
    assert_eq!(
        f.qp_state(p.qb.qpn()),
        Some(SimQpState::Rts),
        "remote errors leave the responder up"
    );
    // Flush after error.
    let idx2 = post(&mut p.qa, &desc(Opcode::Nop));
    let c = poll(&f, &mut p.cqa.cq);
    expect_err(&c, CqeOpcode::ReqErr, Syndrome::WrFlush);
    assert_eq!(c.wqe_counter, idx2);
    assert_empty(&mut p.cqb.cq);
    // Nothing was written remotely.
    assert!(remote.read(0, 4096).iter().all(|&b| b == 0));
}

fn op_is_atomic(op: Opcode) -> bool {
    matches!(op, Opcode::AtomicCs | Opcode::AtomicFa)
}

#[test]
fn bad_lkey_is_local_protection() {
    requester_fails(
        |_, l, r| {
            let mut s = l.sge(0, 8);
            s.lkey ^= 0x100; // another (unregistered) index
            (Opcode::RdmaWrite, Some(r.raddr(0)), vec![s])
        },
        Syndrome::LocalProt,
    );
    // An rkey used as an lkey is also rejected.
    requester_fails(
        |_, l, r| {
            let mut s = l.sge(0, 8);
            s.lkey = l.mr.rkey;
            (Opcode::RdmaWrite, Some(r.raddr(0)), vec![s])
        },
        Syndrome::LocalProt,
    );
}

#[test]
fn local_sge_out_of_range_is_local_protection() {
    requester_fails(
        |_, l, r| (Opcode::RdmaWrite, Some(r.raddr(0)), vec![l.sge(4000, 200)]),
        Syndrome::LocalProt,
    );
}

#[test]
fn read_into_memory_without_local_write_is_local_protection() {
    let (f, mut p) = pair();
    let ro = p.a.buf(64, Access::empty());
    let remote = p.b.buf(64, Access::REMOTE_READ);
    let sges = [ro.sge(0, 8)];
    post(
        &mut p.qa,
        &WqeDesc {
            remote: Some(remote.raddr(0)),
            sges: &sges,
            ..desc(Opcode::RdmaRead)
        },
    );
    expect_err(
        &poll(&f, &mut p.cqa.cq),
        CqeOpcode::ReqErr,
        Syndrome::LocalProt,
    );
}

#[test]
fn lkey_of_another_pd_is_local_protection() {
    let (f, mut p) = pair();
    let pd2 = p.a.ctx.alloc_pd().unwrap();
    let mem = mlx5::mem::DmaBuf::with_normal_pages(64).unwrap();
    // SAFETY: `mem` lives to the end of the test, after the MR and every WQE using it.
    let mr = unsafe {
        p.a.ctx
            .reg_mr(&pd2, mem.as_mut_ptr(), 64, Access::LOCAL_WRITE)
    }
    .unwrap();
    let remote = p.b.buf(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let sges = [Sge {
        addr: mr.addr,
        len: 8,
        lkey: mr.lkey,
    }];
    post(
        &mut p.qa,
        &WqeDesc {
            remote: Some(remote.raddr(0)),
            sges: &sges,
            ..desc(Opcode::RdmaWrite)
        },
    );
    expect_err(
        &poll(&f, &mut p.cqa.cq),
        CqeOpcode::ReqErr,
        Syndrome::LocalProt,
    );
}

#[test]
fn bad_rkey_is_remote_access() {
    requester_fails(
        |_, l, r| {
            let mut ra = r.raddr(0);
            ra.rkey ^= 0x100;
            (Opcode::RdmaWrite, Some(ra), vec![l.sge(0, 8)])
        },
        Syndrome::RemoteAccess,
    );
    // An lkey used as an rkey.
    requester_fails(
        |_, l, r| {
            let mut ra = r.raddr(0);
            ra.rkey = r.mr.lkey;
            (Opcode::RdmaWrite, Some(ra), vec![l.sge(0, 8)])
        },
        Syndrome::RemoteAccess,
    );
    // An rkey of the requester's own node (another PD/device than the responder QP's).
    requester_fails(
        |_, l, _| (Opcode::RdmaWrite, Some(l.raddr(0)), vec![l.sge(0, 8)]),
        Syndrome::RemoteAccess,
    );
}

#[test]
fn remote_out_of_range_is_remote_access() {
    requester_fails(
        |_, l, r| (Opcode::RdmaWrite, Some(r.raddr(4090)), vec![l.sge(0, 8)]),
        Syndrome::RemoteAccess,
    );
    requester_fails(
        |_, l, r| {
            let mut ra = r.raddr(0);
            ra.raddr -= 1;
            (Opcode::RdmaWrite, Some(ra), vec![l.sge(0, 8)])
        },
        Syndrome::RemoteAccess,
    );
}

#[test]
fn unpermitted_remote_access() {
    // The responder buffer has LOCAL_WRITE | REMOTE_WRITE only.
    requester_fails(
        |_, l, r| (Opcode::RdmaRead, Some(r.raddr(0)), vec![l.sge(0, 8)]),
        Syndrome::RemoteAccess,
    );
    requester_fails(
        |_, l, r| (Opcode::AtomicFa, Some(r.raddr(0)), vec![l.sge(0, 8)]),
        Syndrome::RemoteAccess,
    );
    // A read-only responder buffer takes no WRITE.
    let (f, mut p) = pair();
    let local = p.a.buf(64, Access::LOCAL_WRITE);
    let ro = p.b.buf(64, Access::REMOTE_READ);
    post(
        &mut p.qa,
        &WqeDesc {
            remote: Some(ro.raddr(0)),
            inline: b"nope",
            ..desc(Opcode::RdmaWrite)
        },
    );
    expect_err(
        &poll(&f, &mut p.cqa.cq),
        CqeOpcode::ReqErr,
        Syndrome::RemoteAccess,
    );
    assert_eq!(ro.read(0, 4), [0; 4]);
    let _ = local;
}

#[test]
fn qp_access_flags_and_misaligned_atomics_are_invalid_requests() {
    // The responder QP does not grant REMOTE_WRITE.
    let f = Fabric::new(SimConfig::deterministic());
    let params = RcParams {
        access: Access::REMOTE_READ,
        ..RcParams::default()
    };
    let mut p = RcPair::new(&f, QpCaps::default(), &params);
    let remote = p.b.buf(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    post(
        &mut p.qa,
        &WqeDesc {
            remote: Some(remote.raddr(0)),
            inline: b"x",
            ..desc(Opcode::RdmaWrite)
        },
    );
    expect_err(
        &poll(&f, &mut p.cqa.cq),
        CqeOpcode::ReqErr,
        Syndrome::RemoteInvalReq,
    );
    // Misaligned atomic.
    requester_fails(
        |_, l, r| (Opcode::AtomicCs, Some(r.raddr(4)), vec![l.sge(0, 8)]),
        Syndrome::RemoteInvalReq,
    );
}

#[test]
fn atomic_result_buffer_too_short_is_local_length() {
    let f = Fabric::new(SimConfig::deterministic());
    let mut p = RcPair::new(&f, QpCaps::default(), &RcParams::default());
    let local = p.a.buf(64, Access::LOCAL_WRITE);
    let remote = p.b.buf(64, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC);
    let sges = [local.sge(0, 4)];
    post(
        &mut p.qa,
        &WqeDesc {
            remote: Some(remote.raddr(0)),
            atomic: Some(AtomicSeg {
                swap_add: 1,
                compare: 0,
            }),
            sges: &sges,
            ..desc(Opcode::AtomicFa)
        },
    );
    expect_err(
        &poll(&f, &mut p.cqa.cq),
        CqeOpcode::ReqErr,
        Syndrome::LocalLength,
    );
    assert_eq!(remote.read(0, 8), [0; 8]);
}

/// A SEND larger than the receive buffer: responder LOCAL_LENGTH on its receive CQ, requester
/// REMOTE_INVAL_REQ; both QPs enter the error state; the responder's other receives are
/// flushed.
#[test]
fn receive_too_small_is_a_length_error_on_both_sides() {
    let (f, mut p) = pair();
    let dst = p.b.buf(4096, Access::LOCAL_WRITE);
    post_recv(&mut p.qb, &[dst.sge(0, 16)]);
    post_recv(&mut p.qb, &[dst.sge(100, 16)]);
    let big = [7u8; 17];
    let idx = post(
        &mut p.qa,
        &WqeDesc {
            inline: &big,
            ..desc(Opcode::Send)
        },
    );
    let r = poll(&f, &mut p.cqb.cq);
    expect_err(&r, CqeOpcode::RespErr, Syndrome::LocalLength);
    assert_eq!((r.qpn, r.wqe_counter), (p.qb.qpn(), 0));
    assert_eq!(r.status().unwrap_err().side, "responder");
    let s = poll(&f, &mut p.cqa.cq);
    expect_err(&s, CqeOpcode::ReqErr, Syndrome::RemoteInvalReq);
    assert_eq!(s.wqe_counter, idx);
    assert_eq!(dst.read(0, 16), [0; 16], "nothing scattered");
    assert_eq!(f.qp_state(p.qb.qpn()), Some(SimQpState::Error));
    assert_eq!(f.qp_state(p.qa.qpn()), Some(SimQpState::Error));
    // The second receive is flushed (on the next progress step), and so is a later one.
    let r = poll(&f, &mut p.cqb.cq);
    expect_err(&r, CqeOpcode::RespErr, Syndrome::WrFlush);
    assert_eq!(r.wqe_counter, 1);
    post_recv(&mut p.qb, &[dst.sge(200, 16)]);
    let r = poll(&f, &mut p.cqb.cq);
    expect_err(&r, CqeOpcode::RespErr, Syndrome::WrFlush);
    assert_eq!(r.wqe_counter, 2);
}

#[test]
fn bad_receive_lkey_is_responder_protection_and_remote_op() {
    let (f, mut p) = pair();
    let dst = p.b.buf(64, Access::LOCAL_WRITE);
    let mut s = dst.sge(0, 16);
    s.lkey ^= 0x100;
    post_recv(&mut p.qb, &[s]);
    post(
        &mut p.qa,
        &WqeDesc {
            inline: b"data",
            ..desc(Opcode::Send)
        },
    );
    expect_err(
        &poll(&f, &mut p.cqb.cq),
        CqeOpcode::RespErr,
        Syndrome::LocalProt,
    );
    expect_err(
        &poll(&f, &mut p.cqa.cq),
        CqeOpcode::ReqErr,
        Syndrome::RemoteOp,
    );
}

/// No receive WQE: the SEND stalls, is retried once per progress step and fails after
/// `rnr_retry` retries; later WQEs (queued behind it, and posted afterwards) are flushed.
#[test]
fn rnr_retry_exceeded_then_flush() {
    let f = Fabric::new(SimConfig::deterministic());
    let params = RcParams {
        rnr_retry: 3,
        ..RcParams::default()
    };
    let mut p = RcPair::new(&f, QpCaps::default(), &params);
    let i0 = post(
        &mut p.qa,
        &WqeDesc {
            flags: 0,
            inline: b"a",
            ..desc(Opcode::Send)
        },
    );
    let i1 = post(
        &mut p.qa,
        &WqeDesc {
            flags: 0,
            inline: b"b",
            ..desc(Opcode::Send)
        },
    );
    assert_empty(&mut p.cqa.cq);
    assert_eq!(
        f.stats().rnr_retries,
        1,
        "the second doorbell was a progress step"
    );
    f.progress();
    assert_empty(&mut p.cqa.cq);
    f.progress();
    let c = try_poll(&mut p.cqa.cq).expect("third retry failed");
    expect_err(&c, CqeOpcode::ReqErr, Syndrome::RnrRetryExc);
    assert_eq!(c.wqe_counter, i0);
    let c = try_poll(&mut p.cqa.cq).unwrap();
    expect_err(&c, CqeOpcode::ReqErr, Syndrome::WrFlush);
    assert_eq!(c.wqe_counter, i1);
    let i2 = post(&mut p.qa, &desc(Opcode::Nop));
    let c = try_poll(&mut p.cqa.cq).unwrap();
    expect_err(&c, CqeOpcode::ReqErr, Syndrome::WrFlush);
    assert_eq!(c.wqe_counter, i2);
    let st = f.stats();
    assert_eq!((st.rnr_retries, st.flushes, st.error_cqes), (3, 2, 3));
    assert_eq!(st.wqes.send, 0);
}

/// An RNR-stalled SEND (and the WRITE_IMM behind it, in order) completes once receives are
/// posted; with rnr_retry = 7 the model retries forever.
#[test]
fn rnr_stall_recovers_in_order() {
    let (f, mut p) = pair();
    let dst = p.b.buf(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    post(
        &mut p.qa,
        &WqeDesc {
            inline: b"first",
            ..desc(Opcode::Send)
        },
    );
    post(
        &mut p.qa,
        &WqeDesc {
            imm: 2,
            remote: Some(dst.raddr(1000)),
            inline: b"second",
            ..desc(Opcode::RdmaWriteImm)
        },
    );
    for _ in 0..100 {
        f.progress();
    }
    assert_empty(&mut p.cqa.cq);
    assert_eq!(
        dst.read(1000, 6),
        [0; 6],
        "the WRITE_IMM waits behind the SEND"
    );
    post_recv(&mut p.qb, &[dst.sge(0, 64)]);
    post_recv(&mut p.qb, &[]);
    let r = poll(&f, &mut p.cqb.cq);
    expect_ok(&r, CqeOpcode::RespSend);
    let r = poll(&f, &mut p.cqb.cq);
    expect_ok(&r, CqeOpcode::RespWrImm);
    assert_eq!((r.imm, r.byte_cnt), (2, 6));
    assert_eq!(dst.read(0, 5), b"first");
    assert_eq!(dst.read(1000, 6), b"second");
    expect_ok(&poll(&f, &mut p.cqa.cq), CqeOpcode::Req);
    expect_ok(&poll(&f, &mut p.cqa.cq), CqeOpcode::Req);
    assert!(f.stats().rnr_retries >= 100);
}

#[test]
fn rnr_retry_zero_fails_at_once_and_config_override() {
    let f = Fabric::new(SimConfig::deterministic());
    let params = RcParams {
        rnr_retry: 0,
        ..RcParams::default()
    };
    let mut p = RcPair::new(&f, QpCaps::default(), &params);
    post(
        &mut p.qa,
        &WqeDesc {
            inline: b"a",
            ..desc(Opcode::Send)
        },
    );
    expect_err(
        &try_poll(&mut p.cqa.cq).unwrap(),
        CqeOpcode::ReqErr,
        Syndrome::RnrRetryExc,
    );

    // SimConfig overrides the QP's infinite rnr_retry.
    let f = Fabric::new(SimConfig {
        rnr_retry_override: Some(1),
        rnr_retry_interval: 2,
        ..SimConfig::deterministic()
    });
    let mut p = RcPair::new(&f, QpCaps::default(), &RcParams::default());
    post(
        &mut p.qa,
        &WqeDesc {
            inline: b"a",
            ..desc(Opcode::Send)
        },
    );
    f.progress();
    assert_empty(&mut p.cqa.cq);
    f.progress();
    expect_err(
        &try_poll(&mut p.cqa.cq).unwrap(),
        CqeOpcode::ReqErr,
        Syndrome::RnrRetryExc,
    );
    assert_eq!(f.stats().rnr_retries, 1);
}

/// The peer QP is destroyed: the requester retries `retry_cnt` times, then reports
/// TRANSPORT_RETRY_EXC.
#[test]
fn dead_peer_is_transport_retry_exceeded() {
    let f = Fabric::new(SimConfig::deterministic());
    let params = RcParams {
        retry_cnt: 2,
        ..RcParams::default()
    };
    let RcPair {
        mut qa,
        qb,
        mut cqa,
        ..
    } = RcPair::new(&f, QpCaps::default(), &params);
    let qbn = qb.qpn();
    drop(qb);
    assert_eq!(f.qp_state(qbn), None);
    post(
        &mut qa,
        &WqeDesc {
            inline: b"anyone?",
            ..desc(Opcode::Send)
        },
    );
    f.progress();
    assert_empty(&mut cqa.cq);
    f.progress();
    expect_err(
        &try_poll(&mut cqa.cq).unwrap(),
        CqeOpcode::ReqErr,
        Syndrome::TransportRetryExc,
    );
    assert_eq!(f.stats().transport_retries, 2);
}

/// With [`SimConfig::default`] (its progress thread stands in for the NIC's retransmission
/// timer) a WQE to a dead peer fails with TRANSPORT_RETRY_EXC although nobody rings another
/// doorbell or calls `progress`, as on RC hardware; [`SimConfig::deterministic`] has no such
/// thread, and the same WQE waits for a step.
#[test]
fn default_config_reports_a_dead_peer_on_its_own() {
    assert_eq!(
        SimConfig::default().progress_thread,
        Some(mlx5::sim::DEFAULT_PROGRESS_INTERVAL)
    );
    assert_eq!(SimConfig::deterministic().progress_thread, None);
    for deterministic in [false, true] {
        let f = Fabric::new(if deterministic {
            SimConfig::deterministic()
        } else {
            SimConfig::default()
        });
        let RcPair {
            mut qa,
            qb,
            mut cqa,
            ..
        } = RcPair::new(&f, QpCaps::default(), &RcParams::default());
        drop(qb);
        post(
            &mut qa,
            &WqeDesc {
                inline: b"anyone?",
                ..desc(Opcode::Send)
            },
        );
        if deterministic {
            // No step without a doorbell: nothing happens, however long we wait.
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert_empty(&mut cqa.cq);
            assert_eq!(f.stats().transport_retries, 0);
            continue;
        }
        let start = std::time::Instant::now();
        let c = loop {
            if let Some(c) = try_poll(&mut cqa.cq) {
                break c;
            }
            assert!(
                start.elapsed() < std::time::Duration::from_secs(10),
                "no retry-exceeded without doorbells"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        expect_err(&c, CqeOpcode::ReqErr, Syndrome::TransportRetryExc);
        assert_eq!(f.stats().transport_retries, 7);
    }
}

#[test]
fn peer_in_error_or_not_connected_is_unreachable() {
    // The peer entered the error state (here: through its own failed WQE).
    let f = Fabric::new(SimConfig::deterministic());
    let params = RcParams {
        retry_cnt: 0,
        ..RcParams::default()
    };
    let mut p = RcPair::new(&f, QpCaps::default(), &params);
    let mut bad = p.b.buf(64, Access::LOCAL_WRITE).sge(0, 8);
    bad.lkey ^= 0x100;
    post(
        &mut p.qb,
        &WqeDesc {
            sges: &[bad],
            ..desc(Opcode::Send)
        },
    );
    expect_err(
        &poll(&f, &mut p.cqb.cq),
        CqeOpcode::ReqErr,
        Syndrome::LocalProt,
    );
    post(
        &mut p.qa,
        &WqeDesc {
            inline: b"x",
            ..desc(Opcode::Send)
        },
    );
    expect_err(
        &poll(&f, &mut p.cqa.cq),
        CqeOpcode::ReqErr,
        Syndrome::TransportRetryExc,
    );

    // Only one side connected: the other is still in RESET.
    let a = Node::new(&f);
    let b = Node::new(&f);
    let mut cqa = a.cq(8);
    let cqb = b.cq(8);
    let mut qa = a.qp(QpType::Rc, &cqa, &cqa, None, QpCaps::default());
    let qb = b.qp(QpType::Rc, &cqb, &cqb, None, QpCaps::default());
    qa.connect_rc(&b.remote(&qb), &params).unwrap();
    post(
        &mut qa,
        &WqeDesc {
            inline: b"x",
            ..desc(Opcode::Send)
        },
    );
    expect_err(
        &poll(&f, &mut cqa.cq),
        CqeOpcode::ReqErr,
        Syndrome::TransportRetryExc,
    );
}

#[test]
fn qp_not_connected_is_local_qp_op() {
    let f = Fabric::new(SimConfig::deterministic());
    let a = Node::new(&f);
    let mut cq = a.cq(8);
    let mut qp = a.qp(QpType::Rc, &cq, &cq, None, QpCaps::default());
    post(&mut qp, &desc(Opcode::Nop));
    expect_err(
        &poll(&f, &mut cq.cq),
        CqeOpcode::ReqErr,
        Syndrome::LocalQpOp,
    );
    // Connecting a QP twice, or UD-activating an RC QP, is refused.
    assert!(qp.activate_ud(1).is_err());
}

/// Several unsignaled WQEs behind a failing one: one error CQE, then a flush CQE for each.
#[test]
fn flush_after_error_covers_every_queued_wqe() {
    let (f, mut p) = pair();
    let remote = p.b.buf(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut idx = Vec::new();
    for i in 0..5u8 {
        let mut r = remote.raddr(0);
        if i == 1 {
            r.rkey ^= 0x100;
        }
        idx.push(
            p.qa.sq
                .post(&WqeDesc {
                    flags: 0,
                    remote: Some(r),
                    inline: &[i + 1],
                    ..desc(Opcode::RdmaWrite)
                })
                .unwrap(),
        );
    }
    p.qa.sq.ring_doorbell();
    assert_eq!(remote.read(0, 1), [1], "the first WRITE executed");
    let c = try_poll(&mut p.cqa.cq).unwrap();
    expect_err(&c, CqeOpcode::ReqErr, Syndrome::RemoteAccess);
    assert_eq!(c.wqe_counter, idx[1]);
    for &i in &idx[2..] {
        let c = try_poll(&mut p.cqa.cq).unwrap();
        expect_err(&c, CqeOpcode::ReqErr, Syndrome::WrFlush);
        assert_eq!(c.wqe_counter, i);
        p.qa.sq.retire(c.wqe_counter);
    }
    assert_empty(&mut p.cqa.cq);
    assert_eq!(p.qa.sq.outstanding_wqebbs(), 0);
    assert_eq!(f.stats().flushes, 3);
}

/// A 2-entry CQ receiving 3 CQEs without being polled: the model detects the overrun, keeps
/// the two entries intact, and moves the QPs reporting to it to the error state.
#[test]
fn cq_overrun_is_detected() {
    let f = Fabric::new(SimConfig::deterministic());
    let a = Node::new(&f);
    let b = Node::new(&f);
    let mut cqa = a.cq(2);
    let cqb = b.cq(64);
    let mut qa = a.qp(QpType::Rc, &cqa, &cqa, None, QpCaps::default());
    let mut qb = b.qp(QpType::Rc, &cqb, &cqb, None, QpCaps::default());
    connect(&a, &mut qa, &b, &mut qb, &RcParams::default());
    for _ in 0..2 {
        post(&mut qa, &desc(Opcode::Nop));
    }
    assert!(!f.cq_overrun(cqa.cqn()));
    post(&mut qa, &desc(Opcode::Nop));
    assert!(f.cq_overrun(cqa.cqn()));
    assert_eq!(f.qp_state(qa.qpn()), Some(SimQpState::Error));
    let st = f.stats();
    assert_eq!((st.cq_overruns, st.cqes), (1, 2));
    // The two entries written are intact and software-owned; nothing else appears.
    for i in 0..2 {
        let c = try_poll(&mut cqa.cq).unwrap();
        expect_ok(&c, CqeOpcode::Req);
        assert_eq!(c.wqe_counter, i);
    }
    post(&mut qa, &desc(Opcode::Nop));
    assert_empty(&mut cqa.cq);
    assert!(f.stats().cqes_lost >= 2);
}
