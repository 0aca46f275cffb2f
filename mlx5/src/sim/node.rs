//! The node directory: what the device models of the processes on one host share so that a
//! doorbell rung in one process executes against another process's queues and memory.
//!
//! One file `/dev/shm/mlx5sim.<node>` ([`DIR_BYTES`], sparse), mapped by every process that
//! joined `<node>` ([`crate::sim::Fabric::join`]):
//!
//! | bytes | contents |
//! |---|---|
//! | 0..4096 | [`Header`]: magic, layout version, the next LID to hand out |
//! | 4096.. | [`MAX_PROCS`] × [`ProcSlot`] (64 B): pid, state, attention counter |
//! | then | per process slot: [`QP_SLOTS`] × [`QpExport`], [`CQ_SLOTS`] × [`CqExport`], [`SRQ_SLOTS`] × [`SrqExport`], [`MR_SLOTS`] × [`MrExport`] (64 B each) |
//!
//! **Numbers.** A process in slot `s` numbers its objects `(s + 1) << bits | i` (QPN, CQN,
//! SRQN, MR index, PD), so every number is unique on the node and names its owner: the
//! export of QP `qpn` is entry `qpn & (QP_SLOTS - 1)` of slot `(qpn >> QP_BITS) - 1`.
//!
//! **Memory.** Queue memory and registered buffers of a joined process are shared segment
//! files ([`crate::mem`] "Shared backing"); an export names its memory by segment number,
//! and a peer maps `mlx5sim.<node>.<pid>.<segment>` on first use (cached until the model
//! drops). The device-side counters of a queue (CQ producer, RQ/SRQ consumer) live in its
//! doorbell block ([`crate::sim::alloc::COUNTERS_OFF`]), so the owner's model and its peers'
//! update one copy.
//!
//! **Lock.** Every model operation of a joined process (doorbell, progress step, object
//! creation) runs under the process's fabric mutex *and* the node lock: an open-file-description
//! (OFD) write lock on byte 0 of the directory. The kernel releases it when its holder dies,
//! so a crashed process never wedges the node (what it was doing is cut short, like a NIC
//! reset mid-operation).
//!
//! **The lock wait is bounded.** Anyone who can open the directory can lock its bytes, and a
//! peer can be stopped (SIGSTOP) while holding the lock, so the node lock is never waited for
//! without a bound: it is taken with non-blocking `F_OFD_SETLK` — one `fcntl` when
//! uncontended, the hot path of every doorbell — and on contention retried with backoff
//! (spinning, then yielding, then sleeping 20 µs doubling to 1 ms) until
//! [`SimConfig::node_lock_timeout`](crate::sim::SimConfig::node_lock_timeout) (default
//! [`DEFAULT_NODE_LOCK_TIMEOUT`], 1 s) has passed. Then the call gives up with
//! [`Error::LockTimeout`] naming the lock, the file and how long it waited, counted in
//! [`SimStats::node_lock_timeouts`](crate::sim::SimStats::node_lock_timeouts): a join or an
//! object creation returns it; a doorbell cannot fail (it has no error path, like a NIC's), so
//! its WQEs stay posted and run at the next doorbell of that QP that gets the lock; a progress
//! step is skipped; the teardown of this process's own objects (dropping a QP, CQ, SRQ or MR)
//! and leaving the node proceed without the node lock after the bound, since they must not
//! leave freed memory in the model (peers keep their own mappings of the segments).
//!
//! **Ownership.** The directory and every segment file are created `O_EXCL`, mode exactly
//! 0600 whatever the umask, and opened only after `fstat` on the descriptor shows a regular
//! file of this process's effective uid with no group or other permission bits (see
//! [`crate::mem`] "Ownership"): only processes of the same user share a node, and another
//! user's file at the directory's name is an error, never wiped or reused. A stale directory
//! wipe removes only this user's segment files.
//!
//! **Liveness.** Each process holds an OFD write lock on byte `LIVENESS_BASE + slot` for as
//! long as it is joined. The kernel drops it when the process exits, however it exits (even
//! before its parent reaps it). Peers test it with `F_OFD_GETLK` at most once per
//! [`LIVENESS_PERIOD`] and mark a slot whose lock is gone dead: from then on its QPs are
//! unreachable, so RC requests to them fail with TRANSPORT_RETRY_EXC after the QP's
//! `retry_cnt` retries, as when a remote node's HCA disappears, and UD packets to them are
//! dropped (`ud_no_dest`).
//!
//! **Error transitions across processes.** A peer that puts one of our QPs in the error state
//! (a responder error, an overrun of our CQ) sets the QP's `err_pending` and bumps our slot's
//! attention counter; our model applies it on its next step (the QP is treated as not in RTS
//! in the meantime).
//!
//! Limits: [`MAX_PROCS`] processes over the directory's lifetime (slots are not reused, so a
//! dead process's QPNs never come back), and per process [`QP_SLOTS`] QPs, [`CQ_SLOTS`] CQs,
//! [`SRQ_SLOTS`] SRQs, [`MR_SLOTS`] MRs at a time. A directory whose processes are all gone is
//! stale: the next process to join wipes it and the segment files under its prefix.

use std::collections::HashMap;
use std::fs::File;
use std::hash::{BuildHasherDefault, Hasher};
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::mem::Backing;

