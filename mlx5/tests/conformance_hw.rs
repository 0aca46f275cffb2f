//! The hardware provider on a real ConnectX device: object creation, the memory rdma-core hands
//! over, QP transitions, and loopback traffic through the crate's own driver (WQEs written by
//! `mlx5::sq`, CQEs read by `mlx5::cq`).
//!
//! Every test calls `hw::open` first; without a device (or without rdma-core) it prints
//! "skipped: no RDMA device (<reason>)" and returns. On this project's CI machines there is no
//! RDMA hardware, so these tests only check that the skip path is clean; `MLX5_TEST_DEVICE`
//! (device name) and `MLX5_TEST_PORT` (default 1) choose the device where there is one.

use std::time::{Duration, Instant};

use mlx5::Error;
use mlx5::cqe::{Cqe, CqeOpcode};
use mlx5::hw;
use mlx5::verbs::{
    Access, Context, Cq, LinkLayer, Mr, Pd, Qp, QpCaps, QpInit, QpType, RcParams, RcRemote, UdDest,
};
use mlx5::wqe::{self, AtomicSeg, Opcode, RaddrSeg, Sge, WqeDesc};

/// Opens the test device, or prints why the test is skipped.
fn device() -> Option<Context> {
    let name = std::env::var("MLX5_TEST_DEVICE").ok();
    let port = std::env::var("MLX5_TEST_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(1);
    match hw::open(name.as_deref(), port) {
        Ok(ctx) => {
            println!("using {} port {:?}", ctx.provider().name(), ctx.port());
            Some(ctx)
        }
        Err(Error::NoDevice { reason }) => {
            println!("skipped: no RDMA device ({reason})");
            None
        }
        Err(e) => panic!("hw::open failed with something other than NoDevice: {e}"),
    }
}

/// A registered, page-aligned buffer.
struct Buf {
    mr: Mr,
    mem: Vec<u64>,
}

impl Buf {
    fn new(ctx: &Context, pd: &Pd, bytes: usize) -> Buf {
        let mut mem = vec![0u64; bytes.div_ceil(8)];
        let access = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        // SAFETY: the `Vec`'s heap buffer moves into the `Buf` with the registration (MR
        // dropped first) and is never resized.
        let mr = unsafe { ctx.reg_mr(pd, mem.as_mut_ptr().cast(), bytes, access) }.expect("reg_mr");
        Buf { mr, mem }
    }
    fn bytes(&mut self) -> &mut [u8] {
        let len = self.mr.len;
        // SAFETY: `mem` holds at least `len` bytes; u8 has no alignment requirement.
        unsafe { std::slice::from_raw_parts_mut(self.mem.as_mut_ptr().cast::<u8>(), len) }
    }
    fn sge(&self, off: usize, len: u32) -> Sge {
        Sge {
            addr: self.mr.addr + off as u64,
            len,
            lkey: self.mr.lkey,
        }
    }
}

/// Polls `cq` for one CQE, failing after 5 s.
fn wait(cq: &mut Cq) -> Cqe {
    let start = Instant::now();
    loop {
        if let Some(c) = cq.cq.poll_one() {
            cq.cq.update_dbrec();
            return c;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "no CQE within 5 s"
        );
        std::hint::spin_loop();
    }
}

fn rc_qp(ctx: &Context, pd: &Pd, cq: &Cq) -> Qp {
    ctx.create_qp(
        pd,
        &QpInit {
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            caps: QpCaps::default(),
        },
    )
    .expect("create RC QP")
}

fn remote_of(ctx: &Context, qp: &Qp) -> RcRemote {
    let port = ctx.port();
    RcRemote {
        qpn: qp.qpn(),
        lid: port.lid,
        gid: port.gid,
        psn: 0,
    }
}

fn desc<'a>(opcode: Opcode, sges: &'a [Sge]) -> WqeDesc<'a> {
    WqeDesc {
        opcode,
        flags: wqe::CQ_UPDATE,
        imm: 0,
        ud: None,
        remote: None,
        atomic: None,
        inline: &[],
        sges,
    }
}

