//! The memory-region table and checked copies.
//!
//! Every address a WQE names is validated against a registered region (key, protection domain,
//! range, access) before a single byte moves; a failed check leaves memory untouched. Keys are
//! unique within a fabric and never equal [`crate::wqe::INVALID_LKEY`]: `lkey = index << 8 |
//! 0x4c`, `rkey = index << 8 | 0x52`, so an lkey used as an rkey (or the reverse) is rejected
//! (stricter than ConnectX, where the two are usually equal).

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use crate::sim::table::NumTable;
use crate::verbs::Access;
use crate::wqe::Sge;

/// Low byte of every lkey.
pub(crate) const LKEY_TAG: u32 = 0x4c;
/// Low byte of every rkey.
pub(crate) const RKEY_TAG: u32 = 0x52;

/// One registered region.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MrEntry {
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) access: Access,
    pub(crate) pd: u32,
}

/// A validated piece of registered memory.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Span {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
}

/// Why a scatter list cannot take a payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ScatterError {
    /// Bad key, wrong PD, out of range or no LOCAL_WRITE.
    Protection,
    /// The buffers are shorter than the payload.
    Length,
}

/// All memory regions of a fabric.
#[derive(Debug, Default)]
pub(crate) struct MrTable {
    /// Regions by index (direct table, `sim/table.rs`).
    map: NumTable<MrEntry>,
    next: u32,
    /// On a joined node: this process's slot (indices are `(slot + 1) << MR_BITS | i`).
    pub(crate) slot: Option<u32>,
}

impl MrTable {
    /// Registers a region; returns `(index, lkey, rkey)`.
    ///
    /// # Errors
    /// `None` when every index is in use.
    pub(crate) fn register(&mut self, e: MrEntry) -> Option<(u32, u32, u32)> {
        let idx = self
            .map
            .alloc(&mut self.next, self.slot, crate::sim::node::MR_BITS, 1, e)
            .ok()?;
        Some((idx, (idx << 8) | LKEY_TAG, (idx << 8) | RKEY_TAG))
    }

    /// Removes a region (its memory may be freed afterwards).
    pub(crate) fn deregister(&mut self, idx: u32) {
        self.map.remove(idx);
    }

    #[inline]
    fn lookup(
        &self,
        key: u32,
        tag: u32,
        pd: u32,
        addr: u64,
        len: usize,
        need: Access,
    ) -> Option<Span> {
        if key & 0xff != tag {
            return None;
        }
        let e = self.map.get(key >> 8)?;
        let end = addr.checked_add(len as u64)?;
        if e.pd != pd || addr < e.addr || end > e.addr + e.len || !e.access.contains(need) {
            return None;
        }
        Some(Span {
            ptr: addr as usize as *mut u8,
            len,
        })
    }

    /// Validates a local buffer (data segment) of the QP's PD; `need` is empty for reads and
    /// LOCAL_WRITE for writes.
    pub(crate) fn local(
        &self,
        lkey: u32,
        pd: u32,
        addr: u64,
        len: usize,
        need: Access,
    ) -> Option<Span> {
        self.lookup(lkey, LKEY_TAG, pd, addr, len, need)
    }

    /// Validates a remote buffer (raddr segment) against the responder QP's PD.
    pub(crate) fn remote(
        &self,
        rkey: u32,
        pd: u32,
        addr: u64,
        len: usize,
        need: Access,
    ) -> Option<Span> {
        self.lookup(rkey, RKEY_TAG, pd, addr, len, need)
    }

