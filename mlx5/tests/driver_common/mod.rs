//! Shared helpers of the driver tests: queue memory over [`DmaBuf`]s and a minimal device that
//! reads what the driver wrote, the way hardware does, without the device model.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use mlx5::cqe::{CQE_BYTES, Cqe, CqeOpcode, OP_OWN_INVALID, op_own};
use mlx5::mem::DmaBuf;
use mlx5::queue::{CqMem, Doorbell, RqMem, SimDoorbell, SqMem, SrqMem};
use mlx5::wqe::{self, AtomicSeg, DgramSeg, ParsedWqe, RaddrSeg, Sge, WQEBB, WqeDesc};

/// QPN every test send queue uses.
pub(crate) const QPN: u32 = 0x00ab_cdef;

/// Reads `len` bytes at `off` of a buffer (no device touches it concurrently in these tests).
pub(crate) fn bytes(buf: &DmaBuf, off: usize, len: usize) -> Vec<u8> {
    assert!(off + len <= buf.mapped_len());
    // SAFETY: inside the mapping; no concurrent writer.
    unsafe { std::slice::from_raw_parts(buf.as_ptr().add(off), len).to_vec() }
}

/// Reads doorbell record word `i` (host order).
pub(crate) fn dbrec_word(db: &DmaBuf, i: usize) -> u32 {
    // SAFETY: inside the mapping, 4-byte aligned.
    u32::from_be(unsafe { db.as_ptr().cast::<u32>().add(i).read_volatile() })
}

/// A stand-in device for a send queue: on every doorbell it reads `dbrec[1]`, extends it
/// against its own consumer counter and parses every new WQE from the ring as the PRM defines
/// it (checking `wqe_index`, the QPN and that no WQE crosses the ring end).
pub(crate) struct MiniSqDevice {
    ring: usize,
    wqe_cnt: u32,
    dbrec: usize,
    ud: bool,
    pub state: Mutex<DevState>,
}

#[derive(Default)]
pub(crate) struct DevState {
    /// Consumer counter in WQEBBs.
    pub ci: u32,
    /// Every WQE read, in order, with its producer counter.
    pub seen: Vec<(u32, ParsedWqe)>,
    /// `dbrec[1]` at each doorbell.
    pub rings: Vec<u16>,
}

impl SimDoorbell for MiniSqDevice {
    fn ring_sq(&self, qpn: u32) {
        assert_eq!(qpn, QPN);
        let mut st = self.state.lock().unwrap();
        // SAFETY: the test keeps the doorbell record alive while the queue exists.
        let p16 = u32::from_be(unsafe { (self.dbrec as *const u32).add(1).read_volatile() }) as u16;
        st.rings.push(p16);
        let pi = st
            .ci
            .wrapping_add(u32::from(p16.wrapping_sub(st.ci as u16)));
        while st.ci != pi {
            let ci = st.ci;
            let slot = ci & (self.wqe_cnt - 1);
            let off = slot as usize * WQEBB;
            let len = self.wqe_cnt as usize * WQEBB - off;
            // SAFETY: inside the ring; the driver does not write rung WQEs.
            let b = unsafe { std::slice::from_raw_parts((self.ring + off) as *const u8, len) };
            let w = wqe::parse(b, self.ud).unwrap_or_else(|e| panic!("WQE at pi {ci}: {e}"));
            assert_eq!(w.ctrl.wqe_index, ci as u16, "wqe_index at pi {ci}");
            assert_eq!(w.ctrl.qpn, QPN);
            let n = wqe::wqebbs(u32::from(w.ctrl.ds));
            assert!(
                slot + n <= self.wqe_cnt,
                "WQE at pi {ci} crosses the ring end"
            );
            st.ci = ci.wrapping_add(n);
            st.seen.push((ci, w));
        }
    }
}

/// A send queue over test buffers with a [`MiniSqDevice`] behind its doorbell.
pub(crate) struct SqHarness {
    pub ring: Arc<DmaBuf>,
    pub db: Arc<DmaBuf>,
    pub dev: Arc<MiniSqDevice>,
    pub sq: mlx5::sq::SendQueue,
}

