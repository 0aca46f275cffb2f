//! The operating-system side of an ipc segment: names in `/dev/shm`, opening with the owner and
//! mode checks of [`mlx5::private_file`], OFD byte-range locks (liveness tokens, as in the
//! delegation ring), and a mapping with bounds-checked accessors.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64};

use memmap2::{MmapOptions, MmapRaw};

use super::error::IpcError;

/// Directory of ipc segments. Source: seeds/004 §2.1 (shared memory lives in `/dev/shm`).
pub const SHM_DIR: &str = "/dev/shm";

/// Normalizes `name` (`"kv0"` or `"/kv0"`) to `(name, /dev/shm/name)`: a single non-empty
/// file name of at most 200 bytes, not `.` or `..`.
pub(super) fn shm_path(name: &str) -> Result<(String, PathBuf), IpcError> {
    let n = name.strip_prefix('/').unwrap_or(name);
    let reason = if n.is_empty() {
        Some("empty")
    } else if n.len() > 200 {
        Some("longer than 200 bytes")
    } else if n.contains('/') || n.contains('\0') {
        Some("must be a single file name")
    } else if n == "." || n == ".." {
        Some("'.' and '..' are not file names")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(IpcError::InvalidName {
            name: name.to_owned(),
            reason,
        }),
        None => Ok((n.to_owned(), Path::new(SHM_DIR).join(n))),
    }
}

pub(crate) fn io_err(path: &Path, op: &'static str) -> impl FnOnce(io::Error) -> IpcError {
    let path = path.to_path_buf();
    move |source| IpcError::Io { path, op, source }
}

/// Files refused by [`open_checked`] in this process.
static UNSAFE_FILES_REFUSED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many ipc segment files this process refused because of their owner, mode or type
/// ([`IpcError::UnsafeFile`]), since it started.
pub fn unsafe_files_refused() -> u64 {
    UNSAFE_FILES_REFUSED.load(std::sync::atomic::Ordering::Relaxed)
}

#[cold]
fn refuse(path: &Path, (owner, mode): (u32, u32), reason: &'static str) -> IpcError {
    UNSAFE_FILES_REFUSED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    tracing::warn!(path = %path.display(), owner, mode = format_args!("{mode:o}"), reason,
        "refusing an ipc segment");
    IpcError::UnsafeFile {
        path: path.to_path_buf(),
        owner,
        mode,
        expected_uid: mlx5::private_file::euid(),
        reason,
    }
}

