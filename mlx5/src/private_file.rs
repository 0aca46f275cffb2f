//! The trust rule for files in shared memory (`/dev/shm`), in one place: the device model's
//! node directory and segments use it, and so do `rpc-runtime`'s delegation rings and ring
//! manifests. A shared file is trusted only if it is a regular file owned by this process's
//! effective uid with no group or other permission bits; it is created with
//! `O_CREAT | O_EXCL | O_NOFOLLOW` and then set to exactly [`MODE`] with `fchmod` (not subject
//! to the umask); it is opened with `O_NOFOLLOW` (a symbolic link fails with `ELOOP`) and
//! checked with `fstat` on the open descriptor before anything is read or mapped, so the check
//! and the use are on the same inode. Each user of these functions maps a refusal to its own
//! error type and counter.

use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Mode of every shared file: read-write for the owner only.
pub const MODE: u32 = 0o600;

/// This process's effective uid.
pub fn euid() -> u32 {
    // SAFETY: `geteuid` has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Creates `path` exclusively (`O_CREAT | O_EXCL | O_NOFOLLOW`, read-write, close-on-exec) and
/// sets its mode to exactly [`MODE`] with `fchmod`.
///
/// # Errors
/// `AlreadyExists` if anything (a file, a symbolic link) is at `path`; the `open` or `fchmod`
/// error otherwise (a file created before a failed `fchmod` is removed).
pub fn create(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(MODE)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    // SAFETY: `file` keeps the descriptor open for the duration of the call.
    if unsafe { libc::fchmod(file.as_raw_fd(), MODE as libc::mode_t) } == -1 {
        let e = io::Error::last_os_error();
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(file)
}

/// Opens the existing `path` read-write (close-on-exec, `O_NOFOLLOW | O_NONBLOCK`) without
/// checking it: follow with [`problem`] (or [`owner_problem`]) on its metadata before use.
///
/// # Errors
/// The `open` error; `ELOOP` (see [`is_symlink_error`]) for a symbolic link.
pub fn open(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
}

/// Whether an [`open`] error means `path` is a symbolic link.
pub fn is_symlink_error(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ELOOP)
}

/// What is wrong with a shared file, from the `fstat` of its open descriptor: `None` if it is
/// a regular file owned by this process's effective uid with no group or other bits.
pub fn problem(md: &Metadata) -> Option<&'static str> {
    if !md.file_type().is_file() {
        Some("it is not a regular file")
    } else {
        owner_problem(md).or(if md.mode() & 0o077 != 0 {
            Some("group or other users have access to it")
        } else {
            None
        })
    }
}

/// [`problem`] restricted to the owner: `None` if this process's effective uid owns the file
/// (what a creator checks before it may unlink and replace a stale file of its own).
pub fn owner_problem(md: &Metadata) -> Option<&'static str> {
    (md.uid() != euid()).then_some("it is owned by another user")
}

/// `(owner uid, permission bits)` of a file's metadata, for error messages.
pub fn owner_and_mode(md: &Metadata) -> (u32, u32) {
    (md.uid(), md.mode() & 0o7777)
}

/// `(owner uid, permission bits)` of the symbolic link at `path` itself (`(u32::MAX, 0)` if it
/// cannot be read), for the error that refuses it.
pub fn link_owner_and_mode(path: &Path) -> (u32, u32) {
    std::fs::symlink_metadata(path)
        .map(|m| owner_and_mode(&m))
        .unwrap_or((u32::MAX, 0))
}