/// Processes that may join one node directory over its lifetime.
pub(crate) const MAX_PROCS: usize = 64;
/// QPN bits below the slot prefix.
pub(crate) const QP_BITS: u32 = 14;
/// CQN bits below the slot prefix.
pub(crate) const CQ_BITS: u32 = 12;
/// SRQN bits below the slot prefix.
pub(crate) const SRQ_BITS: u32 = 10;
/// MR index bits below the slot prefix.
pub(crate) const MR_BITS: u32 = 14;
/// PD bits below the slot prefix.
pub(crate) const PD_BITS: u32 = 16;
/// QPs one process may have at a time.
pub(crate) const QP_SLOTS: usize = 1 << QP_BITS;
/// CQs one process may have at a time.
pub(crate) const CQ_SLOTS: usize = 1 << CQ_BITS;
/// SRQs one process may have at a time.
pub(crate) const SRQ_SLOTS: usize = 1 << SRQ_BITS;
/// MRs one process may have at a time.
pub(crate) const MR_SLOTS: usize = 1 << MR_BITS;
/// How often a model checks its peers' liveness locks (at most).
pub(crate) const LIVENESS_PERIOD: Duration = Duration::from_millis(1);
/// Default bound on waiting for the node lock
/// ([`SimConfig::node_lock_timeout`](crate::sim::SimConfig::node_lock_timeout)): long
/// compared with any model operation (microseconds to a few milliseconds under load), short
/// enough that a held lock surfaces as an error rather than a stall.
pub const DEFAULT_NODE_LOCK_TIMEOUT: Duration = Duration::from_secs(1);
/// Names the node lock in [`Error::LockTimeout`].
const NODE_LOCK: &str = "node lock (byte 0)";

const MAGIC: u64 = u64::from_le_bytes(*b"MLX5NODE");
const VERSION: u32 = 1;
const HEADER_BYTES: usize = 4096;
const ENTRY: usize = 64;
const SLOTS_OFF: usize = HEADER_BYTES;
const AREAS_OFF: usize = SLOTS_OFF + MAX_PROCS * ENTRY;
const QP_OFF: usize = 0;
const CQ_OFF: usize = QP_OFF + QP_SLOTS * ENTRY;
const SRQ_OFF: usize = CQ_OFF + CQ_SLOTS * ENTRY;
const MR_OFF: usize = SRQ_OFF + SRQ_SLOTS * ENTRY;
const AREA_BYTES: usize = MR_OFF + MR_SLOTS * ENTRY;
/// Size of the directory file in bytes (sparse: untouched pages cost nothing).
pub(crate) const DIR_BYTES: usize = AREAS_OFF + MAX_PROCS * AREA_BYTES;
/// Byte of the node lock.
const LOCK_BYTE: i64 = 0;
/// First liveness byte (one per slot).
const LIVENESS_BASE: i64 = 16;

/// Slot states.
pub(crate) mod slot_state {
    /// Never used.
    pub(crate) const FREE: u32 = 0;
    /// Joined, running.
    pub(crate) const ALIVE: u32 = 1;
    /// Left cleanly (its fabric dropped).
    pub(crate) const LEFT: u32 = 2;
    /// Died while joined (liveness lock gone).
    pub(crate) const DEAD: u32 = 3;
}

/// Directory header.
#[repr(C)]
pub(crate) struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    next_lid: AtomicU32,
}

/// One process slot.
#[repr(C)]
pub(crate) struct ProcSlot {
    pub(crate) pid: AtomicU32,
    pub(crate) state: AtomicU32,
    /// Bumped by a peer that left work for the owner (an `err_pending`).
    pub(crate) attention: AtomicU32,
}

/// An exported QP (64 B).
#[repr(C)]
pub(crate) struct QpExport {
    /// 1 while the QP exists.
    pub(crate) live: AtomicU32,
    /// [`qp_state`] value.
    pub(crate) state: AtomicU32,
    /// A peer moved the QP to the error state; the owner applies it on its next step.
    pub(crate) err_pending: AtomicU32,
    /// 0 RC, 1 UD.
    pub(crate) kind: AtomicU32,
    pub(crate) lid: AtomicU32,
    pub(crate) pd: AtomicU32,
    /// RC responder access flags ([`crate::verbs::Access`] bits).
    pub(crate) access: AtomicU32,
    pub(crate) qkey: AtomicU32,
    /// RC: the QPN it is connected to.
    pub(crate) peer_qpn: AtomicU32,
    pub(crate) recv_cq: AtomicU32,
    /// SRQN, 0 for none.
    pub(crate) srq: AtomicU32,
    /// RQ ring segment (offset 0) and its doorbell block segment.
    pub(crate) rq_seg: AtomicU32,
    pub(crate) db_seg: AtomicU32,
    pub(crate) rq_wqe_cnt: AtomicU32,
    pub(crate) rq_stride: AtomicU32,
    _pad: AtomicU32,
}

/// QP states in [`QpExport::state`].
pub(crate) mod qp_state {
    pub(crate) const RESET: u32 = 0;
    pub(crate) const RTS: u32 = 1;
    pub(crate) const ERROR: u32 = 2;
}

/// An exported CQ (64 B).
#[repr(C)]
pub(crate) struct CqExport {
    pub(crate) live: AtomicU32,
    pub(crate) cqe_cnt: AtomicU32,
    pub(crate) ring_seg: AtomicU32,
    pub(crate) db_seg: AtomicU32,
    _pad: [AtomicU32; 12],
}

/// An exported SRQ (64 B).
#[repr(C)]
pub(crate) struct SrqExport {
    pub(crate) live: AtomicU32,
    pub(crate) wqe_cnt: AtomicU32,
    pub(crate) stride: AtomicU32,
    pub(crate) max_sge: AtomicU32,
    pub(crate) pd: AtomicU32,
    pub(crate) ring_seg: AtomicU32,
    pub(crate) db_seg: AtomicU32,
    _pad: [AtomicU32; 9],
}

/// An exported memory region (64 B).
#[repr(C)]
pub(crate) struct MrExport {
    pub(crate) live: AtomicU32,
    pub(crate) access: AtomicU32,
    pub(crate) pd: AtomicU32,
    /// Segment holding the region, or `u32::MAX`: private memory, unreachable from peers.
    pub(crate) seg: AtomicU32,
    /// Start address in the owner's address space.
    pub(crate) addr: AtomicU64,
    pub(crate) len: AtomicU64,
    /// Offset of `addr` inside the segment.
    pub(crate) seg_off: AtomicU64,
    _pad: [AtomicU64; 3],
}

