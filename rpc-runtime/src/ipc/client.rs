//! The client side: [`Ipc`] claims a client block, writes requests into its SPSC request ring
//! and reads responses from its SPSC response ring (seeds/004 §1.3 "ipc Client", §4.4 steps 1
//! and 3, §7).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::fence;
use std::time::{Duration, Instant};

use super::error::IpcError;
use super::header::{self, Header};
use super::layout::*;
use super::shm::{self, Map};
use crate::error::RpcError;

/// Empty polls with calls in flight between two reads of the clock for the server-liveness
/// check (which runs every `liveness_interval` of the server's header).
///
/// Small on purpose: a waiting client's polls are paced by its backoff, which yields the
/// core, and on a loaded machine a yield can take tens of ms; with 256 polls per clock read a
/// killed server was found only after 5 s (after the call's deadline) with six busy threads
/// on two cores. 16 bounds the detection at 16 yields past `liveness_interval`, and a clock
/// read (about 25 ns) every 16 idle polls costs nothing a waiting client needs.
const EMPTY_POLLS_PER_CLOCK: u32 = 16;

/// Client-side counters; every field counts events since attach.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IpcClientStats {
    /// Requests published.
    pub sent: u64,
    /// Responses delivered to their call.
    pub delivered: u64,
    /// Responses whose tag matched no call in flight (a duplicate, a reply to an earlier use
    /// of the slot, a corrupted tag): dropped, never delivered to another call.
    pub stale_responses: u64,
    /// Responses with a length over the response capacity: delivered to their call as an
    /// empty message (which fails to decode).
    pub corrupt_responses: u64,
    /// Times this client found its response ring corrupt (`resp_head` more than `depth` ahead
    /// of `resp_tail`, or behind it).
    pub ring_faults: u64,
    /// Sleeps in [`Ipc::sleep_for_response`] (woken, timed out, or the word changed before the
    /// wait).
    pub idle_waits: u64,
    /// Times this client woke the server after its sends (module docs, "Sleeping").
    pub server_wakes: u64,
}

/// Client transport over an ipc segment in `/dev/shm` (seeds/004 §1.3).
///
/// `KvClient::<Ipc>::connect("kv0")` attaches to `/dev/shm/kv0`. Up to `depth` calls may be
/// in flight ([`crate::ClientTransport::max_in_flight`]); `send` returns [`RpcError::WouldBlock`]
/// beyond that (per-client back-pressure, seeds/004 §2.3 "ring ベース (per-client)"). Dropping
/// it detaches (the server reclaims the block).
#[derive(Debug)]
pub struct Ipc {
    path: PathBuf,
    /// Own open file description: holds the OFD lock on this block's record line.
    file: File,
    map: Map,
    pub(super) layout: Layout,
    pub(super) hdr: Header,
    client: u32,
    owner: u64,
    block: usize,
    /// Requests published (local copy of `req_head`).
    req_head: u64,
    /// Responses consumed (local copy of `resp_tail`).
    resp_tail: u64,
    /// Per token: tag of the call in flight on it, or `NO_CALL`.
    calls: Box<[u32]>,
    /// Free tokens (stack).
    free: Vec<u32>,
    /// Per-call sequence number (upper bits of tags).
    seq: u32,
    /// `log2(depth)`.
    shift: u32,
    gone: bool,
    fault: Option<(u32, &'static str)>,
    empty_polls: u32,
    next_liveness_check: Option<Instant>,
    stats: IpcClientStats,
    /// Requests were published since the last check of the server's sleep word.
    unchecked_sends: bool,
    /// `FUTEX_WAIT` was refused once: `sleep_for_response` no longer sleeps.
    sleep_unsupported: bool,
    /// [`OFF_CLIENT_SLEEP_ARMED`] is stored.
    armed: bool,
    /// When a typed blocking call sleeps (`ClientTransport::wait_for_response`); `None`: never.
    pub(super) call_wait: Option<crate::erpc::idle::CallWait>,
}

const NO_CALL: u32 = u32::MAX;

/// What [`Ipc::arm_sleep`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ArmSleep {
    /// The word is armed: sleep on it, then `end_sleep`.
    Armed,
    /// A response (or a reason to fail) is there: poll.
    NotNow,
    /// No sleep now (the first call only arms the server's checks) or ever (the server is
    /// gone, `FUTEX_WAIT` was refused).
    Refused,
}

