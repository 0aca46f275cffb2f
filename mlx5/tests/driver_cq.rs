//! Completion queue driver: ownership across many passes of the ring (owner bit flips),
//! `poll`/`poll_one`, the consumer doorbell record, and a concurrent producer.

mod driver_common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use driver_common::{CqHarness, Rng, produce_at, req_cqe};
use mlx5::cqe::{Cqe, CqeOpcode};

fn resp_cqe(i: u32) -> Cqe {
    Cqe {
        opcode: CqeOpcode::RespWrImm as u8,
        qpn: 0x10 + (i % 3),
        wqe_opcode: 0,
        wqe_counter: i as u16,
        byte_cnt: i * 7,
        imm: i ^ 0xa5a5_0000,
        src_qpn: 0,
        grh: 0,
        srqn: 0x77,
        syndrome: 0,
        vendor_syndrome: 0,
    }
}

#[test]
fn wraparound_over_many_passes_with_poll_batches() {
    for log2 in [0u32, 1, 3, 6] {
        let cnt = 1 << log2;
        let mut h = CqHarness::new(cnt);
        assert_eq!(h.cq.cqe_cnt(), cnt);
        assert_eq!(h.cq.log2_cqe_cnt(), log2);
        let mut rng = Rng(u64::from(log2) + 1);
        let mut next_expected = 0u32;
        // ~20 passes over the ring.
        while h.pi < 20 * cnt + 3 {
            // Produce up to the free entries (the device's rule: never overwrite an entry the
            // consumer has not released through the doorbell record).
            // The record always holds the driver's full progress here (every poll that consumed
            // wrote it), so the device may fill up to `next_expected + cnt`.
            assert_eq!(h.dbrec(), next_expected & 0xff_ffff);
            let room = cnt - (h.pi - next_expected);
            for _ in 0..rng.below(u64::from(room) + 1) {
                let c = resp_cqe(h.pi);
                h.produce(&c);
            }
            let max = rng.below(u64::from(cnt) + 2) as usize;
            let avail = (h.pi - next_expected) as usize;
            let before_db = h.dbrec();
            let mut got = Vec::new();
            let n = h.cq.poll(max, |c| got.push(*c));
            assert_eq!(n, avail.min(max));
            assert_eq!(got.len(), n);
            for c in &got {
                assert_eq!(*c, resp_cqe(next_expected));
                next_expected += 1;
            }
            assert_eq!(h.cq.ci(), next_expected);
            if n > 0 {
                assert_eq!(h.dbrec(), next_expected & 0xff_ffff);
            } else {
                assert_eq!(
                    h.dbrec(),
                    before_db,
                    "no doorbell record write without CQEs"
                );
            }
        }
        // Drain; then stale entries of the last pass are never taken again.
        let rest = h.pi - next_expected;
        assert_eq!(h.cq.poll(usize::MAX, |_| ()) as u32, rest);
        assert_eq!(h.cq.poll_one(), None);
        assert_eq!(h.cq.poll(16, |_| panic!("stale CQE")), 0);
        assert_eq!(h.cq.polled(), u64::from(h.pi));
        assert_eq!(h.cq.corrupt_cqes(), 0);
    }
}

#[test]
fn poll_one_leaves_dbrec_until_update() {
    let mut h = CqHarness::new(8);
    for i in 0..20u32 {
        h.produce(&req_cqe(5, i as u16));
        let c = h.cq.poll_one().unwrap();
        assert_eq!(c.wqe_counter, i as u16);
        assert_eq!(c.qpn, 5);
        assert!(c.status().is_ok());
        assert_eq!(h.cq.poll_one(), None);
        if i % 4 == 3 {
            h.cq.update_dbrec();
            assert_eq!(h.dbrec(), i + 1);
        } else {
            assert_eq!(h.dbrec(), i & !3);
        }
    }
}

#[test]
fn error_cqes_come_through_with_their_syndrome() {
    let mut h = CqHarness::new(4);
    let mut c = req_cqe(9, 3);
    c.opcode = CqeOpcode::ReqErr as u8;
    c.syndrome = 0x16;
    h.produce(&c);
    let got = h.cq.poll_one().unwrap();
    assert!(got.is_error());
    assert_eq!(got.status().unwrap_err().wqe_counter, 3);
}

#[test]
fn concurrent_producer_and_consumer() {
    const CNT: u32 = 16;
    const TOTAL: u32 = 50_000;
    let mut h = CqHarness::new(CNT);
    let buf = h.buf.as_mut_ptr() as usize;
    let db = h.db.as_ptr() as usize;
    let done = Arc::new(AtomicBool::new(false));
    let producer = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut pi = 0u32;
            while pi < TOTAL {
                // The device reads the consumer index (Acquire) before reusing an entry.
                // SAFETY: the doorbell record outlives the thread (joined below).
                let ci = u32::from_be(
                    unsafe { std::sync::atomic::AtomicU32::from_ptr(db as *mut u32) }
                        .load(Ordering::Acquire),
                );
                let ci_full = pi.wrapping_sub(pi.wrapping_sub(ci) & 0xff_ffff);
                if pi - ci_full >= CNT {
                    // Yield rather than spin: the test machine may have fewer free cores than
                    // threads.
                    std::thread::yield_now();
                    continue;
                }
                produce_at(buf, CNT, pi, &resp_cqe(pi));
                pi += 1;
            }
            done.store(true, Ordering::Release);
        })
    };
    let mut next = 0u32;
    while next < TOTAL {
        let n = h.cq.poll(5, |c| {
            assert_eq!(*c, resp_cqe(next));
            next += 1;
        });
        if n == 0 {
            std::thread::yield_now();
        }
    }
    producer.join().unwrap();
    assert!(done.load(Ordering::Acquire));
    assert_eq!(h.cq.polled(), u64::from(TOTAL));
    assert_eq!(h.dbrec(), TOTAL);
}
