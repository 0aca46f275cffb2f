//! Queue memory the model allocates and hands to the driver: 64 B aligned, zeroed, freed when
//! the provider handle that owns it drops.

use std::alloc::Layout;
use std::ptr::NonNull;

use crate::error::{Error, Result};

/// Alignment of every allocation (a WQEBB / CQE / cache line).
pub(crate) const ALIGN: usize = 64;

/// One zeroed, 64 B aligned allocation (a WQE ring, a CQE ring or a doorbell record).
#[derive(Debug)]
pub(crate) struct ModelMem {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: plain heap memory, not tied to a thread; every access goes through raw pointers whose
// synchronisation is documented in `sim/mod.rs` ("Memory ordering").
unsafe impl Send for ModelMem {}
unsafe impl Sync for ModelMem {}

impl ModelMem {
    /// Allocates `len` zeroed bytes (at least one 64 B block).
    pub(crate) fn zeroed(len: usize) -> Result<Self> {
        let layout = Layout::from_size_align(len.max(ALIGN).next_multiple_of(ALIGN), ALIGN)
            .map_err(|e| Error::InvalidArgument(format!("allocation of {len} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr)
            .ok_or_else(|| Error::Memory(std::io::Error::from(std::io::ErrorKind::OutOfMemory)))?;
        Ok(ModelMem { ptr, layout })
    }

    /// Start of the allocation.
    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }
}

impl Drop for ModelMem {
    fn drop(&mut self) {
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
