//! The operating-system side of the ring: `/dev/shm` file names, creating and opening the file
//! (mode 0600), mapping it ([`ShmMap`], over `memmap2::MmapRaw`), and open-file-description
//! (OFD) byte-range locks (`fcntl` `F_OFD_SETLK` / `F_OFD_GETLK`).
//!
//! # Ownership: nothing shared is trusted by name
//! `/dev/shm` is writable by every local user, so a name there proves nothing about who made
//! the file behind it. The rule, for every ring file and ring manifest:
//! - **Creating**: `O_CREAT | O_EXCL | O_NOFOLLOW` with mode 0600, then `fchmod(0600)` on the
//!   new descriptor, so the mode is exactly 0600 whatever the process's umask
//!   ([`create_exclusive`]).
//! - **Opening**: `O_NOFOLLOW`, then `fstat` on the opened descriptor, *before* anything is
//!   read or mapped: the file must be a regular file, owned by this process's effective uid,
//!   with no group or other permission bit ([`open_private`], [`check_private`]). Anything
//!   else is refused with [`RingError::UnsafeFile`], which names the file, its owner uid and its
//!   mode, and is counted process-wide ([`unsafe_files_refused`]). Checking the descriptor
//!   (not the name) leaves no window between the check and the use.
//! - **Replacing**: a file of this user that no live server holds is stale and is replaced
//!   (see [`RingServer::create`](super::RingServer::create)); a file of another user is an
//!   error and is never unlinked, locked, read or reused.
//!
//! So only processes of the same user can reach a ring: that user's processes are trusted
//! not to be hostile (they could `ptrace` each other anyway), and everything they write is
//! still validated (see the module docs of [`super`]).
//!
//! # Locks are never waited for
//! Every lock on a ring file is taken with non-blocking `F_OFD_SETLK` ([`try_lock_write`]),
//! which fails at once when another open file description holds a conflicting lock, or tested
//! with `F_OFD_GETLK`; nothing here uses a blocking `F_OFD_SETLKW`, so no lock held by another
//! process can stall a server or a client (the bound on waiting is zero).
//!
//! OFD locks belong to an open file description (one `open(2)`), not to a process: two
//! `open`s of the same file in one process hold independent locks that conflict with each other,
//! and the kernel releases a description's locks when its last descriptor is closed — in
//! particular when the owning process dies. This is what makes them usable as liveness tokens
//! between threads of one process as well as between processes.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, AtomicU16, AtomicU32, AtomicU64, Ordering::Relaxed};

use memmap2::{MmapOptions, MmapRaw};

use super::error::RingError;

/// Directory holding ring files. Source: seeds/004 §2.1 ("全領域は `/dev/shm` 上に配置される").
pub const SHM_DIR: &str = "/dev/shm";

/// Longest accepted ring name, in bytes (leaves room for the temporary-file decoration within
/// `NAME_MAX` = 255).
pub(super) const MAX_NAME_LEN: usize = 200;

/// Normalizes a ring name (`"kv0"` or `"/kv0"`) and returns it with its path
/// (`/dev/shm/kv0`). The name must be a single, non-empty file name: no `/` after the optional
/// leading one, no NUL, not `.` or `..`, at most [`MAX_NAME_LEN`] bytes.
pub(super) fn shm_path(name: &str) -> Result<(String, PathBuf), RingError> {
    let bad = |reason| {
        Err(RingError::InvalidName {
            name: name.to_owned(),
            reason,
        })
    };
    let n = name.strip_prefix('/').unwrap_or(name);
    if n.is_empty() {
        return bad("empty");
    }
    if n.len() > MAX_NAME_LEN {
        return bad("longer than 200 bytes");
    }
    if n.contains('/') || n.contains('\0') {
        return bad("must be a single file name (no '/' or NUL after the optional leading '/')");
    }
    if n == "." || n == ".." {
        return bad("'.' and '..' are not file names");
    }
    Ok((n.to_owned(), Path::new(SHM_DIR).join(n)))
}

/// Files refused by [`check_private`] in this process (all rings and manifests).
static UNSAFE_FILES_REFUSED: AtomicU64 = AtomicU64::new(0);

/// How many shared-memory files (ring files, ring manifests) this process refused to use
/// because of their owner, mode or type ([`RingError::UnsafeFile`]), since it started.
pub fn unsafe_files_refused() -> u64 {
    UNSAFE_FILES_REFUSED.load(Relaxed)
}

/// This process's effective uid (the owner every file it opens must have).
pub(super) fn euid() -> u32 {
    mlx5::private_file::euid()
}

