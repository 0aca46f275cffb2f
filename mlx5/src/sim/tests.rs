//! Model tests below the driver: raw WQEs written straight into the ring (shapes the driver
//! never produces: WQEs wrapping past the ring end, malformed control segments, impossible
//! producer indices), object destruction, provider argument checks, the progress thread.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cqe::{Cqe, CqeOpcode, Syndrome};
use crate::mem::DmaBuf;
use crate::queue::{Doorbell, SimDoorbell};
use crate::sim::{Fabric, SimConfig, SimQpState};
use crate::verbs::{Access, Context, Cq, Mr, Pd, Qp, QpCaps, QpInit, QpType, RcParams, RcRemote};
use crate::wqe::{CQ_UPDATE, Opcode, RaddrSeg, Sge, WQEBB, WqeDesc};

struct Side {
    ctx: Context,
    pd: Pd,
    cq: Cq,
    qp: Qp,
}

fn side(f: &Fabric, caps: QpCaps) -> Side {
    let ctx = f.open();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let qp = ctx
        .create_qp(
            &pd,
            &QpInit {
                qp_type: QpType::Rc,
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                caps,
            },
        )
        .unwrap();
    Side { ctx, pd, cq, qp }
}

fn remote(s: &Side) -> RcRemote {
    RcRemote {
        qpn: s.qp.qpn(),
        lid: s.ctx.port().lid,
        gid: [0; 16],
        psn: 0,
    }
}

fn pair(f: &Fabric, caps: QpCaps) -> (Side, Side) {
    let mut a = side(f, caps);
    let mut b = side(f, caps);
    let (ra, rb) = (remote(&a), remote(&b));
    a.qp.connect_rc(&rb, &RcParams::default()).unwrap();
    b.qp.connect_rc(&ra, &RcParams::default()).unwrap();
    (a, b)
}

fn reg(s: &Side, len: usize, access: Access) -> (Mr, DmaBuf) {
    let mem = DmaBuf::with_normal_pages(len).unwrap();
    // SAFETY: `mem` is returned with the registration; callers keep both alive together.
    let mr = unsafe { s.ctx.reg_mr(&s.pd, mem.as_mut_ptr(), len, access) }.unwrap();
    (mr, mem)
}

/// Writes `bytes` into the SQ ring at WQEBB counter `pi` (modulo the ring), bypassing the
/// driver.
fn raw_write(qp: &Qp, pi: u32, bytes: &[u8]) {
    let mem = qp.sq.mem();
    let ring = mem.wqe_cnt as usize * WQEBB;
    let start = (pi & (mem.wqe_cnt - 1)) as usize * WQEBB;
    for (i, b) in bytes.iter().enumerate() {
        // SAFETY: inside the ring; the model only reads below the rung producer index.
        unsafe { mem.buf.as_ptr().add((start + i) % ring).write(*b) };
    }
}

/// Publishes producer `pi` in dbrec[1] and rings the model directly.
fn raw_ring(qp: &Qp, pi: u32) {
    let mem = qp.sq.mem();
    // SAFETY: the QP's doorbell record, 2 words.
    unsafe {
        mem.dbrec
            .as_ptr()
            .add(1)
            .write_volatile((pi & 0xffff).to_be())
    };
    doorbell(qp).ring_sq(qp.qpn());
}

fn doorbell(qp: &Qp) -> Arc<dyn SimDoorbell> {
    match &qp.sq.mem().doorbell {
        Doorbell::Sim { device, .. } => device.clone(),
        Doorbell::Mmio(_) => unreachable!(),
    }
}

fn wqe(d: &WqeDesc<'_>, pi: u32, qpn: u32) -> Vec<u8> {
    let mut b = vec![0u8; d.ds() as usize * 16];
    d.write(&mut b, pi as u16, qpn);
    b
}

fn poll(cq: &mut Cq) -> Option<Cqe> {
    let c = cq.cq.poll_one();
    cq.cq.update_dbrec();
    c
}

fn write_desc<'a>(remote: RaddrSeg, inline: &'a [u8], flags: u8) -> WqeDesc<'a> {
    WqeDesc {
        opcode: Opcode::RdmaWrite,
        flags,
        imm: 0,
        ud: None,
        remote: Some(remote),
        atomic: None,
        inline,
        sges: &[],
    }
}

