//! Helpers shared by the device-model tests (`tests/sim_*.rs`): nodes (one simulated device
//! each), registered buffers, connected RC pairs, CQ polling with a bound.
#![allow(dead_code)]

use mlx5::cq::CompletionQueue;
use mlx5::cqe::{Cqe, CqeOpcode, Syndrome};
use mlx5::mem::DmaBuf;
use mlx5::sim::Fabric;
use mlx5::verbs::{
    Access, Context, Cq, Mr, Pd, Qp, QpCaps, QpInit, QpType, RcParams, RcRemote, Srq, UdDest,
};
use mlx5::wqe::{CQ_UPDATE, DgramSeg, Opcode, RaddrSeg, Sge, WqeDesc};

/// Every access right.
pub(crate) fn all_access() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
}

/// A registered buffer. `mr` is declared first: deregistered before the memory is unmapped.
pub(crate) struct Buf {
    pub mr: Mr,
    pub mem: DmaBuf,
}

impl Buf {
    /// Address of byte `off`.
    pub(crate) fn addr(&self, off: usize) -> u64 {
        self.mem.as_ptr() as u64 + off as u64
    }
    /// An SGE over `[off, off+len)` with this buffer's lkey.
    pub(crate) fn sge(&self, off: usize, len: u32) -> Sge {
        Sge {
            addr: self.addr(off),
            len,
            lkey: self.mr.lkey,
        }
    }
    /// A remote-address segment for `off` with this buffer's rkey.
    pub(crate) fn raddr(&self, off: usize) -> RaddrSeg {
        RaddrSeg {
            raddr: self.addr(off),
            rkey: self.mr.rkey,
        }
    }
    /// Copies `len` bytes at `off` out (the model writes with raw copies; tests read after
    /// the CQE that published them, or when no device work is in flight).
    pub(crate) fn read(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= self.mem.len());
        let mut v = vec![0u8; len];
        // SAFETY: inside the mapping; see above for ordering.
        unsafe { std::ptr::copy_nonoverlapping(self.mem.as_ptr().add(off), v.as_mut_ptr(), len) };
        v
    }
    /// Writes `data` at `off`.
    pub(crate) fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.mem.len());
        // SAFETY: inside the mapping; no device access in flight on these bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.mem.as_mut_ptr().add(off), data.len())
        };
    }
}

/// One rank: a device context and a protection domain on it.
pub(crate) struct Node {
    pub pd: Pd,
    pub ctx: Context,
}

impl Node {
    pub(crate) fn new(fabric: &Fabric) -> Node {
        let ctx = fabric.open();
        let pd = ctx.alloc_pd().unwrap();
        Node { pd, ctx }
    }

    pub(crate) fn buf(&self, len: usize, access: Access) -> Buf {
        let mem = DmaBuf::with_normal_pages(len).unwrap();
        // SAFETY: `mem` moves into the `Buf` with the registration (MR dropped first).
        let mr = unsafe { self.ctx.reg_mr(&self.pd, mem.as_mut_ptr(), len, access) }.unwrap();
        Buf { mr, mem }
    }

    pub(crate) fn cq(&self, n: u32) -> Cq {
        self.ctx.create_cq(n).unwrap()
    }

    pub(crate) fn srq(&self, max_wr: u32, max_sge: u32) -> Srq {
        self.ctx.create_srq(&self.pd, max_wr, max_sge).unwrap()
    }

    pub(crate) fn qp(
        &self,
        qp_type: QpType,
        send_cq: &Cq,
        recv_cq: &Cq,
        srq: Option<&Srq>,
        caps: QpCaps,
    ) -> Qp {
        self.ctx
            .create_qp(
                &self.pd,
                &QpInit {
                    qp_type,
                    send_cq,
                    recv_cq,
                    srq,
                    caps,
                },
            )
            .unwrap()
    }

    /// Where a peer connects to reach `qp`.
    pub(crate) fn remote(&self, qp: &Qp) -> RcRemote {
        let port = self.ctx.port();
        RcRemote {
            qpn: qp.qpn(),
            lid: port.lid,
            gid: port.gid,
            psn: 0,
        }
    }

    /// UD destination `qp` with `qkey` (no GRH).
    pub(crate) fn ud_dest(&self, qp: &Qp, qkey: u32) -> UdDest {
        UdDest {
            qpn: qp.qpn(),
            qkey,
            lid: self.ctx.port().lid,
            gid: [0; 16],
        }
    }