/// The blocking wait of a client of several servers (an [`Ipc`] connection each), as
/// `ClientTransport::wait_for_response` is for one: if the first connection's policy says so
/// for a client whose polls found nothing for `waited` (`CallWait`; never from a pinned
/// thread), one `futex_waitv` over the words of the connections with calls in flight (at
/// most 8), so that a response on any ends it; a sleep of at most `bound`. Returns `true` if
/// it slept (counted on each connection waited on) or a response is there, `false` without
/// sleeping (the policy, no call in flight, more than 8 such connections, or a connection
/// that cannot sleep now: the first sleep of each only arms its server's checks).
pub fn sleep_for_any_response<'a>(
    clients: impl IntoIterator<Item = &'a mut Ipc>,
    waited: Duration,
    bound: Duration,
) -> bool {
    // The cold path of an idle client (its policy said sleep): the two small allocations per
    // sleep are on no hot path.
    let mut v: Vec<&mut Ipc> = clients.into_iter().filter(|c| c.in_flight() > 0).collect();
    if v.is_empty() || v.len() > crate::futex::WAIT_ANY_MAX || !v[0].call_wait_blocks(waited) {
        return false;
    }
    let mut armed = 0;
    let mut outcome = None;
    for c in v.iter_mut() {
        match c.arm_sleep() {
            ArmSleep::Armed => armed += 1,
            ArmSleep::NotNow => {
                outcome = Some(true);
                break;
            }
            ArmSleep::Refused => {
                outcome = Some(false);
                break;
            }
        }
    }
    let end = match outcome {
        Some(_) => crate::futex::WaitEnd::Returned,
        None => {
            let words: Vec<&std::sync::atomic::AtomicU32> =
                v.iter().map(|c| c.sleep_word()).collect();
            crate::futex::wait_any(&words, bound)
        }
    };
    let mut slept = outcome.is_none();
    for c in v.iter_mut().take(armed) {
        if outcome.is_none() {
            slept &= c.end_sleep(end);
        } else {
            c.sleep_word().store(0, Relaxed);
        }
    }
    outcome.unwrap_or(slept)
}

impl Ipc {
    /// Attaches to `/dev/shm/<name>`: checks the file (regular, owned by this euid, mode 0600)
    /// and its header before mapping it, checks that a live server holds it, and claims a free
    /// client block (lock its record line, then CAS its owner word `FREE(g)` → `ACTIVE(g,
    /// pid)`).
    ///
    /// # Errors
    /// [`IpcError::InvalidName`]; [`IpcError::Io`] (`NotFound` if no such file);
    /// [`IpcError::UnsafeFile`]; [`IpcError::BadMagic`], [`IpcError::UnsupportedVersion`],
    /// [`IpcError::CorruptHeader`]; [`IpcError::NoServer`] (shut down or dead);
    /// [`IpcError::NoFreeSlot`].
    pub fn attach(name: &str) -> Result<Self, IpcError> {
        let (_, path) = shm::shm_path(name)?;
        let Some(file) = shm::open_checked(&path, true)? else {
            return Err(shm::io_err(&path, "open")(
                std::io::ErrorKind::NotFound.into(),
            ));
        };
        let hdr = header::read_and_validate(&file, &path)?;
        let layout = hdr.layout;
        let map = Map::new(&file, layout.total_size).map_err(shm::io_err(&path, "mmap"))?;
        if map.u8(OFF_SERVER_ALIVE).load(Acquire) != 1
            || !shm::locked_by_other(&file, 0, SERVER_LOCK_LEN)
        {
            return Err(IpcError::NoServer { path });
        }
        let pid = std::process::id();
        for c in 0..layout.params.max_clients {
            let block = layout.block(c);
            let owner = map.u64(block + CB_OWNER).load(Acquire);
            if owner_state(owner) != STATE_FREE {
                continue;
            }
            if !shm::try_lock(&file, block as u64, RECORD_SIZE)
                .map_err(shm::io_err(&path, "fcntl"))?
            {
                continue;
            }
            let mine = owner_word(STATE_ACTIVE, owner_gen(owner), pid);
            if map
                .u64(block + CB_OWNER)
                .compare_exchange(owner, mine, AcqRel, Relaxed)
                .is_err()
            {
                let _ = shm::unlock(&file, block as u64, RECORD_SIZE);
                continue;
            }
            let depth = layout.params.depth;
            return Ok(Ipc {
                req_head: map.u64(block + CB_REQ_HEAD).load(Acquire),
                resp_tail: map.u64(block + CB_RESP_TAIL).load(Acquire),
                path,
                file,
                map,
                layout,
                hdr,
                client: c,
                owner: mine,
                block,
                calls: vec![NO_CALL; depth as usize].into_boxed_slice(),
                free: (0..depth).rev().collect(),
                seq: 0,
                shift: depth.trailing_zeros(),
                gone: false,
                fault: None,
                empty_polls: 0,
                next_liveness_check: None,
                stats: IpcClientStats::default(),
                unchecked_sends: false,
                sleep_unsupported: false,
                armed: false,
                call_wait: Some(crate::erpc::idle::CallWait::new(
                    crate::erpc::idle::IdleConfig::default(),
                    crate::erpc::idle::usable_cpus(),
                )),
            });
        }
        Err(IpcError::NoFreeSlot {
            path,
            max_clients: layout.params.max_clients,
        })
    }

