//! Property tests of the node directory's peer exports (issue 14 §4): the records another
//! process's model writes into the shared directory (`node.rs`: QP, SRQ, CQ and MR exports)
//! are read by [`Model::resolve`] and [`Model::target_mr`], and the receive WQEs in the peer's
//! rings by `RecvQ::peek`. Every field here is arbitrary (a corrupt or hostile peer), and
//! the segment numbers name files of chosen lengths (or none).
//!
//! The directory's own header and process slots (written by every process that joined) are
//! read by `NodeDir::join` and the LID allocator: [`join_over_arbitrary_directory_records`].
//!
//! Asserted: nothing panics; a live export addressed by the LID is either resolved into a
//! target whose every ring and doorbell block lies inside a segment that exists and is long
//! enough, or refused and counted in `SimStats::remote_bad_exports`; an export that is not
//! live or not addressed is refused without counting; a resolved memory span lies inside its
//! segment. 256 cases by default; `PROPTEST_CASES=<n>` runs more (proptest reads the variable
//! itself; the runner below starts from `ProptestConfig::default()`, which applies it).

use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use super::SimConfig;
use super::memory::RKEY_TAG;
use super::model::Model;
use super::node::{CQ_BITS, DIR_BYTES, MAX_PROCS, MR_BITS, NodeDir, QP_BITS, SRQ_BITS};
use super::target::{RecvQ, link};
use crate::verbs::Access;

/// Segment numbers the test creates, with their lengths in bytes; other numbers name no file.
const SEGS: [(u32, usize); 4] = [
    (900_001, 64),
    (900_002, 4096),
    (900_003, 1 << 16),
    (900_004, 1 << 20),
];

fn seg_len(seg: u32) -> Option<usize> {
    SEGS.iter().find(|s| s.0 == seg).map(|s| s.1)
}

/// A segment number: one of [`SEGS`], or anything.
fn seg() -> impl Strategy<Value = u32> {
    prop_oneof![
        1 => Just(SEGS[0].0),
        1 => Just(SEGS[1].0),
        2 => Just(SEGS[2].0),
        4 => Just(SEGS[3].0),
        1 => any::<u32>(),
    ]
}

/// A count: a small power of two, zero, or anything.
fn count() -> impl Strategy<Value = u32> {
    prop_oneof![
        6 => (0u32..8).prop_map(|s| 1 << s),
        1 => Just(0u32),
        1 => any::<u32>(),
    ]
}

/// A stride: a multiple of 16 below 1 KiB, or anything.
fn stride() -> impl Strategy<Value = u32> {
    prop_oneof![6 => (0u32..17).prop_map(|s| s * 16), 1 => any::<u32>()]
}

#[derive(Clone, Debug)]
struct QpFields {
    live: u32,
    lid_matches: bool,
    lid: u32,
    state: u32,
    err_pending: u32,
    kind: u32,
    pd: u32,
    access: u32,
    qkey: u32,
    peer_qpn: u32,
    /// `Some(i)`: a CQ number of the peer's slot (index `i`); `None`: `raw_cq`.
    cq_idx: Option<u32>,
    raw_cq: u32,
    /// 0 none, 1 an SRQ of the peer's slot, 2 an arbitrary number.
    srq_sel: u8,
    raw_srq: u32,
    rq_seg: u32,
    db_seg: u32,
    rq_wqe_cnt: u32,
    rq_stride: u32,
}

#[derive(Clone, Debug)]
struct SrqFields {
    live: u32,
    wqe_cnt: u32,
    stride: u32,
    max_sge: u32,
    pd: u32,
    ring_seg: u32,
    db_seg: u32,
}

#[derive(Clone, Debug)]
struct CqFields {
    live: u32,
    cqe_cnt: u32,
    ring_seg: u32,
    db_seg: u32,
}

fn live() -> impl Strategy<Value = u32> {
    prop_oneof![4 => Just(1u32), 1 => any::<u32>()]
}

