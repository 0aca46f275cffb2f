//! Send queue driver: WQEs of mixed shapes across ring wraps, read back by a stand-in device
//! at the slots the driver reported; NOP padding; SqFull; selective signaling; doorbell record.

mod driver_common;

use std::collections::VecDeque;

use driver_common::{Expected, QPN, Rng, SqHarness, dbrec_word, shape};
use mlx5::Error;
use mlx5::sq::MAX_WQEBBS;
use mlx5::sq::SendQueue;
use mlx5::wqe::{self, Opcode, Sge, WqeDesc, wqebbs};

/// Posting without a device: these tests run the driver alone, so nothing ever writes the
/// memory a scatter list names, and every opcode (RDMA READ and atomics included) may be
/// posted: `SendQueue::post_local_write`'s contract asks for nothing more.
trait NoDevice {
    fn post_nodev(&mut self, desc: &WqeDesc<'_>) -> mlx5::Result<u16>;
}

impl NoDevice for SendQueue {
    fn post_nodev(&mut self, desc: &WqeDesc<'_>) -> mlx5::Result<u16> {
        // SAFETY: no device runs in these tests (trait docs).
        unsafe { self.post_local_write(desc) }
    }
}

/// One posted WQE as the test remembers it.
struct Posted {
    pi: u32,
    n: u32,
    signaled: bool,
}

/// Posts `count` random WQEs (inline 0..=220 B, 0-2 SGEs, every RC opcode or UD sends) into
/// a `wqe_cnt` ring, ringing and completing in between, and checks everything the device
/// reads: same WQEs, in order, NOP padding exactly to the ring end, correct `wqe_index`.
fn mixed_run(wqe_cnt: u32, ud: bool, count: usize, seed: u64) {
    let mut h = SqHarness::new(wqe_cnt, 220, ud);
    let mut rng = Rng(seed);
    // The stream the device must see: (pi, Some(expected) | None for a padding NOP of n).
    let mut expected: Vec<(u32, Option<Expected>, u32)> = Vec::new();
    let mut live: VecDeque<Posted> = VecDeque::new();
    let mut since_signal = 0;
    let mut pads = 0;
    let mut fulls = 0;
    let mut posted = 0;
    while posted < count {
        let signaled = since_signal >= 2 || rng.below(4) == 0;
        let e = shape(
            rng.below(6) as u8,
            rng.below(221) as usize,
            rng.below(3) as usize,
            signaled,
            rng.next(),
            ud,
        );
        let pi_before = h.sq.pi();
        let free_before = h.sq.free_wqebbs();
        let n = wqebbs(e.ds());
        let slot = pi_before & (wqe_cnt - 1);
        let pad = if slot + n > wqe_cnt {
            wqe_cnt - slot
        } else {
            0
        };
        match h.sq.post_nodev(&e.desc()) {
            Ok(idx) => {
                assert!(pad + n <= free_before);
                let pi = pi_before + pad;
                assert_eq!(idx, pi as u16);
                if pad > 0 {
                    expected.push((pi_before, None, pad));
                    live.push_back(Posted {
                        pi: pi_before,
                        n: pad,
                        signaled: false,
                    });
                    pads += 1;
                }
                // Read back right away at the reported slot.
                e.check(&h.parse_at(u32::from(idx), ud), idx);
                expected.push((pi, Some(e), n));
                live.push_back(Posted { pi, n, signaled });
                assert_eq!(h.sq.pi(), pi + n);
                assert_eq!(h.sq.free_wqebbs(), free_before - pad - n);
                since_signal = if signaled { 0 } else { since_signal + 1 };
                posted += 1;
            }
            Err(Error::SqFull { need, free }) => {
                assert_eq!((need, free), (pad + n, free_before));
                assert!(need > free);
                assert_eq!(h.sq.pi(), pi_before, "nothing written on SqFull");
                fulls += 1;
                // Complete the newest signaled WQE the device has been told about.
                h.sq.ring_doorbell();
                let last = live
                    .iter()
                    .rposition(|p| p.signaled)
                    .expect("a signaled WQE is live");
                let p = &live[last];
                let before = h.sq.retired();
                let end = p.pi + p.n;
                assert_eq!(h.sq.retire(p.pi as u16), end - before);
                assert_eq!(h.sq.retired(), end);
                live.drain(..=last);
            }
            Err(e) => panic!("unexpected {e}"),
        }
        if rng.below(3) == 0 {
            h.sq.ring_doorbell();
            assert_eq!(dbrec_word(&h.db, 1), h.sq.pi() & 0xffff);
            // In-order CQE for the oldest signaled WQE, sometimes.
            if rng.below(2) == 0
                && let Some(first) = live.iter().position(|p| p.signaled)
            {
                let p = &live[first];
                let before = h.sq.outstanding_wqebbs();
                let freed = h.sq.retire(p.pi as u16);
                assert_eq!(h.sq.retired(), p.pi + p.n);
                assert_eq!(before - freed, h.sq.outstanding_wqebbs());
                live.drain(..=first);
            }
        }
        assert_eq!(
            h.sq.outstanding_wqebbs(),
            live.iter().map(|p| p.n).sum::<u32>(),
            "outstanding accounting"
        );
    }
    h.sq.ring_doorbell();
    assert!(h.sq.pi() > 3 * wqe_cnt, "several ring wraps");
    assert!(pads > 0, "the run crossed the ring end with padding");
    assert!(fulls > 0, "the run filled the ring");
    assert_eq!(h.sq.pad_nops(), pads);

    let st = h.dev.state.lock().unwrap();
    assert_eq!(st.seen.len(), expected.len());
    for ((pi, w), (epi, e, n)) in st.seen.iter().zip(&expected) {
        assert_eq!(pi, epi);
        match e {
            Some(e) => e.check(w, *pi as u16),
            None => {
                // Padding: an unsignaled NOP covering exactly the rest of the ring.
                assert_eq!(w.ctrl.opcode, Opcode::Nop as u8);
                assert_eq!(w.ctrl.fm_ce_se, 0);
                assert_eq!(wqebbs(u32::from(w.ctrl.ds)), *n);
                assert_eq!((pi & (wqe_cnt - 1)) + n, wqe_cnt);
            }
        }
    }
    assert_eq!(st.ci, h.sq.pi());
}

#[test]
fn mixed_rc_wqes_across_ring_wraps() {
    for seed in 1..=4 {
        mixed_run(64, false, 600, seed);
    }
    mixed_run(32, false, 400, 99);
}

#[test]
fn mixed_ud_wqes_across_ring_wraps() {
    for seed in 1..=3 {
        mixed_run(64, true, 500, seed);
    }
}

fn nop_desc(signaled: bool) -> WqeDesc<'static> {
    WqeDesc {
        opcode: Opcode::Nop,
        flags: if signaled { wqe::CQ_UPDATE } else { 0 },
        imm: 0,
        ud: None,
        remote: None,
        atomic: None,
        inline: &[],
        sges: &[],
    }
}