const _: () = {
    assert!(std::mem::size_of::<ProcSlot>() <= ENTRY);
    assert!(std::mem::size_of::<QpExport>() == ENTRY);
    assert!(std::mem::size_of::<CqExport>() == ENTRY);
    assert!(std::mem::size_of::<SrqExport>() == ENTRY);
    assert!(std::mem::size_of::<MrExport>() == ENTRY);
};

/// A joined directory: the mapping, the open file (it carries the OFD locks) and our slot.
pub(crate) struct NodeDir {
    file: File,
    base: NonNull<u8>,
    pub(crate) slot: u32,
    pub(crate) backing: Backing,
    path: String,
    /// Bound on waiting for the node lock.
    lock_timeout: Duration,
}

// SAFETY: the mapping is shared memory accessed only through atomics (the export structs are
// all atomics) and the file handle is thread-safe.
unsafe impl Send for NodeDir {}
// SAFETY: see `Send`.
unsafe impl Sync for NodeDir {}

fn ofd_lock(file: &File, byte: i64, cmd: libc::c_int, ty: libc::c_int) -> io::Result<libc::flock> {
    // SAFETY: `flock` is plain data; zeroed is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = ty as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = byte as libc::off_t;
    fl.l_len = 1;
    loop {
        // SAFETY: a valid fd and a valid `flock` for the OFD lock commands.
        let r = unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut fl as *mut libc::flock) };
        if r == 0 {
            return Ok(fl);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Takes a non-blocking OFD write lock on `byte` of `file`: `Ok(false)` if another open file
/// description holds a conflicting lock.
#[inline]
fn try_lock_byte(file: &File, byte: i64) -> io::Result<bool> {
    match ofd_lock(file, byte, libc::F_OFD_SETLK, libc::F_WRLCK) {
        Ok(_) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Takes the write lock on `byte` of `file` (at `path`), waiting at most `bound`: one
/// `F_OFD_SETLK` when it is free, else [`lock_contended`].
///
/// # Errors
/// [`Error::LockTimeout`] naming `what`, `path` and the time waited if the lock stayed held
/// for `bound`; [`Error::Memory`] if `fcntl` fails otherwise.
#[inline]
fn lock_byte(
    file: &File,
    byte: i64,
    what: &'static str,
    path: &str,
    bound: Duration,
) -> Result<()> {
    if try_lock_byte(file, byte).map_err(Error::Memory)? {
        return Ok(());
    }
    lock_contended(file, byte, what, path, bound)
}

/// The contended path of [`lock_byte`]: retries with backoff (about 64 spins, then yields up
/// to 50 µs after the start, then sleeps of 20 µs doubling to 1 ms) until `bound` has passed.
#[cold]
#[inline(never)]
fn lock_contended(
    file: &File,
    byte: i64,
    what: &'static str,
    path: &str,
    bound: Duration,
) -> Result<()> {
    let t0 = Instant::now();
    let mut spins = 0u32;
    let mut nap = Duration::from_micros(20);
    loop {
        let waited = t0.elapsed();
        if waited >= bound {
            tracing::error!(
                lock = what,
                path,
                ?waited,
                "sim: lock held too long; giving up"
            );
            return Err(Error::LockTimeout {
                lock: what,
                path: path.to_string(),
                waited,
                bound,
            });
        }
        if spins < 64 {
            spins += 1;
            std::hint::spin_loop();
        } else if waited < Duration::from_micros(50) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(nap.min(bound - waited));
            nap = (nap * 2).min(Duration::from_millis(1));
        }
        if try_lock_byte(file, byte).map_err(Error::Memory)? {
            return Ok(());
        }
    }
}

/// The node lock, held while it lives.
pub(crate) struct NodeLock<'a> {
    dir: &'a NodeDir,
}

impl Drop for NodeLock<'_> {
    fn drop(&mut self) {
        let _ = ofd_lock(&self.dir.file, LOCK_BYTE, libc::F_OFD_SETLK, libc::F_UNLCK);
    }
}

