//! Registered-memory buffers: anonymous mappings, from 2 MiB hugepages when available.
//!
//! [`DmaBuf`] is the memory a transport registers with [`crate::verbs::Context::reg_mr`] (rings,
//! message pools) and what tests use to stand in for provider queue memory. It is an anonymous
//! private mapping:
//!
//! - first `MAP_HUGETLB | MAP_HUGE_2MB` with the length rounded up to 2 MiB: fewer TLB misses
//!   for the NIC's and the CPU's address translation, the reason RDMA stacks use hugepages;
//! - if that fails (no hugepages reserved in `/proc/sys/vm/nr_hugepages`, the usual case on a
//!   development machine), normal pages with the length rounded up to the page size (4 KiB on
//!   x86-64), after a one-line `tracing::info!` notice printed once per process.
//!
//! Alignment: the start is 2 MiB aligned for a hugepage mapping and page aligned (4 KiB on
//! x86-64) otherwise, which covers every alignment the queues need (64 B WQEBBs/CQEs, 4 B
//! doorbell records). The memory is zeroed (fresh anonymous pages).
//!
//! # Shared backing (device model across processes)
//! After [`crate::sim::Fabric::join`], a process's new `DmaBuf`s are *shared* file mappings
//! instead: one file per buffer in `/dev/shm` (`mlx5sim.<node>.<pid>.<segment>`, normal pages,
//! unlinked when the buffer drops), recorded in a process-wide segment table. That is what lets
//! the device model running in another process of the node map the buffer and move bytes into
//! it, as a NIC's DMA would ([`shared_segment_of`]).
//!
//! **Ownership.** These files hold live payloads, so only processes of the same user may
//! reach them. Every such file (segments and the node directory) is created
//! `O_CREAT | O_EXCL | O_NOFOLLOW` and `fchmod`ed to exactly 0600 whatever the umask; every
//! opener checks the opened descriptor with `fstat` before mapping it — a regular file, owned
//! by this process's effective uid, no group or other permission bit — and refuses anything
//! else ([`crate::error::Error::UnsafeFile`], counted in
//! [`SimStats::unsafe_files_refused`](crate::sim::SimStats::unsafe_files_refused)).

use std::collections::BTreeMap;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::{Mutex, Once};

use crate::error::{Error, Result};

/// Size of a 2 MiB hugepage in bytes.
pub const HUGEPAGE_BYTES: usize = 2 << 20;

static FALLBACK_NOTICE: Once = Once::new();

/// A zeroed, page-aligned anonymous memory mapping for DMA (registered memory).
///
/// Owns the mapping: [`Drop`] unmaps it. The address is stable for the buffer's lifetime
/// (moving a `DmaBuf` moves only the handle), so it can be registered and handed to a device.
///
/// The buffer exposes raw pointers rather than slices: once registered, a device (hardware
/// DMA or the in-process device model) may write it at any time, which a `&[u8]` would not
/// allow. [`DmaBuf::as_slice`]/[`DmaBuf::as_mut_slice`] are `unsafe` for that reason.
#[derive(Debug)]
pub struct DmaBuf {
    ptr: NonNull<u8>,
    /// Requested length in bytes.
    len: usize,
    /// Mapped length in bytes (`len` rounded up to the page size).
    map_len: usize,
    hugepage: bool,
    /// Shared-backing segment number (`None`: a private anonymous mapping).
    segment: Option<u32>,
}

// SAFETY: a `DmaBuf` owns its mapping (private anonymous, or a shared segment that other
// processes' device models may also map, like a NIC's DMA); the mapping is not tied to the
// creating thread (munmap works from any thread). Sharing `&DmaBuf`
// only shares the address and length: every access to the bytes goes through raw pointers
// (or the `unsafe` slice accessors), whose callers are responsible for synchronisation, exactly
// as with memory the device writes.
unsafe impl Send for DmaBuf {}
// SAFETY: see `Send`; `&self` methods read only the immutable handle fields.
unsafe impl Sync for DmaBuf {}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}

/// Maps `len` bytes (a multiple of the page size) of anonymous memory with extra `flags`.
fn map(len: usize, flags: libc::c_int) -> io::Result<NonNull<u8>> {
    // SAFETY: an anonymous private mapping at an address chosen by the kernel does not alias
    // any existing Rust object; the arguments are plain values.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned NULL"))
}

