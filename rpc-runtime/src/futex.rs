//! Shared-memory futexes (Linux `futex(2)`, through `rustix`): the sleep and the wake of the
//! delegation ring's and ipc's wake protocols (`delegation::sleep`, `ipc` module docs,
//! "Sleeping"). The words live in `MAP_SHARED` mappings of files, so the operations are the
//! shared ones (no `FUTEX_PRIVATE_FLAG`): sleeper and waker may be different processes.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

use rustix::thread::futex;

/// How a [`wait`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitEnd {
    /// Woken, timed out, the word changed before the wait (`EAGAIN`) or a signal (`EINTR`):
    /// the caller polls again.
    Returned,
    /// The kernel refused the wait (e.g. `ENOSYS` under a seccomp filter): the caller must not
    /// try again, it would spin.
    Unsupported,
}

/// `FUTEX_WAIT(word, 1, bound)` on a shared mapping: sleeps while `word == 1`, at most `bound`.
pub(crate) fn wait(word: &AtomicU32, bound: Duration) -> WaitEnd {
    let ts = futex::Timespec {
        tv_sec: i64::try_from(bound.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: bound.subsec_nanos() as futex::Nsecs,
    };
    match futex::wait(word, futex::Flags::empty(), 1, Some(&ts)) {
        Ok(()) => WaitEnd::Returned,
        Err(e)
            if e == rustix::io::Errno::AGAIN
                || e == rustix::io::Errno::TIMEDOUT
                || e == rustix::io::Errno::INTR =>
        {
            WaitEnd::Returned
        }
        Err(e) => {
            tracing::warn!(error = %e, "FUTEX_WAIT refused; polling instead");
            WaitEnd::Unsupported
        }
    }
}

/// The waker's step: if `word` is non-zero, `swap(0)` it and, if the swap returned non-zero,
/// `FUTEX_WAKE` one sleeper. Returns whether it made the system call.
#[cold]
#[inline(never)]
pub(crate) fn wake(word: &AtomicU32) -> bool {
    use std::sync::atomic::Ordering::SeqCst;
    if word.swap(0, SeqCst) == 0 {
        return false;
    }
    // An error (`EFAULT` cannot happen on a live mapping) leaves the sleeper to its bound.
    let _ = futex::wake(word, futex::Flags::empty(), 1);
    true
}