impl NodeDir {
    /// Joins (creating or wiping a stale directory as needed) the node `name` under
    /// `/dev/shm`, waiting at most `lock_timeout` for the node lock.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad name or a file that is not a node directory;
    /// [`Error::UnsafeFile`] if the file at the directory's name is not this user's private
    /// regular file; [`Error::LockTimeout`] if the node lock stays held for `lock_timeout`;
    /// [`Error::Memory`] if creating, opening or mapping fails.
    pub(crate) fn join(name: &str, lock_timeout: Duration) -> Result<NodeDir> {
        if name.is_empty()
            || name.len() > 100
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(Error::InvalidArgument(format!(
                "node name {name:?}: use 1..=100 of [A-Za-z0-9_-]"
            )));
        }
        let path = format!("/dev/shm/mlx5sim.{name}");
        let file = Self::open_or_create(&path)?;
        lock_byte(&file, LOCK_BYTE, NODE_LOCK, &path, lock_timeout)?;
        let r = Self::join_locked(name, file, path, lock_timeout);
        if let Err(e) = &r {
            tracing::warn!("sim: joining node {name} failed: {e}");
        }
        r
    }

    /// Creates the directory file (`O_EXCL`, 0600) or opens the existing one and checks its
    /// owner, mode and type before it is used. A new file is empty; it is sized and
    /// initialized under the node lock (by whichever process locks it first).
    fn open_or_create(path: &str) -> Result<File> {
        let p = std::path::Path::new(path);
        // Racing with a process that creates or removes the file at the same time: a few
        // rounds settle it.
        for _ in 0..8 {
            match crate::mem::create_private(p) {
                Ok(f) => return Ok(f),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(Error::Memory(e)),
            }
            if let Some(f) = crate::mem::open_private(p)? {
                return Ok(f);
            }
        }
        Err(Error::Memory(io::Error::other(format!(
            "{path}: created and removed by others while joining; try again"
        ))))
    }

    fn join_locked(
        name: &str,
        file: File,
        path: String,
        lock_timeout: Duration,
    ) -> Result<NodeDir> {
        let unlock = |f: &File| {
            let _ = ofd_lock(f, LOCK_BYTE, libc::F_OFD_SETLK, libc::F_UNLCK);
        };
        let size = file.metadata().map_err(Error::Memory)?.len();
        if size != DIR_BYTES as u64 && size != 0 {
            unlock(&file);
            return Err(Error::InvalidArgument(format!(
                "{path}: {size} bytes, not a version-{VERSION} node directory"
            )));
        }
        if size == 0 {
            file.set_len(DIR_BYTES as u64).map_err(Error::Memory)?;
        }
        let base = match crate::mem::map_file(&file, DIR_BYTES) {
            Ok(b) => b,
            Err(e) => {
                unlock(&file);
                return Err(Error::Memory(e));
            }
        };
        let mut dir = NodeDir {
            file,
            base,
            slot: 0,
            backing: Backing {
                prefix: format!("/dev/shm/mlx5sim.{name}"),
            },
            path,
            lock_timeout,
        };
        let h = dir.header();
        let magic = h.magic.load(Ordering::Acquire);
        if magic != 0 && (magic != MAGIC || h.version.load(Ordering::Relaxed) != VERSION) {
            unlock(&dir.file);
            return Err(Error::InvalidArgument(format!(
                "{}: not a version-{VERSION} node directory",
                dir.path
            )));
        }
        if magic != 0 && dir.is_stale() {
            tracing::info!("sim: node {name}: every process of the directory is gone; wiping it");
            dir.wipe()?;
        }
        let h = dir.header();
        if h.magic.load(Ordering::Acquire) == 0 {
            h.version.store(VERSION, Ordering::Relaxed);
            h.next_lid.store(1, Ordering::Relaxed);
            h.magic.store(MAGIC, Ordering::Release);
        }
        let Some(slot) = (0..MAX_PROCS as u32)
            .find(|&s| dir.proc_slot(s).state.load(Ordering::Acquire) == slot_state::FREE)
        else {
            unlock(&dir.file);
            return Err(Error::InvalidArgument(format!(
                "node {name}: all {MAX_PROCS} process slots were used; join a new node name"
            )));
        };
        dir.slot = slot;
        let s = dir.proc_slot(slot);
        s.pid.store(std::process::id(), Ordering::Relaxed);
        s.attention.store(0, Ordering::Relaxed);
        s.state.store(slot_state::ALIVE, Ordering::Release);
        let live = ofd_lock(
            &dir.file,
            LIVENESS_BASE + i64::from(slot),
            libc::F_OFD_SETLK,
            libc::F_WRLCK,
        );
        unlock(&dir.file);
        live.map_err(Error::Memory)?;
        Ok(dir)
    }

    /// Whether no slot is held by a running process.
    fn is_stale(&self) -> bool {
        (0..MAX_PROCS as u32).all(|s| {
            self.proc_slot(s).state.load(Ordering::Acquire) != slot_state::ALIVE
                || !self.liveness_held(s)
        })
    }

    /// Zeroes the directory and removes the segment files under its prefix.
    fn wipe(&mut self) -> Result<()> {
        // SAFETY: the mapping is DIR_BYTES long and no other process uses it (stale).
        unsafe { libc::munmap(self.base.as_ptr().cast(), DIR_BYTES) };
        self.file.set_len(0).map_err(Error::Memory)?;
        self.file.set_len(DIR_BYTES as u64).map_err(Error::Memory)?;
        self.base = crate::mem::map_file(&self.file, DIR_BYTES).map_err(Error::Memory)?;
        let prefix = format!("{}.", self.backing.prefix.trim_start_matches("/dev/shm/"));
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if let Ok(rd) = std::fs::read_dir("/dev/shm") {
            for e in rd.flatten() {
                if !e.file_name().to_string_lossy().starts_with(&prefix) {
                    continue;
                }
                // Only this user's files: another user's file is never removed.
                use std::os::unix::fs::MetadataExt;
                match std::fs::symlink_metadata(e.path()) {
                    Ok(m) if m.uid() == me => {
                        let _ = std::fs::remove_file(e.path());
                    }
                    Ok(m) => tracing::warn!(
                        path = %e.path().display(), owner = m.uid(),
                        "sim: leaving another user's file under the node prefix"
                    ),
                    Err(_) => {}
                }
            }
        }
        Ok(())
    }

    /// Takes the node lock, waiting at most the node's lock bound (one `fcntl` when free; see
    /// "The lock wait is bounded" in the module docs).
    ///
    /// # Errors
    /// [`Error::LockTimeout`] if another open file description holds it for the whole bound;
    /// [`Error::Memory`] if `fcntl` fails otherwise.
    #[inline]
    pub(crate) fn lock(&self) -> Result<NodeLock<'_>> {
        lock_byte(
            &self.file,
            LOCK_BYTE,
            NODE_LOCK,
            &self.path,
            self.lock_timeout,
        )?;
        Ok(NodeLock { dir: self })
    }

    /// Whether slot `s`'s liveness lock is held by some process other than us.
    fn liveness_held(&self, s: u32) -> bool {
        match ofd_lock(
            &self.file,
            LIVENESS_BASE + i64::from(s),
            libc::F_OFD_GETLK,
            libc::F_WRLCK,
        ) {
            Ok(fl) => i32::from(fl.l_type) != libc::F_UNLCK,
            Err(_) => true,
        }
    }

    /// Marks dead every alive peer slot whose liveness lock is gone; returns how many.
    pub(crate) fn check_liveness(&self) -> u32 {
        let mut n = 0;
        for s in 0..MAX_PROCS as u32 {
            if s == self.slot {
                continue;
            }
            let st = &self.proc_slot(s).state;
            if st.load(Ordering::Acquire) == slot_state::ALIVE && !self.liveness_held(s) {
                st.store(slot_state::DEAD, Ordering::Release);
                tracing::warn!(
                    slot = s,
                    pid = self.proc_slot(s).pid.load(Ordering::Relaxed),
                    "sim: a process of the node died; its QPs are unreachable"
                );
                n += 1;
            }
        }
        n
    }

    /// Hands out a node-unique LID, always a unicast LID (`1..0xc000`). The counter is in
    /// the shared header, so any value may be found there (issue 14): 0 (which the model
    /// reads as "address by GID") and values past the unicast range give `0xbfff`.
    pub(crate) fn alloc_lid(&self) -> u16 {
        let l = self.header().next_lid.fetch_add(1, Ordering::Relaxed);
        u16::try_from(l)
            .ok()
            .filter(|&l| (1..0xc000).contains(&l))
            .unwrap_or(0xbfff)
    }

    fn at<T>(&self, off: usize) -> &T {
        debug_assert!(off + std::mem::size_of::<T>() <= DIR_BYTES);
        debug_assert_eq!(off % std::mem::align_of::<T>(), 0);
        // SAFETY: `off` is inside the mapping (the callers index fixed tables) and aligned;
        // `T` is one of the repr(C) all-atomic structs above, valid for any bit pattern
        // (zero-initialised by the kernel), and only accessed through atomics.
        unsafe { &*self.base.as_ptr().add(off).cast::<T>() }
    }

    fn header(&self) -> &Header {
        self.at(0)
    }

    /// Slot `s` (< MAX_PROCS).
    pub(crate) fn proc_slot(&self, s: u32) -> &ProcSlot {
        self.at(SLOTS_OFF + (s as usize % MAX_PROCS) * ENTRY)
    }

    fn area(&self, s: u32) -> usize {
        AREAS_OFF + (s as usize % MAX_PROCS) * AREA_BYTES
    }

    /// Owner slot of a number with `bits` index bits (`None`: not a node number).
    pub(crate) fn owner(num: u32, bits: u32) -> Option<u32> {
        let s = num >> bits;
        (1..=MAX_PROCS as u32).contains(&s).then(|| s - 1)
    }

    /// The export of QP `qpn` (any slot).
    pub(crate) fn qp(&self, qpn: u32) -> Option<(u32, &QpExport)> {
        let s = Self::owner(qpn, QP_BITS)?;
        let i = qpn as usize & (QP_SLOTS - 1);
        Some((s, self.at(self.area(s) + QP_OFF + i * ENTRY)))
    }

    /// The export of CQ `cqn`.
    pub(crate) fn cq(&self, cqn: u32) -> Option<(u32, &CqExport)> {
        let s = Self::owner(cqn, CQ_BITS)?;
        let i = cqn as usize & (CQ_SLOTS - 1);
        Some((s, self.at(self.area(s) + CQ_OFF + i * ENTRY)))
    }

    /// The export of SRQ `srqn`.
    pub(crate) fn srq(&self, srqn: u32) -> Option<(u32, &SrqExport)> {
        let s = Self::owner(srqn, SRQ_BITS)?;
        let i = srqn as usize & (SRQ_SLOTS - 1);
        Some((s, self.at(self.area(s) + SRQ_OFF + i * ENTRY)))
    }

    /// The export of MR index `idx`.
    pub(crate) fn mr(&self, idx: u32) -> Option<(u32, &MrExport)> {
        let s = Self::owner(idx, MR_BITS)?;
        let i = idx as usize & (MR_SLOTS - 1);
        Some((s, self.at(self.area(s) + MR_OFF + i * ENTRY)))
    }

    /// Whether slot `s` is a running process.
    pub(crate) fn alive(&self, s: u32) -> bool {
        self.proc_slot(s).state.load(Ordering::Acquire) == slot_state::ALIVE
    }

    /// The pid of slot `s`.
    pub(crate) fn pid(&self, s: u32) -> u32 {
        self.proc_slot(s).pid.load(Ordering::Relaxed)
    }

    /// Tells slot `s` it has an `err_pending` to apply.
    pub(crate) fn poke(&self, s: u32) {
        self.proc_slot(s).attention.fetch_add(1, Ordering::Release);
    }

    /// Our attention counter.
    pub(crate) fn attention(&self) -> u32 {
        self.proc_slot(self.slot).attention.load(Ordering::Acquire)
    }
}