impl SqHarness {
    pub(crate) fn new(wqe_cnt: u32, max_inline: u32, ud: bool) -> Self {
        let ring = Arc::new(DmaBuf::with_normal_pages(wqe_cnt as usize * WQEBB).unwrap());
        let db = Arc::new(DmaBuf::with_normal_pages(8).unwrap());
        let dev = Arc::new(MiniSqDevice {
            ring: ring.as_ptr() as usize,
            wqe_cnt,
            dbrec: db.as_ptr() as usize,
            ud,
            state: Mutex::new(DevState::default()),
        });
        // SAFETY: a page-aligned ring of `wqe_cnt` WQEBBs and an 8-byte doorbell record,
        // kept alive by the description's owner; only the queue and the stand-in device (which
        // reads rung WQEs, as hardware does) use them.
        let mem = unsafe {
            SqMem::new(
                ring.as_non_null(),
                wqe_cnt,
                db.as_non_null().cast(),
                max_inline,
                64,
                Doorbell::Sim {
                    device: dev.clone(),
                    qpn: QPN,
                },
            )
        }
        .owned_by(Arc::new((ring.clone(), db.clone())));
        let sq = mlx5::sq::SendQueue::new(mem, QPN);
        SqHarness { ring, db, dev, sq }
    }

    /// Parses the WQE whose first WQEBB is at producer counter `pi`.
    pub(crate) fn parse_at(&self, pi: u32, ud: bool) -> ParsedWqe {
        let cnt = self.sq.wqe_cnt();
        let off = (pi & (cnt - 1)) as usize * WQEBB;
        wqe::parse(&bytes(&self.ring, off, cnt as usize * WQEBB - off), ud).unwrap()
    }

    pub(crate) fn ring_snapshot(&self) -> Vec<u8> {
        bytes(&self.ring, 0, self.sq.wqe_cnt() as usize * WQEBB)
    }
}

/// An owned copy of a [`WqeDesc`], to compare with what the device parses.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Expected {
    pub opcode: wqe::Opcode,
    pub flags: u8,
    pub imm: u32,
    pub ud: Option<DgramSeg>,
    pub remote: Option<RaddrSeg>,
    pub atomic: Option<AtomicSeg>,
    pub inline: Vec<u8>,
    pub sges: Vec<Sge>,
}

impl Expected {
    pub(crate) fn desc(&self) -> WqeDesc<'_> {
        WqeDesc {
            opcode: self.opcode,
            flags: self.flags,
            imm: self.imm,
            ud: self.ud,
            remote: self.remote,
            atomic: self.atomic,
            inline: &self.inline,
            sges: &self.sges,
        }
    }

    pub(crate) fn ds(&self) -> u32 {
        self.desc().ds()
    }

    /// Asserts that `w` is this WQE with `wqe_index`.
    pub(crate) fn check(&self, w: &ParsedWqe, wqe_index: u16) {
        assert_eq!(w.ctrl.wqe_index, wqe_index);
        assert_eq!(w.ctrl.opcode, self.opcode as u8);
        assert_eq!(w.ctrl.qpn, QPN);
        assert_eq!(u32::from(w.ctrl.ds), self.ds());
        assert_eq!(w.ctrl.fm_ce_se, self.flags);
        if self.opcode.has_imm() {
            assert_eq!(w.ctrl.imm, self.imm);
        }
        assert_eq!(w.ud, self.ud);
        assert_eq!(w.remote, self.remote);
        assert_eq!(w.atomic, self.atomic);
        assert_eq!(w.inline, self.inline);
        assert_eq!(w.sges, self.sges);
    }
}