/// Opens the existing `path` and checks the descriptor with `fstat` before anything is read:
/// with `private`, a regular file of this euid with no group/other bits (what a client
/// requires); otherwise only the owner (what a server checks before replacing a stale file).
/// `Ok(None)` if nothing is there.
///
/// # Errors
/// [`IpcError::UnsafeFile`] (symbolic link, other owner, mode other than 0600 with `private`);
/// [`IpcError::Io`].
pub(super) fn open_checked(path: &Path, private: bool) -> Result<Option<File>, IpcError> {
    match mlx5::private_file::open(path) {
        Ok(file) => {
            let md = file.metadata().map_err(io_err(path, "fstat"))?;
            let problem = if private {
                mlx5::private_file::problem(&md)
            } else {
                mlx5::private_file::owner_problem(&md)
            };
            match problem {
                None => Ok(Some(file)),
                Some(reason) => Err(refuse(
                    path,
                    mlx5::private_file::owner_and_mode(&md),
                    reason,
                )),
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) if mlx5::private_file::is_symlink_error(&e) => Err(refuse(
            path,
            mlx5::private_file::link_owner_and_mode(path),
            "it is a symbolic link",
        )),
        Err(e) => Err(io_err(path, "open")(e)),
    }
}

fn flock(l_type: libc::c_int, start: u64, len: u64) -> libc::flock {
    // SAFETY: `flock` is a C struct of integers, all-zero is valid (`l_pid` must be 0 for OFD
    // commands).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = l_type as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start as libc::off_t;
    fl.l_len = len as libc::off_t;
    fl
}

fn fcntl(file: &File, cmd: libc::c_int, fl: &mut libc::flock) -> io::Result<()> {
    // SAFETY: the descriptor is open for the call; `fl` is a valid exclusive `struct flock`.
    if unsafe { libc::fcntl(file.as_raw_fd(), cmd, fl as *mut libc::flock) } == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Non-blocking OFD write lock on `[start, start + len)`; `Ok(false)` if another open file
/// description holds a conflicting lock. Never waits.
pub(super) fn try_lock(file: &File, start: u64, len: u64) -> io::Result<bool> {
    match fcntl(
        file,
        libc::F_OFD_SETLK,
        &mut flock(libc::F_WRLCK, start, len),
    ) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Releases this description's lock on `[start, start + len)`.
pub(super) fn unlock(file: &File, start: u64, len: u64) -> io::Result<()> {
    fcntl(
        file,
        libc::F_OFD_SETLK,
        &mut flock(libc::F_UNLCK, start, len),
    )
}

/// Whether another open file description holds a lock on `[start, start + len)`
/// (`F_OFD_GETLK`). A failing system call counts as locked (the peer is presumed alive; the
/// caller's deadline still bounds its wait).
pub(super) fn locked_by_other(file: &File, start: u64, len: u64) -> bool {
    let mut fl = flock(libc::F_WRLCK, start, len);
    match fcntl(file, libc::F_OFD_GETLK, &mut fl) {
        Ok(()) => fl.l_type != libc::F_UNLCK as libc::c_short,
        Err(_) => true,
    }
}

/// Out-of-bounds or misaligned field: a logic error of this crate.
#[cold]
#[inline(never)]
#[track_caller]
fn out_of_bounds(off: usize, size: usize, len: usize) -> ! {
    panic!("ipc field at {off} ({size} B) outside mapping of {len} B or misaligned")
}

/// A shared read-write mapping of `[0, len)` of a segment, with bounds-checked accessors: a
/// logic error can panic, never touch memory outside the mapping.
#[derive(Debug)]
pub(super) struct Map {
    map: MmapRaw,
    len: usize,
}

impl Map {
    /// Maps `[0, len)` of `file` shared read-write.
    pub(super) fn new(file: &File, len: u64) -> io::Result<Self> {
        let len = usize::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let map = MmapOptions::new().len(len).map_raw(file)?;
        Ok(Map { map, len })
    }

    #[inline(always)]
    fn field(&self, off: usize, size: usize) -> *mut u8 {
        if off > self.len.wrapping_sub(size) || size > self.len || off & (size - 1) != 0 {
            out_of_bounds(off, size, self.len);
        }
        self.map.as_mut_ptr().wrapping_add(off)
    }

    /// The `AtomicU64` at `off` (8-aligned, in bounds, else panics).
    #[inline(always)]
    pub(super) fn u64(&self, off: usize) -> &AtomicU64 {
        // SAFETY: in bounds and aligned (checked; the mapping is page-aligned); it lives as long
        // as `self`; every access to it by this crate, in any process, is atomic.
        unsafe { AtomicU64::from_ptr(self.field(off, 8).cast()) }
    }

    /// The `AtomicU32` at `off` (4-aligned, in bounds, else panics).
    #[inline(always)]
    pub(super) fn u32(&self, off: usize) -> &AtomicU32 {
        // SAFETY: as for `u64`.
        unsafe { AtomicU32::from_ptr(self.field(off, 4).cast()) }
    }

    /// The `AtomicU8` at `off` (in bounds, else panics).
    #[inline(always)]
    pub(super) fn u8(&self, off: usize) -> &AtomicU8 {
        // SAFETY: as for `u64`.
        unsafe { AtomicU8::from_ptr(self.field(off, 1)) }
    }

    /// Pointer to `[off, off + len)` (in bounds, else panics). Who may access the bytes when
    /// is decided by the ring protocol (see the client and server modules).
    #[inline(always)]
    pub(super) fn bytes(&self, off: usize, len: usize) -> *mut u8 {
        if off > self.len || len > self.len - off {
            out_of_bounds(off, len, self.len);
        }
        self.map.as_mut_ptr().wrapping_add(off)
    }
}