fn big_write(sges: &[Sge]) -> WqeDesc<'_> {
    WqeDesc {
        opcode: Opcode::RdmaWrite,
        flags: wqe::CQ_UPDATE,
        imm: 0,
        ud: None,
        remote: Some(wqe::RaddrSeg { raddr: 0, rkey: 1 }),
        atomic: None,
        inline: &[],
        sges,
    }
}

#[test]
fn full_ring_is_sq_full_and_nothing_is_written() {
    let mut h = SqHarness::new(16, 64, false);
    for i in 0..16 {
        assert_eq!(h.sq.post_nodev(&nop_desc(i == 15)).unwrap(), i as u16);
    }
    assert_eq!(h.sq.free_wqebbs(), 0);
    let snap = h.ring_snapshot();
    match h.sq.post_nodev(&nop_desc(false)) {
        Err(Error::SqFull { need: 1, free: 0 }) => {}
        r => panic!("expected SqFull, got {r:?}"),
    }
    assert!(matches!(
        h.sq.post_nop(true),
        Err(Error::SqFull { need: 1, free: 0 })
    ));
    assert_eq!(h.ring_snapshot(), snap);
    assert_eq!(h.sq.pi(), 16);
    // The signaled last WQE retires everything.
    h.sq.ring_doorbell();
    assert_eq!(h.sq.retire(15), 16);
    assert_eq!(h.sq.free_wqebbs(), 16);
}