    /// The payload of a send WQE: the inline bytes, then every gather entry (each validated
    /// first; `None` if any fails). Zero-length entries are skipped unchecked. With no
    /// non-empty entry the payload is `inline` itself; otherwise it is gathered into `out`
    /// (previous contents replaced).
    pub(crate) fn gather<'a>(
        &self,
        pd: u32,
        inline: &'a [u8],
        sges: &[Sge],
        out: &'a mut Vec<u8>,
    ) -> Option<&'a [u8]> {
        if sges.iter().all(|s| s.len == 0) {
            return Some(inline);
        }
        let mut spans = Spans::new();
        let mut total = inline.len();
        for s in sges.iter().filter(|s| s.len != 0) {
            spans.push(self.local(s.lkey, pd, s.addr, s.len as usize, Access::empty())?);
            total += s.len as usize;
        }
        out.clear();
        out.reserve(total);
        out.extend_from_slice(inline);
        for &sp in spans.as_slice() {
            read_into(sp, out);
        }
        Some(out)
    }

    /// Validates a scatter list for `len` bytes (only the entries the payload reaches).
    pub(crate) fn scatter_list(
        &self,
        pd: u32,
        sges: impl Iterator<Item = Sge>,
        len: usize,
    ) -> Result<Spans, ScatterError> {
        scatter_with(sges, len, |s| {
            self.local(s.lkey, pd, s.addr, s.len as usize, Access::LOCAL_WRITE)
        })
    }
}

/// Spans kept inline by [`Spans`] before it spills to the heap.
const INLINE_SPANS: usize = 4;

/// A list of validated spans: up to [`INLINE_SPANS`] without allocating (the common
/// one- or two-entry scatter and gather lists), more on the heap.
#[derive(Debug)]
pub(crate) struct Spans {
    head: [Span; INLINE_SPANS],
    n: usize,
    /// Every span once there are more than [`INLINE_SPANS`].
    spill: Vec<Span>,
}

