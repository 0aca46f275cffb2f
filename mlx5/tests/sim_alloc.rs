//! The device model's RC path allocates nothing per WQE once warm (issue 16): a counting
//! global allocator counts the allocations made on this test's thread while it posts, rings
//! and polls RDMA WRITE (inline and from a data segment), RDMA READ, WRITE_IMM and SEND, and
//! the count must stay zero; likewise UD SENDs (inline and from a data segment), UD SENDs
//! under fault injection (packets dropped, duplicated, held back and delayed), and an RC SEND
//! that stalls for want of a receive WQE (RNR), is retried by progress steps and resumes.
//! (Own test binary: the allocator is process-wide; counts are per thread.)

#[path = "sim_common/mod.rs"]
mod sim_common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use mlx5::cqe::CqeOpcode;
use mlx5::sim::{Fabric, SimConfig};
use mlx5::verbs::{Access, QpCaps, RcParams};
use mlx5::wqe::Opcode;
use sim_common::*;

/// Counts allocations made on threads that switched counting on.
struct Counting;

thread_local! {
    /// Whether this thread counts its allocations.
    static COUNT_HERE: Cell<bool> = const { Cell::new(false) };
    /// This thread's allocations while counting (tests run on parallel threads).
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn note() {
    if COUNT_HERE.try_with(Cell::get).unwrap_or(false) {
        let _ = ALLOCS.try_with(|a| a.set(a.get() + 1));
    }
}

// SAFETY: forwards every call to `System` unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        note();
        // SAFETY: as above.
        unsafe { System.realloc(p, l, n) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Allocations `f` makes on this thread.
fn allocations(f: impl FnOnce()) -> u64 {
    let before = ALLOCS.with(Cell::get);
    COUNT_HERE.with(|c| c.set(true));
    f();
    COUNT_HERE.with(|c| c.set(false));
    ALLOCS.with(Cell::get) - before
}

/// Polls A's requester CQE (success) and retires its WQE.
fn req_done(p: &mut RcPair) {
    let c = try_poll(&mut p.cqa.cq).expect("requester CQE");
    expect_ok(&c, CqeOpcode::Req);
    p.qa.sq.retire(c.wqe_counter);
}

#[test]
fn rc_wqes_allocate_nothing_once_warm() {
    let f = Fabric::new(SimConfig::deterministic());
    let mut p = RcPair::new(&f, QpCaps::default(), &RcParams::default());
    let src = p.a.buf(4096, Access::LOCAL_WRITE);
    let dst = p.b.buf(
        4096,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
    );
    let rbuf = p.b.buf(4096, Access::LOCAL_WRITE);
    src.write(0, &[0x5a; 4096]);
    let msg = [7u8; 64];
    let mut round = |i: u32| {
        let off = (i as usize % 8) * 256;
        // RDMA WRITE, inline.
        post(
            &mut p.qa,
            &mlx5::wqe::WqeDesc {
                remote: Some(dst.raddr(off)),
                inline: &msg,
                ..desc(Opcode::RdmaWrite)
            },
        );
        req_done(&mut p);
        // RDMA WRITE from a data segment (the gather path).
        let sge = [src.sge(off, 256)];
        post(
            &mut p.qa,
            &mlx5::wqe::WqeDesc {
                remote: Some(dst.raddr(2048 + off)),
                sges: &sge,
                ..desc(Opcode::RdmaWrite)
            },
        );
        req_done(&mut p);
        // RDMA READ into a data segment (the local scatter path).
        let rsge = [src.sge(2048 + off, 128)];
        post(
            &mut p.qa,
            &mlx5::wqe::WqeDesc {
                remote: Some(dst.raddr(off)),
                sges: &rsge,
                ..desc(Opcode::RdmaRead)
            },
        );
        req_done(&mut p);
        // WRITE_IMM and SEND, each consuming a receive WQE at B (the responder scatter path).
        post_recv(&mut p.qb, &[rbuf.sge(0, 4096)]);
        post(
            &mut p.qa,
            &mlx5::wqe::WqeDesc {
                imm: i,
                remote: Some(dst.raddr(off)),
                inline: &msg,
                ..desc(Opcode::RdmaWriteImm)
            },
        );
        req_done(&mut p);
        let c = try_poll(&mut p.cqb.cq).unwrap();
        expect_ok(&c, CqeOpcode::RespWrImm);
        assert_eq!(c.imm, i);
        p.qb.rq.as_mut().unwrap().complete();
        post_recv(&mut p.qb, &[rbuf.sge(0, 4096)]);
        let ssge = [src.sge(off, 200)];
        post(
            &mut p.qa,
            &mlx5::wqe::WqeDesc {
                sges: &ssge,
                ..desc(Opcode::Send)
            },
        );
        req_done(&mut p);
        let c = try_poll(&mut p.cqb.cq).unwrap();
        expect_ok(&c, CqeOpcode::RespSend);
        assert_eq!(c.byte_cnt, 200);
        p.qb.rq.as_mut().unwrap().complete();
    };
    for i in 0..64 {
        round(i);
    }
    let n = allocations(|| {
        for i in 64..1064 {
            round(i);
        }
    });
    assert_eq!(n, 0, "allocations in 1000 rounds of 5 WQEs");
    assert_eq!(rbuf.read(0, 200), vec![0x5a; 200], "the last SEND landed");
}

#[test]
fn ud_sends_allocate_nothing_once_warm() {
    use mlx5::verbs::QpType;
    const QKEY: u32 = 0x1111_0000;
    let f = Fabric::new(SimConfig::deterministic());
    let sn = Node::new(&f);
    let dn = Node::new(&f);
    let (mut scq, mut dcq) = (sn.cq(256), dn.cq(256));
    let mut sqp = sn.qp(QpType::Ud, &scq, &scq, None, QpCaps::default());
    let mut dqp = dn.qp(QpType::Ud, &dcq, &dcq, None, QpCaps::default());
    sqp.activate_ud(QKEY).unwrap();
    dqp.activate_ud(QKEY).unwrap();
    let av = dn.ah(&dn.ud_dest(&dqp, QKEY));
    let src = sn.buf(4096, Access::empty());
    src.write(0, &[0x3c; 4096]);
    let rbuf = dn.buf(4096, Access::LOCAL_WRITE);
    let msg = [9u8; 100];
    let mut round = |i: u32| {
        for (inline, sges) in [(&msg[..], &[][..]), (&[][..], &[src.sge(0, 300)][..])] {
            post_recv(&mut dqp, &[rbuf.sge(0, 4096)]);
            post(
                &mut sqp,
                &mlx5::wqe::WqeDesc {
                    imm: i,
                    ud: Some(av),
                    inline,
                    sges,
                    ..desc(Opcode::SendImm)
                },
            );
            let c = try_poll(&mut scq.cq).expect("requester CQE");
            expect_ok(&c, CqeOpcode::Req);
            sqp.sq.retire(c.wqe_counter);
            let c = try_poll(&mut dcq.cq).expect("UD receive");
            expect_ok(&c, CqeOpcode::RespSendImm);
            assert_eq!(c.imm, i);
            assert_eq!(c.byte_cnt as usize, 40 + inline.len() + sges.len() * 300);
            dqp.rq.as_mut().unwrap().complete();
        }
    };
    for i in 0..64 {
        round(i);
    }
    let n = allocations(|| {
        for i in 64..1064 {
            round(i);
        }
    });
    assert_eq!(n, 0, "allocations in 1000 rounds of 2 UD SENDs");
    assert_eq!(rbuf.read(40, 300), vec![0x3c; 300], "the last SEND landed");
}

/// A SEND finding no receive WQE stalls (its QP joins the model's set of QPs visited by every
/// progress step), is retried by steps, then completes once a receive is posted (the QP leaves
/// the set): none of it allocates once warm.
#[test]
fn rnr_stall_and_retries_allocate_nothing_once_warm() {
    let f = Fabric::new(SimConfig::deterministic());
    let mut p = RcPair::new(&f, QpCaps::default(), &RcParams::default());
    let rbuf = p.b.buf(4096, Access::LOCAL_WRITE);
    let msg = [3u8; 48];
    let mut round = |i: u32| {
        post(
            &mut p.qa,
            &mlx5::wqe::WqeDesc {
                imm: i,
                inline: &msg,
                ..desc(Opcode::SendImm)
            },
        );
        for _ in 0..4 {
            f.progress();
        }
        assert!(
            try_poll(&mut p.cqa.cq).is_none(),
            "stalled: no requester CQE"
        );
        post_recv(&mut p.qb, &[rbuf.sge(0, 4096)]);
        f.progress();
        req_done(&mut p);
        let c = try_poll(&mut p.cqb.cq).expect("the SEND arrived after the stall");
        expect_ok(&c, CqeOpcode::RespSendImm);
        assert_eq!((c.imm, c.byte_cnt), (i, 48));
        p.qb.rq.as_mut().unwrap().complete();
    };
    for i in 0..64 {
        round(i);
    }
    let retries = f.stats().rnr_retries;
    let n = allocations(|| {
        for i in 64..1064 {
            round(i);
        }
    });
    assert_eq!(
        n, 0,
        "allocations in 1000 RNR stalls, retries and resumptions"
    );
    assert!(
        f.stats().rnr_retries - retries >= 1000,
        "every round retried the stalled SEND"
    );
}

/// UD SENDs under fault injection: packets held back (reorder) or delayed leave the model's
/// reused send buffer with their payload and come back when delivered; none of it allocates
/// once warm.
#[test]
fn ud_fault_injection_allocates_nothing_once_warm() {
    use mlx5::sim::UdFaults;
    use mlx5::verbs::QpType;
    const QKEY: u32 = 0x2222_0000;
    let f = Fabric::new(SimConfig {
        ud_faults: Some(UdFaults {
            seed: 5,
            drop: 0.1,
            duplicate: 0.1,
            reorder: 0.2,
            delay: 0.2,
            max_delay: 3,
        }),
        ..SimConfig::deterministic()
    });
    let sn = Node::new(&f);
    let dn = Node::new(&f);
    let (mut scq, mut dcq) = (sn.cq(256), dn.cq(256));
    let mut sqp = sn.qp(QpType::Ud, &scq, &scq, None, QpCaps::default());
    let mut dqp = dn.qp(QpType::Ud, &dcq, &dcq, None, QpCaps::default());
    sqp.activate_ud(QKEY).unwrap();
    dqp.activate_ud(QKEY).unwrap();
    let av = dn.ah(&dn.ud_dest(&dqp, QKEY));
    let rbuf = dn.buf(4096, Access::LOCAL_WRITE);
    for _ in 0..16 {
        post_recv(&mut dqp, &[rbuf.sge(0, 4096)]);
    }
    let msg = [0x6du8; 200];
    let mut received = 0u64;
    let mut round = |i: u32| {
        post(
            &mut sqp,
            &mlx5::wqe::WqeDesc {
                imm: i,
                ud: Some(av),
                inline: &msg,
                ..desc(Opcode::SendImm)
            },
        );
        let c = try_poll(&mut scq.cq).expect("requester CQE");
        expect_ok(&c, CqeOpcode::Req);
        sqp.sq.retire(c.wqe_counter);
        // Longer than the longest delay: nothing is still held or delayed after the round.
        for _ in 0..5 {
            f.progress();
        }
        while let Some(c) = try_poll(&mut dcq.cq) {
            expect_ok(&c, CqeOpcode::RespSendImm);
            assert_eq!(c.byte_cnt, 40 + 200);
            received += 1;
            dqp.rq.as_mut().unwrap().complete();
            post_recv(&mut dqp, &[rbuf.sge(0, 4096)]);
        }
    };
    for i in 0..64 {
        round(i);
    }
    let before = f.stats();
    let n = allocations(|| {
        for i in 64..1064 {
            round(i);
        }
    });
    let after = f.stats();
    assert_eq!(n, 0, "allocations in 1000 UD SENDs under fault injection");
    assert!(
        after.ud_reorders - before.ud_reorders > 100 && after.ud_delays - before.ud_delays > 100,
        "packets were held back and delayed: {after:?}"
    );
    assert_eq!(
        received, after.ud_delivered,
        "every delivered packet completed"
    );
    assert_eq!(rbuf.read(40, 200), vec![0x6d; 200]);
}