#[test]
fn a_wqe_may_wrap_past_the_ring_end() {
    let f = Fabric::new(SimConfig::deterministic());
    let caps = QpCaps {
        max_send_wr: 1,
        max_send_sge: 1,
        max_inline_data: 200,
        ..QpCaps::default()
    };
    let (mut a, b) = pair(&f, caps);
    let (dst_mr, dst) = reg(&b, 4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let cnt = a.qp.sq.mem().wqe_cnt;
    assert_eq!(cnt, 8);
    let qpn = a.qp.qpn();
    let raddr = RaddrSeg {
        raddr: dst_mr.addr,
        rkey: dst_mr.rkey,
    };
    // 3 one-WQEBB WQEs + one 4-WQEBB WQE starting at slot 6: it wraps into slots 0 and 1.
    let payload: Vec<u8> = (0..180u8).collect();
    let mut pi = 0;
    for _ in 0..6 {
        raw_write(&a.qp, pi, &wqe(&write_desc(raddr, b"", 0), pi, qpn));
        pi += 1;
    }
    raw_ring(&a.qp, pi);
    let big = wqe(&write_desc(raddr, &payload, CQ_UPDATE), pi, qpn);
    assert_eq!(big.len(), 16 * 14, "4 WQEBBs: slots 6, 7, 0, 1");
    raw_write(&a.qp, pi, &big);
    pi += 4;
    raw_ring(&a.qp, pi);
    let c = poll(&mut a.cq).expect("completion");
    assert_eq!(c.opcode, CqeOpcode::Req as u8, "{c:?}");
    assert_eq!(c.wqe_counter, 6);
    // SAFETY: test memory, the model is idle.
    assert_eq!(unsafe { &dst.as_slice()[..180] }, &payload[..]);
}

/// A named corruption of a WQE's bytes.
type Corruption = (&'static str, fn(&mut [u8]));

#[test]
fn malformed_wqes_are_local_qp_operation_errors() {
    let cases: [Corruption; 5] = [
        ("ds 0", |b| b[7] = 0),
        ("unknown opcode", |b| b[3] = 0x42),
        ("wqe_index", |b| b[2] ^= 1),
        ("qpn", |b| b[6] ^= 1),
        ("ds past the doorbell", |b| b[7] = 12),
    ];
    for (what, corrupt) in cases {
        let f = Fabric::new(SimConfig::deterministic());
        let (mut a, b) = pair(&f, QpCaps::default());
        let (mr, _m) = reg(&b, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        let raddr = RaddrSeg {
            raddr: mr.addr,
            rkey: mr.rkey,
        };
        let qpn = a.qp.qpn();
        let mut w = wqe(&write_desc(raddr, b"abc", 0), 0, qpn);
        corrupt(&mut w);
        raw_write(&a.qp, 0, &w);
        raw_write(&a.qp, 1, &wqe(&write_desc(raddr, b"abc", 0), 1, qpn));
        raw_ring(&a.qp, 2);
        let c = poll(&mut a.cq).unwrap_or_else(|| panic!("{what}: no CQE"));
        assert_eq!(c.opcode, CqeOpcode::ReqErr as u8, "{what}");
        assert_eq!(c.syndrome, Syndrome::LocalQpOp as u8, "{what}");
        assert_eq!(c.wqe_counter, 0, "{what}");
        assert_eq!(f.qp_state(qpn), Some(SimQpState::Error), "{what}");
        if what != "ds past the doorbell" {
            let c = poll(&mut a.cq).unwrap();
            assert_eq!(
                (c.syndrome, c.wqe_counter),
                (Syndrome::WrFlush as u8, 1),
                "{what}"
            );
        }
    }
}

#[test]
fn inline_data_on_read_is_a_local_qp_operation_error() {
    let f = Fabric::new(SimConfig::deterministic());
    let (mut a, b) = pair(&f, QpCaps::default());
    let (mr, _m) = reg(&b, 64, Access::REMOTE_READ);
    let d = WqeDesc {
        opcode: Opcode::RdmaRead,
        ..write_desc(
            RaddrSeg {
                raddr: mr.addr,
                rkey: mr.rkey,
            },
            b"no",
            CQ_UPDATE,
        )
    };
    // SAFETY: no scatter list (the inline data is the error under test): the device writes
    // no local memory.
    unsafe { a.qp.sq.post_local_write(&d) }.unwrap();
    a.qp.sq.ring_doorbell();
    let c = poll(&mut a.cq).unwrap();
    assert_eq!(c.syndrome, Syndrome::LocalQpOp as u8);
}

#[test]
fn impossible_producer_index_is_ignored() {
    let f = Fabric::new(SimConfig::deterministic());
    let (mut a, _b) = pair(&f, QpCaps::default());
    let cnt = a.qp.sq.mem().wqe_cnt;
    raw_ring(&a.qp, cnt + 1);
    assert!(poll(&mut a.cq).is_none());
    assert_eq!(f.qp_state(a.qp.qpn()), Some(SimQpState::Rts));
    // The queue still works afterwards.
    a.qp.sq.post_nop(true).unwrap();
    a.qp.sq.ring_doorbell();
    assert_eq!(poll(&mut a.cq).unwrap().opcode, CqeOpcode::Req as u8);
}

#[test]
fn destroyed_objects_are_forgotten() {
    let f = Fabric::new(SimConfig::deterministic());
    let (mut a, b) = pair(&f, QpCaps::default());
    // A doorbell on a destroyed QP is ignored.
    let db = doorbell(&b.qp);
    let bqpn = b.qp.qpn();
    let Side {
        qp: bqp, cq: bcq, ..
    } = b;
    drop(bqp);
    db.ring_sq(bqpn);
    assert_eq!(f.qp_state(bqpn), None);
    // A deregistered MR's keys stop working.
    let (mr, _mem) = reg(&a, 64, Access::LOCAL_WRITE);
    let sge = Sge {
        addr: mr.addr,
        len: 8,
        lkey: mr.lkey,
    };
    drop(mr);
    let d = WqeDesc {
        opcode: Opcode::Send,
        flags: CQ_UPDATE,
        imm: 0,
        ud: None,
        remote: None,
        atomic: None,
        inline: &[],
        sges: &[sge],
    };
    a.qp.sq.post(&d).unwrap();
    a.qp.sq.ring_doorbell();
    let c = poll(&mut a.cq).unwrap();
    assert_eq!(c.syndrome, Syndrome::LocalProt as u8);
    a.qp.sq.post_nop(true).unwrap();
    a.qp.sq.ring_doorbell();
    assert_eq!(poll(&mut a.cq).unwrap().syndrome, Syndrome::WrFlush as u8);
    // CQEs for a destroyed CQ are lost, not written.
    drop(bcq);
    let Side {
        cq: ccq,
        qp: mut cqp,
        ..
    } = side(&f, QpCaps::default());
    let lost = f.stats().cqes_lost;
    drop(ccq);
    cqp.sq.post_nop(true).unwrap();
    cqp.sq.ring_doorbell();
    assert_eq!(f.stats().cqes_lost, lost + 1);
}

/// The model's tables are indexed by the low bits of an object number (`sim/table.rs`): a
/// number that shares a live object's slot but differs in its high bits is unknown, exactly as
/// a never-allocated one: a doorbell on it is ignored, an rkey or lkey naming it is refused.
#[test]
fn forged_numbers_sharing_a_live_slot_are_unknown() {
    let f = Fabric::new(SimConfig::deterministic());
    let (mut a, b) = pair(&f, QpCaps::default());
    let (dst_mr, dst) = reg(&b, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    // Far above any table size, inside the 24-bit number space: the same slot.
    let far = 1u32 << 20;
    let forged_qpn = b.qp.qpn() + far;
    assert_eq!(f.qp_state(forged_qpn), None);
    let before = f.stats();
    doorbell(&b.qp).ring_sq(forged_qpn);
    assert_eq!(f.qp_state(b.qp.qpn()), Some(SimQpState::Rts));
    assert_eq!(f.stats().cqes, before.cqes);
    // An rkey whose index shares the region's slot.
    let forged_rkey = dst_mr.rkey + (far << 8);
    let d = write_desc(
        RaddrSeg {
            raddr: dst_mr.addr,
            rkey: forged_rkey,
        },
        b"forged!!",
        CQ_UPDATE,
    );
    a.qp.sq.post(&d).unwrap();
    a.qp.sq.ring_doorbell();
    let c = poll(&mut a.cq).expect("completion");
    assert_eq!(c.syndrome, Syndrome::RemoteAccess as u8);
    // SAFETY: 64 registered bytes, read after the model finished.
    let got = unsafe { std::slice::from_raw_parts(dst.as_mut_ptr(), 8) };
    assert_eq!(got, [0u8; 8], "nothing written");
    // An lkey likewise (a fresh pair: `a` is in the error state now).
    let (mut c1, _c2) = pair(&f, QpCaps::default());
    let (src_mr, _src) = reg(&c1, 64, Access::LOCAL_WRITE);
    let sge = Sge {
        addr: src_mr.addr,
        len: 8,
        lkey: src_mr.lkey + (far << 8),
    };
    let d = WqeDesc {
        opcode: Opcode::Send,
        flags: CQ_UPDATE,
        imm: 0,
        ud: None,
        remote: None,
        atomic: None,
        inline: &[],
        sges: &[sge],
    };
    c1.qp.sq.post(&d).unwrap();
    c1.qp.sq.ring_doorbell();
    assert_eq!(
        poll(&mut c1.cq).expect("completion").syndrome,
        Syndrome::LocalProt as u8
    );
}

#[test]
fn provider_checks_arguments() {
    let f = Fabric::new(SimConfig::deterministic());
    let a = side(&f, QpCaps::default());
    let other = f.open();
    let other_pd = other.alloc_pd().unwrap();
    let mem = DmaBuf::with_normal_pages(64).unwrap();
    // Remote write without local write; zero length; a PD of another device.
    assert!(
        // SAFETY: refused (checked); `mem` outlives the call either way.
        unsafe {
            a.ctx
                .reg_mr(&a.pd, mem.as_mut_ptr(), 64, Access::REMOTE_WRITE)
        }
        .is_err()
    );
    assert!(
        // SAFETY: as above.
        unsafe {
            a.ctx
                .reg_mr(&a.pd, mem.as_mut_ptr(), 0, Access::LOCAL_WRITE)
        }
        .is_err()
    );
    assert!(
        // SAFETY: as above.
        unsafe {
            a.ctx
                .reg_mr(&other_pd, mem.as_mut_ptr(), 64, Access::LOCAL_WRITE)
        }
        .is_err()
    );
    // A CQ of another device.
    let cq2 = other.create_cq(8).unwrap();
    let init = QpInit {
        qp_type: QpType::Rc,
        send_cq: &cq2,
        recv_cq: &a.cq,
        srq: None,
        caps: QpCaps::default(),
    };
    assert!(a.ctx.create_qp(&a.pd, &init).is_err());
    // An oversized inline cap.
    let init = QpInit {
        caps: QpCaps {
            max_inline_data: 2000,
            ..QpCaps::default()
        },
        send_cq: &a.cq,
        ..init
    };
    assert!(a.ctx.create_qp(&a.pd, &init).is_err());
    // Sizes are powers of two, CQEs start INVALID, SRQs have a sentinel.
    let cq = a.ctx.create_cq(100).unwrap();
    assert_eq!(cq.cq.cqe_cnt(), 128);
    // SAFETY: the CQ ring just created.
    let op_own = unsafe { cq.cq.mem().buf.as_ptr().add(127 * 64 + 63).read() };
    assert_eq!(op_own, 0xF0);
    let srq = a.ctx.create_srq(&a.pd, 100, 3).unwrap();
    assert_eq!((srq.srq.wqe_cnt(), srq.srq.mem().ring.stride), (128, 64));
    assert!(srq.srq.capacity() >= 100);
    // Distinct LIDs and QPNs; a second connect is refused.
    let mut b = side(&f, QpCaps::default());
    assert_ne!(a.ctx.port().lid, b.ctx.port().lid);
    assert_ne!(a.qp.qpn(), b.qp.qpn());
    b.qp.connect_rc(&remote(&a), &RcParams::default()).unwrap();
    assert!(b.qp.connect_rc(&remote(&a), &RcParams::default()).is_err());
}

/// With a progress thread, an RNR-stalled sender resumes without anyone ringing a doorbell.
#[test]
fn progress_thread_retries_stalled_senders() {
    let f = Fabric::new(SimConfig {
        progress_thread: Some(Duration::from_millis(1)),
        ..SimConfig::deterministic()
    });
    let (mut a, mut b) = pair(&f, QpCaps::default());
    let d = WqeDesc {
        opcode: Opcode::Send,
        ..write_desc(RaddrSeg { raddr: 0, rkey: 0 }, b"late", CQ_UPDATE)
    };
    let d = WqeDesc { remote: None, ..d };
    a.qp.sq.post(&d).unwrap();
    a.qp.sq.ring_doorbell();
    let (mr, mem) = reg(&b, 64, Access::LOCAL_WRITE);
    let rq = b.qp.rq.as_mut().unwrap();
    // SAFETY: `mem` (64 bytes, registered as `mr`) lives to the end of the test and is read
    // only after the completion is polled.
    unsafe {
        rq.post(&[Sge {
            addr: mr.addr,
            len: 64,
            lkey: mr.lkey,
        }])
    }
    .unwrap();
    rq.ring_doorbell();
    let start = Instant::now();
    let c = loop {
        if let Some(c) = poll(&mut b.cq) {
            break c;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no progress");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!((c.opcode, c.byte_cnt), (CqeOpcode::RespSend as u8, 4));
    // SAFETY: test memory; the CQE published the data.
    assert_eq!(unsafe { &mem.as_slice()[..4] }, b"late");
}

/// RoCE-style addressing: LID 0 and the port GID reach the peer, for RC and UD.
#[test]
fn gid_addressing_with_lid_zero() {
    let f = Fabric::new(SimConfig::deterministic());
    let mut a = side(&f, QpCaps::default());
    let mut b = side(&f, QpCaps::default());
    let by_gid = |s: &Side| RcRemote {
        lid: 0,
        gid: s.ctx.port().gid,
        ..remote(s)
    };
    let (ra, rb) = (by_gid(&a), by_gid(&b));
    a.qp.connect_rc(&rb, &RcParams::default()).unwrap();
    b.qp.connect_rc(&ra, &RcParams::default()).unwrap();
    a.qp.sq.post_nop(true).unwrap();
    let (mr, _m) = reg(&b, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let raddr = RaddrSeg {
        raddr: mr.addr,
        rkey: mr.rkey,
    };
    a.qp.sq
        .post(&write_desc(raddr, b"roce", CQ_UPDATE))
        .unwrap();
    a.qp.sq.ring_doorbell();
    assert_eq!(poll(&mut a.cq).unwrap().opcode, CqeOpcode::Req as u8);
    let c = poll(&mut a.cq).unwrap();
    assert_eq!((c.opcode, c.syndrome), (CqeOpcode::Req as u8, 0));
    // A wrong GID is unreachable.
    let mut c2 = side(&f, QpCaps::default());
    let mut d2 = side(&f, QpCaps::default());
    let wrong = RcRemote {
        lid: 0,
        gid: [9; 16],
        ..remote(&d2)
    };
    c2.qp
        .connect_rc(
            &wrong,
            &RcParams {
                retry_cnt: 0,
                ..RcParams::default()
            },
        )
        .unwrap();
    d2.qp
        .connect_rc(&remote(&c2), &RcParams::default())
        .unwrap();
    c2.qp.sq.post(&write_desc(raddr, b"x", CQ_UPDATE)).unwrap();
    c2.qp.sq.ring_doorbell();
    assert_eq!(
        poll(&mut c2.cq).unwrap().syndrome,
        Syndrome::TransportRetryExc as u8
    );
}

/// The device handle reports the QPC cache size the fabric was configured with (what
/// ScaleRPC derives its group size from), and `None` when the cache is not modelled.
#[test]
fn device_handle_reports_its_qpc_cache_size() {
    use crate::sim::QpcCacheConfig;
    assert_eq!(
        Fabric::new(SimConfig::deterministic())
            .open()
            .qpc_cache_entries(),
        Some(QpcCacheConfig::CX5_ENTRIES as u32)
    );
    let cx3 = Fabric::new(SimConfig {
        qpc_cache: Some(QpcCacheConfig {
            entries: QpcCacheConfig::CX3_ENTRIES,
            ..QpcCacheConfig::default()
        }),
        ..SimConfig::deterministic()
    });
    assert_eq!(cx3.open().qpc_cache_entries(), Some(400));
    let off = Fabric::new(SimConfig {
        qpc_cache: None,
        ..SimConfig::deterministic()
    });
    assert_eq!(off.open().qpc_cache_entries(), None);
}