    /// The client block this client owns.
    pub fn client_index(&self) -> u32 {
        self.client
    }

    /// The file attached to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The segment's layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The schema fingerprint in the header.
    pub fn fingerprint(&self) -> u64 {
        self.hdr.fingerprint
    }

    /// Counters since attach.
    pub fn stats(&self) -> &IpcClientStats {
        &self.stats
    }

    /// Calls in flight (sent, response not yet delivered).
    pub fn in_flight(&self) -> usize {
        self.calls.len() - self.free.len()
    }

    /// Fails with the fault recorded by the server or this client, or with
    /// `ServerDisconnected` after a clean shutdown or a detected death.
    #[inline]
    fn check(&mut self) -> Result<(), RpcError> {
        if self.gone {
            return Err(RpcError::ServerDisconnected);
        }
        if self.map.u8(OFF_SERVER_ALIVE).load(Acquire) != 1 {
            return Err(self.server_gone());
        }
        if let Some((code, reason)) = self.fault {
            return Err(self.fault_error(code, reason));
        }
        let code = self.map.u32(self.block + CB_FAULT).load(Acquire);
        if code != 0 {
            let reason = match code {
                FAULT_HEAD => "the server found req_head out of range",
                FAULT_RESP_TAIL => "the server found resp_tail out of range",
                _ => "the server's fault word holds an unknown code",
            };
            return Err(self.faulted(code, reason));
        }
        Ok(())
    }

    #[cold]
    fn server_gone(&mut self) -> RpcError {
        self.gone = true;
        RpcError::ServerDisconnected
    }

    #[cold]
    fn faulted(&mut self, code: u32, reason: &'static str) -> RpcError {
        if self.fault.is_none() {
            self.fault = Some((code, reason));
            if code == 0 {
                self.stats.ring_faults += 1;
            }
        }
        self.fault_error(code, reason)
    }

    #[cold]
    fn fault_error(&self, code: u32, reason: &'static str) -> RpcError {
        RpcError::from(IpcError::ClientFault {
            path: self.path.clone(),
            client: self.client,
            code,
            reason,
        })
    }

    /// Publishes one request: `encode` writes the message into the slot (a buffer of the
    /// request capacity) and returns its length. Returns the call's token (`0..depth`). Never
    /// waits.
    ///
    /// # Errors
    /// [`RpcError::WouldBlock`] with `depth` calls in flight, or while the server has not
    /// released the request slots (nothing sent); [`RpcError::MessageTooLarge`] if `encode`
    /// returns more than the capacity (nothing sent); [`RpcError::ServerDisconnected`];
    /// [`RpcError::Transport`] with [`IpcError::ClientFault`].
    #[inline]
    pub fn try_send(&mut self, encode: impl FnOnce(&mut [u8]) -> usize) -> Result<u32, RpcError> {
        self.check()?;
        let Some(&token) = self.free.last() else {
            return Err(RpcError::WouldBlock);
        };
        let depth = u64::from(self.layout.params.depth);
        let tail = self.map.u64(self.block + CB_REQ_TAIL).load(Acquire);
        let used = self.req_head.wrapping_sub(tail);
        if used >= depth {
            if used > depth {
                return Err(self.faulted(0, "req_tail is ahead of req_head or too far behind"));
            }
            return Err(RpcError::WouldBlock);
        }
        let cap = self.layout.params.req_cap as usize;
        let slot = self.layout.req_slot(self.client, self.req_head);
        let ptr = self.map.bytes(slot + SLOT_PAYLOAD, cap);
        // SAFETY: in bounds (checked by `bytes`); position `req_head` is at least one lap ahead
        // of everything the server may still read (`req_head - req_tail < depth`), so only this
        // client touches the slot until `req_head` is published past it.
        let len = encode(unsafe { std::slice::from_raw_parts_mut(ptr, cap) });
        if len > cap {
            return Err(RpcError::MessageTooLarge {
                len,
                cap,
                setting: crate::error::SETTING_SERVICE_MAX,
            });
        }
        self.free.pop();
        let tag = (self.seq << self.shift) | token;
        self.seq = self.seq.wrapping_add(1) & (u32::MAX >> self.shift);
        self.calls[token as usize] = tag;
        self.map.u32(slot + SLOT_LEN).store(len as u32, Relaxed);
        self.map.u32(slot + SLOT_TAG).store(tag, Relaxed);
        self.req_head += 1;
        self.map
            .u64(self.block + CB_REQ_HEAD)
            .store(self.req_head, Release);
        self.stats.sent += 1;
        self.unchecked_sends = true;
        Ok(token)
    }