#[test]
fn padding_counts_against_free_space_exactly() {
    let sges = [Sge {
        addr: 0,
        len: 1,
        lkey: 1,
    }; 61];
    // A ring of 16 WQEBBs takes WQEs of at most 8 (see the sq module docs): ds 63 is too
    // large for it, not "full".
    let mut h = SqHarness::new(16, 64, false);
    assert_eq!(h.sq.max_wqebbs(), 8);
    assert_eq!(big_write(&sges).ds(), 63);
    assert!(matches!(
        h.sq.post_nodev(&big_write(&sges)),
        Err(Error::WqeTooLarge(_))
    ));
    assert_eq!(h.sq.pi(), 0);

    // pi at slot 14 with 7 WQEBBs outstanding (free 9); an 8-WQEBB WQE needs 2 + 8.
    let d8 = big_write(&sges[..30]); // ds 32
    assert_eq!(wqebbs(d8.ds()), 8);
    let mut h2 = SqHarness::new(16, 64, false);
    for i in 0..14 {
        h2.sq.post_nodev(&nop_desc(i == 6)).unwrap();
    }
    h2.sq.ring_doorbell();
    assert_eq!(h2.sq.retire(6), 7);
    assert_eq!(h2.sq.free_wqebbs(), 9);
    assert_eq!(h2.sq.wqebbs_needed(d8.ds()), 10);
    assert!(!h2.sq.has_room(d8.ds()));
    let snap = h2.ring_snapshot();
    match h2.sq.post_nodev(&d8) {
        Err(Error::SqFull { need: 10, free: 9 }) => {}
        r => panic!("expected SqFull {{ need: 10, free: 9 }}, got {r:?}"),
    }
    assert_eq!(h2.ring_snapshot(), snap);
    assert_eq!(h2.sq.pi(), 14);
    // A (flush) CQE naming unsignaled WQE 7 frees one more: exactly enough.
    assert_eq!(h2.sq.retire(7), 1);
    assert_eq!(h2.sq.free_wqebbs(), 10);
    assert!(h2.sq.has_room(d8.ds()));
    assert_eq!(h2.sq.post_nodev(&d8).unwrap(), 16);
    assert_eq!(h2.sq.free_wqebbs(), 0);
    let pad = h2.parse_at(14, false);
    assert_eq!(pad.ctrl.opcode, Opcode::Nop as u8);
    assert_eq!(pad.ctrl.wqe_index, 14);
    assert_eq!(pad.ctrl.ds, 8);
    assert_eq!(pad.ctrl.fm_ce_se, 0);
    // Retiring the big signaled WQE retires the padding NOP with it.
    assert_eq!(h2.sq.retire(16), 6 + 2 + 8);
    assert_eq!(h2.sq.outstanding_wqebbs(), 0);
}

#[test]
fn largest_wqe_pads_with_one_nop_of_fifteen_wqebbs() {
    let mut h = SqHarness::new(64, 64, false);
    let sges = [Sge {
        addr: 8,
        len: 8,
        lkey: 2,
    }; 61];
    let d = big_write(&sges);
    assert_eq!((d.ds(), wqebbs(d.ds())), (63, MAX_WQEBBS));
    // Move pi to slot 49: 64 - 49 = 15 WQEBBs to the end, the WQE needs 16.
    for i in 0..49 {
        h.sq.post_nodev(&nop_desc(i == 48)).unwrap();
    }
    h.sq.ring_doorbell();
    h.sq.retire(48);
    assert_eq!(h.sq.post_nodev(&d).unwrap(), 64);
    h.sq.ring_doorbell();
    let st = h.dev.state.lock().unwrap();
    let (pi, pad) = &st.seen[49];
    assert_eq!(*pi, 49);
    assert_eq!(pad.ctrl.opcode, Opcode::Nop as u8);
    assert_eq!(pad.ctrl.ds, 60);
    let (pi, w) = &st.seen[50];
    assert_eq!(*pi, 64);
    assert_eq!(w.sges.len(), 61);
    assert_eq!(st.ci, 80);
}

