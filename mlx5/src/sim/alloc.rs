//! Queue memory the model allocates and hands to the driver: 64 B aligned, zeroed, freed when
//! the provider handle that owns it drops.

use std::alloc::Layout;
use std::ptr::NonNull;

use crate::error::{Error, Result};

/// Alignment of every allocation (a WQEBB / CQE / cache line).
pub(crate) const ALIGN: usize = 64;

/// Byte offset, inside a queue's 64 B doorbell-record block, of the device-side counters the
/// model keeps for the queue (a CQ's producer counter and overrun flag, an RQ's consumer
/// counter, an SRQ's head and consumer counter). The driver uses bytes 0..8 of the block.
/// A NIC keeps such state on the device; the model keeps it next to the record so that every
/// model that writes the queue (one per process on a node, see "Across processes" in
/// `sim/mod.rs`) shares one copy. Accessed only with the fabric (and node) lock held.
pub(crate) const COUNTERS_OFF: usize = 32;

/// The counters of the queue whose doorbell record block starts at `dbrec`.
pub(crate) fn counters(dbrec: *mut u32) -> *mut u32 {
    // SAFETY (of later accesses): every doorbell record block is a 64 B `ModelMem`, so bytes
    // COUNTERS_OFF..COUNTERS_OFF+16 are inside it. `wrapping_add` keeps this function safe.
    dbrec.cast::<u8>().wrapping_add(COUNTERS_OFF).cast()
}

/// Counter `i` (< 4) of a counter block.
pub(crate) fn load(ctr: *mut u32, i: usize) -> u32 {
    debug_assert!(i < 4);
    // SAFETY: `ctr` comes from `counters` on a live doorbell block (alive while its object is
    // in a model's tables or mapped from a peer); 4-byte aligned. Relaxed suffices: every
    // access happens under the fabric/node lock, which orders them.
    unsafe { std::sync::atomic::AtomicU32::from_ptr(ctr.add(i)) }
        .load(std::sync::atomic::Ordering::Relaxed)
}

/// Stores counter `i` (< 4) of a counter block (see [`load`]).
pub(crate) fn store(ctr: *mut u32, i: usize, v: u32) {
    debug_assert!(i < 4);
    // SAFETY: as in `load`.
    unsafe { std::sync::atomic::AtomicU32::from_ptr(ctr.add(i)) }
        .store(v, std::sync::atomic::Ordering::Relaxed)
}

/// One zeroed, 64 B aligned allocation (a WQE ring, a CQE ring or a doorbell record).
///
/// Heap memory, or, once the process joined a node ([`crate::sim::Fabric::join`]), a shared
/// segment ([`crate::mem::DmaBuf`] with shared backing) that the models of other processes
/// can map.
#[derive(Debug)]
pub(crate) struct ModelMem {
    ptr: NonNull<u8>,
    layout: Layout,
    /// The shared segment holding the memory (then `layout` is unused).
    shared: Option<crate::mem::DmaBuf>,
}

// SAFETY: plain heap memory, not tied to a thread; every access goes through raw pointers whose
// synchronisation is documented in `sim/mod.rs` ("Memory ordering").
unsafe impl Send for ModelMem {}
// SAFETY: as for `Send`: `&ModelMem` gives only the pointer, never a reference to the bytes.
unsafe impl Sync for ModelMem {}

impl ModelMem {
    /// Allocates `len` zeroed bytes (at least one 64 B block).
    pub(crate) fn zeroed(len: usize) -> Result<Self> {
        let layout = Layout::from_size_align(len.max(ALIGN).next_multiple_of(ALIGN), ALIGN)
            .map_err(|e| Error::InvalidArgument(format!("allocation of {len} bytes: {e}")))?;
        if crate::mem::shared_backing_active() {
            let buf = crate::mem::DmaBuf::with_normal_pages(layout.size())?;
            return Ok(ModelMem {
                ptr: buf.as_non_null(),
                layout,
                shared: Some(buf),
            });
        }
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr)
            .ok_or_else(|| Error::Memory(std::io::Error::from(std::io::ErrorKind::OutOfMemory)))?;
        Ok(ModelMem {
            ptr,
            layout,
            shared: None,
        })
    }

    /// Start of the allocation.
    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }
}

impl Drop for ModelMem {
    fn drop(&mut self) {
        if self.shared.is_some() {
            return; // the DmaBuf unmaps itself
        }
        // SAFETY: allocated in `zeroed` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        for len in [1, 8, 64, 65, 4096] {
            let m = ModelMem::zeroed(len).unwrap();
            assert_eq!(m.ptr().as_ptr() as usize % ALIGN, 0);
            // SAFETY: `len` bytes are allocated.
            let s = unsafe { std::slice::from_raw_parts(m.ptr().as_ptr(), len) };
            assert!(s.iter().all(|&b| b == 0));
        }
    }
}