impl Drop for NodeDir {
    fn drop(&mut self) {
        // Leaving cannot fail: without the lock (held by someone else for the whole bound)
        // the slot is still marked LEFT, but the directory is not removed.
        let _guard = self.lock().ok();
        self.proc_slot(self.slot)
            .state
            .store(slot_state::LEFT, Ordering::Release);
        let _ = ofd_lock(
            &self.file,
            LIVENESS_BASE + i64::from(self.slot),
            libc::F_OFD_SETLK,
            libc::F_UNLCK,
        );
        let last = (0..MAX_PROCS as u32).all(|s| !self.alive(s) || !self.liveness_held(s));
        if last && _guard.is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
        drop(_guard);
        // SAFETY: the mapping is DIR_BYTES long, created in `join`, unmapped once; no
        // reference into it outlives `self` (the accessors borrow `self`).
        unsafe { libc::munmap(self.base.as_ptr().cast(), DIR_BYTES) };
    }
}

/// The segments of peers this model has mapped: `(pid, segment)` → `(start, length)`.
///
/// Looked up on every operation on a peer process's QP (its queues, CQ and memory regions),
/// so hashed with [`SegHasher`] rather than SipHash.
#[derive(Default)]
pub(crate) struct PeerMaps {
    maps: HashMap<(u32, u32), (usize, usize), BuildHasherDefault<SegHasher>>,
}

