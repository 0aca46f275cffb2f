//! Test support (feature `testkit`): a raw RC peer on the device model, for tests that forge
//! what a transport's peer sends.
//!
//! [`RawRcPeer`] is one RC QP driven through this crate's driver directly, with no transport
//! core above it: its receive queue is full of zero-length receives (so it can take the
//! WRITE+IMMs a transport sends it), and it posts whatever RDMA WRITEs and WRITE+IMMs a test
//! asks for, one at a time, waiting for each completion (the model executes a send inside
//! its doorbell). Tests describe the memory a real peer would advertise with [`RegBuf`]s
//! registered on the peer's protection domain.
//!
//! Everything here panics on failure: it is for tests, where a failed setup step is a failed
//! test.

use crate::cqe::CqeOpcode;
use crate::mem::DmaBuf;
use crate::verbs::RcRemote;
use crate::verbs::{Access, Context, Cq, Mr, Pd, PortInfo, Qp, QpCaps, QpInit, QpType, RcParams};
use crate::wqe::{CQ_UPDATE, Opcode, RaddrSeg, Sge, WqeDesc};

use super::Fabric;

/// A registered buffer of normal pages. Field order is drop order: the MR is deregistered
/// before the memory is unmapped.
pub struct RegBuf {
    /// The memory region (address, lkey, rkey).
    pub mr: Mr,
    mem: DmaBuf,
}

impl RegBuf {
    /// The address of byte `off` as the device sees it.
    pub fn addr(&self, off: usize) -> u64 {
        self.mr.addr + off as u64
    }

    /// A copy of `len` bytes at `off`.
    ///
    /// # Panics
    /// If `off + len` is beyond the buffer.
    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= self.mr.len, "read beyond the buffer");
        let mut v = vec![0u8; len];
        // SAFETY: inside the mapping (checked above). The model writes this memory only
        // inside doorbells and polls, which need `&mut` access to a queue, not this buffer's.
        unsafe { std::ptr::copy_nonoverlapping(self.mem.as_ptr().add(off), v.as_mut_ptr(), len) };
        v
    }

    /// Writes `data` at `off`. Takes `&mut self`, so no other thread reads or writes the
    /// buffer through this `RegBuf` meanwhile; the device model writes it only inside the
    /// doorbells and polls of the thread that drives the peer.
    ///
    /// # Panics
    /// If `off + data.len()` is beyond the buffer.
    pub fn write(&mut self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.mr.len, "write beyond the buffer");
        // SAFETY: inside the mapping (checked above); `&mut self` excludes other CPU
        // accesses through this buffer, and as in `read`, no device access runs while this
        // thread copies.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.mem.as_mut_ptr().add(off), data.len())
        };
    }
}

/// A raw RC QP on its own device of a [`Fabric`], with a CQ for both directions, a staging
/// buffer for the bytes it sends, and a receive queue kept full of zero-length receives.
/// Field order is drop order.
pub struct RawRcPeer {
    qp: Qp,
    cq: Cq,
    staging: RegBuf,
    pd: Pd,
    dev: Context,
    received: Vec<u32>,
}

impl RawRcPeer {
    /// Opens a device on `fabric` and creates the QP (64 send WQEs, 256 receives posted, no
    /// inline data) and a staging buffer of `staging_bytes` (the largest single send).
    pub fn new(fabric: &Fabric, staging_bytes: usize) -> RawRcPeer {
        let dev = fabric.open();
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(1024).unwrap();
        let mut qp = dev
            .create_qp(
                &pd,
                &QpInit {
                    qp_type: QpType::Rc,
                    send_cq: &cq,
                    recv_cq: &cq,
                    srq: None,
                    caps: QpCaps {
                        max_send_wr: 64,
                        max_recv_wr: 256,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: 0,
                    },
                },
            )
            .unwrap();
        let rq = qp.rq.as_mut().unwrap();
        while rq.post_empty().is_ok() {}
        rq.ring_doorbell();
        let staging = reg(&dev, &pd, staging_bytes, Access::LOCAL_WRITE);
        RawRcPeer {
            qp,
            cq,
            staging,
            pd,
            dev,
            received: Vec::new(),
        }
    }

    /// A buffer of `len` bytes registered on the peer's protection domain with `access`.
    /// Drop it before the peer.
    pub fn reg(&self, len: usize, access: Access) -> RegBuf {
        reg(&self.dev, &self.pd, len, access)
    }

    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qp.qpn()
    }

    /// The port the QP is on (LID and GID for the remote side's connect).
    pub fn port(&self) -> PortInfo {
        self.dev.port()
    }

    /// Connects the QP to `remote` (RESET → INIT → RTR → RTS) with `params`.
    pub fn connect(&mut self, remote: &RcRemote, params: &RcParams) {
        self.qp.connect_rc(remote, params).unwrap();
    }

    /// Posts one signaled RDMA WRITE of `bytes` (a WRITE+IMM if `imm` is given) to
    /// `raddr`/`rkey`, rings the doorbell and checks that it completed successfully.
    ///
    /// # Panics
    /// If `bytes` exceeds the staging buffer, the post fails, or the WRITE does not complete
    /// (an error completion panics in [`RawRcPeer::poll`]).
    pub fn write(&mut self, raddr: u64, rkey: u32, bytes: &[u8], imm: Option<u32>) {
        self.staging.write(0, bytes);
        self.qp
            .sq
            .post(&WqeDesc {
                opcode: if imm.is_some() {
                    Opcode::RdmaWriteImm
                } else {
                    Opcode::RdmaWrite
                },
                flags: CQ_UPDATE,
                imm: imm.unwrap_or(0),
                ud: None,
                remote: Some(RaddrSeg { raddr, rkey }),
                atomic: None,
                inline: &[],
                sges: &[Sge {
                    addr: self.staging.addr(0),
                    len: bytes.len() as u32,
                    lkey: self.staging.mr.lkey,
                }],
            })
            .unwrap();
        self.qp.sq.ring_doorbell();
        assert_eq!(self.poll(), 1, "the forged WRITE completed");
    }

    /// Handles the completions: retires finished sends and returns how many; records the
    /// immediate of each WRITE+IMM received (reposting its receive WQE).
    ///
    /// # Panics
    /// On an error completion or a completion of another kind.
    pub fn poll(&mut self) -> usize {
        let mut sent = 0;
        while let Some(c) = self.cq.cq.poll_one() {
            self.cq.cq.update_dbrec();
            assert!(!c.is_error(), "raw RC peer: error completion {c:?}");
            match CqeOpcode::from_nibble(c.opcode) {
                Some(CqeOpcode::Req) => {
                    self.qp.sq.retire(c.wqe_counter);
                    sent += 1;
                }
                Some(CqeOpcode::RespWrImm) => {
                    let rq = self.qp.rq.as_mut().unwrap();
                    rq.complete();
                    rq.post_empty().unwrap();
                    rq.ring_doorbell();
                    self.received.push(c.imm);
                }
                _ => panic!("raw RC peer: unexpected completion {c:?}"),
            }
        }
        sent
    }

    /// Immediates of the WRITE+IMMs received so far, in arrival order.
    pub fn received(&self) -> &[u32] {
        &self.received
    }
}

fn reg(dev: &Context, pd: &Pd, len: usize, access: Access) -> RegBuf {
    let mem = DmaBuf::with_normal_pages(len).unwrap();
    // SAFETY: `mem` moves into the `RegBuf` with the registration, whose field order drops
    // the MR first.
    let mr = unsafe { dev.reg_mr(pd, mem.as_mut_ptr(), len, access) }.unwrap();
    RegBuf { mr, mem }
}
