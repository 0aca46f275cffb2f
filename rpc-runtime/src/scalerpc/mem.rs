//! Registered regions divided into fixed-size slots (the server's message pool, the client's
//! response and staging slots), with the few raw accesses the protocol needs.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use mlx5::mem::DmaBuf;
use mlx5::verbs::{Access, Context, Mr, Pd};

/// `n` slots of `slot` bytes in one registered buffer (hugepages when the size warrants it,
/// seeds/003 §4.2 `HugePageBuffer`). Field order: the registration drops before the memory.
pub(crate) struct Slots {
    pub mr: Mr,
    pub buf: DmaBuf,
    pub slot: usize,
    pub n: usize,
}

impl Slots {
    /// Allocates and registers `n * slot` bytes (zeroed) with `access`.
    pub(super) fn new(
        dev: &Context,
        pd: &Pd,
        n: usize,
        slot: usize,
        access: Access,
    ) -> Result<Slots, mlx5::Error> {
        let len = (n * slot).max(64);
        let buf = if len >= mlx5::mem::HUGEPAGE_BYTES {
            DmaBuf::new(len)?
        } else {
            DmaBuf::with_normal_pages(len)?
        };
        // SAFETY: `buf` moves into `Slots` with its registration (MR declared, so dropped,
        // first).
        let mr = unsafe { dev.reg_mr(pd, buf.as_mut_ptr(), len, access)? };
        Ok(Slots { mr, buf, slot, n })
    }

    /// Address of byte `off` of slot `i`.
    #[inline(always)]
    pub(super) fn addr(&self, i: usize, off: usize) -> u64 {
        self.mr.addr + (i * self.slot + off) as u64
    }

    /// Slot `i`'s bytes.
    ///
    /// # Safety
    /// `i < n`; the caller knows which of these bytes the device may be writing (only those
    /// of a message not yet complete) and reads only completed ones.
    #[inline(always)]
    pub(super) unsafe fn bytes(&self, i: usize) -> &[u8] {
        debug_assert!(i < self.n);
        // SAFETY: `i < n`, so slot `i` lies inside the `n * slot` bytes of `buf`; the caller
        // reads only bytes the device has finished writing (the contract above).
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr().add(i * self.slot), self.slot) }
    }

    /// Slot `i`'s bytes, mutably.
    ///
    /// # Safety
    /// `i < n`, and no device operation reads or writes the slot while the slice lives.
    #[allow(clippy::mut_from_ref)]
    #[inline(always)]
    pub(super) unsafe fn bytes_mut(&self, i: usize) -> &mut [u8] {
        debug_assert!(i < self.n);
        // SAFETY: `i < n`, so slot `i` lies inside `buf`, and no device operation touches it
        // while the slice lives (the contract above).
        unsafe {
            std::slice::from_raw_parts_mut(self.buf.as_mut_ptr().add(i * self.slot), self.slot)
        }
    }

    /// Loads the u32 at byte `off` of slot `i` with Acquire (a magic the peer may be writing).
    #[inline(always)]
    pub(super) fn load_u32(&self, i: usize, off: usize) -> u32 {
        debug_assert!(i < self.n && off + 4 <= self.slot && off.is_multiple_of(4));
        // SAFETY: inside the buffer, 4-aligned (slots and offsets are multiples of 4); other
        // writers are the device (RDMA) or ourselves; an atomic load tolerates both.
        let a = unsafe { &*(self.buf.as_ptr().add(i * self.slot + off) as *const AtomicU32) };
        u32::from_le(a.load(Ordering::Acquire))
    }

    /// Loads the u64 at byte `off` of slot `i` with Acquire (a trailer).
    #[inline(always)]
    pub(super) fn load_u64(&self, i: usize, off: usize) -> u64 {
        debug_assert!(i < self.n && off + 8 <= self.slot && off.is_multiple_of(8));
        // SAFETY: as `load_u32`, 8-aligned.
        let a = unsafe { &*(self.buf.as_ptr().add(i * self.slot + off) as *const AtomicU64) };
        u64::from_le(a.load(Ordering::Acquire))
    }

    /// Stores the u64 at byte `off` of slot `i` (clearing a trailer).
    #[inline(always)]
    pub(super) fn store_u64(&self, i: usize, off: usize, v: u64) {
        debug_assert!(i < self.n && off + 8 <= self.slot && off.is_multiple_of(8));
        // SAFETY: as `load_u64`.
        let a = unsafe { &*(self.buf.as_ptr().add(i * self.slot + off) as *const AtomicU64) };
        a.store(v.to_le(), Ordering::Release);
    }

    /// Stores the u32 at byte `off` of slot `i` (clearing a magic).
    #[inline(always)]
    pub(super) fn store_u32(&self, i: usize, off: usize, v: u32) {
        debug_assert!(i < self.n && off + 4 <= self.slot && off.is_multiple_of(4));
        // SAFETY: as `load_u32`.
        let a = unsafe { &*(self.buf.as_ptr().add(i * self.slot + off) as *const AtomicU32) };
        a.store(v.to_le(), Ordering::Release);
    }
}
