//! Device-model cost, through the driver, in a release build.
//!
//! Workloads (one JSON line each on stdout):
//! - `write_batch`: one thread, one RC QP pair, RDMA WRITE of 64 B inline, 32 WQEs per doorbell,
//!   the last one signaled; reports WQEs per second through the model.
//! - `write_imm_pingpong`: two threads (ranks) on one fabric, WRITE_IMM of 64 B each way, one
//!   message in flight; reports the round-trip time.
//! - `write_imm_cycle*`: one thread, one RC QP pair, the receiver on an SRQ of zero-length
//!   receive WQEs (as copyrpc does). One cycle = post one signaled RDMA WRITE_IMM on A, ring the
//!   doorbell (the model executes it inside that call), poll A's CQ for the requester CQE and
//!   retire it, poll B's CQ for the responder CQE (opcode, imm, byte_cnt, srqn checked),
//!   release its SRQ WQE, post a new one and ring the SRQ doorbell. Reports ns per cycle, i.e.
//!   per (WQE emitted + doorbell + CQE polled), as
//!   `{"workload":..,"iterations":..,"ns_per_op":..}` (median of the trials, plus the best
//!   trial). Variants: `write_imm_cycle` (64 B inline), `write_imm_cycle_inline8`,
//!   `write_imm_cycle_inline220` (the QP's `max_inline_data`), `write_imm_cycle_sge4k` (4 KiB
//!   from one data segment) and `write_imm_cycle_rq` (64 B inline, the receiver on its own RQ).
//!
//! `cargo bench -p mlx5 --bench sim_model [-- --quick]`. Timings on shared machines are noisy:
//! compare ratios within one run. Instructions per WRITE_IMM ping-pong, driver vs model:
//! `scripts/callgrind-mlx5-pingpong.sh` (example `writeimm_callgrind`).

#[path = "../tests/sim_common/mod.rs"]
mod sim_common;

use std::sync::{Arc, Barrier, mpsc};
use std::time::Instant;

use mlx5::cqe::CqeOpcode;
use mlx5::sim::{Fabric, SimConfig};
use mlx5::verbs::{Access, Cq, Qp, QpCaps, QpType, RcParams, Srq};
use mlx5::wqe::{CQ_UPDATE, Opcode, Sge, WqeDesc};
use sim_common::*;

