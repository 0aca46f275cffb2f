//! Shared receive queue driver: the free list as the device follows it (from WQE 0 through
//! `next_wqe_index`), out-of-order releases, bad indices, the sentinel, the doorbell record.

mod driver_common;

use std::collections::VecDeque;

use driver_common::{Rng, bytes, dbrec_word, srq_mem};
use mlx5::Error;
use mlx5::mem::DmaBuf;
use mlx5::srq::{NEXT_SEG_BYTES, NEXT_WQE_INDEX_OFF, SharedRecvQueue};
use mlx5::wqe::{DataSeg, Sge};

/// Posting without a device: these tests run the driver alone, so nothing ever writes the
/// memory a scatter list names, which is all `SharedRecvQueue::post`'s contract asks about.
trait NoDevice {
    fn post_nodev(&mut self, sges: &[Sge]) -> mlx5::Result<u16>;
}

impl NoDevice for SharedRecvQueue {
    fn post_nodev(&mut self, sges: &[Sge]) -> mlx5::Result<u16> {
        // SAFETY: no device runs in these tests (trait docs).
        unsafe { self.post(sges) }
    }
}

fn next_of(buf: &DmaBuf, stride: u32, i: u32) -> u16 {
    let b = bytes(buf, (i * stride) as usize + NEXT_WQE_INDEX_OFF, 2);
    u16::from_be_bytes([b[0], b[1]])
}

fn data_seg(buf: &DmaBuf, stride: u32, i: u32, k: usize) -> DataSeg {
    DataSeg::read(&bytes(
        buf,
        (i * stride) as usize + NEXT_SEG_BYTES + k * 16,
        16,
    ))
}

/// The device side of an SRQ, as hardware and the model behave: its head starts at WQE 0,
/// and each consumed WQE moves it to that WQE's `next_wqe_index`; it consumes only WQEs the
/// doorbell record (16-bit counter) says are posted.
struct Device {
    head: u32,
    consumed: u32,
}

impl Device {
    fn consume(&mut self, buf: &DmaBuf, db: &DmaBuf, stride: u32) -> Option<u16> {
        let posted16 = dbrec_word(db, 0) as u16;
        if posted16 == self.consumed as u16 {
            return None;
        }
        let i = self.head;
        self.head = u32::from(next_of(buf, stride, i));
        self.consumed += 1;
        Some(i as u16)
    }
}

fn sge(i: u32) -> Sge {
    Sge {
        addr: u64::from(i) << 12,
        len: 100 + i,
        lkey: 7,
    }
}

#[test]
fn initial_list_links_every_wqe_in_order() {
    let (buf, db, mem) = srq_mem(8, 2);
    let stride = mem.ring().stride();
    assert_eq!(stride, 64);
    let srq = SharedRecvQueue::new(mem);
    for i in 0..8 {
        assert_eq!(next_of(&buf, stride, i), ((i + 1) % 8) as u16);
    }
    assert_eq!((srq.head(), srq.tail()), (0, 7));
    assert_eq!(srq.capacity(), 7);
    assert_eq!(srq.available(), 7);
    assert_eq!(srq.srqn(), 0x77);
    assert_eq!(dbrec_word(&db, 0), 0);
}

#[test]
fn sentinel_limits_posting_to_wqe_cnt_minus_one() {
    let (buf, db, mem) = srq_mem(4, 1);
    let stride = mem.ring().stride();
    let mut srq = SharedRecvQueue::new(mem);
    for i in 0..3 {
        assert_eq!(srq.post_nodev(&[sge(i)]).unwrap(), i as u16);
    }
    let snap = bytes(&buf, 0, 4 * stride as usize);
    assert!(matches!(srq.post_empty(), Err(Error::RqFull)));
    assert!(matches!(
        srq.post_nodev(&[sge(0), sge(1)]),
        Err(Error::WqeTooLarge(_))
    ));
    assert_eq!(bytes(&buf, 0, 4 * stride as usize), snap, "nothing written");
    assert_eq!((srq.posted(), srq.available()), (3, 0));
    srq.ring_doorbell();
    assert_eq!(dbrec_word(&db, 0), 3);
    // Release WQE 1 (out of order): the sentinel 3 links to it, and 3 becomes postable.
    srq.release(1).unwrap();
    assert_eq!(next_of(&buf, stride, 3), 1);
    assert_eq!(srq.tail(), 1);
    assert_eq!(srq.post_empty().unwrap(), 3);
    assert!(matches!(srq.post_empty(), Err(Error::RqFull)));
    // WQE 3 got a terminator (zero-length receive; max_sge 1).
    assert!(data_seg(&buf, stride, 3, 0).is_terminator());
}