#[test]
fn selective_signaling_retires_earlier_unsignaled_wqes() {
    let mut h = SqHarness::new(64, 220, false);
    let mut idx = vec![];
    for i in 0..10u32 {
        let e = shape(
            0,
            (i * 20) as usize,
            1,
            i == 4 || i == 9,
            u64::from(i),
            false,
        );
        idx.push((h.sq.post_nodev(&e.desc()).unwrap(), h.sq.pi()));
    }
    h.sq.ring_doorbell();
    let total = h.sq.pi();
    assert_eq!(h.sq.outstanding_wqebbs(), total);
    // CQE for WQE 4: WQEs 0..=4 retire.
    let (w4, after4) = idx[4];
    assert_eq!(h.sq.retire(w4), after4);
    assert_eq!(h.sq.retired(), after4);
    assert_eq!(h.sq.outstanding_wqebbs(), total - after4);
    // A stale/duplicate counter (already retired) and a counter that is not a WQE start
    // change nothing.
    assert_eq!(h.sq.retire(w4), 0);
    assert_eq!(h.sq.retire(idx[5].0 + 1), 0);
    assert_eq!(h.sq.retire(0xfff0), 0);
    assert_eq!(h.sq.bad_retires(), 3);
    assert_eq!(h.sq.retired(), after4);
    // CQE for WQE 9 retires the rest.
    let (w9, after9) = idx[9];
    assert_eq!(h.sq.retire(w9), after9 - after4);
    assert_eq!(h.sq.outstanding_wqebbs(), 0);
    assert_eq!(h.sq.free_wqebbs(), 64);
}

#[test]
fn doorbell_record_and_sim_rings() {
    let mut h = SqHarness::new(64, 64, false);
    // Nothing posted: no ring at all.
    h.sq.ring_doorbell();
    assert!(h.dev.state.lock().unwrap().rings.is_empty());
    assert_eq!(dbrec_word(&h.db, 1), 0);
    // Beyond 2^16 WQEBBs: the record carries pi & 0xffff, the device extends it.
    let mut rng = Rng(5);
    let mut rung = 0;
    while h.sq.pi() < 70_000 {
        for _ in 0..=rng.below(4) {
            let i = h.sq.post_nop(true).unwrap();
            h.sq.retire(i);
        }
        assert!(h.sq.pending_since_doorbell() > 0);
        h.sq.ring_doorbell();
        rung += 1;
        assert_eq!(h.sq.pending_since_doorbell(), 0);
        assert_eq!(dbrec_word(&h.db, 1), h.sq.pi() & 0xffff);
        h.sq.ring_doorbell(); // no-op
    }
    let st = h.dev.state.lock().unwrap();
    assert_eq!(st.rings.len(), rung);
    assert_eq!(st.ci, h.sq.pi());
    assert!(
        st.seen
            .iter()
            .all(|(pi, w)| w.ctrl.wqe_index == *pi as u16 && w.ctrl.ds == 1)
    );
    assert_eq!(h.sq.qpn(), QPN);
}

#[test]
fn post_errors_are_typed_and_write_nothing() {
    let mut h = SqHarness::new(64, 64, false);
    let snap = h.ring_snapshot();
    let inline = [0u8; 65];
    let d = WqeDesc {
        inline: &inline,
        ..nop_desc(false)
    };
    assert!(matches!(
        h.sq.post_nodev(&WqeDesc {
            opcode: Opcode::Send,
            ..d
        }),
        Err(Error::InlineTooLarge { len: 65, max: 64 })
    ));
    let sges = [Sge {
        addr: 0,
        len: 0,
        lkey: 0,
    }; 62];
    let d = big_write(&sges); // ds 64
    assert_eq!(d.ds(), 64);
    assert!(matches!(h.sq.post_nodev(&d), Err(Error::WqeTooLarge(_))));
    assert_eq!(h.ring_snapshot(), snap);
    assert_eq!(h.sq.pi(), 0);
}