/// Deterministic pseudo-random numbers (SplitMix64).
pub(crate) struct Rng(pub u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A send WQE of one of the shapes a transport posts: `kind` selects RDMA WRITE(+IMM) with
/// inline data or SGEs, SEND(+IMM), RDMA READ, atomics, or (for UD) a datagram SEND.
pub(crate) fn shape(
    kind: u8,
    inline_len: usize,
    nsges: usize,
    signaled: bool,
    seed: u64,
    ud: bool,
) -> Expected {
    let sge = |i: u64| Sge {
        addr: seed.wrapping_mul(0x1000).wrapping_add(i * 64),
        len: (seed as u32 & 0xfff) + i as u32,
        lkey: 0x100 + seed as u32 % 7,
    };
    let inline: Vec<u8> = (0..inline_len).map(|i| (seed as usize + i) as u8).collect();
    let flags = if signaled { wqe::CQ_UPDATE } else { 0 };
    let remote = Some(RaddrSeg {
        raddr: seed ^ 0xdead_0000,
        rkey: seed as u32 | 1,
    });
    let sges: Vec<Sge> = (0..nsges as u64).map(sge).collect();
    let mut e = Expected {
        opcode: wqe::Opcode::Send,
        flags,
        imm: seed as u32 ^ 0x5555_aaaa,
        ud: None,
        remote: None,
        atomic: None,
        inline: Vec::new(),
        sges: Vec::new(),
    };
    if ud {
        e.opcode = if kind.is_multiple_of(2) {
            wqe::Opcode::Send
        } else {
            wqe::Opcode::SendImm
        };
        e.ud = Some(DgramSeg {
            qkey: 0x1111_0000 | seed as u32 & 0xffff,
            dqpn: seed as u32 & 0xff_ffff,
            rlid: seed as u16,
            stat_rate_sl: 0,
            grh: kind.is_multiple_of(3),
            rgid: [seed as u8; 16],
        });
        if !e.ud.unwrap().grh {
            e.ud.as_mut().unwrap().rgid = [0; 16];
        }
        e.inline = inline;
        e.sges = sges;
        return e;
    }
    match kind % 6 {
        0 => {
            e.opcode = wqe::Opcode::RdmaWrite;
            e.remote = remote;
            e.inline = inline;
            e.sges = sges;
        }
        1 => {
            e.opcode = wqe::Opcode::RdmaWriteImm;
            e.remote = remote;
            e.inline = inline;
            e.sges = sges;
        }
        2 => {
            e.opcode = wqe::Opcode::Send;
            e.inline = inline;
            e.sges = sges;
        }
        3 => {
            e.opcode = wqe::Opcode::SendImm;
            e.inline = inline;
            e.sges = sges;
        }
        4 => {
            e.opcode = wqe::Opcode::RdmaRead;
            e.remote = remote;
            e.sges = if sges.is_empty() { vec![sge(0)] } else { sges };
        }
        _ => {
            e.opcode = if seed.is_multiple_of(2) {
                wqe::Opcode::AtomicFa
            } else {
                wqe::Opcode::AtomicCs
            };
            e.remote = remote;
            e.atomic = Some(AtomicSeg {
                swap_add: seed,
                compare: if seed.is_multiple_of(2) { 0 } else { !seed },
            });
            e.sges = vec![Sge {
                addr: seed & !7,
                len: 8,
                lkey: 3,
            }];
        }
    }
    e
}

/// A CQ over test buffers plus the producer side (what the device writes).
pub(crate) struct CqHarness {
    pub buf: Arc<DmaBuf>,
    pub db: Arc<DmaBuf>,
    pub cnt: u32,
    /// Producer counter.
    pub pi: u32,
    pub cq: mlx5::cq::CompletionQueue,
}

impl CqHarness {
    pub(crate) fn new(cnt: u32) -> Self {
        let buf = Arc::new(DmaBuf::with_normal_pages(cnt as usize * CQE_BYTES).unwrap());
        let db = Arc::new(DmaBuf::with_normal_pages(8).unwrap());
        for i in 0..cnt as usize {
            // SAFETY: inside the buffer.
            unsafe {
                buf.as_mut_ptr()
                    .add(i * CQE_BYTES + 63)
                    .write(OP_OWN_INVALID)
            };
        }
        // SAFETY: `cnt` CQEs initialised invalid above and an 8-byte doorbell record, kept
        // alive by the description's owner; only the queue and the test's producer (which
        // writes `op_own` atomically, as a device does) use them.
        let mem = unsafe { CqMem::new(buf.as_non_null(), cnt, db.as_non_null().cast(), 9) }
            .owned_by(Arc::new((buf.clone(), db.clone())));
        let cq = mlx5::cq::CompletionQueue::new(mem);
        CqHarness {
            buf,
            db,
            cnt,
            pi: 0,
            cq,
        }
    }

    /// Writes `c` at the producer counter like a device: bytes 0..63, then `op_own` with
    /// Release.
    pub(crate) fn produce(&mut self, c: &Cqe) {
        produce_at(self.buf.as_mut_ptr() as usize, self.cnt, self.pi, c);
        self.pi += 1;
    }

    /// The consumer index the driver published.
    pub(crate) fn dbrec(&self) -> u32 {
        dbrec_word(&self.db, 0)
    }
}

/// Device-side CQE write at producer counter `pi` of a ring at address `buf` of `cnt` entries.
pub(crate) fn produce_at(buf: usize, cnt: u32, pi: u32, c: &Cqe) {
    let mut b = [0u8; CQE_BYTES];
    c.encode(&mut b);
    let op = op_own(
        CqeOpcode::from_nibble(c.opcode).unwrap(),
        pi,
        cnt.trailing_zeros(),
    );
    let slot = (buf + (pi & (cnt - 1)) as usize * CQE_BYTES) as *mut u8;
    // SAFETY: inside the ring; the consumer does not read this entry until `op_own` flips.
    unsafe {
        std::ptr::copy_nonoverlapping(b.as_ptr(), slot, 63);
        std::sync::atomic::AtomicU8::from_ptr(slot.add(63))
            .store(op, std::sync::atomic::Ordering::Release);
    }
}

/// A requester CQE naming `wqe_counter`.
pub(crate) fn req_cqe(qpn: u32, wqe_counter: u16) -> Cqe {
    Cqe {
        opcode: CqeOpcode::Req as u8,
        qpn,
        wqe_opcode: wqe::Opcode::RdmaWrite as u8,
        wqe_counter,
        byte_cnt: 0,
        imm: 0,
        src_qpn: 0,
        grh: 0,
        srqn: 0,
        syndrome: 0,
        vendor_syndrome: 0,
    }
}

/// RQ memory over test buffers.
pub(crate) fn rq_mem(wqe_cnt: u32, max_sge: u32) -> (Arc<DmaBuf>, Arc<DmaBuf>, RqMem) {
    let stride = (16 * max_sge.max(1)).next_power_of_two();
    let buf = Arc::new(DmaBuf::with_normal_pages((wqe_cnt * stride) as usize).unwrap());
    let db = Arc::new(DmaBuf::with_normal_pages(8).unwrap());
    // SAFETY: `wqe_cnt` page-aligned WQEs of `stride >= 16 * max_sge` bytes and an 8-byte
    // doorbell record, kept alive by the description's owner; only the queue and the test
    // (reading what the driver wrote) use them.
    let mem = unsafe {
        RqMem::new(
            buf.as_non_null(),
            wqe_cnt,
            stride,
            max_sge,
            db.as_non_null().cast(),
        )
    }
    .owned_by(Arc::new((buf.clone(), db.clone())));
    (buf, db, mem)
}

/// SRQ memory over test buffers (stride `pow2(max(32, 16 + 16 * max_sge))`).
pub(crate) fn srq_mem(wqe_cnt: u32, max_sge: u32) -> (Arc<DmaBuf>, Arc<DmaBuf>, SrqMem) {
    let stride = (16 + 16 * max_sge).max(32).next_power_of_two();
    let buf = Arc::new(DmaBuf::with_normal_pages((wqe_cnt * stride) as usize).unwrap());
    let db = Arc::new(DmaBuf::with_normal_pages(8).unwrap());
    // SAFETY: `wqe_cnt` page-aligned WQEs of `stride >= 16 + 16 * max_sge` bytes and an 8-byte
    // doorbell record, kept alive by the description's owner; only the queue and the test
    // (reading what the driver wrote) use them.
    let mem = unsafe {
        SrqMem::new(
            buf.as_non_null(),
            wqe_cnt,
            stride,
            max_sge,
            db.as_non_null().cast(),
            0x77,
        )
    }
    .owned_by(Arc::new((buf.clone(), db.clone())));
    (buf, db, mem)
}