    /// The client's half of the server's sleep (module docs, "Sleeping"), once per poll after
    /// sends: if the server may sleep at all ([`OFF_SLEEP_ARMED`]), one SeqCst fence after
    /// the sends, then its sleep word; a sleeping server is woken.
    #[inline]
    fn wake_check(&mut self) {
        self.unchecked_sends = false;
        if self.map.u32(OFF_SLEEP_ARMED).load(Relaxed) != 0 {
            self.wake_server();
        }
    }

    #[cold]
    #[inline(never)]
    fn wake_server(&mut self) {
        fence(SeqCst);
        let word = self.map.u32(OFF_SERVER_SLEEP);
        if word.load(Relaxed) != 0 && crate::futex::wake(word) {
            self.stats.server_wakes += 1;
        }
    }

    /// Blocks until a response to one of this client's calls may have arrived, at most
    /// `bound` (module docs, "Sleeping": the block's word [`CB_RESP_SLEEP`], which the server
    /// checks after its round of replies). For a caller whose polls found nothing; the
    /// caller decides when to sleep (e.g. `rpc::erpc::idle::CallWait`).
    ///
    /// Returns `true` if it slept (counted in [`IpcClientStats::idle_waits`]) or a response is
    /// already there, `false` without sleeping: at the first call (it arms the server's
    /// checks, [`OFF_CLIENT_SLEEP_ARMED`], and sleeps from the next call on), with no call in
    /// flight, the server gone or a fault recorded (the next poll reports it), or once
    /// `FUTEX_WAIT` was refused. A server that died or stopped leaves the sleep to its bound;
    /// the polls then check its liveness.
    pub fn sleep_for_response(&mut self, bound: Duration) -> bool {
        if self.free.len() == self.calls.len() {
            return false;
        }
        match self.arm_sleep() {
            ArmSleep::Armed => {}
            ArmSleep::NotNow => return true,
            ArmSleep::Refused => return false,
        }
        let end = crate::futex::wait(self.sleep_word(), bound);
        self.end_sleep(end)
    }

    /// The first half of [`sleep_for_response`](Self::sleep_for_response) (also for a client
    /// of several servers, [`sleep_for_any_response`]): arms the block's word unless a
    /// response (or a reason to fail) is there.
    pub(super) fn arm_sleep(&mut self) -> ArmSleep {
        if self.gone || self.sleep_unsupported {
            return ArmSleep::Refused;
        }
        if !self.armed {
            // The first time: arm the server's checks, do not sleep yet.
            self.armed = true;
            self.map.u32(OFF_CLIENT_SLEEP_ARMED).store(1, SeqCst);
            return ArmSleep::Refused;
        }
        if self.unchecked_sends {
            self.wake_check();
        }
        let word = self.map.u32(self.block + CB_RESP_SLEEP);
        word.swap(1, SeqCst);
        fence(SeqCst);
        if self.map.u64(self.block + CB_RESP_HEAD).load(Acquire) != self.resp_tail
            || self.map.u8(OFF_SERVER_ALIVE).load(Acquire) != 1
            || self.map.u32(self.block + CB_FAULT).load(Acquire) != 0
        {
            word.store(0, Relaxed);
            return ArmSleep::NotNow;
        }
        ArmSleep::Armed
    }

    /// The block's sleep word.
    pub(super) fn sleep_word(&self) -> &std::sync::atomic::AtomicU32 {
        self.map.u32(self.block + CB_RESP_SLEEP)
    }

    /// The second half: disarms the word and counts the sleep; `false` (and never again)
    /// if the kernel refused it.
    pub(super) fn end_sleep(&mut self, end: crate::futex::WaitEnd) -> bool {
        self.sleep_word().store(0, Relaxed);
        if end == crate::futex::WaitEnd::Unsupported {
            self.sleep_unsupported = true;
            return false;
        }
        self.stats.idle_waits += 1;
        true
    }

