//! Futexes (Linux `futex(2)` through `rustix`, and `futex_waitv(2)`): the sleep and the wake
//! of the delegation ring's, ipc's and Flux's wake protocols (`delegation::sleep`; the `ipc`
//! and `flux` module docs, "Sleeping"). The ring's and ipc's words live in `MAP_SHARED`
//! mappings of files, so the operations are the shared ones (no `FUTEX_PRIVATE_FLAG`):
//! sleeper and waker may be different processes (Flux's in-process words work the same).

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

/// `struct futex_waitv` (Linux `include/uapi/linux/futex.h`, since 5.16).
#[repr(C)]
struct FutexWaitv {
    val: u64,
    uaddr: u64,
    flags: u32,
    reserved: u32,
}

/// `FUTEX2_SIZE_U32`: a 32-bit word; without `FUTEX2_PRIVATE` (shared mappings).
const FUTEX2_SIZE_U32: u32 = 0x02;

/// Most words [`wait_any`] takes (the kernel's limit is 128).
pub(crate) const WAIT_ANY_MAX: usize = 8;

/// `futex_waitv(2)` over `words` (at most [`WAIT_ANY_MAX`]): sleeps while every word holds 1,
/// at most `bound`, and returns when any is woken (`FUTEX_WAKE` on it), a word no longer
/// holds 1 (`EAGAIN`), the bound passes or a signal arrives. One word is a plain [`wait`].
/// [`WaitEnd::Unsupported`] if the kernel lacks the call (`ENOSYS`, before Linux 5.16) or
/// refuses it.
pub(crate) fn wait_any(words: &[&AtomicU32], bound: Duration) -> WaitEnd {
    match words {
        [] => return WaitEnd::Returned,
        [one] => return wait(one, bound),
        _ => {}
    }
    assert!(words.len() <= WAIT_ANY_MAX, "wait_any: too many words");
    let mut v: [FutexWaitv; WAIT_ANY_MAX] = std::array::from_fn(|_| FutexWaitv {
        val: 1,
        uaddr: 0,
        flags: FUTEX2_SIZE_U32,
        reserved: 0,
    });
    for (w, word) in v.iter_mut().zip(words) {
        w.uaddr = word.as_ptr() as u64;
    }
    // The timeout of futex_waitv is absolute, on the clock named by the last argument.
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    // `CLOCK_MONOTONIC` readings are non-negative; the deadline saturates far in the future.
    let at = Duration::new(
        u64::try_from(now.tv_sec).unwrap_or(0),
        u32::try_from(now.tv_nsec).unwrap_or(0),
    )
    .saturating_add(bound);
    let deadline = libc::timespec {
        tv_sec: libc::time_t::try_from(at.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: at.subsec_nanos().into(),
    };
    // SAFETY: `v[..words.len()]` are valid futex_waitv entries naming live, 4-aligned words
    // (references) that stay mapped for the call; `deadline` is a valid timespec; flags 0.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex_waitv,
            v.as_ptr(),
            words.len() as libc::c_uint,
            0 as libc::c_uint,
            &deadline as *const libc::timespec,
            libc::CLOCK_MONOTONIC,
        )
    };
    if rc >= 0 {
        return WaitEnd::Returned;
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EAGAIN | libc::ETIMEDOUT | libc::EINTR) => WaitEnd::Returned,
        e => {
            tracing::warn!(errno = ?e, "futex_waitv refused; polling instead");
            WaitEnd::Unsupported
        }
    }
}

/// Whether this kernel offers `futex_waitv` (Linux ≥ 5.16, and no seccomp filter refusing
/// it): a wait on two words that do not hold 1 returns at once either way.
#[cfg(test)]
pub(crate) fn waitv_supported() -> bool {
    let (a, b) = (AtomicU32::new(0), AtomicU32::new(0));
    wait_any(&[&a, &b], Duration::from_millis(1)) == WaitEnd::Returned
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// `wait_any` sleeps its bound while every word holds 1, and returns at once when one
    /// does not (`EAGAIN`): what makes a sleep armed before a waker's store safe.
    #[test]
    fn wait_any_ends_at_its_bound_or_at_once_for_a_changed_word() {
        if !waitv_supported() {
            eprintln!("skipped: this kernel refuses futex_waitv (Linux >= 5.16 needed)");
            return;
        }
        let (a, b) = (AtomicU32::new(1), AtomicU32::new(1));
        let t = Instant::now();
        assert_eq!(
            wait_any(&[&a, &b], Duration::from_millis(20)),
            WaitEnd::Returned
        );
        assert!(
            t.elapsed() >= Duration::from_millis(10),
            "{:?}",
            t.elapsed()
        );
        b.store(0, std::sync::atomic::Ordering::SeqCst);
        let t = Instant::now();
        assert_eq!(
            wait_any(&[&a, &b], Duration::from_secs(10)),
            WaitEnd::Returned
        );
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