/// A multiply-rotate hasher for the `(pid, segment)` keys of [`PeerMaps`]: two multiplies per
/// key instead of SipHash's rounds. Not resistant to chosen collisions, which it need not be:
/// an entry is added only for a segment file that exists and passed the ownership checks
/// (this user's private regular file), so the map holds at most the segments this user's
/// processes created, and the keys a lookup uses come from the node directory (`pid` of a
/// slot, a segment number of an export), not from the network.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SegHasher(u64);

impl SegHasher {
    /// An odd 64-bit constant (2^64 / golden ratio): its product spreads every input bit into
    /// the high bits, which the table's control bytes and bucket index use.
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
}

impl Hasher for SegHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u32(u32::from(b));
        }
    }

    fn write_u32(&mut self, x: u32) {
        self.0 = (self.0.rotate_left(26) ^ u64::from(x)).wrapping_mul(Self::K);
    }

    fn finish(&self) -> u64 {
        // Fold the high half down too: hashbrown takes the bucket index from the low bits.
        self.0 ^ (self.0 >> 32)
    }
}

impl PeerMaps {
    /// Maps (or finds) segment `seg` of process `pid`; `None` if it no longer exists or is not
    /// this user's private regular file (see [`crate::mem::open_private`]).
    pub(crate) fn get(&mut self, backing: &Backing, pid: u32, seg: u32) -> Option<(usize, usize)> {
        if let Some(&m) = self.maps.get(&(pid, seg)) {
            return Some(m);
        }
        let path = backing.segment_path(pid, seg);
        // Owner, mode and type checked on the descriptor before mapping (a refusal is logged
        // and counted by `open_private`).
        let file = crate::mem::open_private(std::path::Path::new(&path)).ok()??;
        let len = usize::try_from(file.metadata().ok()?.len()).ok()?;
        if len == 0 {
            return None;
        }
        let p = crate::mem::map_file(&file, len).ok()?;
        let m = (p.as_ptr() as usize, len);
        self.maps.insert((pid, seg), m);
        Some(m)
    }
}

impl Drop for PeerMaps {
    fn drop(&mut self) {
        for &(p, len) in self.maps.values() {
            // SAFETY: each entry is a mapping made in `get`, unmapped once; the model that
            // owned the pointers into it is being dropped.
            unsafe { libc::munmap(p as *mut libc::c_void, len) };
        }
    }
}

/// State a joined model keeps about the node.
pub(crate) struct NodeLink {
    pub(crate) dir: std::sync::Arc<NodeDir>,
    pub(crate) maps: PeerMaps,
    /// When peers' liveness was last checked.
    pub(crate) last_check: Instant,
    /// Our attention counter as last handled.
    pub(crate) seen_attention: u32,
}