impl Spans {
    pub(crate) fn new() -> Spans {
        Spans {
            head: [Span {
                ptr: std::ptr::null_mut(),
                len: 0,
            }; INLINE_SPANS],
            n: 0,
            spill: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, sp: Span) {
        if self.spill.is_empty() && self.n < INLINE_SPANS {
            self.head[self.n] = sp;
            self.n += 1;
            return;
        }
        if self.spill.is_empty() {
            self.spill.extend_from_slice(&self.head[..self.n]);
        }
        self.spill.push(sp);
    }

    /// The spans, in order.
    pub(crate) fn as_slice(&self) -> &[Span] {
        if self.spill.is_empty() {
            &self.head[..self.n]
        } else {
            &self.spill
        }
    }
}

/// The spans `len` bytes take in a scatter list, each entry the payload reaches validated
/// whole by `lookup` (zero-length entries skipped): [`ScatterError::Protection`] if one fails,
/// [`ScatterError::Length`] if the list is too short.
pub(crate) fn scatter_with(
    sges: impl Iterator<Item = Sge>,
    len: usize,
    mut lookup: impl FnMut(&Sge) -> Option<Span>,
) -> Result<Spans, ScatterError> {
    let mut spans = Spans::new();
    let mut left = len;
    for s in sges.filter(|s| s.len != 0) {
        if left == 0 {
            break;
        }
        let take = left.min(s.len as usize);
        let sp = lookup(&s).ok_or(ScatterError::Protection)?;
        spans.push(Span {
            ptr: sp.ptr,
            len: take,
        });
        left -= take;
    }
    if left > 0 {
        Err(ScatterError::Length)
    } else {
        Ok(spans)
    }
}

/// Copies the bytes of a validated span into `out` (exactly `sp.len` bytes).
pub(crate) fn read_span(sp: Span, out: &mut [u8]) {
    assert_eq!(
        sp.len,
        out.len(),
        "read_span: span and buffer lengths differ"
    );
    // SAFETY: as in `read_into`; `out` holds `sp.len` bytes.
    unsafe { std::ptr::copy_nonoverlapping(sp.ptr, out.as_mut_ptr(), sp.len) };
}

/// Appends the bytes of a validated span to `out`.
pub(crate) fn read_into(sp: Span, out: &mut Vec<u8>) {
    let old = out.len();
    out.reserve(sp.len);
    // SAFETY: `sp` lies inside a registered region (validated under the fabric lock, which also
    // orders deregistration); `out` has room for `sp.len` more bytes, which are initialised by
    // the copy before `set_len`. No reference to the registered memory is created, only raw
    // reads, because other threads may access it concurrently (as a NIC's DMA would).
    unsafe {
        std::ptr::copy_nonoverlapping(sp.ptr, out.as_mut_ptr().add(old), sp.len);
        out.set_len(old + sp.len);
    }
}

/// Writes `data` across validated spans, in order (the spans cover exactly `data.len()`).
///
/// Each span's bytes are copied with one memcpy except its last (up to) 8 bytes, which are then
/// stored with Release atomics after the rest: a consumer that polls the last byte of a buffer
/// with an Acquire load (last-byte polling) sees everything before it. When those 8 bytes are
/// 8-aligned they are one `AtomicU64` store, as a NIC writes an aligned 8 B word in one piece
/// (one PCIe write, never torn in practice): a consumer that reads such a word with one 8 B
/// load (ScaleRPC's notice and acknowledgement words, seeds/003) sees the old or the new
/// value, never a mix. Other tails are stored byte by byte.
pub(crate) fn scatter(spans: &[Span], data: &[u8]) {
    let mut off = 0;
    for sp in spans {
        write_span(*sp, &data[off..off + sp.len]);
        off += sp.len;
    }
    debug_assert_eq!(off, data.len());
}

/// Writes `data` (exactly `sp.len` bytes) into one validated span; see [`scatter`].
pub(crate) fn write_span(sp: Span, data: &[u8]) {
    debug_assert_eq!(sp.len, data.len());
    let body = data.len().saturating_sub(8);
    // SAFETY: `sp` lies inside a registered region with LOCAL_WRITE or remote-write access,
    // validated under the fabric lock; `data` is model-owned (never overlaps it).
    unsafe {
        std::ptr::copy_nonoverlapping(data.as_ptr(), sp.ptr, body);
        let tail = sp.ptr.add(body);
        if let Ok(word) = <[u8; 8]>::try_from(&data[body..])
            && tail.addr().is_multiple_of(8)
        {
            // SAFETY: as above; `tail` is 8-aligned and the span holds its 8 bytes.
            AtomicU64::from_ptr(tail.cast()).store(u64::from_ne_bytes(word), Ordering::Release);
            return;
        }
        for (i, &b) in data[body..].iter().enumerate() {
            // SAFETY: as above; AtomicU8 has the alignment and size of u8.
            AtomicU8::from_ptr(tail.add(i)).store(b, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(buf: &mut [u8], access: Access) -> (MrTable, u32, u32) {
        let mut t = MrTable::default();
        let (_, l, r) = t
            .register(MrEntry {
                addr: buf.as_mut_ptr() as u64,
                len: buf.len() as u64,
                access,
                pd: 1,
            })
            .unwrap();
        (t, l, r)
    }

    #[test]
    fn keys_ranges_pd_and_access() {
        let mut buf = vec![0u8; 64];
        let base = buf.as_mut_ptr() as u64;
        let (t, l, r) = table(&mut buf, Access::LOCAL_WRITE | Access::REMOTE_READ);
        assert_ne!(l, r);
        assert_ne!(l, crate::wqe::INVALID_LKEY);
        assert!(t.local(l, 1, base, 64, Access::LOCAL_WRITE).is_some());
        assert!(
            t.local(l, 1, base + 1, 64, Access::empty()).is_none(),
            "past the end"
        );
        assert!(
            t.local(l, 1, base - 1, 2, Access::empty()).is_none(),
            "before the start"
        );
        assert!(
            t.local(l, 2, base, 1, Access::empty()).is_none(),
            "other PD"
        );
        assert!(
            t.local(r, 1, base, 1, Access::empty()).is_none(),
            "rkey as lkey"
        );
        assert!(
            t.remote(l, 1, base, 1, Access::REMOTE_READ).is_none(),
            "lkey as rkey"
        );
        assert!(t.remote(r, 1, base, 64, Access::REMOTE_READ).is_some());
        assert!(
            t.remote(r, 1, base, 8, Access::REMOTE_WRITE).is_none(),
            "no REMOTE_WRITE"
        );
        assert!(
            t.remote(r, 1, u64::MAX - 2, 8, Access::REMOTE_READ)
                .is_none(),
            "overflow"
        );
    }

    #[test]
    fn gather_and_scatter() {
        let mut src = (0u8..32).collect::<Vec<_>>();
        let mut dst = vec![0u8; 40];
        let mut t = MrTable::default();
        let (_, ls, _) = t
            .register(MrEntry {
                addr: src.as_mut_ptr() as u64,
                len: 32,
                access: Access::empty(),
                pd: 1,
            })
            .unwrap();
        let (_, ld, _) = t
            .register(MrEntry {
                addr: dst.as_mut_ptr() as u64,
                len: 40,
                access: Access::LOCAL_WRITE,
                pd: 1,
            })
            .unwrap();
        let s = |off: u64, len: u32, lkey: u32, base: &mut Vec<u8>| Sge {
            addr: base.as_mut_ptr() as u64 + off,
            len,
            lkey,
        };
        let g = [
            s(4, 4, ls, &mut src),
            s(0, 0, 0xdead, &mut src),
            s(30, 2, ls, &mut src),
        ];
        let mut buf = b"stale bytes".to_vec();
        let data = t.gather(1, b"ab", &g, &mut buf).unwrap().to_vec();
        assert_eq!(data, [b'a', b'b', 4, 5, 6, 7, 30, 31]);
        let mut buf = Vec::new();
        assert!(
            t.gather(1, b"", &[s(0, 1, ld + 256, &mut src)], &mut buf)
                .is_none()
        );
        // Inline only (or only zero-length entries): the inline bytes themselves.
        let only = t.gather(1, b"xyz", &g[1..2], &mut buf).unwrap();
        assert_eq!((only, only.as_ptr()), (&b"xyz"[..], b"xyz".as_ptr()));
        // More entries than the inline span list holds: spilled, same bytes in order.
        let many: Vec<Sge> = (0..9).map(|i| s(i, 1, ls, &mut src)).collect();
        let got = t.gather(1, b"", &many, &mut buf).unwrap();
        assert_eq!(got, (0u8..9).collect::<Vec<_>>());
        // Scatter into two pieces; only the entries the payload reaches are checked.
        let sl = [
            s(0, 3, ld, &mut dst),
            s(10, 20, ld, &mut dst),
            s(0, 1, 0xbad, &mut dst),
        ];
        let spans = t.scatter_list(1, sl.iter().copied(), data.len()).unwrap();
        scatter(spans.as_slice(), &data);
        assert_eq!(&dst[..3], b"ab\x04");
        assert_eq!(&dst[10..15], [5, 6, 7, 30, 31]);
        assert_eq!(
            t.scatter_list(1, sl.iter().copied(), 24).unwrap_err(),
            ScatterError::Protection
        );
        assert_eq!(
            t.scatter_list(1, sl[..2].iter().copied(), 24).unwrap_err(),
            ScatterError::Length
        );
        // Source memory is not writable locally.
        assert_eq!(
            t.scatter_list(1, [s(0, 4, ls, &mut src)].into_iter(), 4)
                .unwrap_err(),
            ScatterError::Protection
        );
    }

    /// An aligned final 8 B word is written in one store: a reader loading the word (as a
    /// ScaleRPC client reads its notice word) while the model overwrites it sees the old or
    /// the new value, never a mix of their bytes (byte-by-byte stores let it see, e.g., a new
    /// epoch with half of an old base). The reader checks every load; with one store per word
    /// no interleaving of the two threads can fail it.
    #[test]
    fn an_aligned_final_word_is_never_torn() {
        use std::sync::atomic::AtomicBool;
        let cell = AtomicU64::new(0);
        let (a, b) = (0x0000_001b_0000_0005_u64, 0xffff_ffff_0000_0004_u64);
        cell.store(a, Ordering::Relaxed);
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !done.load(Ordering::Acquire) {
                    let v = cell.load(Ordering::Acquire);
                    assert!(v == a || v == b, "torn word {v:#018x}");
                }
            });
            let span = Span {
                ptr: cell.as_ptr().cast(),
                len: 8,
            };
            for i in 0..200_000 {
                let w = if i % 2 == 0 { b } else { a };
                write_span(span, &w.to_ne_bytes());
            }
            done.store(true, Ordering::Release);
        });
        // A 16 B span: its body is copied, its final aligned word stored at once.
        let mut buf = [0u64; 2];
        let span = Span {
            ptr: buf.as_mut_ptr().cast(),
            len: 16,
        };
        let data: Vec<u8> = (1..=16).collect();
        write_span(span, &data);
        assert_eq!(
            buf.iter().flat_map(|w| w.to_ne_bytes()).collect::<Vec<_>>(),
            data
        );
    }
}
