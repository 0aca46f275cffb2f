//! Device model across threads ("ranks"): a WRITE_IMM ping-pong between two threads on one
//! fabric through the same driver code as on hardware, every message's data checked; and
//! several ranks sending to one SRQ concurrently.
//!
//! The round-trip count can be changed with `MLX5_SIM_PINGPONG_ROUNDS` (default 100000).

mod sim_common;

use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use mlx5::cqe::{Cqe, CqeOpcode};
use mlx5::sim::{Fabric, SimConfig};
use mlx5::verbs::{Access, Cq, QpCaps, QpType, RcParams, RcRemote};
use mlx5::wqe::{CQ_UPDATE, Opcode, RaddrSeg, WqeDesc};
use sim_common::*;

const SLOTS: usize = 64;
const MSG: usize = 64;
const RECVS: u32 = 128;

/// What ranks exchange out of band (as they would through MPI).
#[derive(Clone, Copy, Debug)]
struct Endpoint {
    remote: RcRemote,
    ring: RaddrSeg,
}

/// The bytes of message `seq` sent by `rank`.
fn message(rank: u8, seq: u32) -> [u8; MSG] {
    let mut m = [0u8; MSG];
    m[..4].copy_from_slice(&seq.to_le_bytes());
    m[4] = rank;
    for (j, b) in m.iter_mut().enumerate().skip(5) {
        *b = (seq as usize)
            .wrapping_mul(31)
            .wrapping_add(j * 7 + rank as usize) as u8;
    }
    m
}

/// Polls `cq` until a responder CQE arrives; requester CQEs met on the way are handed to
/// `on_req`. Panics after a generous deadline instead of hanging.
fn wait_recv(cq: &mut Cq, mut on_req: impl FnMut(&Cqe)) -> Cqe {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        if let Some(c) = try_poll(&mut cq.cq) {
            if opcode(&c) == CqeOpcode::Req {
                on_req(&c);
                continue;
            }
            return c;
        }
        spins += 1;
        if spins.is_multiple_of(1024) {
            std::thread::yield_now();
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "ping-pong stuck"
            );
        }
    }
}