#[test]
fn hw_open_without_device_is_a_clean_no_device() {
    // Whatever the machine: a device name that cannot exist is NoDevice with a reason.
    match hw::open(Some("mlx5_no_such_device_42"), 1) {
        Err(Error::NoDevice { reason }) => {
            assert!(!reason.is_empty());
            println!("no RDMA device: {reason}");
        }
        Err(e) => panic!("expected NoDevice, got {e}"),
        Ok(_) => panic!("a device named mlx5_no_such_device_42 cannot exist"),
    }
}

#[test]
fn hw_queue_memory_is_what_the_driver_expects() {
    let Some(ctx) = device() else { return };
    let pd = ctx.alloc_pd().expect("alloc_pd");
    let cq = ctx.create_cq(100).expect("create_cq");
    let mem = cq.cq.mem();
    assert!(mem.cqe_cnt().is_power_of_two() && mem.cqe_cnt() > 100);
    // rdma-core initialises every entry to opcode INVALID.
    for i in 0..mem.cqe_cnt() as usize {
        // SAFETY: the CQ buffer holds cqe_cnt 64-byte entries.
        let op_own = unsafe { *mem.buf().as_ptr().add(i * 64 + 63) };
        assert_eq!(
            op_own >> 4,
            CqeOpcode::Invalid as u8,
            "CQE {i} op_own {op_own:#x}"
        );
    }
    let srq = ctx.create_srq(&pd, 64, 2).expect("create_srq");
    let m = srq.srq.mem().ring();
    assert!(
        m.wqe_cnt().is_power_of_two() && m.wqe_cnt() > 64,
        "SRQ wqe_cnt {}",
        m.wqe_cnt()
    );
    assert!(m.max_sge() >= 2 && m.stride() as usize >= 16 + 16 * m.max_sge() as usize);
    let qp = rc_qp(&ctx, &pd, &cq);
    let sq = qp.sq.mem();
    assert!(sq.wqe_cnt().is_power_of_two() && sq.wqe_cnt() >= 256);
    assert!(sq.max_inline() >= 64, "max_inline {}", sq.max_inline());
    let rq = qp.rq.as_ref().expect("RQ").mem();
    assert!(rq.wqe_cnt() >= 256 && rq.stride() >= 16);
    let srq_qp = ctx
        .create_qp(
            &pd,
            &QpInit {
                qp_type: QpType::Rc,
                send_cq: &cq,
                recv_cq: &cq,
                srq: Some(&srq),
                caps: QpCaps::default(),
            },
        )
        .expect("create QP with SRQ");
    assert!(srq_qp.rq.is_none());
    // Objects are destroyed in any order: handles keep their dependencies alive.
    drop(pd);
    drop(cq);
    drop(srq);
    drop(qp);
    drop(srq_qp);
}

