//! RDMA WRITE_IMM ping-pong between two ranks on the device model, in one thread and in lock
//! step, shaped for callgrind: instructions per round trip, split into driver and model.
//!
//! Rank A writes a 64 B inline message with immediate into B's landing ring (RDMA WRITE_IMM,
//! signaled); the model executes it inside A's doorbell (`SendQueue::ring_doorbell` →
//! `<mlx5::sim::Shared as mlx5::queue::SimDoorbell>::ring_sq`). B polls its receive CQ, checks
//! the CQE and the landed bytes, re-posts the zero-length SRQ receive WQE and replies the same
//! way; B and then A retire their requester CQEs, and A polls, checks and re-posts for the
//! reply. Each rank has its own device, PD, SRQ (zero-length receive WQEs, as copyrpc posts),
//! send CQ, receive CQ and RC QP.
//!
//! Cost attribution: every driver operation is an `#[inline(never)]` function whose name starts
//! with `driver_` (post + doorbell, poll a CQ, re-post a receive WQE); the application's checks
//! are in `app_*`; one round trip is `round_trip` (the function to toggle collection on). The
//! model runs only inside `ring_sq` (receive-queue doorbells and CQ polls are plain memory
//! accesses on the model's queues too). `scripts/callgrind-mlx5-pingpong.sh` runs this under
//! callgrind.
//!
//! `cargo run --release -p mlx5 --example writeimm_callgrind [round_trips]` (default 100000).
//! Every message is verified (CQE opcode, status, imm, byte_cnt, SRQ number, requester
//! `wqe_counter`, and all 64 payload bytes in the landing ring); the run ends with a check of
//! the fabric's counters and prints one summary line.

#[path = "../tests/sim_common/mod.rs"]
mod sim_common;

use std::time::Instant;

use mlx5::cq::CompletionQueue;
use mlx5::cqe::{Cqe, CqeOpcode};
use mlx5::sim::{Fabric, SimConfig};
use mlx5::sq::SendQueue;
use mlx5::srq::SharedRecvQueue;
use mlx5::verbs::{Access, Cq, Qp, QpCaps, QpType, RcParams, Srq};
use mlx5::wqe::{Opcode, RaddrSeg, WqeDesc};
use sim_common::{Buf, Node, connect, desc};

/// Payload bytes per message (inline).
const MSG: usize = 64;
/// Slots in each rank's landing ring.
const SLOTS: usize = 64;
/// Round trips before the measured ones (every SQ, CQ and SRQ slot used at least once).
const WARMUP: u32 = 2048;
/// Set in the immediate of replies.
const REPLY: u32 = 0x8000_0000;
/// Payload pattern tags of the two directions.
const TAG_A: u8 = 0xa5;
const TAG_B: u8 = 0x5b;

/// One rank. Field order = drop order: the QP before the SRQ and CQs it uses, the landing
/// ring's MR before its memory, objects before the device.
struct Rank {
    qp: Qp,
    srq: Srq,
    send_cq: Cq,
    recv_cq: Cq,
    /// Where the peer writes.
    ring: Buf,
    /// The peer's landing ring (slot 0).
    peer_ring: RaddrSeg,
    node: Node,
}