fn rank(
    fabric: Fabric,
    me: u8,
    rounds: u32,
    tx: mpsc::Sender<Endpoint>,
    rx: mpsc::Receiver<Endpoint>,
    go: Arc<Barrier>,
) {
    let node = Node::new(&fabric);
    let mut cq = node.cq(512);
    let caps = QpCaps {
        max_send_wr: 64,
        max_recv_wr: RECVS,
        max_inline_data: 128,
        ..QpCaps::default()
    };
    let mut qp = node.qp(QpType::Rc, &cq, &cq, None, caps);
    let ring = node.buf(SLOTS * MSG, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let src = node.buf(SLOTS * MSG, Access::empty());
    tx.send(Endpoint {
        remote: node.remote(&qp),
        ring: ring.raddr(0),
    })
    .unwrap();
    let peer = rx.recv().unwrap();
    qp.connect_rc(&peer.remote, &RcParams::default()).unwrap();
    for _ in 0..RECVS {
        qp.rq.as_mut().unwrap().post_empty().unwrap();
    }
    qp.rq.as_mut().unwrap().ring_doorbell();
    go.wait();

    let other = 1 - me;
    let retire = |qp: &mut mlx5::verbs::Qp, c: &Cqe| {
        assert!(c.status().is_ok(), "{c:?}");
        assert!(qp.sq.retire(c.wqe_counter) > 0);
    };
    for seq in 0..rounds {
        if me == 1 {
            // Pong: wait for ping `seq`, check it, answer.
            let r = wait_recv(&mut cq, |c| retire(&mut qp, c));
            expect_ok(&r, CqeOpcode::RespWrImm);
            assert_eq!((r.imm, r.byte_cnt as usize), (seq, MSG));
            let slot = seq as usize % SLOTS;
            assert_eq!(
                ring.read(slot * MSG, MSG),
                message(other, seq),
                "ping {seq}"
            );
            let rq = qp.rq.as_mut().unwrap();
            rq.complete();
            rq.post_empty().unwrap();
            rq.ring_doorbell();
        }
        // Send message `seq` into the peer's ring, inline or gathered alternately.
        let slot = seq as usize % SLOTS;
        let m = message(me, seq);
        let flags = if seq % 16 == 15 { CQ_UPDATE } else { 0 };
        let mut raddr = peer.ring;
        raddr.raddr += (slot * MSG) as u64;
        let sges;
        let d = if seq % 2 == 0 {
            WqeDesc {
                flags,
                imm: seq,
                remote: Some(raddr),
                inline: &m,
                ..desc(Opcode::RdmaWriteImm)
            }
        } else {
            src.write(slot * MSG, &m);
            sges = [src.sge(slot * MSG, MSG as u32)];
            WqeDesc {
                flags,
                imm: seq,
                remote: Some(raddr),
                sges: &sges,
                ..desc(Opcode::RdmaWriteImm)
            }
        };
        while !qp.sq.has_room(d.ds()) {
            if let Some(c) = try_poll(&mut cq.cq) {
                assert_eq!(opcode(&c), CqeOpcode::Req, "{c:?}");
                retire(&mut qp, &c);
            }
        }
        qp.sq.post(&d).unwrap();
        qp.sq.ring_doorbell();
        if me == 0 {
            // Ping: wait for pong `seq`.
            let r = wait_recv(&mut cq, |c| retire(&mut qp, c));
            expect_ok(&r, CqeOpcode::RespWrImm);
            assert_eq!((r.imm, r.byte_cnt as usize), (seq, MSG));
            assert_eq!(
                ring.read(slot * MSG, MSG),
                message(other, seq),
                "pong {seq}"
            );
            let rq = qp.rq.as_mut().unwrap();
            rq.complete();
            rq.post_empty().unwrap();
            rq.ring_doorbell();
        }
    }
    // Drain the last requester CQE(s) so that the SQ is empty.
    let start = Instant::now();
    while qp.sq.outstanding_wqebbs() > 0 {
        if let Some(c) = try_poll(&mut cq.cq) {
            retire(&mut qp, &c);
        } else if start.elapsed() > Duration::from_secs(10) {
            // Unsignaled tail: retire it with a signaled NOP.
            panic!("SQ not drained");
        } else if qp.sq.pending_since_doorbell() == 0 && qp.sq.outstanding_wqebbs() > 0 {
            qp.sq.post_nop(true).unwrap();
            qp.sq.ring_doorbell();
        }
    }
    go.wait();
}

#[test]
fn write_imm_ping_pong_between_two_threads() {
    let rounds: u32 = std::env::var("MLX5_SIM_PINGPONG_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let fabric = Fabric::new(SimConfig::deterministic());
    let (tx0, rx1) = mpsc::channel();
    let (tx1, rx0) = mpsc::channel();
    let go = Arc::new(Barrier::new(2));
    let start = Instant::now();
    let t: Vec<_> = [(0u8, tx0, rx0), (1u8, tx1, rx1)]
        .into_iter()
        .map(|(me, tx, rx)| {
            let (f, go) = (fabric.clone(), go.clone());
            std::thread::Builder::new()
                .name(format!("rank{me}"))
                .spawn(move || rank(f, me, rounds, tx, rx, go))
                .unwrap()
        })
        .collect();
    for h in t {
        h.join().unwrap();
    }
    let el = start.elapsed();
    let st = fabric.stats();
    eprintln!(
        "ping-pong: {rounds} round trips in {el:.2?} ({:.2} us/round trip)",
        el.as_secs_f64() * 1e6 / f64::from(rounds.max(1))
    );
    assert_eq!(st.wqes.rdma_write_imm, 2 * u64::from(rounds));
    assert_eq!(st.bytes, 2 * u64::from(rounds) * MSG as u64);
    assert_eq!(st.error_cqes, 0);
    assert_eq!(st.cq_overruns, 0);
}

/// Four sender ranks, each on its own thread and device, SEND to one receiver rank whose QPs
/// share an SRQ and a CQ; the receiver releases SRQ WQEs as it consumes them.
#[test]
fn many_ranks_send_into_one_srq() {
    const SENDERS: usize = 4;
    const PER: u32 = 2000;
    let fabric = Fabric::new(SimConfig::deterministic());
    let recv = Node::new(&fabric);
    let mut rcq = recv.cq(1024);
    let mut srq = recv.srq(255, 1);
    let bufs = recv.buf(srq.srq.wqe_cnt() as usize * 64, Access::LOCAL_WRITE);
    let mut rqps = Vec::new();
    let mut handles = Vec::new();
    let go = Arc::new(Barrier::new(SENDERS + 1));
    for s in 0..SENDERS {
        let rqp = recv.qp(QpType::Rc, &rcq, &rcq, Some(&srq), QpCaps::default());
        let to_recv = recv.remote(&rqp);
        let (f, go) = (fabric.clone(), go.clone());
        let (back_tx, back_rx) = mpsc::channel::<RcRemote>();
        handles.push(std::thread::spawn(move || {
            let node = Node::new(&f);
            let mut cq = node.cq(64);
            let mut qp = node.qp(QpType::Rc, &cq, &cq, None, QpCaps::default());
            back_tx.send(node.remote(&qp)).unwrap();
            qp.connect_rc(&to_recv, &RcParams::default()).unwrap();
            go.wait();
            for i in 0..PER {
                let v = ((s as u64) << 32) | u64::from(i);
                let flags = if i % 8 == 7 { CQ_UPDATE } else { 0 };
                let d = WqeDesc {
                    flags,
                    inline: &v.to_le_bytes(),
                    ..desc(Opcode::Send)
                };
                // Poll as we go (a CQ of 64 cannot hold the completions of a full SQ).
                while let Some(c) = try_poll(&mut cq.cq) {
                    assert!(c.status().is_ok(), "{c:?}");
                    qp.sq.retire(c.wqe_counter);
                }
                // At most 256 WQEs (32 signaled) outstanding: after an RNR stall they all
                // complete at once, and the 64-entry CQ must hold their CQEs.
                while !qp.sq.has_room(d.ds()) || qp.sq.outstanding_wqebbs() >= 256 {
                    if let Some(c) = try_poll(&mut cq.cq) {
                        assert!(c.status().is_ok(), "{c:?}");
                        qp.sq.retire(c.wqe_counter);
                    } else {
                        std::thread::yield_now();
                    }
                }
                qp.sq.post(&d).unwrap();
                qp.sq.ring_doorbell();
            }
            while qp.sq.outstanding_wqebbs() > 0 {
                if let Some(c) = try_poll(&mut cq.cq) {
                    assert!(c.status().is_ok(), "{c:?}");
                    qp.sq.retire(c.wqe_counter);
                } else {
                    std::thread::yield_now();
                }
            }
        }));
        let mut rqp = rqp;
        rqp.connect_rc(&back_rx.recv().unwrap(), &RcParams::default())
            .unwrap();
        rqps.push(rqp);
    }
    while srq.srq.available() > 0 {
        let i = srq.srq.head() as usize;
        // SAFETY: `bufs` outlives the QPs and is read only by copies after completions.
        unsafe { srq.srq.post(&[bufs.sge(i * 64, 64)]) }.unwrap();
    }
    srq.srq.ring_doorbell();
    go.wait();
    let mut next = [0u32; SENDERS];
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut got = 0;
    while got < SENDERS as u32 * PER {
        let Some(r) = try_poll(&mut rcq.cq) else {
            assert!(
                Instant::now() < deadline,
                "stuck at {got}: {:?}",
                fabric.stats()
            );
            fabric.progress(); // senders may be RNR-stalled while we refill
            std::thread::yield_now();
            continue;
        };
        expect_ok(&r, CqeOpcode::RespSend);
        let v = u64::from_le_bytes(
            bufs.read(r.wqe_counter as usize * 64, 8)
                .try_into()
                .unwrap(),
        );
        let (s, i) = ((v >> 32) as usize, v as u32);
        assert_eq!(rqps[s].qpn(), r.qpn);
        assert_eq!(i, next[s], "in order per connection");
        next[s] += 1;
        got += 1;
        srq.srq.release(r.wqe_counter).unwrap();
        let idx = srq.srq.head() as usize;
        // SAFETY: as above; the slot's previous message was copied out before the release.
        unsafe { srq.srq.post(&[bufs.sge(idx * 64, 64)]) }.unwrap();
        srq.srq.ring_doorbell();
    }
    for h in handles {
        h.join().unwrap();
    }
    let st = fabric.stats();
    assert_eq!((st.error_cqes, st.cq_overruns), (0, 0));
    assert_eq!(st.wqes.send, u64::from(SENDERS as u32 * PER));
}