#[test]
fn hw_rc_loopback_write_send_read_atomic() {
    let Some(ctx) = device() else { return };
    let pd = ctx.alloc_pd().unwrap();
    let mut cq_a = ctx.create_cq(64).unwrap();
    let mut cq_b = ctx.create_cq(64).unwrap();
    let mut a = rc_qp(&ctx, &pd, &cq_a);
    let mut b = rc_qp(&ctx, &pd, &cq_b);
    let params = RcParams::default();
    let (ra, rb) = (remote_of(&ctx, &a), remote_of(&ctx, &b));
    a.connect_rc(&rb, &params).expect("connect A");
    b.connect_rc(&ra, &params).expect("connect B");
    let mut src = Buf::new(&ctx, &pd, 4096);
    let mut dst = Buf::new(&ctx, &pd, 4096);
    src.bytes()
        .iter_mut()
        .enumerate()
        .for_each(|(i, x)| *x = i as u8);

    // RDMA WRITE A→B.
    let sges = [src.sge(0, 256)];
    let mut d = desc(Opcode::RdmaWrite, &sges);
    d.remote = Some(RaddrSeg {
        raddr: dst.mr.addr,
        rkey: dst.mr.rkey,
    });
    let idx = a.sq.post(&d).unwrap();
    a.sq.ring_doorbell();
    let c = wait(&mut cq_a);
    c.status().expect("WRITE completion");
    assert_eq!(c.opcode, CqeOpcode::Req as u8);
    assert_eq!(c.wqe_counter, idx);
    assert_eq!(c.qpn, a.qpn());
    a.sq.retire(c.wqe_counter);
    assert_eq!(&dst.bytes()[..256], &src.bytes()[..256]);

    // SEND with immediate A→B into a posted receive.
    let rsges = [dst.sge(1024, 512)];
    // SAFETY: `dst` outlives the QPs; its bytes are borrowed only after the completion.
    unsafe { b.rq.as_mut().unwrap().post(&rsges) }.unwrap();
    b.rq.as_mut().unwrap().ring_doorbell();
    let sges = [src.sge(100, 77)];
    let mut d = desc(Opcode::SendImm, &sges);
    d.imm = 0xfeed_f00d;
    a.sq.post(&d).unwrap();
    a.sq.ring_doorbell();
    let c = wait(&mut cq_a);
    c.status().expect("SEND completion");
    a.sq.retire(c.wqe_counter);
    let r = wait(&mut cq_b);
    r.status().expect("receive completion");
    assert_eq!(r.opcode, CqeOpcode::RespSendImm as u8);
    assert_eq!(r.byte_cnt, 77);
    assert_eq!(r.imm, 0xfeed_f00d);
    assert_eq!(r.qpn, b.qpn());
    b.rq.as_mut().unwrap().complete();
    assert_eq!(&dst.bytes()[1024..1024 + 77], &src.bytes()[100..177]);

    // RDMA READ B's bytes back into A's buffer.
    let sges = [src.sge(2048, 256)];
    let mut d = desc(Opcode::RdmaRead, &sges);
    d.remote = Some(RaddrSeg {
        raddr: dst.mr.addr,
        rkey: dst.mr.rkey,
    });
    // SAFETY: `src` outlives the QPs; its bytes are borrowed only after the completion.
    unsafe { a.sq.post_local_write(&d) }.unwrap();
    a.sq.ring_doorbell();
    let c = wait(&mut cq_a);
    c.status().expect("READ completion");
    assert_eq!(c.byte_cnt, 256);
    a.sq.retire(c.wqe_counter);
    let (s, rest) = src.bytes().split_at_mut(2048);
    assert_eq!(&rest[..256], &s[..256]);

    // Fetch-and-add on an 8-byte word of B. ConnectX atomics treat the target as a big-endian
    // 64-bit integer and return the old value big-endian (UCX byte-swaps them the same way).
    dst.mem[256] = 40u64.to_be();
    let sges = [src.sge(3072, 8)];
    let mut d = desc(Opcode::AtomicFa, &sges);
    d.remote = Some(RaddrSeg {
        raddr: dst.mr.addr + 256 * 8,
        rkey: dst.mr.rkey,
    });
    d.atomic = Some(AtomicSeg {
        swap_add: 2,
        compare: 0,
    });
    // SAFETY: as for the READ above.
    unsafe { a.sq.post_local_write(&d) }.unwrap();
    a.sq.ring_doorbell();
    let c = wait(&mut cq_a);
    c.status().expect("atomic completion");
    a.sq.retire(c.wqe_counter);
    // SAFETY: volatile read of memory the NIC wrote (the completion orders it).
    let now = unsafe { std::ptr::read_volatile(&dst.mem[256]) };
    assert_eq!(u64::from_be(now), 42);
    assert_eq!(
        u64::from_be(src.mem[3072 / 8]),
        40,
        "atomics return the old value big-endian"
    );

    // A bad rkey is a remote access error, reported with a typed syndrome.
    let sges = [src.sge(0, 8)];
    let mut d = desc(Opcode::RdmaWrite, &sges);
    d.remote = Some(RaddrSeg {
        raddr: dst.mr.addr,
        rkey: dst.mr.rkey ^ 0xff00,
    });
    a.sq.post(&d).unwrap();
    a.sq.ring_doorbell();
    let c = wait(&mut cq_a);
    assert!(c.is_error(), "a bad rkey must fail: {c:?}");
}