fn write_batch(total: u64) {
    let f = Fabric::new(SimConfig::deterministic());
    let mut p = RcPair::new(&f, QpCaps::default(), &RcParams::default());
    let dst = p.b.buf(1 << 16, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let msg = [7u8; 64];
    const BATCH: u64 = 32;
    let start = Instant::now();
    let mut done = 0u64;
    while done < total {
        for i in 0..BATCH {
            let d = WqeDesc {
                flags: if i == BATCH - 1 { CQ_UPDATE } else { 0 },
                remote: Some(dst.raddr(((done + i) % 1024) as usize * 64)),
                inline: &msg,
                ..desc(Opcode::RdmaWrite)
            };
            p.qa.sq.post(&d).unwrap();
        }
        p.qa.sq.ring_doorbell();
        let c = try_poll(&mut p.cqa.cq).expect("CQE after the doorbell");
        p.qa.sq.retire(c.wqe_counter);
        done += BATCH;
    }
    let s = start.elapsed().as_secs_f64();
    println!(
        "{{\"bench\":\"write_batch\",\"msg_bytes\":64,\"batch\":{BATCH},\"wqes\":{done},\"secs\":{s:.4},\"mwqe_per_s\":{:.3}}}",
        done as f64 / s / 1e6
    );
}

fn pingpong(rounds: u32) {
    let fabric = Fabric::new(SimConfig::deterministic());
    let (tx0, rx1) = mpsc::channel();
    let (tx1, rx0) = mpsc::channel();
    let go = Arc::new(Barrier::new(2));
    let handles: Vec<_> = [(0u8, tx0, rx0), (1u8, tx1, rx1)]
        .into_iter()
        .map(|(me, tx, rx): (u8, mpsc::Sender<_>, mpsc::Receiver<_>)| {
            let (f, go) = (fabric.clone(), go.clone());
            std::thread::spawn(move || {
                let node = Node::new(&f);
                let mut cq = node.cq(512);
                let mut qp = node.qp(QpType::Rc, &cq, &cq, None, QpCaps::default());
                let ring = node.buf(64 * 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
                tx.send((node.remote(&qp), ring.raddr(0))).unwrap();
                let (peer, raddr) = rx.recv().unwrap();
                qp.connect_rc(&peer, &RcParams::default()).unwrap();
                for _ in 0..128 {
                    qp.rq.as_mut().unwrap().post_empty().unwrap();
                }
                qp.rq.as_mut().unwrap().ring_doorbell();
                go.wait();
                let start = Instant::now();
                let msg = [me; 64];
                for seq in 0..rounds {
                    let mut turn = me == 0;
                    for _ in 0..2 {
                        if turn {
                            let d = WqeDesc {
                                flags: if seq % 16 == 15 { CQ_UPDATE } else { 0 },
                                imm: seq,
                                remote: Some(raddr),
                                inline: &msg,
                                ..desc(Opcode::RdmaWriteImm)
                            };
                            qp.sq.post(&d).unwrap();
                            qp.sq.ring_doorbell();
                        } else {
                            loop {
                                let Some(c) = try_poll(&mut cq.cq) else {
                                    continue;
                                };
                                if opcode(&c) == CqeOpcode::Req {
                                    qp.sq.retire(c.wqe_counter);
                                    continue;
                                }
                                assert_eq!(c.imm, seq);
                                let rq = qp.rq.as_mut().unwrap();
                                rq.complete();
                                rq.post_empty().unwrap();
                                rq.ring_doorbell();
                                break;
                            }
                        }
                        turn = !turn;
                    }
                }
                start.elapsed()
            })
        })
        .collect();
    let el: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let s = el[0].as_secs_f64();
    println!(
        "{{\"bench\":\"write_imm_pingpong\",\"msg_bytes\":64,\"ranks\":2,\"round_trips\":{rounds},\"secs\":{s:.4},\"us_per_round_trip\":{:.3}}}",
        s * 1e6 / f64::from(rounds)
    );
}

/// How a `write_imm_cycle` WQE carries its payload.
#[derive(Clone, Copy, Debug)]
enum Payload {
    /// Inline in the WQE, this many bytes.
    Inline(usize),
    /// From registered memory through one data segment, this many bytes.
    Sge(usize),
}

impl Payload {
    fn len(self) -> usize {
        match self {
            Payload::Inline(n) | Payload::Sge(n) => n,
        }
    }
    fn kind(self) -> &'static str {
        match self {
            Payload::Inline(_) => "inline",
            Payload::Sge(_) => "sge",
        }
    }
}

/// Slots of the responder's landing ring (each `payload.len()` bytes).
const CYCLE_SLOTS: usize = 16;

/// One RC pair for `write_imm_cycle`: A only sends, B only receives (SRQ or own RQ).
/// Field order = drop order: QPs before the SRQ and CQs they use, MRs before memory.
struct CycleRig {
    qa: Qp,
    qb: Qp,
    srq: Option<Srq>,
    cqa: Cq,
    cqb: Cq,
    dst: Buf,
    src: Buf,
    _b: Node,
    _a: Node,
    fabric: Fabric,
}

impl CycleRig {
    fn new(payload: Payload, use_srq: bool) -> CycleRig {
        let fabric = Fabric::new(SimConfig::deterministic());
        let a = Node::new(&fabric);
        let b = Node::new(&fabric);
        let cqa = a.cq(256);
        let cqb = b.cq(256);
        let mut srq = use_srq.then(|| b.srq(255, 1));
        let caps = QpCaps::default();
        let mut qa = a.qp(QpType::Rc, &cqa, &cqa, None, caps);
        let mut qb = b.qp(QpType::Rc, &cqb, &cqb, srq.as_ref(), caps);
        connect(&a, &mut qa, &b, &mut qb, &RcParams::default());
        let len = payload.len();
        let dst = b.buf(
            CYCLE_SLOTS * len,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        );
        let src = a.buf(len.max(64), Access::LOCAL_WRITE);
        src.write(0, &vec![0x5a; len.max(64)]);
        // Zero-length receive WQEs, as many as fit.
        match &mut srq {
            Some(s) => {
                let n = s.srq.available();
                assert_eq!(s.srq.post_empty_n(n), n);
                s.srq.ring_doorbell();
            }
            None => {
                let rq = qb.rq.as_mut().unwrap();
                while rq.free() > 0 {
                    rq.post_empty().unwrap();
                }
                rq.ring_doorbell();
            }
        }
        CycleRig {
            qa,
            qb,
            srq,
            cqa,
            cqb,
            dst,
            src,
            _b: b,
            _a: a,
            fabric,
        }
    }

    /// One cycle with immediate `seq`: WQE emitted + doorbell (model executes) + requester CQE
    /// polled and retired + responder CQE polled, checked and its receive WQE re-posted.
    #[inline(always)]
    fn cycle(&mut self, payload: Payload, msg: &[u8], sge: &[Sge; 1], seq: u32) {
        let len = payload.len();
        let slot = seq as usize % CYCLE_SLOTS;
        let (inline, sges): (&[u8], &[Sge]) = match payload {
            Payload::Inline(_) => (msg, &[]),
            Payload::Sge(_) => (&[], sge),
        };
        let d = WqeDesc {
            imm: seq,
            remote: Some(self.dst.raddr(slot * len)),
            inline,
            sges,
            ..desc(Opcode::RdmaWriteImm)
        };
        self.qa.sq.post(&d).unwrap();
        self.qa.sq.ring_doorbell();

        let c = try_poll(&mut self.cqa.cq).expect("requester CQE right after the doorbell");
        assert!(c.opcode == CqeOpcode::Req as u8, "{c:?}");
        self.qa.sq.retire(c.wqe_counter);

        let r = try_poll(&mut self.cqb.cq).expect("responder CQE right after the doorbell");
        assert!(
            r.opcode == CqeOpcode::RespWrImm as u8 && r.imm == seq && r.byte_cnt == len as u32,
            "{r:?}"
        );
        match &mut self.srq {
            Some(s) => {
                assert_eq!(r.srqn, s.srq.srqn());
                s.srq.release(r.wqe_counter).unwrap();
                s.srq.post_empty().unwrap();
                s.srq.ring_doorbell();
            }
            None => {
                let rq = self.qb.rq.as_mut().unwrap();
                rq.complete();
                rq.post_empty().unwrap();
                rq.ring_doorbell();
            }
        }
    }
}

fn write_imm_cycle(name: &str, payload: Payload, use_srq: bool, iters: u64, trials: usize) {
    let mut rig = CycleRig::new(payload, use_srq);
    let len = payload.len();
    let msg: Vec<u8> = (0..len).map(|i| i as u8).collect();
    let sge = [rig.src.sge(0, len as u32)];
    let mut seq = 0u32;
    // Warm-up: every SQ/CQ/SRQ slot touched at least once, allocator warmed.
    for _ in 0..(iters / 10).max(1024) {
        rig.cycle(payload, &msg, &sge, seq);
        seq = seq.wrapping_add(1);
    }
    let mut ns = Vec::with_capacity(trials);
    for _ in 0..trials {
        let start = Instant::now();
        for _ in 0..iters {
            rig.cycle(payload, &msg, &sge, seq);
            seq = seq.wrapping_add(1);
        }
        ns.push(start.elapsed().as_nanos() as f64 / iters as f64);
    }
    // The last message really landed: slot of `seq - 1` holds the payload.
    let last = seq.wrapping_sub(1) as usize % CYCLE_SLOTS;
    let want = match payload {
        Payload::Inline(_) => msg.clone(),
        Payload::Sge(_) => rig.src.read(0, len),
    };
    assert_eq!(rig.dst.read(last * len, len), want);
    let stats = rig.fabric.stats();
    assert_eq!(stats.wqes.rdma_write_imm, u64::from(seq));
    assert_eq!(stats.error_cqes, 0);
    ns.sort_by(f64::total_cmp);
    println!(
        "{{\"workload\":\"{name}\",\"msg_bytes\":{len},\"payload\":\"{}\",\"recv\":\"{}\",\"iterations\":{iters},\"trials\":{trials},\"ns_per_op\":{:.1},\"ns_per_op_min\":{:.1}}}",
        payload.kind(),
        if use_srq { "srq" } else { "rq" },
        ns[ns.len() / 2],
        ns[0]
    );
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let scale = if quick { 10 } else { 1 };
    write_batch(2_000_000 / scale);
    pingpong(200_000 / scale as u32);
    let trials = if quick { 3 } else { 5 };
    let n = 500_000 / scale;
    write_imm_cycle("write_imm_cycle", Payload::Inline(64), true, n, trials);
    write_imm_cycle(
        "write_imm_cycle_inline8",
        Payload::Inline(8),
        true,
        n,
        trials,
    );
    write_imm_cycle(
        "write_imm_cycle_inline220",
        Payload::Inline(220),
        true,
        n,
        trials,
    );
    write_imm_cycle(
        "write_imm_cycle_sge4k",
        Payload::Sge(4096),
        true,
        n / 2,
        trials,
    );
    write_imm_cycle("write_imm_cycle_rq", Payload::Inline(64), false, n, trials);
}