#[cfg(target_os = "linux")]
fn map_hugepages(len: usize) -> io::Result<NonNull<u8>> {
    map(len, libc::MAP_HUGETLB | libc::MAP_HUGE_2MB)
}

#[cfg(not(target_os = "linux"))]
fn map_hugepages(_len: usize) -> io::Result<NonNull<u8>> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

#[cold]
fn notice_fallback(err: &io::Error) {
    FALLBACK_NOTICE.call_once(|| {
        tracing::info!(
            "mlx5: 2 MiB hugepages unavailable ({err}); registered buffers use normal pages"
        );
    });
}

fn round_up(len: usize, to: usize) -> Result<usize> {
    len.checked_next_multiple_of(to).ok_or_else(|| {
        Error::Memory(io::Error::new(
            io::ErrorKind::InvalidInput,
            "length overflow",
        ))
    })
}

impl DmaBuf {
    /// Maps `len` bytes (> 0), zeroed: 2 MiB hugepages when available (length rounded up to
    /// 2 MiB, start 2 MiB aligned), else normal pages (length rounded up to the page size,
    /// start page aligned) with a one-time notice.
    ///
    /// # Errors
    /// [`Error::Memory`] for a zero length or when the normal-page mapping fails too.
    pub fn new(len: usize) -> Result<Self> {
        if len == 0 {
            return Err(zero_len());
        }
        if let Some(b) = backing() {
            return Self::shared(&b, len);
        }
        let huge_len = round_up(len, HUGEPAGE_BYTES)?;
        match map_hugepages(huge_len) {
            Ok(ptr) => Ok(DmaBuf {
                ptr,
                len,
                map_len: huge_len,
                hugepage: true,
                segment: None,
            }),
            Err(e) => {
                notice_fallback(&e);
                Self::with_normal_pages(len)
            }
        }
    }

    /// Maps `len` bytes (> 0) of normal pages, zeroed (length rounded up to the page size,
    /// start page aligned), without trying hugepages: for small buffers (a queue ring of a few
    /// KiB) that should not take a whole 2 MiB page.
    ///
    /// # Errors
    /// [`Error::Memory`] for a zero length or a failed mapping.
    pub fn with_normal_pages(len: usize) -> Result<Self> {
        if len == 0 {
            return Err(zero_len());
        }
        if let Some(b) = backing() {
            return Self::shared(&b, len);
        }
        let map_len = round_up(len, page_size())?;
        let ptr = map(map_len, 0).map_err(Error::Memory)?;
        Ok(DmaBuf {
            ptr,
            len,
            map_len,
            hugepage: false,
            segment: None,
        })
    }