#[cfg(test)]
impl NodeLink {
    /// The peer segments mapped so far, `(start address, length)` (for `export_props`).
    pub(crate) fn maps_for_test(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.maps.maps.values().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg_hash(pid: u32, seg: u32) -> u64 {
        use std::hash::{BuildHasher, BuildHasherDefault};
        BuildHasherDefault::<SegHasher>::default().hash_one((pid, seg))
    }

    #[test]
    fn seg_hasher_spreads_pids_and_segments() {
        // Keys as they occur: a few hundred consecutive pids, small segment numbers.
        let mut all = std::collections::HashSet::new();
        let mut buckets = [0u32; 1024];
        for pid in 4000..4500u32 {
            for seg in 0..64u32 {
                let h = seg_hash(pid, seg);
                assert!(all.insert(h), "collision at ({pid}, {seg})");
                buckets[(h & 1023) as usize] += 1;
            }
        }
        // 32000 keys over 1024 low-bit buckets: mean 31.25.
        let (lo, hi) = (buckets.iter().min().unwrap(), buckets.iter().max().unwrap());
        assert!(*lo >= 10 && *hi <= 60, "uneven low bits: {lo}..{hi}");
        assert_ne!(
            seg_hash(1, 2),
            seg_hash(2, 1),
            "the order of the fields matters"
        );
    }
    use crate::sim::SimConfig;
    use crate::sim::model::Model;

    fn name(tag: &str) -> String {
        format!("unit-{tag}-{}", std::process::id())
    }

    fn cleanup(n: &str) {
        let _ = std::fs::remove_file(format!("/dev/shm/mlx5sim.{n}"));
    }

    #[test]
    fn bad_names_and_foreign_files_are_refused() {
        for bad in ["", "a/b", "x.y", &"n".repeat(101)] {
            assert!(
                matches!(
                    NodeDir::join(bad, DEFAULT_NODE_LOCK_TIMEOUT),
                    Err(Error::InvalidArgument(_))
                ),
                "{bad:?}"
            );
        }
        // A file of another size: not ours, left alone.
        let n = name("size");
        {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(format!("/dev/shm/mlx5sim.{n}"))
                .and_then(|mut f| f.write_all(b"hello"))
                .unwrap();
        }
        let e = NodeDir::join(&n, DEFAULT_NODE_LOCK_TIMEOUT)
            .err()
            .expect("refused");
        assert!(
            e.to_string().contains("not a version-1 node directory"),
            "{e}"
        );
        // The right size with a wrong magic.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/dev/shm/mlx5sim.{n}"))
            .unwrap();
        f.set_len(DIR_BYTES as u64).unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(b"NOTANODE", 0).unwrap();
        assert!(matches!(
            NodeDir::join(&n, DEFAULT_NODE_LOCK_TIMEOUT),
            Err(Error::InvalidArgument(_))
        ));
        cleanup(&n);
    }

    #[test]
    fn slots_liveness_and_the_last_leaver() {
        let n = name("live");
        let a = NodeDir::join(&n, DEFAULT_NODE_LOCK_TIMEOUT).unwrap();
        let b = NodeDir::join(&n, DEFAULT_NODE_LOCK_TIMEOUT).unwrap();
        assert_eq!((a.slot, b.slot), (0, 1));
        assert_ne!(a.alloc_lid(), b.alloc_lid());
        assert_eq!(a.check_liveness(), 0, "b holds its liveness lock");
        // b's lock vanishes as when its process dies: a marks it dead, once.
        ofd_lock(&b.file, LIVENESS_BASE + 1, libc::F_OFD_SETLK, libc::F_UNLCK).unwrap();
        assert_eq!(a.check_liveness(), 1);
        assert!(!a.alive(1));
        assert_eq!(a.check_liveness(), 0);
        drop(b);
        assert!(std::path::Path::new(&format!("/dev/shm/mlx5sim.{n}")).exists());
        drop(a);
        assert!(
            !std::path::Path::new(&format!("/dev/shm/mlx5sim.{n}")).exists(),
            "the last process to leave removes the directory"
        );
    }

    #[test]
    fn a_stale_directory_is_wiped_with_its_segments() {
        let n = name("stale");
        let path = format!("/dev/shm/mlx5sim.{n}");
        {
            let a = NodeDir::join(&n, DEFAULT_NODE_LOCK_TIMEOUT).unwrap();
            // Pretend a crash: the slot stays ALIVE, its lock goes.
            ofd_lock(&a.file, LIVENESS_BASE, libc::F_OFD_SETLK, libc::F_UNLCK).unwrap();
            a.proc_slot(0).pid.store(1, Ordering::Relaxed);
            std::mem::forget(a); // no Drop: the directory keeps the "alive" slot
        }
        let seg = format!("{path}.1.7");
        std::fs::write(&seg, b"orphan").unwrap();
        let b = NodeDir::join(&n, DEFAULT_NODE_LOCK_TIMEOUT).unwrap();
        assert_eq!(b.slot, 0, "wiped: slot 0 is free again");
        assert!(
            !std::path::Path::new(&seg).exists(),
            "orphan segment removed"
        );
        drop(b);
        cleanup(&n);
    }

    #[test]
    fn corrupt_exports_are_unreachable_and_counted() {
        let n = name("corrupt");
        let me = std::sync::Arc::new(NodeDir::join(&n, DEFAULT_NODE_LOCK_TIMEOUT).unwrap());
        let peer = NodeDir::join(&n, DEFAULT_NODE_LOCK_TIMEOUT).unwrap();
        let lid = peer.alloc_lid();
        let mut model = Model::new(SimConfig::default());
        model.node = Some(crate::sim::target::link(me.clone()));
        let qpn = ((peer.slot + 1) << QP_BITS) | 5;
        let (_, e) = peer.qp(qpn).unwrap();
        // Not live: simply unreachable, not counted.
        assert!(model.resolve(lid, None, qpn).is_none());
        assert_eq!(model.stats.remote_bad_exports, 0);
        e.lid.store(u32::from(lid), Ordering::Relaxed);
        e.state.store(qp_state::RTS, Ordering::Relaxed);
        e.rq_wqe_cnt.store(3, Ordering::Relaxed); // not a power of two
        e.rq_stride.store(16, Ordering::Relaxed);
        e.live.store(1, Ordering::Release);
        assert!(model.resolve(lid, None, qpn).is_none());
        assert_eq!(model.stats.remote_bad_exports, 1);
        // Plausible sizes, but the segments do not exist.
        e.rq_wqe_cnt.store(4, Ordering::Relaxed);
        e.rq_seg.store(12345, Ordering::Relaxed);
        assert!(model.resolve(lid, None, qpn).is_none());
        assert_eq!(model.stats.remote_bad_exports, 2);
        // An SRQ number owned by another slot.
        e.srq
            .store(((me.slot + 1) << SRQ_BITS) | 1, Ordering::Relaxed);
        assert!(model.resolve(lid, None, qpn).is_none());
        assert_eq!(model.stats.remote_bad_exports, 3);
        // Another LID: not addressed there, not counted.
        assert!(model.resolve(lid + 1, None, qpn).is_none());
        assert_eq!(model.stats.remote_bad_exports, 3);
        drop(model);
        drop(peer);
        drop(me);
        cleanup(&n);
    }

    /// Writes `bytes` into a new file `path` with exactly `mode`.
    fn write_file(path: &str, bytes: &[u8], mode: u32) {
        use std::io::Write;
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .unwrap();
        f.write_all(bytes).unwrap();
        f.set_permissions(std::fs::Permissions::from_mode(mode))
            .unwrap();
    }

    fn mode_of(path: &str) -> u32 {
        use std::os::unix::fs::MetadataExt;
        std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
    }

    fn is_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    /// Runs `f` on a thread; panics if it has not returned within `limit` (so that a call
    /// that blocks forever fails the test instead of hanging it).
    fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(limit)
            .unwrap_or_else(|_| panic!("did not return within {limit:?}: a stall"))
    }

    #[test]
    fn the_directory_is_created_0600_whatever_the_umask() {
        let n = name("umask");
        let path = format!("/dev/shm/mlx5sim.{n}");
        // SAFETY: umask has no preconditions; restored at once. (Other tests of this binary
        // that create files set their modes explicitly or through `create_private`.)
        let old = unsafe { libc::umask(0) };
        let d = NodeDir::join(&n, DEFAULT_NODE_LOCK_TIMEOUT);
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        let d = d.unwrap();
        assert_eq!(mode_of(&path), 0o600);
        drop(d);
        cleanup(&n);
    }