mod accounting {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        Post {
            kind: u8,
            inline: usize,
            nsges: usize,
            signaled: bool,
            seed: u64,
        },
        /// A CQE naming the k-th (mod len) outstanding, rung WQE (signaled or a flush).
        RetireNth(usize),
        /// A CQE with an arbitrary counter.
        RetireRaw(u16),
        /// A CQE naming `delta` WQEBBs after the start of the k-th outstanding WQE: mostly
        /// not a WQE start (must be rejected), sometimes one.
        RetireNear(usize, u16),
        Ring,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            5 => (any::<u8>(), 0usize..=220, prop_oneof![3 => 0usize..=2, 1 => 3usize..=61], any::<bool>(), any::<u64>())
                .prop_map(|(kind, inline, nsges, signaled, seed)| Op::Post { kind, inline, nsges, signaled, seed }),
            2 => any::<usize>().prop_map(Op::RetireNth),
            1 => any::<u16>().prop_map(Op::RetireRaw),
            1 => (any::<usize>(), 0u16..20).prop_map(|(k, d)| Op::RetireNear(k, d)),
            2 => Just(Op::Ring),
        ]
    }

    /// A WQE the model knows about: `None` is a padding NOP.
    struct Live {
        pi: u32,
        n: u32,
        e: Option<Expected>,
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Random post sizes and retire points: the driver's free-space accounting equals an
        /// independent model, errors come exactly when the model says so, live WQEs are never
        /// overwritten, and the device reads exactly the posted stream.
        #[test]
        fn sq_accounting(log2 in 3u32..=6, ops in prop::collection::vec(op(), 1..300)) {
            let cnt = 1u32 << log2;
            let max_n = MAX_WQEBBS.min(cnt.div_ceil(2));
            let mut h = SqHarness::new(cnt, 220, false);
            let (mut pi, mut retired, mut rung) = (0u32, 0u32, 0u32);
            let mut live: VecDeque<Live> = VecDeque::new();
            let mut stream: Vec<(u32, Option<Expected>, u32)> = Vec::new();
            let mut bad = 0u64;
            for op in ops.iter().cloned() {
                match op {
                    Op::Post { kind, inline, nsges, signaled, seed } => {
                        let e = shape(kind, inline, nsges, signaled, seed, false);
                        let ds = e.ds();
                        let n = wqebbs(ds);
                        let slot = pi & (cnt - 1);
                        let pad = if slot + n > cnt { cnt - slot } else { 0 };
                        let free = cnt - (pi - retired);
                        let r = h.sq.post_nodev(&e.desc());
                        if ds > 63 || n > max_n {
                            prop_assert!(matches!(r, Err(Error::WqeTooLarge(_))), "{r:?}");
                        } else if pad + n > free {
                            prop_assert!(
                                matches!(r, Err(Error::SqFull { need, free: f }) if need == pad + n && f == free),
                                "{r:?}"
                            );
                        } else {
                            prop_assert_eq!(r.unwrap(), (pi + pad) as u16);
                            if pad > 0 {
                                live.push_back(Live { pi, n: pad, e: None });
                                stream.push((pi, None, pad));
                            }
                            live.push_back(Live { pi: pi + pad, n, e: Some(e.clone()) });
                            stream.push((pi + pad, Some(e), n));
                            pi += pad + n;
                        }
                    }
                    Op::RetireNth(k) => {
                        let rung_live = live.iter().take_while(|l| l.pi < rung).count();
                        if rung_live > 0 {
                            let k = k % rung_live;
                            let freed = h.sq.retire(live[k].pi as u16);
                            let end = live[k].pi + live[k].n;
                            prop_assert_eq!(freed, end - retired);
                            retired = end;
                            live.drain(..=k);
                        }
                    }
                    Op::RetireRaw(_) | Op::RetireNear(..) => {
                        let c = match op {
                            Op::RetireRaw(c) => c,
                            Op::RetireNear(k, d) if !live.is_empty() => {
                                (live[k % live.len()].pi as u16).wrapping_add(d)
                            }
                            _ => continue,
                        };
                        match live.iter().position(|l| l.pi as u16 == c) {
                            Some(k) if live[k].pi < rung => {
                                let end = live[k].pi + live[k].n;
                                prop_assert_eq!(h.sq.retire(c), end - retired);
                                retired = end;
                                live.drain(..=k);
                            }
                            Some(_) => {} // not rung yet: no CQE can name it
                            None => {
                                prop_assert_eq!(h.sq.retire(c), 0);
                                bad += 1;
                            }
                        }
                    }
                    Op::Ring => {
                        h.sq.ring_doorbell();
                        rung = pi;
                        prop_assert_eq!(dbrec_word(&h.db, 1), pi & 0xffff);
                    }
                }
                prop_assert_eq!(h.sq.pi(), pi);
                prop_assert_eq!(h.sq.retired(), retired);
                prop_assert_eq!(h.sq.bad_retires(), bad);
                prop_assert_eq!(h.sq.outstanding_wqebbs(), pi - retired);
                prop_assert_eq!(h.sq.free_wqebbs(), cnt - (pi - retired));
                prop_assert!(pi - retired <= cnt);
                // No live WQE was overwritten.
                for l in &live {
                    let w = h.parse_at(l.pi, false);
                    match &l.e {
                        Some(e) => e.check(&w, l.pi as u16),
                        None => {
                            prop_assert_eq!(w.ctrl.opcode, Opcode::Nop as u8);
                            prop_assert_eq!(wqebbs(u32::from(w.ctrl.ds)), l.n);
                        }
                    }
                }
            }
            h.sq.ring_doorbell();
            let st = h.dev.state.lock().unwrap();
            prop_assert_eq!(st.seen.len(), stream.len());
            for ((spi, w), (epi, e, n)) in st.seen.iter().zip(&stream) {
                prop_assert_eq!(spi, epi);
                match e {
                    Some(e) => e.check(w, *spi as u16),
                    None => prop_assert_eq!(wqebbs(u32::from(w.ctrl.ds)), *n),
                }
            }
        }
    }
}