fn qp_fields() -> impl Strategy<Value = QpFields> {
    (
        (
            live(),
            prop_oneof![4 => Just(true), 1 => Just(false)],
            any::<u32>(),
            0u32..4,
            prop_oneof![Just(0u32), any::<u32>()],
        ),
        (
            0u32..3,
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
        ),
        (
            proptest::option::of(0u32..8),
            any::<u32>(),
            0u8..3,
            any::<u32>(),
        ),
        (seg(), seg(), count(), stride()),
    )
        .prop_map(
            |(
                (live, lid_matches, lid, state, err_pending),
                (kind, pd, access, qkey, peer_qpn),
                (cq_idx, raw_cq, srq_sel, raw_srq),
                (rq_seg, db_seg, rq_wqe_cnt, rq_stride),
            )| QpFields {
                live,
                lid_matches,
                lid,
                state,
                err_pending,
                kind,
                pd,
                access,
                qkey,
                peer_qpn,
                cq_idx,
                raw_cq,
                srq_sel,
                raw_srq,
                rq_seg,
                db_seg,
                rq_wqe_cnt,
                rq_stride,
            },
        )
}

fn srq_fields() -> impl Strategy<Value = SrqFields> {
    (
        live(),
        count(),
        stride(),
        prop_oneof![4 => 0u32..8, 1 => any::<u32>()],
        any::<u32>(),
        seg(),
        seg(),
    )
        .prop_map(
            |(live, wqe_cnt, stride, max_sge, pd, ring_seg, db_seg)| SrqFields {
                live,
                wqe_cnt,
                stride,
                max_sge,
                pd,
                ring_seg,
                db_seg,
            },
        )
}

fn cq_fields() -> impl Strategy<Value = CqFields> {
    (live(), count(), seg(), seg()).prop_map(|(live, cqe_cnt, ring_seg, db_seg)| CqFields {
        live,
        cqe_cnt,
        ring_seg,
        db_seg,
    })
}

/// Whether `[ptr, ptr + need)` lies inside the mapping of one of the test's segments.
fn inside(maps: &[(usize, usize)], ptr: *mut u8, need: usize) -> bool {
    let p = ptr as usize;
    maps.iter()
        .any(|&(start, len)| p >= start && p.checked_add(need).is_some_and(|e| e <= start + len))
}

/// Two directories of one node (this process plays both), the test's segment files, and
/// cleanup of everything on drop.
struct Node {
    me: Arc<NodeDir>,
    peer: NodeDir,
    name: String,
    files: Vec<String>,
}