impl Rank {
    fn new(fabric: &Fabric) -> Rank {
        let node = Node::new(fabric);
        let send_cq = node.cq(256);
        let recv_cq = node.cq(256);
        let mut srq = node.srq(255, 1);
        let qp = node.qp(
            QpType::Rc,
            &send_cq,
            &recv_cq,
            Some(&srq),
            QpCaps::default(),
        );
        let ring = node.buf(SLOTS * MSG, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        let n = srq.srq.available();
        assert_eq!(srq.srq.post_empty_n(n), n);
        srq.srq.ring_doorbell();
        Rank {
            qp,
            srq,
            send_cq,
            recv_cq,
            ring,
            peer_ring: RaddrSeg { raddr: 0, rkey: 0 },
            node,
        }
    }

    /// Two connected ranks, each knowing the other's landing ring.
    fn pair(fabric: &Fabric) -> (Rank, Rank) {
        let mut a = Rank::new(fabric);
        let mut b = Rank::new(fabric);
        connect(&a.node, &mut a.qp, &b.node, &mut b.qp, &RcParams::default());
        a.peer_ring = b.ring.raddr(0);
        b.peer_ring = a.ring.raddr(0);
        (a, b)
    }
}

// ---- driver: everything a transport does per message ------------------------------------

/// Posts one WQE and rings the send doorbell (the model executes it inside the doorbell).
/// Returns the WQE's `wqe_index`.
#[inline(never)]
fn driver_post_write_imm(sq: &mut SendQueue, d: &WqeDesc<'_>) -> u16 {
    let idx = sq.post(d).expect("post WRITE_IMM");
    sq.ring_doorbell();
    idx
}

/// Polls one CQE from a receive CQ and publishes the consumer index.
#[inline(never)]
fn driver_poll_recv_cq(cq: &mut CompletionQueue) -> Option<Cqe> {
    let c = cq.poll_one()?;
    cq.update_dbrec();
    Some(c)
}

/// Polls one requester CQE, publishes the consumer index and retires the WQEs it names.
/// Returns the CQE and the WQEBBs freed.
#[inline(never)]
fn driver_poll_send_cq(cq: &mut CompletionQueue, sq: &mut SendQueue) -> Option<(Cqe, u32)> {
    let c = cq.poll_one()?;
    cq.update_dbrec();
    let freed = sq.retire(c.wqe_counter);
    Some((c, freed))
}

/// Returns the SRQ WQE a responder CQE consumed, posts a fresh zero-length one and rings the
/// SRQ doorbell.
#[inline(never)]
fn driver_repost_recv(srq: &mut SharedRecvQueue, wqe_index: u16) {
    srq.release(wqe_index).expect("release SRQ WQE");
    srq.post_empty().expect("post SRQ WQE");
    srq.ring_doorbell();
}

// ---- application: message contents and checks -------------------------------------------

/// The message for immediate `imm` from the side tagged `tag`.
#[inline(always)]
fn app_message(imm: u32, tag: u8) -> [u8; MSG] {
    let mut m = [0u8; MSG];
    for (i, b) in m.iter_mut().enumerate() {
        *b = tag ^ (imm as u8).wrapping_add(i as u8);
    }
    m[..4].copy_from_slice(&imm.to_le_bytes());
    m
}

/// Checks a responder CQE (WRITE_IMM, success, `imm`, 64 bytes, from `srqn`) and the 64 bytes
/// it announced in `ring` slot `slot`.
#[inline(never)]
fn app_check_recv(c: &Cqe, ring: &Buf, slot: usize, imm: u32, tag: u8, srqn: u32) {
    assert!(
        c.opcode == CqeOpcode::RespWrImm as u8
            && c.status().is_ok()
            && c.imm == imm
            && c.byte_cnt == MSG as u32
            && c.srqn == srqn,
        "unexpected responder CQE {c:?} (want imm {imm:#x})"
    );
    let mut got = [0u8; MSG];
    // SAFETY: the slot lies inside the landing ring; the model wrote it before publishing the
    // CQE just consumed (Acquire on `op_own`), and nothing writes it until the next message.
    unsafe {
        std::ptr::copy_nonoverlapping(ring.mem.as_ptr().add(slot * MSG), got.as_mut_ptr(), MSG)
    };
    assert!(
        got == app_message(imm, tag),
        "payload of imm {imm:#x} in slot {slot}: {got:02x?}"
    );
}

/// Checks a requester CQE: success, names the WQE just posted, freed it.
#[inline(never)]
fn app_check_send(c: &(Cqe, u32), idx: u16) {
    let (c, freed) = c;
    assert!(
        c.opcode == CqeOpcode::Req as u8 && c.wqe_counter == idx && *freed > 0,
        "unexpected requester CQE {c:?} (want WQE {idx}, freed {freed})"
    );
}

/// A signaled WRITE_IMM of `msg` to `peer` slot `slot`.
#[inline(always)]
fn write_imm<'a>(msg: &'a [u8], peer: RaddrSeg, slot: usize, imm: u32) -> WqeDesc<'a> {
    WqeDesc {
        imm,
        remote: Some(RaddrSeg {
            raddr: peer.raddr + (slot * MSG) as u64,
            rkey: peer.rkey,
        }),
        inline: msg,
        ..desc(Opcode::RdmaWriteImm)
    }
}