/// Creates `path` exclusively (`O_CREAT | O_EXCL | O_NOFOLLOW`), read-write, close-on-exec,
/// with mode exactly 0600 ([`mlx5::private_file::create`]).
///
/// # Errors
/// `AlreadyExists` if anything (a file, a symbolic link) is at `path`; the `open` or `fchmod`
/// error otherwise (a file created before a failed `fchmod` is removed).
pub(super) fn create_exclusive(path: &Path) -> io::Result<File> {
    mlx5::private_file::create(path)
}

/// Opens an existing `path` read-write (close-on-exec, `O_NOFOLLOW`: a symbolic link fails
/// with `ELOOP`), without checking it: follow with [`check_private`] before using the file.
pub(super) fn open_existing(path: &Path) -> io::Result<File> {
    mlx5::private_file::open(path)
}

#[cold]
#[inline(never)]
fn refuse(path: &Path, (owner, mode): (u32, u32), reason: &'static str) -> RingError {
    UNSAFE_FILES_REFUSED.fetch_add(1, Relaxed);
    tracing::warn!(
        path = %path.display(), owner, mode = format_args!("{mode:o}"), reason,
        "refusing a shared-memory file"
    );
    RingError::UnsafeFile {
        path: path.to_path_buf(),
        owner,
        mode,
        expected_uid: euid(),
        reason,
    }
}

/// Checks the open `file` (at `path`, for the error) with `fstat` against `problem` (one of
/// [`mlx5::private_file`]'s rules).
fn check_with(
    file: &File,
    path: &Path,
    problem: fn(&std::fs::Metadata) -> Option<&'static str>,
) -> Result<(), RingError> {
    let md = file.metadata().map_err(|source| RingError::Io {
        path: path.to_path_buf(),
        op: "fstat",
        source,
    })?;
    match problem(&md) {
        None => Ok(()),
        Some(reason) => Err(refuse(
            path,
            mlx5::private_file::owner_and_mode(&md),
            reason,
        )),
    }
}

/// Checks the open `file` (at `path`, for the error) with `fstat`: a regular file, owned by
/// this process's effective uid, with no group or other permission bits (see the module docs
/// and [`mlx5::private_file`]).
///
/// # Errors
/// [`RingError::UnsafeFile`] (counted in [`unsafe_files_refused`]) naming the file, its owner
/// uid, its mode and what is wrong; [`RingError::Io`] if `fstat` fails.
pub(super) fn check_private(file: &File, path: &Path) -> Result<(), RingError> {
    check_with(file, path, mlx5::private_file::problem)
}

/// Refuses the file `file` (at `path`) unless this process's effective uid owns it (mode and
/// type are not checked): what a server checks before treating an existing file as its own
/// stale ring that it may lock, unlink and replace.
///
/// # Errors
/// [`RingError::UnsafeFile`] (counted) for a file of another user; [`RingError::Io`] if
/// `fstat` fails.
pub(super) fn check_owner(file: &File, path: &Path) -> Result<(), RingError> {
    check_with(file, path, mlx5::private_file::owner_problem)
}

/// Opens the existing `path` ([`open_existing`]) and checks it ([`check_private`]) before
/// returning it. `Ok(None)` if nothing is at `path`.
///
/// # Errors
/// [`RingError::UnsafeFile`] for a symbolic link, a file that is not regular, owned by another
/// user or accessible to group or other users; [`RingError::Io`] if `open` fails otherwise.
pub(super) fn open_private(path: &Path) -> Result<Option<File>, RingError> {
    open_checked(path, check_private)
}

/// Opens the existing `path` ([`open_existing`]) and checks that this user owns it
/// ([`check_owner`]; mode and type are not checked). `Ok(None)` if nothing is at `path`.
///
/// # Errors
/// [`RingError::UnsafeFile`] for a symbolic link or another user's file; [`RingError::Io`] if
/// `open` fails otherwise.
pub(super) fn open_owned(path: &Path) -> Result<Option<File>, RingError> {
    open_checked(path, check_owner)
}

fn open_checked(
    path: &Path,
    check: fn(&File, &Path) -> Result<(), RingError>,
) -> Result<Option<File>, RingError> {
    match open_existing(path) {
        Ok(file) => {
            check(&file, path)?;
            Ok(Some(file))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) if mlx5::private_file::is_symlink_error(&e) => Err(refuse(
            path,
            mlx5::private_file::link_owner_and_mode(path),
            "it is a symbolic link",
        )),
        Err(source) => Err(RingError::Io {
            path: path.to_path_buf(),
            op: "open",
            source,
        }),
    }
}