impl Node {
    fn new(tag: &str) -> Node {
        let name = format!("props-{tag}-{}", std::process::id());
        let me = Arc::new(NodeDir::join(&name, super::DEFAULT_NODE_LOCK_TIMEOUT).unwrap());
        let peer = NodeDir::join(&name, super::DEFAULT_NODE_LOCK_TIMEOUT).unwrap();
        let pid = peer.pid(peer.slot);
        let mut files = Vec::new();
        for (s, len) in SEGS {
            let path = peer.backing.segment_path(pid, s);
            let f = private_file(&path);
            f.set_len(len as u64).unwrap();
            // Arbitrary-looking receive WQEs and doorbell records: every byte 0x5a except a
            // few, so `peek` finds posted WQEs with garbage scatter entries.
            f.write_all_at(&vec![0x5a; len], 0).unwrap();
            files.push(path);
        }
        Node {
            me,
            peer,
            name,
            files,
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
        let _ = std::fs::remove_file(format!("/dev/shm/mlx5sim.{}", self.name));
    }
}

#[test]
fn peer_exports_are_validated_or_counted() {
    let node = Node::new("exports");
    let lid = node.peer.alloc_lid();
    let (me, peer) = (&node.me, &node.peer);
    let slot_prefix = peer.slot + 1;
    let mut runner = TestRunner::new(Config::default());
    let strategy = (qp_fields(), srq_fields(), cq_fields(), 0u32..(1 << QP_BITS));
    runner
        .run(&strategy, |(q, s, c, qidx)| {
            let qpn = (slot_prefix << QP_BITS) | qidx;
            let srqn = (slot_prefix << SRQ_BITS) | 3;
            let (_, e) = peer.qp(qpn).unwrap();
            let (_, se) = peer.srq(srqn).unwrap();
            let cqn = match q.cq_idx {
                Some(i) => (slot_prefix << CQ_BITS) | i,
                None => q.raw_cq,
            };
            if let Some((_, ce)) = peer.cq((slot_prefix << CQ_BITS) | q.cq_idx.unwrap_or(0)) {
                ce.live.store(c.live, Ordering::Relaxed);
                ce.cqe_cnt.store(c.cqe_cnt, Ordering::Relaxed);
                ce.ring_seg.store(c.ring_seg, Ordering::Relaxed);
                ce.db_seg.store(c.db_seg, Ordering::Relaxed);
            }
            se.live.store(s.live, Ordering::Relaxed);
            se.wqe_cnt.store(s.wqe_cnt, Ordering::Relaxed);
            se.stride.store(s.stride, Ordering::Relaxed);
            se.max_sge.store(s.max_sge, Ordering::Relaxed);
            se.pd.store(s.pd, Ordering::Relaxed);
            se.ring_seg.store(s.ring_seg, Ordering::Relaxed);
            se.db_seg.store(s.db_seg, Ordering::Relaxed);
            let elid = if q.lid_matches { u32::from(lid) } else { q.lid };
            e.lid.store(elid, Ordering::Relaxed);
            e.state.store(q.state, Ordering::Relaxed);
            e.err_pending.store(q.err_pending, Ordering::Relaxed);
            e.kind.store(q.kind, Ordering::Relaxed);
            e.pd.store(q.pd, Ordering::Relaxed);
            e.access.store(q.access, Ordering::Relaxed);
            e.qkey.store(q.qkey, Ordering::Relaxed);
            e.peer_qpn.store(q.peer_qpn, Ordering::Relaxed);
            e.recv_cq.store(cqn, Ordering::Relaxed);
            let srq = match q.srq_sel {
                0 => 0,
                1 => srqn,
                _ => q.raw_srq,
            };
            e.srq.store(srq, Ordering::Relaxed);
            e.rq_seg.store(q.rq_seg, Ordering::Relaxed);
            e.db_seg.store(q.db_seg, Ordering::Relaxed);
            e.rq_wqe_cnt.store(q.rq_wqe_cnt, Ordering::Relaxed);
            e.rq_stride.store(q.rq_stride, Ordering::Relaxed);
            e.live.store(q.live, Ordering::Release);

            // A fresh model per case: its peer-segment cache starts empty.
            let mut model = Model::new(SimConfig::default());
            model.node = Some(link(me.clone()));
            let addressed = q.live == 1 && elid == u32::from(lid);
            let t = model.resolve(lid, None, qpn);
            let bad = model.stats.remote_bad_exports;
            let Some(t) = t else {
                prop_assert_eq!(
                    bad,
                    u64::from(addressed),
                    "refusals of addressed exports count"
                );
                e.live.store(0, Ordering::Release);
                return Ok(());
            };
            prop_assert!(addressed, "only a live export at this LID resolves");
            prop_assert_eq!(bad, 0);
            prop_assert_eq!(t.remote, Some(peer.slot));
            // Everything the target points into lies inside a segment of the right length.
            let maps: Vec<(usize, usize)> = model.node.as_ref().unwrap().maps_for_test().collect();
            for &(_, len) in &maps {
                prop_assert!(SEGS.iter().any(|s| s.1 == len));
            }
            match &t.recv {
                Some((RecvQ::Rq(rq), _)) => {
                    prop_assert!(rq.wqe_cnt.is_power_of_two());
                    let need = rq.wqe_cnt as usize * rq.stride as usize;
                    prop_assert!(inside(&maps, rq.buf, need));
                    prop_assert!(inside(&maps, rq.dbrec.cast(), 64));
                    prop_assert!(rq.max_sge as usize * 16 <= rq.stride as usize);
                    prop_assert!(seg_len(q.rq_seg).is_some_and(|l| need <= l));
                }
                Some((RecvQ::Srq(n, sq), _)) => {
                    prop_assert_eq!(*n, srqn);
                    let need = sq.wqe_cnt as usize * sq.stride as usize;
                    prop_assert!(sq.wqe_cnt.is_power_of_two());
                    prop_assert!(inside(&maps, sq.buf, need));
                    prop_assert!(inside(&maps, sq.dbrec.cast(), 64));
                    prop_assert!(16 + sq.max_sge as usize * 16 <= sq.stride as usize);
                }
                None => prop_assert!(q.srq_sel == 0 && q.rq_wqe_cnt == 0),
            }
            if let Some((r, _)) = &t.recv {
                // Garbage receive WQEs in the peer's ring: read without panicking, within
                // the WQE's scatter capacity.
                if let Some(w) = r.peek() {
                    let max = match r {
                        RecvQ::Rq(rq) => rq.max_sge,
                        RecvQ::Srq(_, sq) => sq.max_sge,
                    };
                    prop_assert!(w.sges().count() <= max as usize);
                }
            }
            // Memory-region exports: arbitrary records, looked up with the rkey of their
            // index; a span is granted only inside its segment.
            let mr_idx = (slot_prefix << MR_BITS) | 7;
            let (_, me_) = peer.mr(mr_idx).unwrap();
            let (base, len, off) = (
                u64::from(q.qkey) << 12,
                u64::from(q.peer_qpn),
                u64::from(q.access),
            );
            me_.access.store(Access::all().bits(), Ordering::Relaxed);
            me_.pd.store(t.pd, Ordering::Relaxed);
            me_.seg.store(q.rq_seg, Ordering::Relaxed);
            me_.addr.store(base, Ordering::Relaxed);
            me_.len.store(len, Ordering::Relaxed);
            me_.seg_off.store(off, Ordering::Relaxed);
            me_.live.store(1, Ordering::Release);
            let want = (q.raw_cq as usize) % 8192;
            let rkey = (mr_idx << 8) | RKEY_TAG;
            let addr = base.wrapping_add(u64::from(q.raw_srq) % 8192);
            if let Some(span) =
                model.target_mr(&t, rkey, false, t.pd, addr, want, Access::REMOTE_WRITE)
            {
                let maps: Vec<(usize, usize)> =
                    model.node.as_ref().unwrap().maps_for_test().collect();
                prop_assert_eq!(span.len, want);
                prop_assert!(inside(&maps, span.ptr, want));
                prop_assert!(seg_len(q.rq_seg).is_some());
            }
            me_.live.store(0, Ordering::Release);
            e.live.store(0, Ordering::Release);
            Ok(())
        })
        .unwrap();
}

/// Layout of the directory's records as `node.rs` documents it: the header (magic `u64`,
/// version `u32`, next LID `u32`) at 0, process slot `s` (pid, state, attention: `u32`s) at
/// `4096 + 64 * s`.
const SLOT0: u64 = 4096;

/// Creates `path` (truncating) with mode 0600, as the model's own files are: the tests are
/// about the records' contents, not about the ownership checks (see `node.rs` for those).
fn private_file(path: &str) -> std::fs::File {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .unwrap();
    f
}

proptest! {
    /// A directory file whose header and process slots hold arbitrary values (another
    /// process wrote them, or a crash tore them): joining either succeeds, in a slot that was
    /// free (or after wiping a directory whose processes are all gone), handing out LIDs in
    /// the unicast range, or fails with a typed error; it never panics.
    #[test]
    fn join_over_arbitrary_directory_records(
        magic in prop_oneof![Just(0u64), Just(u64::from_le_bytes(*b"MLX5NODE")), any::<u64>()],
        version in prop_oneof![Just(1u32), any::<u32>()],
        next_lid in prop_oneof![Just(1u32), Just(0u32), 0xbff0u32..0xc010, any::<u32>()],
        slots in proptest::collection::vec(
            (0usize..MAX_PROCS, any::<u32>(), prop_oneof![0u32..5, any::<u32>()], any::<u32>()),
            0..8,
        ),
    ) {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let name = format!("props-dir-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
        let path = format!("/dev/shm/mlx5sim.{name}");
        let f = private_file(&path);
        f.set_len(DIR_BYTES as u64).unwrap();
        f.write_all_at(&magic.to_le_bytes(), 0).unwrap();
        f.write_all_at(&version.to_le_bytes(), 8).unwrap();
        f.write_all_at(&next_lid.to_le_bytes(), 12).unwrap();
        for &(s, pid, state, attention) in &slots {
            let off = SLOT0 + 64 * s as u64;
            f.write_all_at(&pid.to_le_bytes(), off).unwrap();
            f.write_all_at(&state.to_le_bytes(), off + 4).unwrap();
            f.write_all_at(&attention.to_le_bytes(), off + 8).unwrap();
        }
        drop(f);
        let r = NodeDir::join(&name, super::DEFAULT_NODE_LOCK_TIMEOUT);
        let result = match &r {
            Ok(d) => {
                let ok = (d.slot as usize) < MAX_PROCS && d.alive(d.slot);
                let lid = d.alloc_lid();
                ok && (1..0xc000).contains(&lid)
            }
            Err(crate::error::Error::InvalidArgument(_)) | Err(crate::error::Error::Memory(_)) => {
                magic != 0
            }
            Err(_) => false,
        };
        drop(r);
        let _ = std::fs::remove_file(&path);
        prop_assert!(result);
    }
}

proptest! {
    /// The same with a live process in the directory (so it is not wiped): its header's LID
    /// counter and the other process slots are overwritten; a second process joins in a free
    /// slot other than the live one's, and every LID handed out is a unicast LID
    /// (`1..0xc000`: LID 0 would mean "address by GID" to the model); or the join fails with
    /// a typed error when no slot is free.
    #[test]
    fn join_beside_a_live_process_over_arbitrary_records(
        next_lid in prop_oneof![Just(0u32), Just(1u32), 0xbff0u32..0xc010, any::<u32>()],
        slots in proptest::collection::vec(
            (1usize..MAX_PROCS, any::<u32>(), prop_oneof![0u32..5, any::<u32>()]),
            0..8,
        ),
        fill in any::<bool>(),
    ) {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let name = format!("props-live-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
        let path = format!("/dev/shm/mlx5sim.{name}");
        let a = NodeDir::join(&name, super::DEFAULT_NODE_LOCK_TIMEOUT).unwrap();
        prop_assert_eq!(a.slot, 0);
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&next_lid.to_le_bytes(), 12).unwrap();
        let mut writes = slots.clone();
        if fill {
            // Every other slot used: no room for a second process.
            writes.extend((1..MAX_PROCS).map(|s| (s, 1, 2)));
        }
        for &(s, pid, state) in &writes {
            let off = SLOT0 + 64 * s as u64;
            f.write_all_at(&pid.to_le_bytes(), off).unwrap();
            f.write_all_at(&state.to_le_bytes(), off + 4).unwrap();
        }
        let lid_a = a.alloc_lid();
        let b = NodeDir::join(&name, super::DEFAULT_NODE_LOCK_TIMEOUT);
        let free = (1..MAX_PROCS).any(|s| {
            writes.iter().rev().find(|w| w.0 == s).is_none_or(|w| w.2 == 0)
        });
        let outcome = match &b {
            Ok(b) => Ok((b.slot, b.alloc_lid())),
            Err(crate::error::Error::InvalidArgument(_)) => Err(()),
            Err(e) => panic!("join: {e}"),
        };
        drop(b);
        drop(a);
        let _ = std::fs::remove_file(&path);
        prop_assert!((1..0xc000).contains(&lid_a), "LID {} handed out", lid_a);
        match outcome {
            Ok((slot, lid_b)) => {
                prop_assert!(free && slot != 0 && (slot as usize) < MAX_PROCS);
                prop_assert!((1..0xc000).contains(&lid_b), "LID {} handed out", lid_b);
            }
            Err(()) => prop_assert!(!free),
        }
    }
}

/// Regression (found by `join_beside_a_live_process_over_arbitrary_records`): a LID counter
/// of 0 in the shared header used to hand out LID 0.
#[test]
fn a_zero_lid_counter_gives_a_unicast_lid() {
    let name = format!("props-lid0-{}", std::process::id());
    let path = format!("/dev/shm/mlx5sim.{name}");
    let a = NodeDir::join(&name, super::DEFAULT_NODE_LOCK_TIMEOUT).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&0u32.to_le_bytes(), 12).unwrap();
    let lid = a.alloc_lid();
    drop(a);
    let _ = std::fs::remove_file(&path);
    assert_ne!(lid, 0);
}
