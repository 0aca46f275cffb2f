//! Receive queue driver: WQE layout (data segments + terminator), full queue, in-order
//! completion, doorbell record across the 16-bit wrap.

mod driver_common;

use driver_common::{bytes, dbrec_word, rq_mem};
use mlx5::Error;
use mlx5::rq::RecvQueue;
use mlx5::wqe::{DataSeg, INVALID_LKEY, Sge};

/// Posting without a device: these tests run the driver alone, so nothing ever writes the
/// memory a scatter list names, which is all `RecvQueue::post`'s contract asks about.
trait NoDevice {
    fn post_nodev(&mut self, sges: &[Sge]) -> mlx5::Result<()>;
    fn repost_nodev(&mut self, n: u32) -> bool;
}

impl NoDevice for RecvQueue {
    fn post_nodev(&mut self, sges: &[Sge]) -> mlx5::Result<()> {
        // SAFETY: no device runs in these tests (trait docs).
        unsafe { self.post(sges) }
    }
    fn repost_nodev(&mut self, n: u32) -> bool {
        // SAFETY: as `post_nodev`.
        unsafe { self.repost(n) }
    }
}

fn sge(i: u32) -> Sge {
    Sge {
        addr: 0x1000_0000 + u64::from(i) * 0x100,
        len: 64 + i,
        lkey: 0x42 + i,
    }
}

fn seg(buf: &mlx5::mem::DmaBuf, stride: u32, slot: u32, i: usize) -> DataSeg {
    DataSeg::read(&bytes(buf, (slot * stride) as usize + i * 16, 16))
}

#[test]
fn wqe_layout_with_terminator() {
    let (buf, db, mem) = rq_mem(8, 4);
    let stride = mem.stride();
    assert_eq!(stride, 64);
    let mut rq = RecvQueue::new(mem);
    for n in 0..=4u32 {
        let sges: Vec<Sge> = (0..n).map(|i| sge(i + n)).collect();
        rq.post_nodev(&sges).unwrap();
        let slot = n;
        for (i, s) in sges.iter().enumerate() {
            assert_eq!(seg(&buf, stride, slot, i).0, *s);
        }
        if n < 4 {
            let t = seg(&buf, stride, slot, n as usize);
            assert!(t.is_terminator());
            assert_eq!((t.0.len, t.0.lkey, t.0.addr), (0, INVALID_LKEY, 0));
        }
    }
    assert_eq!(rq.head(), 5);
    assert_eq!(rq.posted(), 5);
    assert_eq!(dbrec_word(&db, 0), 0, "no doorbell yet");
    rq.ring_doorbell();
    assert_eq!(dbrec_word(&db, 0), 5);
    assert_eq!(dbrec_word(&db, 1), 0, "the RQ never touches the SQ word");
}

#[test]
fn too_many_sges_and_full() {
    let (buf, _db, mem) = rq_mem(4, 2);
    let mut rq = RecvQueue::new(mem);
    assert!(matches!(
        rq.post_nodev(&[sge(0), sge(1), sge(2)]),
        Err(Error::WqeTooLarge(_))
    ));
    assert_eq!(rq.head(), 0);
    for i in 0..4 {
        rq.post_nodev(&[sge(i)]).unwrap();
    }
    assert_eq!(rq.free(), 0);
    let snap = bytes(&buf, 0, 4 * 32);
    assert!(matches!(rq.post_nodev(&[]), Err(Error::RqFull)));
    assert_eq!(bytes(&buf, 0, 4 * 32), snap, "nothing written when full");
    rq.complete();
    assert_eq!((rq.tail(), rq.free()), (1, 1));
    rq.post_nodev(&[sge(9)]).unwrap();
    // WQE 4 reused slot 0.
    assert_eq!(seg(&buf, 32, 0, 0).0, sge(9));
    assert!(seg(&buf, 32, 0, 1).is_terminator());
}

#[test]
fn exactly_max_sge_has_no_terminator() {
    let (buf, _db, mem) = rq_mem(2, 1);
    let mut rq = RecvQueue::new(mem);
    // Pre-fill the slot with garbage to see that only the used segment is written.
    // SAFETY: test memory.
    unsafe { buf.as_mut_slice()[..32].fill(0xee) };
    rq.post_nodev(&[sge(3)]).unwrap();
    assert_eq!(seg(&buf, 16, 0, 0).0, sge(3));
    rq.post_nodev(&[]).unwrap(); // zero-length receive: terminator only
    assert!(seg(&buf, 16, 1, 0).is_terminator());
}

#[test]
fn doorbell_record_wraps_at_16_bits() {
    let (_buf, db, mem) = rq_mem(16, 1);
    let mut rq = RecvQueue::new(mem);
    while rq.head() < 70_000 {
        while rq.free() > 0 {
            rq.post_nodev(&[]).unwrap();
        }
        assert!(rq.pending_since_doorbell() > 0);
        rq.ring_doorbell();
        assert_eq!(rq.pending_since_doorbell(), 0);
        assert_eq!(dbrec_word(&db, 0), rq.head() & 0xffff);
        for _ in 0..7 {
            rq.complete();
        }
    }
    assert_eq!(rq.head() - rq.tail(), rq.posted());
}

/// `repost` moves only the producer counter, and only once every slot holds a WQE and the
/// WQEs are free; the ring bytes stay those `post` wrote.
#[test]
fn repost_reuses_the_written_wqes() {
    let (buf, db, mem) = rq_mem(4, 1);
    let mut rq = RecvQueue::new(mem);
    assert!(!rq.repost_nodev(0), "no slot written yet");
    for i in 0..3 {
        rq.post_nodev(&[sge(i)]).unwrap();
    }
    for _ in 0..3 {
        rq.complete();
    }
    assert!(!rq.repost_nodev(1), "slot 3 never written");
    assert_eq!(rq.head(), 3);
    rq.post_nodev(&[sge(3)]).unwrap();
    let snap = bytes(&buf, 0, 4 * 16);
    assert!(!rq.repost_nodev(4), "only 3 free");
    assert!(rq.repost_nodev(3));
    assert_eq!((rq.head(), rq.posted(), rq.free()), (7, 4, 0));
    assert!(!rq.repost_nodev(1), "full");
    assert_eq!(bytes(&buf, 0, 4 * 16), snap, "nothing written");
    rq.ring_doorbell();
    assert_eq!(dbrec_word(&db, 0), 7);
    for i in 0..4u32 {
        assert_eq!(seg(&buf, 16, i, 0).0, sge(i));
    }
}