/// Whether `path` currently names the same inode as `file` (false if `path` is gone).
pub(super) fn same_file(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

fn flock(l_type: libc::c_int, start: u64, len: u64) -> io::Result<libc::flock> {
    let (Ok(start), Ok(len)) = (libc::off_t::try_from(start), libc::off_t::try_from(len)) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    // SAFETY: `flock` is a plain C struct of integers; all-zero is a valid value (and `l_pid`
    // must be 0 for OFD commands).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = l_type as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start;
    fl.l_len = len;
    Ok(fl)
}

fn fcntl_lock(file: &File, cmd: libc::c_int, fl: &mut libc::flock) -> io::Result<()> {
    // SAFETY: `file` keeps the descriptor open for the duration of the call; `fl` is a valid,
    // exclusively borrowed `struct flock` that the kernel reads (and, for F_OFD_GETLK, writes).
    let r = unsafe { libc::fcntl(file.as_raw_fd(), cmd, fl as *mut libc::flock) };
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Takes a non-blocking OFD write lock on `[start, start + len)` through `file`'s open file
/// description. `Ok(false)` if another open file description holds a conflicting lock.
pub(super) fn try_lock_write(file: &File, start: u64, len: u64) -> io::Result<bool> {
    let mut fl = flock(libc::F_WRLCK, start, len)?;
    match fcntl_lock(file, libc::F_OFD_SETLK, &mut fl) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Releases this open file description's OFD lock on `[start, start + len)` (no-op if none).
pub(super) fn unlock(file: &File, start: u64, len: u64) -> io::Result<()> {
    let mut fl = flock(libc::F_UNLCK, start, len)?;
    fcntl_lock(file, libc::F_OFD_SETLK, &mut fl)
}

/// Whether some *other* open file description holds a lock on `[start, start + len)` that
/// conflicts with a write lock (`F_OFD_GETLK`). Locks held through `file` itself are not
/// reported.
pub(super) fn is_locked_by_other(file: &File, start: u64, len: u64) -> io::Result<bool> {
    let mut fl = flock(libc::F_WRLCK, start, len)?;
    fcntl_lock(file, libc::F_OFD_GETLK, &mut fl)?;
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

/// Bytes of the ring header that every mapping has ([`ShmMap::map`] refuses less): the fixed
/// fields up to `tail` (`RING_SLOTS_OFFSET`).
pub(super) const HEADER_LEN: usize = super::layout::RING_SLOTS_OFFSET as usize;

/// A field accessor was given an offset outside the mapping or misaligned: a logic error.
#[cold]
#[inline(never)]
#[track_caller]
fn field_out_of_bounds(off: usize, size: usize, len: usize) -> ! {
    panic!("ring field at {off} ({size} B) outside mapping of {len} bytes or misaligned")
}

/// A shared read-write mapping of the first `len` bytes of a ring file, with bounds-checked
/// accessors for the atomic fields and payload areas.
///
/// Every accessor asserts that the requested range lies inside the mapping (and, for atomics,
/// is naturally aligned), so a logic error can only panic, never touch memory outside the
/// mapping. The mapping itself is page-aligned, so aligned offsets give aligned addresses.
#[derive(Debug)]
pub(super) struct ShmMap {
    map: MmapRaw,
    len: usize,
}

impl ShmMap {
    /// Maps `[0, len)` of `file` shared and read-write.
    ///
    /// # Errors
    /// `InvalidInput` if `len` is below [`HEADER_LEN`] (the header's fixed fields, which the
    /// unchecked [`ShmMap::hdr_u8`]/[`ShmMap::hdr_u64`] accessors rely on) or does not fit a
    /// `usize`; the `mmap` error otherwise.
    pub(super) fn map(file: &File, len: u64) -> io::Result<Self> {
        let len = usize::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        if len < HEADER_LEN {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let map = MmapOptions::new().len(len).map_raw(file)?;
        Ok(Self { map, len })
    }

    /// The `AtomicU8` header field at the constant offset `OFF` (< [`HEADER_LEN`], checked at
    /// compile time): no run-time bounds check, for the fields every call reads
    /// (`server_alive`, the fault byte).
    #[inline(always)]
    pub(super) fn hdr_u8<const OFF: usize>(&self) -> &AtomicU8 {
        const { assert!(OFF < HEADER_LEN) };
        // SAFETY: `OFF < HEADER_LEN <= self.len` (`map` refuses shorter mappings), so the byte
        // is inside the mapping, which lives as long as `self`; every access to it by this
        // crate, in any process, is atomic.
        unsafe { AtomicU8::from_ptr(self.map.as_mut_ptr().add(OFF)) }
    }

    /// The `AtomicU64` header field at the constant offset `OFF` (8-aligned and
    /// `OFF + 8 <= HEADER_LEN`, checked at compile time): no run-time bounds check, for `head`
    /// and `tail`.
    #[inline(always)]
    pub(super) fn hdr_u64<const OFF: usize>(&self) -> &AtomicU64 {
        const { assert!(OFF + 8 <= HEADER_LEN && OFF.is_multiple_of(8)) };
        // SAFETY: in bounds as in `hdr_u8`; aligned because the mapping is page-aligned and
        // `OFF` is a multiple of 8.
        unsafe { AtomicU64::from_ptr(self.map.as_mut_ptr().add(OFF).cast()) }
    }

    /// The `AtomicU32` header field at the constant offset `OFF` (4-aligned and
    /// `OFF + 4 <= HEADER_LEN`, checked at compile time): no run-time bounds check, for the
    /// server's sleep word every commit reads.
    #[inline(always)]
    pub(super) fn hdr_u32<const OFF: usize>(&self) -> &AtomicU32 {
        const { assert!(OFF + 4 <= HEADER_LEN && OFF.is_multiple_of(4)) };
        // SAFETY: in bounds as in `hdr_u8`; aligned because the mapping is page-aligned and
        // `OFF` is a multiple of 4.
        unsafe { AtomicU32::from_ptr(self.map.as_mut_ptr().add(OFF).cast()) }
    }

    /// The three `AtomicU32`s at `off`, `off + 4`, `off + 8` (must be 4-aligned and in bounds,
    /// else panics): one bounds check for a slot header's `client_id`, `resp_slot_idx` and
    /// `payload_len`.
    #[inline]
    pub(super) fn u32x3_at(&self, off: usize) -> &[AtomicU32; 3] {
        let p = self.ptr(off, 12, 4);
        // SAFETY: as for `u64_at` (12 in-bounds bytes, 4-aligned); `[AtomicU32; 3]` has the
        // layout of three consecutive `AtomicU32`s.
        unsafe { &*p.cast::<[AtomicU32; 3]>() }
    }

    /// Pointer to the naturally aligned `SIZE`-byte field at `off` (`SIZE` a power of two up
    /// to 16, so `SIZE <= HEADER_LEN <= self.len` and `self.len - SIZE` cannot underflow):
    /// one branch for both the bounds and the alignment check.
    #[inline(always)]
    fn field_ptr<const SIZE: usize>(&self, off: usize) -> *mut u8 {
        const { assert!(SIZE.is_power_of_two() && SIZE <= 16 && SIZE <= HEADER_LEN) };
        if (off > self.len - SIZE) | (off & (SIZE - 1) != 0) {
            field_out_of_bounds(off, SIZE, self.len);
        }
        self.map.as_mut_ptr().wrapping_add(off)
    }

    #[inline]
    fn ptr(&self, off: usize, size: usize, align: usize) -> *mut u8 {
        assert!(
            off <= self.len && size <= self.len - off && off.is_multiple_of(align),
            "ring offset {off}+{size} outside mapping of {} bytes",
            self.len
        );
        self.map.as_mut_ptr().wrapping_add(off)
    }

    /// The `AtomicU64` at byte offset `off` (must be 8-aligned and in bounds, else panics).
    #[inline]
    pub(super) fn u64_at(&self, off: usize) -> &AtomicU64 {
        let p = self.field_ptr::<8>(off);
        // SAFETY: in bounds and aligned (checked above); the mapping lives as long as `self`;
        // every access to this location by this crate, in any process, is atomic.
        unsafe { AtomicU64::from_ptr(p.cast()) }
    }

    /// The `AtomicU32` at byte offset `off` (must be 4-aligned and in bounds, else panics).
    #[inline]
    pub(super) fn u32_at(&self, off: usize) -> &AtomicU32 {
        let p = self.field_ptr::<4>(off);
        // SAFETY: as for `u64_at`.
        unsafe { AtomicU32::from_ptr(p.cast()) }
    }

    /// The `AtomicU16` at byte offset `off` (must be 2-aligned and in bounds, else panics).
    #[inline]
    pub(super) fn u16_at(&self, off: usize) -> &AtomicU16 {
        let p = self.field_ptr::<2>(off);
        // SAFETY: as for `u64_at`.
        unsafe { AtomicU16::from_ptr(p.cast()) }
    }

    /// The `AtomicU8` at byte offset `off` (must be in bounds, else panics).
    #[inline]
    pub(super) fn u8_at(&self, off: usize) -> &AtomicU8 {
        let p = self.field_ptr::<1>(off);
        // SAFETY: as for `u64_at`.
        unsafe { AtomicU8::from_ptr(p) }
    }

    /// Raw pointer to the payload bytes `[off, off + len)` (must be in bounds, else panics).
    /// Dereferencing it is the caller's responsibility: the ring protocol decides who may
    /// access a payload area when (see the `server` and `client` modules).
    #[inline]
    pub(super) fn bytes(&self, off: usize, len: usize) -> *mut u8 {
        self.ptr(off, len, 1)
    }
}