#[test]
fn hw_ud_loopback_through_an_address_handle() {
    let Some(ctx) = device() else { return };
    let pd = ctx.alloc_pd().unwrap();
    let mut cq = ctx.create_cq(64).unwrap();
    let mut qp = ctx
        .create_qp(
            &pd,
            &QpInit {
                qp_type: QpType::Ud,
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                caps: QpCaps::default(),
            },
        )
        .unwrap();
    let qkey = 0x1111_2222;
    qp.activate_ud(qkey).expect("activate UD");
    let dest = UdDest {
        qpn: qp.qpn(),
        qkey,
        lid: ctx.port().lid,
        gid: ctx.port().gid,
    };
    let ah = match ctx.create_ah(&pd, &dest) {
        Ok(ah) => ah,
        Err(e) if ctx.port().link_layer == LinkLayer::Ethernet => {
            println!("skipped: UD over RoCE is not supported by wqe::DgramSeg ({e})");
            return;
        }
        Err(e) => panic!("create_ah: {e}"),
    };
    assert_eq!(ah.av.dqpn, qp.qpn());
    assert_eq!(ah.av.qkey, qkey);
    assert_eq!(ah.av.rlid, ctx.port().lid);
    let mut buf = Buf::new(&ctx, &pd, 4096);
    buf.bytes()[..64].copy_from_slice(&[0x5a; 64]);
    let rq = qp.rq.as_mut().unwrap();
    // SAFETY: `buf` outlives the QP; its bytes are borrowed only after the completion.
    unsafe { rq.post(&[buf.sge(1024, 40 + 64)]) }.unwrap();
    rq.ring_doorbell();
    let sges = [buf.sge(0, 64)];
    let mut d = desc(Opcode::Send, &sges);
    d.ud = Some(ah.av);
    qp.sq.post(&d).unwrap();
    qp.sq.ring_doorbell();
    let mut got_send = false;
    let mut got_recv = false;
    while !(got_send && got_recv) {
        let c = wait(&mut cq);
        c.status().expect("UD completion");
        if c.opcode == CqeOpcode::Req as u8 {
            qp.sq.retire(c.wqe_counter);
            got_send = true;
        } else {
            assert_eq!(c.opcode, CqeOpcode::RespSend as u8);
            assert_eq!(
                c.byte_cnt,
                40 + 64,
                "UD byte count includes the 40-byte GRH area"
            );
            assert_eq!(c.src_qpn, qp.qpn());
            qp.rq.as_mut().unwrap().complete();
            got_recv = true;
        }
    }
    assert_eq!(&buf.bytes()[1024 + 40..1024 + 104], &[0x5a; 64]);
}

#[test]
fn hw_srq_receives_and_releases() {
    let Some(ctx) = device() else { return };
    let pd = ctx.alloc_pd().unwrap();
    let mut cq = ctx.create_cq(64).unwrap();
    let mut srq = ctx.create_srq(&pd, 16, 1).unwrap();
    let init = |srq| QpInit {
        qp_type: QpType::Rc,
        send_cq: &cq,
        recv_cq: &cq,
        srq,
        caps: QpCaps::default(),
    };
    let mut a = ctx.create_qp(&pd, &init(None)).unwrap();
    let mut b = ctx.create_qp(&pd, &init(Some(&srq))).unwrap();
    let (ra, rb) = (remote_of(&ctx, &a), remote_of(&ctx, &b));
    a.connect_rc(&rb, &RcParams::default()).unwrap();
    b.connect_rc(&ra, &RcParams::default()).unwrap();
    let mut buf = Buf::new(&ctx, &pd, 8192);
    buf.bytes()[..100].fill(7);
    let mut posted = Vec::new();
    for i in 0..4 {
        // SAFETY: `buf` outlives the QPs; its bytes are borrowed only after the completions.
        posted.push(unsafe { srq.srq.post(&[buf.sge(4096 + i * 1024, 1024)]) }.unwrap());
    }
    srq.srq.ring_doorbell();
    for _ in 0..4 {
        let sges = [buf.sge(0, 100)];
        a.sq.post(&desc(Opcode::Send, &sges)).unwrap();
    }
    a.sq.ring_doorbell();
    let mut recvs = 0;
    let mut sends = 0;
    while recvs < 4 || sends < 4 {
        let c = wait(&mut cq);
        c.status().expect("completion");
        if c.opcode == CqeOpcode::Req as u8 {
            a.sq.retire(c.wqe_counter);
            sends += 1;
        } else {
            assert_eq!(c.opcode, CqeOpcode::RespSend as u8);
            assert_eq!(c.byte_cnt, 100);
            assert!(
                posted.contains(&c.wqe_counter),
                "SRQ WQE {} was posted",
                c.wqe_counter
            );
            srq.srq.release(c.wqe_counter).unwrap();
            recvs += 1;
        }
    }
    let _ = &mut b;
}