// ---- one round trip ---------------------------------------------------------------------

#[inline(always)]
fn round_trip_body(a: &mut Rank, b: &mut Rank, seq: u32) {
    let slot = seq as usize % SLOTS;
    // A → B.
    let req = app_message(seq, TAG_A);
    let a_idx = driver_post_write_imm(&mut a.qp.sq, &write_imm(&req, a.peer_ring, slot, seq));
    // B: the request, then the reply.
    let c = driver_poll_recv_cq(&mut b.recv_cq.cq).expect("B: no responder CQE");
    app_check_recv(&c, &b.ring, slot, seq, TAG_A, b.srq.srqn());
    driver_repost_recv(&mut b.srq.srq, c.wqe_counter);
    let rimm = seq ^ REPLY;
    let rep = app_message(rimm, TAG_B);
    let b_idx = driver_post_write_imm(&mut b.qp.sq, &write_imm(&rep, b.peer_ring, slot, rimm));
    let s = driver_poll_send_cq(&mut b.send_cq.cq, &mut b.qp.sq).expect("B: no requester CQE");
    app_check_send(&s, b_idx);
    // A: its request's completion, then the reply.
    let s = driver_poll_send_cq(&mut a.send_cq.cq, &mut a.qp.sq).expect("A: no requester CQE");
    app_check_send(&s, a_idx);
    let c = driver_poll_recv_cq(&mut a.recv_cq.cq).expect("A: no responder CQE");
    app_check_recv(&c, &a.ring, slot, rimm, TAG_B, a.srq.srqn());
    driver_repost_recv(&mut a.srq.srq, c.wqe_counter);
}

/// One measured round trip (callgrind: `--toggle-collect=writeimm_callgrind::round_trip`).
#[inline(never)]
fn round_trip(a: &mut Rank, b: &mut Rank, seq: u32) {
    round_trip_body(a, b, seq);
}

/// `rounds` round trips from `seq` 0, not collected. A loop, not a second copy of
/// `round_trip`: identical functions are merged by LLVM (`merge-functions`), which would put
/// the warm-up under `round_trip`'s symbol.
#[inline(never)]
fn warmup(a: &mut Rank, b: &mut Rank, rounds: u32) -> u32 {
    for seq in 0..rounds {
        round_trip_body(a, b, seq);
    }
    rounds
}

fn main() {
    let n: u32 = match std::env::args().nth(1) {
        Some(s) => s.parse().expect("usage: writeimm_callgrind [round_trips]"),
        None => 100_000,
    };
    let fabric = Fabric::new(SimConfig::deterministic());
    let (mut a, mut b) = Rank::pair(&fabric);
    let mut seq = warmup(&mut a, &mut b, WARMUP);
    let before = fabric.stats();
    let start = Instant::now();
    for _ in 0..n {
        round_trip(&mut a, &mut b, seq);
        seq = seq.wrapping_add(1);
    }
    let secs = start.elapsed().as_secs_f64();
    let after = fabric.stats();
    let n64 = u64::from(n);
    assert_eq!(
        after.wqes.rdma_write_imm - before.wqes.rdma_write_imm,
        2 * n64
    );
    assert_eq!(after.wqes.total() - before.wqes.total(), 2 * n64);
    assert_eq!(after.doorbells - before.doorbells, 2 * n64);
    assert_eq!(after.cqes - before.cqes, 4 * n64);
    assert_eq!(after.bytes - before.bytes, 2 * n64 * MSG as u64);
    assert_eq!(
        (after.error_cqes, after.rnr_retries, after.cq_overruns),
        (0, 0, 0)
    );
    println!(
        "writeimm_callgrind: {n} round trips verified ({} WRITE_IMM, {} CQEs), {:.1} ns per round trip",
        2 * n64,
        4 * n64,
        secs * 1e9 / f64::from(n.max(1))
    );
}