    /// Delivers up to `max` arrived responses as `on_response(token, message)` and returns how
    /// many. A response whose tag matches no call in flight is dropped and counted
    /// ([`IpcClientStats::stale_responses`]). Never waits.
    ///
    /// # Errors
    /// [`RpcError::ServerDisconnected`] after a clean shutdown (checked every call), or, with
    /// calls in flight and nothing arrived, once no process holds the server's lock (checked
    /// every `liveness_interval`); [`RpcError::Transport`] with [`IpcError::ClientFault`].
    #[inline]
    pub fn poll_up_to(
        &mut self,
        max: usize,
        mut on_response: impl FnMut(u32, &[u8]),
    ) -> Result<usize, RpcError> {
        if self.unchecked_sends {
            self.wake_check();
        }
        let head = self.map.u64(self.block + CB_RESP_HEAD).load(Acquire);
        let avail = head.wrapping_sub(self.resp_tail);
        if avail == 0 {
            if self.free.len() == self.calls.len() {
                return Ok(0);
            }
            self.check()?;
            self.check_server_alive()?;
            return Ok(0);
        }
        if avail > u64::from(self.layout.params.depth) {
            return Err(self.faulted(0, "resp_head is behind resp_tail or too far ahead"));
        }
        let cap = self.layout.params.resp_cap;
        let mask = self.layout.params.depth - 1;
        let mut n = 0;
        while self.resp_tail != head && n < max {
            let slot = self.layout.resp_slot(self.client, self.resp_tail);
            let len = self.map.u32(slot + SLOT_LEN).load(Relaxed);
            let tag = self.map.u32(slot + SLOT_TAG).load(Relaxed);
            let token = tag & mask;
            if self.calls[token as usize] != tag {
                self.stats.stale_responses += 1;
                tracing::debug!(client = self.client, tag, "ipc: stale response dropped");
            } else {
                self.calls[token as usize] = NO_CALL;
                self.free.push(token);
                n += 1;
                self.stats.delivered += 1;
                if len > cap {
                    self.stats.corrupt_responses += 1;
                    on_response(token, &[]);
                } else {
                    let ptr = self.map.bytes(slot + SLOT_PAYLOAD, len as usize);
                    // SAFETY: in bounds (checked); the server wrote this slot before publishing
                    // `resp_head` past it (Acquire above) and does not write it again until
                    // this client publishes `resp_tail` past it.
                    on_response(token, unsafe {
                        std::slice::from_raw_parts(ptr, len as usize)
                    });
                }
            }
            self.resp_tail += 1;
        }
        self.map
            .u64(self.block + CB_RESP_TAIL)
            .store(self.resp_tail, Release);
        self.empty_polls = 0;
        Ok(n)
    }

    /// With calls in flight and nothing arrived: every [`EMPTY_POLLS_PER_CLOCK`] such polls,
    /// and at most every `liveness_interval`, checks that a process holds the server's lock.
    #[inline]
    fn check_server_alive(&mut self) -> Result<(), RpcError> {
        self.empty_polls += 1;
        if self.empty_polls < EMPTY_POLLS_PER_CLOCK {
            return Ok(());
        }
        self.empty_polls = 0;
        self.liveness_slow()
    }

    #[cold]
    fn liveness_slow(&mut self) -> Result<(), RpcError> {
        let now = Instant::now();
        match self.next_liveness_check {
            Some(t) if now < t => return Ok(()),
            None => {
                self.next_liveness_check = Some(now + self.hdr.liveness);
                return Ok(());
            }
            Some(_) => {}
        }
        self.next_liveness_check = Some(now + self.hdr.liveness);
        if shm::locked_by_other(&self.file, 0, SERVER_LOCK_LEN) {
            Ok(())
        } else {
            Err(self.server_gone())
        }
    }

    /// Turns the sleeps of typed blocking calls on (`Some`, the default: `CallWait` with
    /// `IdleConfig::default()`) or off (`None`: a waiting call polls and yields).
    pub fn set_call_wait(&mut self, policy: Option<crate::erpc::idle::CallWait>) {
        self.call_wait = policy;
    }

    /// The sleep policy's counters (`None` if off).
    pub fn call_wait_stats(&self) -> Option<crate::erpc::idle::CallWaitStats> {
        self.call_wait
            .as_ref()
            .map(crate::erpc::idle::CallWait::stats)
    }

    /// The server's liveness interval from the header.
    pub fn liveness_interval(&self) -> Duration {
        self.hdr.liveness
    }
}

impl Drop for Ipc {
    fn drop(&mut self) {
        let detached = owner_word(STATE_DETACHED, owner_gen(self.owner), owner_pid(self.owner));
        let _ = self
            .map
            .u64(self.block + CB_OWNER)
            .compare_exchange(self.owner, detached, Release, Relaxed);
        let _ = shm::unlock(&self.file, self.block as u64, RECORD_SIZE);
    }
}