    #[test]
    fn a_directory_with_group_or_other_bits_or_a_symlink_is_refused() {
        for (tag, mode) in [("m644", 0o644), ("m660", 0o660), ("m606", 0o606)] {
            let n = name(tag);
            let path = format!("/dev/shm/mlx5sim.{n}");
            write_file(&path, b"", mode);
            let before = crate::mem::unsafe_files_refused();
            let e = NodeDir::join(&n, DEFAULT_NODE_LOCK_TIMEOUT)
                .err()
                .expect("refused");
            match &e {
                Error::UnsafeFile {
                    path: p,
                    mode: m,
                    owner,
                    ..
                } => {
                    assert_eq!((p.as_str(), *m), (path.as_str(), mode));
                    // SAFETY: `geteuid` has no preconditions and cannot fail.
                    assert_eq!(*owner, unsafe { libc::geteuid() });
                }
                other => panic!("{tag}: expected UnsafeFile, got {other}"),
            }
            assert!(e.to_string().contains(&format!("mode {mode:04o}")), "{e}");
            assert!(crate::mem::unsafe_files_refused() > before);
            assert_eq!(mode_of(&path), mode, "left alone");
            cleanup(&n);
        }
        let n = name("link");
        let path = format!("/dev/shm/mlx5sim.{n}");
        let target = format!("/dev/shm/mlx5sim.{n}-target");
        write_file(&target, b"", 0o600);
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let e = NodeDir::join(&n, DEFAULT_NODE_LOCK_TIMEOUT)
            .err()
            .expect("refused");
        assert!(
            matches!(&e, Error::UnsafeFile { reason, .. } if reason.contains("symbolic link")),
            "{e}"
        );
        cleanup(&n);
        let _ = std::fs::remove_file(&target);
    }

    #[test]
    fn another_users_directory_and_segments_are_refused_and_left() {
        if !is_root() {
            eprintln!("skipped: needs root (chowns files to uid 65534 for another user)");
            return;
        }
        let n = name("foreign");
        let path = format!("/dev/shm/mlx5sim.{n}");
        write_file(&path, b"", 0o600);
        std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
        let e = NodeDir::join(&n, DEFAULT_NODE_LOCK_TIMEOUT)
            .err()
            .expect("refused");
        assert!(matches!(&e, Error::UnsafeFile { owner: 65534, .. }), "{e}");
        assert!(e.to_string().contains("owner uid 65534"), "{e}");
        cleanup(&n);

        // A stale directory of ours is wiped, but another user's file under its prefix stays.
        let n = name("wipe-foreign");
        let path = format!("/dev/shm/mlx5sim.{n}");
        {
            let a = NodeDir::join(&n, DEFAULT_NODE_LOCK_TIMEOUT).unwrap();
            ofd_lock(&a.file, LIVENESS_BASE, libc::F_OFD_SETLK, libc::F_UNLCK).unwrap();
            std::mem::forget(a);
        }
        let foreign = format!("{path}.1.9");
        write_file(&foreign, b"theirs", 0o600);
        std::os::unix::fs::chown(&foreign, Some(65534), Some(65534)).unwrap();
        let b = NodeDir::join(&n, DEFAULT_NODE_LOCK_TIMEOUT).unwrap();
        assert_eq!(b.slot, 0, "wiped");
        assert_eq!(std::fs::read(&foreign).unwrap(), b"theirs", "never removed");
        // And a peer never maps it as a segment.
        let mut maps = PeerMaps::default();
        assert!(maps.get(&b.backing, 1, 9).is_none());
        drop(b);
        let _ = std::fs::remove_file(&foreign);
        cleanup(&n);
    }

    #[test]
    fn a_peer_segment_with_group_or_other_bits_is_not_mapped() {
        let n = name("seg");
        let backing = Backing {
            prefix: format!("/dev/shm/mlx5sim.{n}"),
        };
        let good = backing.segment_path(4242, 1);
        let bad = backing.segment_path(4242, 2);
        write_file(&good, &[7u8; 4096], 0o600);
        write_file(&bad, &[7u8; 4096], 0o644);
        let mut maps = PeerMaps::default();
        assert!(maps.get(&backing, 4242, 1).is_some(), "0600: mapped");
        let before = crate::mem::unsafe_files_refused();
        assert!(maps.get(&backing, 4242, 2).is_none(), "0644: refused");
        assert_eq!(crate::mem::unsafe_files_refused(), before + 1);
        drop(maps);
        let _ = std::fs::remove_file(&good);
        let _ = std::fs::remove_file(&bad);
    }

    #[test]
    fn a_foreign_lock_on_the_node_byte_makes_join_fail_within_its_bound() {
        let n = name("held");
        let path = format!("/dev/shm/mlx5sim.{n}");
        let mut a = NodeDir::join(&n, DEFAULT_NODE_LOCK_TIMEOUT).unwrap();
        // Someone else (another open file description, read-only, as any user who can open
        // the file could) holds a read lock on byte 0.
        let other = std::fs::File::open(&path).unwrap();
        ofd_lock(&other, LOCK_BYTE, libc::F_OFD_SETLK, libc::F_RDLCK).unwrap();
        let bound = Duration::from_millis(100);
        let n2 = n.clone();
        let (r, waited) = within(Duration::from_secs(10), move || {
            let t0 = Instant::now();
            let r = NodeDir::join(&n2, bound).map(|_| ());
            (r, t0.elapsed())
        });
        match r {
            Err(Error::LockTimeout {
                lock,
                path: p,
                waited: w,
                bound: b,
            }) => {
                assert_eq!((lock, p.as_str(), b), (NODE_LOCK, path.as_str(), bound));
                assert!(w >= bound && waited >= bound, "{w:?}");
            }
            other => panic!("expected LockTimeout, got {other:?}"),
        }
        assert!(waited < bound + Duration::from_secs(2), "{waited:?}");
        // `a`'s own lock (an operation of a joined process) fails the same way.
        let t0 = Instant::now();
        a.lock_timeout = bound;
        assert!(matches!(a.lock(), Err(Error::LockTimeout { .. })));
        assert!(t0.elapsed() >= bound && t0.elapsed() < bound + Duration::from_secs(2));
        drop(other);
        // Released: joining works again.
        let b = NodeDir::join(&n, bound).unwrap();
        drop((a, b));
        cleanup(&n);
    }
}