#[test]
fn bad_indices_and_double_release_change_nothing() {
    let (buf, _db, mem) = srq_mem(8, 1);
    let stride = mem.ring().stride();
    let mut srq = SharedRecvQueue::new(mem);
    let a = srq.post_nodev(&[sge(1)]).unwrap();
    let snap = bytes(&buf, 0, 8 * stride as usize);
    for bad in [8u16, 9, 1000, u16::MAX] {
        assert!(
            matches!(srq.release(bad), Err(Error::InvalidArgument(_))),
            "{bad}"
        );
    }
    // Never posted.
    assert!(matches!(srq.release(5), Err(Error::InvalidArgument(_))));
    assert!(matches!(srq.release(7), Err(Error::InvalidArgument(_)))); // the sentinel
    assert_eq!(bytes(&buf, 0, 8 * stride as usize), snap);
    assert_eq!((srq.posted(), srq.tail()), (1, 7));
    srq.release(a).unwrap();
    assert!(matches!(srq.release(a), Err(Error::InvalidArgument(_))));
    assert_eq!((srq.posted(), srq.tail()), (0, a));
    assert!(!srq.is_posted(a));
}

/// Random posts (with a device consuming what was rung) and out-of-order releases: the
/// device always consumes exactly the WQEs the driver posted, in posting order, and finds the
/// scatter list the driver wrote.
#[test]
fn device_follows_the_list_through_out_of_order_releases() {
    for (cnt, seed) in [(4u32, 1u64), (16, 2), (64, 3), (256, 4)] {
        let (buf, db, mem) = srq_mem(cnt, 2);
        let stride = mem.ring().stride();
        let mut srq = SharedRecvQueue::new(mem);
        let mut dev = Device {
            head: 0,
            consumed: 0,
        };
        let mut rng = Rng(seed);
        let mut posted_order: VecDeque<(u16, Vec<Sge>)> = VecDeque::new();
        let mut consumed: Vec<u16> = Vec::new(); // awaiting release, any order
        let mut total = 0u32;
        while total < 80_000 {
            // Post a few.
            for _ in 0..rng.below(u64::from(cnt)) {
                let n = rng.below(3) as u32;
                let sges: Vec<Sge> = (0..n).map(|k| sge(total + k)).collect();
                match srq.post_nodev(&sges) {
                    Ok(i) => {
                        assert!(u32::from(i) < cnt);
                        posted_order.push_back((i, sges));
                        total += 1;
                    }
                    Err(Error::RqFull) => {
                        assert_eq!(srq.posted(), cnt - 1);
                        break;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            if rng.below(2) == 0 {
                srq.ring_doorbell();
                assert_eq!(dbrec_word(&db, 0), srq.counter() & 0xffff);
            }
            // The device consumes some of what was rung.
            for _ in 0..rng.below(u64::from(cnt)) {
                let Some(i) = dev.consume(&buf, &db, stride) else {
                    break;
                };
                let (want, sges) = posted_order.pop_front().unwrap();
                assert_eq!(
                    i, want,
                    "device consumed a WQE the driver did not post next"
                );
                for (k, s) in sges.iter().enumerate() {
                    assert_eq!(data_seg(&buf, stride, u32::from(i), k).0, *s);
                }
                if sges.len() < 2 {
                    assert!(data_seg(&buf, stride, u32::from(i), sges.len()).is_terminator());
                }
                consumed.push(i);
            }
            // CQEs come back in any order: release a random subset.
            for _ in 0..rng.below(consumed.len() as u64 + 1) {
                let k = rng.below(consumed.len() as u64) as usize;
                let i = consumed.swap_remove(k);
                srq.release(i).unwrap();
            }
            assert_eq!(
                srq.posted() as usize,
                posted_order.len() + consumed.len(),
                "posted = not yet consumed + consumed awaiting release"
            );
            assert_eq!(srq.available(), cnt - 1 - srq.posted());
        }
        assert!(
            srq.counter() > 65_536,
            "the 16-bit doorbell counter wrapped"
        );
    }
}

#[test]
fn post_empty_n_fills_to_capacity() {
    let (_buf, db, mem) = srq_mem(32, 1);
    let mut srq = SharedRecvQueue::new(mem);
    assert_eq!(srq.post_empty_n(10), 10);
    assert_eq!(srq.post_empty_n(100), 21);
    assert_eq!(srq.post_empty_n(1), 0);
    assert_eq!(srq.pending_since_doorbell(), 31);
    srq.ring_doorbell();
    assert_eq!(dbrec_word(&db, 0), 31);
    assert_eq!(srq.pending_since_doorbell(), 0);
}