    /// A buffer in a new shared segment file of `b` (normal pages, zeroed: a fresh file).
    fn shared(b: &Backing, len: usize) -> Result<Self> {
        let map_len = round_up(len, page_size())?;
        let (seg, path) = {
            let mut t = table();
            t.next_seg = t.next_seg.wrapping_add(1);
            (t.next_seg, b.segment_path(std::process::id(), t.next_seg))
        };
        let file = create_private(std::path::Path::new(&path)).map_err(Error::Memory)?;
        let mapped = file
            .set_len(map_len as u64)
            .and_then(|()| map_file(&file, map_len));
        let ptr = match mapped {
            Ok(p) => p,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(Error::Memory(e));
            }
        };
        table().segments.insert(
            ptr.as_ptr() as usize,
            SegEntry {
                seg,
                len: map_len,
                path,
            },
        );
        Ok(DmaBuf {
            ptr,
            len,
            map_len,
            hugepage: false,
            segment: Some(seg),
        })
    }

    /// The shared-backing segment number of this buffer (`None`: private memory, which no
    /// other process can reach).
    pub fn segment(&self) -> Option<u32> {
        self.segment
    }

    /// Start of the buffer.
    #[inline]
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Start of the buffer, for writing.
    #[inline]
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Start of the buffer as a `NonNull` (what [`crate::queue`] memory descriptors take).
    #[inline]
    pub fn as_non_null(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Requested length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a `DmaBuf` is at least one byte.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Mapped length in bytes (`len` rounded up to 2 MiB or to the page size); all of it is
    /// usable.
    #[inline]
    pub fn mapped_len(&self) -> usize {
        self.map_len
    }

    /// Whether the buffer is backed by 2 MiB hugepages.
    #[inline]
    pub fn is_hugepage(&self) -> bool {
        self.hugepage
    }

    /// Guaranteed alignment of the start in bytes: 2 MiB for hugepages, else the page size.
    pub fn alignment(&self) -> usize {
        if self.hugepage {
            HUGEPAGE_BYTES
        } else {
            page_size()
        }
    }

    /// The first [`len`](Self::len) bytes as a slice.
    ///
    /// # Safety
    /// No device (DMA or device model) and no other thread may write the buffer while the
    /// slice is alive.
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is valid for `len` bytes; the caller excludes concurrent writes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The first [`len`](Self::len) bytes as a mutable slice.
    ///
    /// # Safety
    /// No device and no other thread may read or write the buffer while the slice is alive.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice(&self) -> &mut [u8] {
        // SAFETY: the mapping is valid for `len` bytes; the caller excludes other accesses.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

#[cold]
fn zero_len() -> Error {
    Error::Memory(io::Error::new(
        io::ErrorKind::InvalidInput,
        "zero-length buffer",
    ))
}

impl Drop for DmaBuf {
    fn drop(&mut self) {
        if self.segment.is_some()
            && let Some(e) = table().segments.remove(&(self.ptr.as_ptr() as usize))
        {
            // Peers that mapped the segment keep their mapping (and the pages) until they
            // unmap it; the name goes now.
            let _ = std::fs::remove_file(&e.path);
        }
        // SAFETY: `ptr`/`map_len` are exactly the mapping created in the constructor, owned
        // by `self` and not used after this point.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.map_len);
        }
    }
}

/// Where the shared segments of this process go (set once, by [`crate::sim::Fabric::join`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Backing {
    /// Path prefix, e.g. `/dev/shm/mlx5sim.<node>`.
    pub(crate) prefix: String,
}

impl Backing {
    /// The file of segment `seg` of process `pid`.
    pub(crate) fn segment_path(&self, pid: u32, seg: u32) -> String {
        format!("{}.{pid}.{seg}", self.prefix)
    }
}

/// One shared segment of this process.
#[derive(Debug)]
struct SegEntry {
    seg: u32,
    len: usize,
    path: String,
}

/// The process-wide shared-backing state.
#[derive(Debug, Default)]
struct SegTable {
    backing: Option<Backing>,
    next_seg: u32,
    /// Live segments by start address.
    segments: BTreeMap<usize, SegEntry>,
}

static SEGMENTS: Mutex<SegTable> = Mutex::new(SegTable {
    backing: None,
    next_seg: 0,
    segments: BTreeMap::new(),
});

fn table() -> std::sync::MutexGuard<'static, SegTable> {
    SEGMENTS.lock().unwrap_or_else(|e| e.into_inner())
}

fn backing() -> Option<Backing> {
    table().backing.clone()
}

/// Whether new buffers of this process go to shared segments.
pub(crate) fn shared_backing_active() -> bool {
    table().backing.is_some()
}

/// Switches this process to shared backing under `b` (idempotent for the same `b`).
///
/// # Errors
/// [`Error::InvalidArgument`] if the process already uses another backing.
pub(crate) fn set_backing(b: Backing) -> Result<()> {
    let mut t = table();
    match &t.backing {
        Some(old) if *old != b => Err(Error::InvalidArgument(format!(
            "this process already joined the device-model node {}",
            old.prefix
        ))),
        _ => {
            t.backing = Some(b);
            Ok(())
        }
    }
}

/// The shared segment holding `[addr, addr + len)`: `(segment, segment start address)`, or
/// `None` when the range is not inside one shared `DmaBuf` of this process.
pub fn shared_segment_of(addr: usize, len: usize) -> Option<(u32, usize)> {
    let t = table();
    let (&base, e) = t.segments.range(..=addr).next_back()?;
    let end = addr.checked_add(len)?;
    (end <= base + e.len).then_some((e.seg, base))
}

