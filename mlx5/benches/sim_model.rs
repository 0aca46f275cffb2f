//! Device-model cost, through the driver, in a release build.
//!
//! Workloads (one JSON line each on stdout):
//! - `write_batch`: one thread, one RC QP pair, RDMA WRITE of 64 B inline, 32 WQEs per doorbell,
//!   the last one signaled; reports WQEs per second through the model.
//! - `write_imm_pingpong`: two threads (ranks) on one fabric, WRITE_IMM of 64 B each way, one
//!   message in flight; reports the round-trip time.
//!
//! `cargo bench -p mlx5 --bench sim_model [-- --quick]`. Timings on shared machines are noisy:
//! compare ratios within one run.

#[path = "../tests/sim_common/mod.rs"]
mod sim_common;

use std::sync::{Arc, Barrier, mpsc};
use std::time::Instant;

use mlx5::cqe::CqeOpcode;
use mlx5::sim::{Fabric, SimConfig};
use mlx5::verbs::{Access, QpCaps, QpType, RcParams};
use mlx5::wqe::{CQ_UPDATE, Opcode, WqeDesc};
use sim_common::*;

fn write_batch(total: u64) {
    let f = Fabric::new(SimConfig::default());
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
    let fabric = Fabric::new(SimConfig::default());
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
                    qp.rq.as_mut().unwrap().post(&[]).unwrap();
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
                                rq.post(&[]).unwrap();
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

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let scale = if quick { 10 } else { 1 };
    write_batch(2_000_000 / scale);
    pingpong(200_000 / scale as u32);
}