    pub(crate) fn ah(&self, dest: &UdDest) -> DgramSeg {
        self.ctx.create_ah(&self.pd, dest).unwrap().av
    }
}

/// Connects two RC QPs to each other with `params`.
pub(crate) fn connect(a: &Node, qa: &mut Qp, b: &Node, qb: &mut Qp, params: &RcParams) {
    qa.connect_rc(&b.remote(qb), params).unwrap();
    qb.connect_rc(&a.remote(qa), params).unwrap();
}

/// Two nodes with one RC QP each, connected; each QP has its own CQ (send and receive) and RQ.
pub(crate) struct RcPair {
    pub qa: Qp,
    pub qb: Qp,
    pub cqa: Cq,
    pub cqb: Cq,
    pub a: Node,
    pub b: Node,
}

impl RcPair {
    pub(crate) fn new(fabric: &Fabric, caps: QpCaps, params: &RcParams) -> RcPair {
        let a = Node::new(fabric);
        let b = Node::new(fabric);
        let cqa = a.cq(256);
        let cqb = b.cq(256);
        let mut qa = a.qp(QpType::Rc, &cqa, &cqa, None, caps);
        let mut qb = b.qp(QpType::Rc, &cqb, &cqb, None, caps);
        connect(&a, &mut qa, &b, &mut qb, params);
        RcPair {
            qa,
            qb,
            cqa,
            cqb,
            a,
            b,
        }
    }
}

/// A WQE descriptor with defaults (signaled).
pub(crate) fn desc<'a>(opcode: Opcode) -> WqeDesc<'a> {
    WqeDesc {
        opcode,
        flags: CQ_UPDATE,
        imm: 0,
        ud: None,
        remote: None,
        atomic: None,
        inline: &[],
        sges: &[],
    }
}

/// Posts one WQE of any opcode (RDMA READ and atomics included) and rings the doorbell;
/// returns its wqe_index. Sound for these tests' scatter lists: they name [`Buf`]s, which
/// the tests keep until their QPs are dropped and read only through raw-pointer copies,
/// never through a live reference (`SendQueue::post_local_write`'s contract).
pub(crate) fn post(qp: &mut Qp, d: &WqeDesc<'_>) -> u16 {
    // SAFETY: see above.
    let idx = unsafe { qp.sq.post_local_write(d) }.unwrap();
    qp.sq.ring_doorbell();
    idx
}

/// Posts a receive WQE on the QP's RQ and rings its doorbell. Sound for these tests'
/// scatter lists, as [`post`] is.
pub(crate) fn post_recv(qp: &mut Qp, sges: &[Sge]) {
    let rq = qp.rq.as_mut().unwrap();
    // SAFETY: as in `post`.
    unsafe { rq.post(sges) }.unwrap();
    rq.ring_doorbell();
}

/// One CQE if there is one (doorbell record updated).
pub(crate) fn try_poll(cq: &mut CompletionQueue) -> Option<Cqe> {
    let c = cq.poll_one();
    if c.is_some() {
        cq.update_dbrec();
    }
    c
}

/// Polls one CQE, making progress steps while waiting; panics after `limit` empty polls.
pub(crate) fn poll(fabric: &Fabric, cq: &mut CompletionQueue) -> Cqe {
    for _ in 0..10_000 {
        if let Some(c) = try_poll(cq) {
            return c;
        }
        fabric.progress();
    }
    panic!("no CQE on CQ {:#x}", cq.cqn());
}

/// Asserts that the CQ is empty now.
pub(crate) fn assert_empty(cq: &mut CompletionQueue) {
    if let Some(c) = try_poll(cq) {
        panic!("unexpected CQE {c:?}");
    }
}

/// The CQE's opcode.
pub(crate) fn opcode(c: &Cqe) -> CqeOpcode {
    CqeOpcode::from_nibble(c.opcode).unwrap()
}

/// Asserts a successful CQE of `op`.
#[track_caller]
pub(crate) fn expect_ok(c: &Cqe, op: CqeOpcode) {
    assert_eq!(opcode(c), op, "{c:?}");
    assert!(c.status().is_ok(), "{c:?}");
}

/// Asserts an error CQE of `op` with syndrome `s`.
#[track_caller]
pub(crate) fn expect_err(c: &Cqe, op: CqeOpcode, s: Syndrome) {
    assert_eq!(opcode(c), op, "{c:?}");
    assert_eq!(Syndrome::from_u8(c.syndrome), Some(s), "{c:?}");
}