/// Shared files this process refused ([`check_private`]), since it started.
static UNSAFE_FILES_REFUSED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many shared files (node directory, peers' segments) this process refused.
pub(crate) fn unsafe_files_refused() -> u64 {
    UNSAFE_FILES_REFUSED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Creates `path` as a private shared file ([`crate::private_file::create`]: `O_EXCL`,
/// `O_NOFOLLOW`, exactly mode 0600).
pub(crate) fn create_private(path: &std::path::Path) -> io::Result<std::fs::File> {
    crate::private_file::create(path)
}

#[cold]
#[inline(never)]
fn refuse(path: &std::path::Path, (owner, mode): (u32, u32), reason: &'static str) -> Error {
    UNSAFE_FILES_REFUSED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    tracing::warn!(
        path = %path.display(), owner, mode = format_args!("{mode:o}"), reason,
        "mlx5 sim: refusing a shared file"
    );
    Error::UnsafeFile {
        path: path.display().to_string(),
        owner,
        mode,
        expected_uid: crate::private_file::euid(),
        reason,
    }
}

/// Checks the open `file` (at `path`) with `fstat` against the shared-file trust rule
/// ([`crate::private_file::problem`]).
///
/// # Errors
/// [`Error::UnsafeFile`] (counted) naming the file, its owner, its mode and the reason;
/// [`Error::Memory`] if `fstat` fails.
pub(crate) fn check_private(file: &std::fs::File, path: &std::path::Path) -> Result<()> {
    let md = file.metadata().map_err(Error::Memory)?;
    match crate::private_file::problem(&md) {
        None => Ok(()),
        Some(reason) => Err(refuse(
            path,
            crate::private_file::owner_and_mode(&md),
            reason,
        )),
    }
}

/// Opens the existing `path` ([`crate::private_file::open`]) and checks it with
/// [`check_private`] before returning it. `Ok(None)` if nothing is at `path`.
///
/// # Errors
/// [`Error::UnsafeFile`] for a symbolic link or a file [`check_private`] refuses;
/// [`Error::Memory`] if `open` fails otherwise.
pub(crate) fn open_private(path: &std::path::Path) -> Result<Option<std::fs::File>> {
    match crate::private_file::open(path) {
        Ok(file) => {
            check_private(&file, path)?;
            Ok(Some(file))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) if crate::private_file::is_symlink_error(&e) => Err(refuse(
            path,
            crate::private_file::link_owner_and_mode(path),
            "it is a symbolic link",
        )),
        Err(e) => Err(Error::Memory(e)),
    }
}

/// Maps `len` bytes of `file` shared, read-write.
pub(crate) fn map_file(file: &std::fs::File, len: usize) -> io::Result<NonNull<u8>> {
    // SAFETY: a new shared mapping of an open file at a kernel-chosen address aliases no
    // existing Rust object; the arguments are plain values.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned NULL"))
}

/// Memory ordering towards the device, after rdma-core's `util/udma_barrier.h`.
///
/// Each helper issues the Rust fence that orders the accesses in the Rust memory model (what
/// an in-process device model on another thread relies on) plus, where the architecture needs
/// more for a DMA-capable device or write-combining MMIO, the instruction rdma-core uses.
pub(crate) mod barrier {
    use std::sync::atomic::{AtomicU32, Ordering, fence};

    /// Store barrier: queue entries written before it are visible to the device before the
    /// doorbell record written after it (`udma_to_device_barrier`: compiler barrier on x86-64,
    /// `dmb oshst` on aarch64).
    #[inline(always)]
    pub(crate) fn dma_wmb() {
        fence(Ordering::Release);
        #[cfg(target_arch = "aarch64")]
        // SAFETY: a barrier instruction; no effect besides ordering.
        unsafe {
            core::arch::asm!("dmb oshst", options(nostack, preserves_flags));
        }
    }

    /// Read barrier between a CQE ownership check and reading the CQE body
    /// (`udma_from_device_barrier`). The Acquire load of `op_own` already orders the loads in
    /// the Rust model and on x86-64; aarch64 adds `dmb oshld` for outer-shareable writers.
    #[inline(always)]
    pub(crate) fn read_barrier() {
        fence(Ordering::Acquire);
        #[cfg(target_arch = "aarch64")]
        // SAFETY: a barrier instruction; no effect besides ordering.
        unsafe {
            core::arch::asm!("dmb oshld", options(nostack, preserves_flags));
        }
    }

    /// Write-combining flush (`mmio_flush_writes`/`mmio_wc_start`): `sfence` on x86-64,
    /// `dsb st` on aarch64, a SeqCst fence elsewhere. Orders the doorbell record before the
    /// BlueFlame/UAR write and pushes the write-combining buffer out after it.
    #[inline(always)]
    pub(crate) fn wc_flush() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `sfence` is part of SSE, which every x86-64 CPU has.
        unsafe {
            core::arch::x86_64::_mm_sfence();
        }
        #[cfg(target_arch = "aarch64")]
        // SAFETY: a barrier instruction; no effect besides ordering.
        unsafe {
            core::arch::asm!("dsb st", options(nostack, preserves_flags));
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        fence(Ordering::SeqCst);
    }

    /// Stores a doorbell record word (already big-endian) as a 32-bit atomic store: the same
    /// single `mov`/`str` a volatile store compiles to, and also a well-defined publication to
    /// an in-process device model that reads the record with an atomic load. Callers issue
    /// [`dma_wmb`] first.
    ///
    /// # Safety
    /// `p` is 4-byte aligned, valid for writes for the queue's lifetime, and only accessed with
    /// 32-bit loads/stores (queue memory contract, [`crate::queue`]).
    #[inline(always)]
    pub(crate) unsafe fn store_dbrec(p: *mut u32, be_value: u32) {
        // SAFETY: caller's contract.
        unsafe { AtomicU32::from_ptr(p) }.store(be_value, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_aligned_and_rounded() {
        for len in [1usize, 64, 4095, 4096, 4097, 3 << 20] {
            let b = DmaBuf::new(len).unwrap();
            assert_eq!(b.len(), len);
            assert!(!b.is_empty());
            assert!(b.mapped_len() >= len);
            assert_eq!(b.as_ptr() as usize % b.alignment(), 0);
            assert_eq!(b.mapped_len() % b.alignment(), 0);
            if b.is_hugepage() {
                assert_eq!(b.alignment(), HUGEPAGE_BYTES);
                assert_eq!(b.mapped_len() % HUGEPAGE_BYTES, 0);
            } else {
                // The fallback notice was issued (once per process).
                assert!(FALLBACK_NOTICE.is_completed());
                assert_eq!(b.alignment(), page_size());
                assert_eq!(b.mapped_len(), len.next_multiple_of(page_size()));
            }
            // SAFETY: no device uses this buffer.
            let s = unsafe { b.as_slice() };
            assert!(s.iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn normal_pages_are_writable_and_page_aligned() {
        let b = DmaBuf::with_normal_pages(10_000).unwrap();
        assert!(!b.is_hugepage());
        assert_eq!(b.as_ptr() as usize % 4096, 0);
        assert_eq!(b.mapped_len(), 10_000usize.next_multiple_of(page_size()));
        // SAFETY: no device uses this buffer.
        let s = unsafe { b.as_mut_slice() };
        s.fill(0xab);
        // The tail of the mapping past `len` is usable too.
        // SAFETY: inside the mapping.
        unsafe { b.as_mut_ptr().add(b.mapped_len() - 1).write(7) };
        assert_eq!(s[9_999], 0xab);
    }

    #[test]
    fn zero_length_is_an_error() {
        assert!(matches!(DmaBuf::new(0), Err(Error::Memory(_))));
        assert!(matches!(
            DmaBuf::with_normal_pages(0),
            Err(Error::Memory(_))
        ));
        assert!(matches!(DmaBuf::new(usize::MAX), Err(Error::Memory(_))));
    }

    #[test]
    fn send_sync_and_moves_keep_the_address() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<DmaBuf>();
        let b = DmaBuf::new(100).unwrap();
        let p = b.as_ptr();
        let moved = std::thread::spawn(move || b).join().unwrap();
        assert_eq!(moved.as_ptr(), p);
    }
}