/// More gather entries than the QP's `max_send_sge` (64 in the harness) is rejected before
/// anything is written (even before the `ds` limit is looked at).
#[test]
fn too_many_sges_is_rejected_and_nothing_is_written() {
    let mut h = SqHarness::new(16, 64, false);
    let sges = [Sge {
        addr: 0x1000,
        len: 8,
        lkey: 1,
    }; 65];
    let snap = h.ring_snapshot();
    match h.sq.post_nodev(&big_write(&sges)) {
        Err(Error::WqeTooLarge(msg)) => assert!(msg.contains("max_send_sge"), "{msg}"),
        r => panic!("expected WqeTooLarge, got {r:?}"),
    }
    assert_eq!(h.ring_snapshot(), snap);
    assert_eq!(h.sq.pi(), 0);
    h.sq.post_nodev(&big_write(&sges[..4])).unwrap();
}

/// The safe `post` refuses the opcodes that make the device write local memory (RDMA READ,
/// atomics), writing nothing; `post_local_write` takes them.
#[test]
fn safe_post_refuses_local_write_opcodes() {
    let mut h = SqHarness::new(16, 64, false);
    let sges = [Sge {
        addr: 0x1000,
        len: 8,
        lkey: 7,
    }];
    for op in [Opcode::RdmaRead, Opcode::AtomicCs, Opcode::AtomicFa] {
        let d = WqeDesc {
            opcode: op,
            sges: &sges,
            ..nop_desc(true)
        };
        assert!(
            matches!(h.sq.post(&d), Err(Error::InvalidArgument(_))),
            "{op:?}"
        );
        assert_eq!(h.sq.pi(), 0, "{op:?}: nothing written");
    }
    let d = WqeDesc {
        opcode: Opcode::RdmaRead,
        sges: &sges,
        ..nop_desc(true)
    };
    assert_eq!(h.sq.post_nodev(&d).unwrap(), 0);
    assert!(h.sq.pi() > 0);
}
