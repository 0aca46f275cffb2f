//! The free list of message buffers (`Rpc::recycle`).
//!
//! Multi-packet messages are reassembled into, and copied messages handed out in, `Vec<u8>`s
//! taken from here; the application returns them with `Rpc::recycle`. Buffers come back in
//! LIFO order, so a steady workload keeps reusing the same few warm buffers and allocates
//! nothing per message.

/// Most buffers the free list keeps.
pub const POOL_MAX_BUFS: usize = 256;
/// Most bytes of buffer capacity the free list keeps (64 MiB: eight maximal messages).
pub const POOL_MAX_BYTES: usize = 64 << 20;

/// A bounded LIFO free list of byte buffers.
#[derive(Debug, Default)]
pub(super) struct BufPool {
    bufs: Vec<Vec<u8>>,
    bytes: usize,
}

impl BufPool {
    /// An empty buffer with room for at least `cap` bytes (allocates only if the free list
    /// is empty or its top buffer is too small).
    pub fn take(&mut self, cap: usize) -> Vec<u8> {
        let mut b = match self.bufs.pop() {
            Some(b) => {
                self.bytes -= b.capacity();
                b
            }
            None => Vec::new(),
        };
        b.reserve(cap);
        b
    }

    /// Keeps `buf` (cleared) for reuse if within the bounds; drops it otherwise.
    pub fn put(&mut self, mut buf: Vec<u8>) {
        let cap = buf.capacity();
        if cap == 0 || self.bufs.len() >= POOL_MAX_BUFS || self.bytes + cap > POOL_MAX_BYTES {
            return;
        }
        if self.bufs.capacity() == 0 {
            // One allocation for the list itself, on first use.
            self.bufs.reserve_exact(POOL_MAX_BUFS);
        }
        buf.clear();
        self.bytes += cap;
        self.bufs.push(buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifo_reuse_and_bounds() {
        let mut p = BufPool::default();
        let a = p.take(100);
        assert!(a.capacity() >= 100);
        let ptr = a.as_ptr();
        p.put(a);
        let b = p.take(50);
        assert_eq!(b.as_ptr(), ptr, "reused");
        assert!(b.is_empty());
        p.put(Vec::new()); // capacity 0: not kept
        assert!(p.bufs.is_empty());
        for _ in 0..POOL_MAX_BUFS + 10 {
            p.put(Vec::with_capacity(8));
        }
        assert_eq!(p.bufs.len(), POOL_MAX_BUFS);
        let mut p = BufPool::default();
        p.put(Vec::with_capacity(POOL_MAX_BYTES));
        p.put(Vec::with_capacity(1));
        assert_eq!(p.bufs.len(), 1, "byte bound");
    }
}
