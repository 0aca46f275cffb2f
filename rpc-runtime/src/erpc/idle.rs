//! What an event loop does after an iteration that found nothing: poll on for a while, then
//! block in the transport until a datagram arrives (adaptive spin-then-block).
//!
//! eRPC's dispatch thread polls without pause on a core of its own (seeds/000 §12.1), and
//! [`Endpoint::run_event_loop_once`](super::event_loop::Endpoint::run_event_loop_once) is
//! that poll. Where cores are shared, a thread that polls while it waits for its peer holds
//! the CPU the peer needs to answer: with busy-polling client and server threads and one
//! unrelated busy process on this two-core machine, `erpc_bench large --idle poll` fell to
//! 0.01-0.6× tarpc's goodput (which blocks in `epoll`), client and server taking turns in
//! scheduler time slices of milliseconds and moving one credit window per slice.
//!
//! [`SpinThenBlock`] decides, iteration by iteration, whether to poll on or to block. It is a
//! sans-I/O state machine driven by the caller's clock ([`Time`], ns) and by samples of the
//! machine's run queue the caller takes ([`runnable_threads`]), so its rules are tested in
//! virtual time. [`Endpoint::idle_wait`](super::event_loop::Endpoint::idle_wait) applies it,
//! blocking in [`DatagramTransport::rx_wait`](super::datagram::DatagramTransport::rx_wait).
//!
//! # The rules
//! 1. **Poll window.** An idle episode starts at the first iteration that found nothing. The
//!    loop polls on until the episode is `window` ns old, then blocks. Any iteration with work
//!    ends the episode ([`SpinThenBlock::busy`]). The window starts at 0.
//! 2. **Adapting the window**, as KVM adapts its halt-polling window for a halted vCPU
//!    (Linux `Documentation/virt/kvm/halt-polling.rst`). A block that ended for a datagram
//!    with the whole wait (polling and block) within [`IdleConfig::max_spin`] is one a longer
//!    window would have caught without a sleep and wake-up: the window doubles, from
//!    [`IdleConfig::grow_start`] up to `max_spin`. A wait longer than `max_spin` means
//!    polling would have been wasted: the window halves, and below `grow_start` it is 0. A
//!    block that ended at its bound (a timer) says nothing of when datagrams come and leaves
//!    the window.
//! 3. **Oversubscription** (this project's rule). While more threads are runnable on the
//!    machine than this process may use CPUs ([`runnable_threads`] above
//!    `std::thread::available_parallelism`), a polling thread takes CPU time from a runnable
//!    one, possibly the one that would produce the awaited datagram. The loop then yields its
//!    CPU [`IdleConfig::oversubscribed_yields`] times (4) and blocks, and rule 2 is
//!    suspended: a block is then short because blocking gave the CPU away, and growing the
//!    window on it would walk back into the trap. A yield lets the threads queued on the
//!    loop's own CPU run (often the peer, which answers before the loop needs a wake-up); a
//!    block leaves the CPU idle, so the scheduler can move a thread waiting on the other CPU,
//!    behind a busy process, to it. The run queue is sampled
//!    every [`IdleConfig::sample_interval`] of idle polling, and the rule holds while two
//!    samples in a row are above the CPUs. A single one is often transient (some thread ran
//!    for a moment): acting on each put about 1 % of small calls on the quiet machine behind
//!    a wake-up (0.9-1.3 % of the client's waits blocked in `erpc_bench echo --qd 1`, p99
//!    23-31 µs against polling's 15-18 µs); with two in a row, 0-0.1 % and 16.4-16.6 µs.
//!
//! A block itself is bounded by the caller (the next protocol timer, and
//! [`IdleConfig::max_block`]), never by this module.
//!
//! # A blocking call ([`CallWait`])
//! The typed client's blocking call (`rpc::Client`, generated stubs) waits for one response.
//! It polls and, once crossbeam's `Backoff` has spun 7 rounds and yielded 4 times without
//! a response, asks the transport
//! ([`ClientTransport::wait_for_response`](crate::client::ClientTransport::wait_for_response)),
//! which for eRPC over UDP blocks in the socket if [`CallWait`] says so, else yields again:
//! 4. **Blocking call.** Block while the machine is oversubscribed (rule 3's samples, taken
//!    at most every `sample_interval` while a call waits), or once the call has waited
//!    [`IdleConfig::max_spin`] without any response (a slow handler: polling on would only
//!    burn a CPU). Otherwise poll and yield on: on a quiet machine a block costs its wake-up.
//!
//! 5. **Pinned threads never sleep** on a shared-memory word ([`may_migrate`]): the
//!    delegation ring's and ipc's sleeps (`rpc::delegation`, module `sleep`; `rpc::ipc`,
//!    "Sleeping"; the `kv` daemons' `NodeDaemon::wait_for_work`) are taken only by a thread
//!    whose affinity allows more than one CPU. A thread pinned to a CPU that a busy process
//!    shares is woken on that CPU only, and there it waits for the busy process's time slice
//!    (our reading of the figures, not traced in the scheduler): `kv --backend direct`
//!    with pinned daemon and client next to `while :; do :; done` fell from 1.28-1.34 Mops/s
//!    (polling) to 0.007-0.008 Mops/s with p50 4 ms when both slept. Unpinned, a few sleeps
//!    let the scheduler move the waiting thread to the CPU left idle: 1.56-1.59 Mops/s and
//!    p99.9 4 ms polling, 1.88-2.01 Mops/s and p99.9 74-109 µs sleeping (2 runs each,
//!    `kv --duration 2 --backend direct --no-pin`). eRPC's blocks (rules 1-4) are not
//!    subject to this rule; they were measured with unpinned threads only.
//!
//! Why it helps (an explanation that fits the figures below, not traced in the scheduler):
//! `yield` only lets the threads of the caller's own CPU run. Next to a busy process, the
//! server thread can wait on the other CPU, behind the busy process, while the client spins
//! and yields on its own; it then runs when that process's time slice ends, 4 ms later here
//! (the p99.9 of polling below). A client that blocks leaves its CPU idle, and the scheduler
//! can move the waiting server thread there; a few blocks per 10 000 calls remove that tail.
//! Measured (`cargo run --release --example typed_blocking --
//! --rounds 6`, 8 B `ping`, one client and one server thread, the two policies alternated
//! round by round): next to `while :; do :; done`, 76-80 k calls/s with p99.9 45-50 µs in
//! every round, against 20-77 k calls/s when polling and yielding, whose p99.9 was 4.0 ms in
//! 5 of the 6 rounds; the client blocked 1-7 times per 10 000 calls. On the quiet machine the
//! same within the rounds' spread (158-175 k against 149-173 k calls/s, p50 5.3-5.6 µs
//! against 5.3-6.2 µs).
//!
//! A first version (not kept) blocked at the first empty poll while oversubscribed, as the
//! event loop does: next to the busy process it fell to 9.8-10.5 k calls/s in 4 of 5 runs,
//! p50 100 µs (a figure not explained). Yielding first answers most calls without a block.
//!
//! Rule 3 replaced a first version's signal, the thread's involuntary context switches
//! (`getrusage`): a server thread on the quiet machine is preempted about 50 times a second
//! (a loaded one about 100), so that signal blocked often on a quiet machine too (8 MiB
//! goodput 0.50-1.13× tarpc instead of 1.30-1.45× polling).
//!
//! # Measured
//! `erpc_bench large --duration 1 --idle adaptive|poll` (eRPC goodput / tarpc's in the same
//! run, 64 KiB / 1 MiB / 8 MiB, 8 alternated runs, this 2-core VM):
//! - next to one busy process: 1.18-1.37× / 0.45-2.36× / 0.83-2.26× (7 and 6 of the 8 runs
//!   at 1 MiB and 8 MiB above 1.0×) against polling's 0.04-0.35× / 0.20-0.52× /
//!   0.11-0.80×; 32 B echo (`echo --qd 1,32`, 2 runs) 1.81-1.90× tarpc at QD 1 and
//!   5.06-5.29× at QD 32, against 0.70-0.84× and 1.68-1.81×;
//! - quiet: 4.50-5.28× / 1.65-1.78× / 1.21-1.39× against 4.70-5.65× / 1.62-1.92× /
//!   1.25-1.50×; echo the same within the runs' spread (4 runs: QD 1 15.6-18.0× tarpc
//!   against 16.4-18.2×, QD 32 10.5-11.1× against 7.7-11.4×).
//!
//! Before rule 3 yielded (it blocked at the first idle iteration), the same busy-neighbour
//! runs measured 0.58-0.64× / 0.81-1.20× / 1.18-1.34× and echo 0.70× (QD 1) and 2.8-3.0×
//! (QD 32): each exchange paid a wake-up that a yield often avoids.
//!
//! The README's eRPC section has the echo figures next to a busy process.

use std::io::Read;
use std::time::Duration;

use super::core::Time;

/// Settings of [`SpinThenBlock`]. All times in ns of the caller's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdleConfig {
    /// Largest poll window, ns (rule 2's cap; also the longest wait counted as short).
    /// Default 200 µs: longer than a credit window's round trip of 9 KB datagrams on UDP
    /// loopback (20-40 µs here), so a quiet machine keeps polling through a large message.
    pub max_spin: Time,
    /// The window a grow starts from when it is 0, ns. Default 10 µs.
    pub grow_start: Time,
    /// Longest single block, ns, whatever the timers: the caller wakes at least this often.
    /// Default 1 ms.
    pub max_block: Time,
    /// Interval between two samples of the run queue (rule 3), ns of idle polling. A sample
    /// costs a read of `/proc/loadavg` (a few µs). Default 5 ms.
    pub sample_interval: Time,
    /// Yields of the CPU (`sched_yield`) an idle episode makes before it blocks while the
    /// machine is oversubscribed (rule 3). Default 4, as many as the typed client's
    /// `crossbeam_utils::Backoff` makes before its blocking call may block.
    pub oversubscribed_yields: u32,
}

impl Default for IdleConfig {
    fn default() -> Self {
        IdleConfig {
            max_spin: 200_000,
            grow_start: 10_000,
            max_block: 1_000_000,
            sample_interval: 5_000_000,
            oversubscribed_yields: 4,
        }
    }
}

/// Counters of a [`SpinThenBlock`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IdleStats {
    /// Blocks begun (rules 1 and 3).
    pub blocks: u64,
    /// Blocks that ended at their bound (a timer or `max_block`), not for a datagram.
    pub timeouts: u64,
    /// Blocks begun because the machine was oversubscribed (rule 3), after the episode's
    /// yields.
    pub oversubscribed_blocks: u64,
    /// Yields of the CPU while oversubscribed (rule 3).
    pub yields: u64,
    /// Run-queue samples taken (rule 3).
    pub samples: u64,
    /// Samples that found the machine oversubscribed.
    pub oversubscribed_samples: u64,
}

/// Rule 3's run-queue samples: whether the machine is oversubscribed (more threads
/// runnable than this process may use CPUs, in two samples in a row). Shared by
/// [`SpinThenBlock`] and [`CallWait`].
#[derive(Clone, Debug)]
pub struct Oversubscription {
    /// CPUs this process may use (the threshold).
    cpus: u32,
    /// Interval between two samples, ns.
    interval: Time,
    /// The last two samples found more runnable threads than `cpus`.
    holds: bool,
    /// The last sample did.
    last_over: bool,
    /// When the next sample is due (`None`: none taken yet).
    next_sample: Option<Time>,
    /// Samples taken, and those above `cpus`.
    samples: u64,
    over_samples: u64,
}

impl Oversubscription {
    /// No sample yet (not oversubscribed) for a process that may use `cpus` CPUs (at least
    /// 1), sampling every `interval` ns.
    pub fn new(cpus: u32, interval: Time) -> Self {
        Oversubscription {
            cpus: cpus.max(1),
            interval,
            holds: false,
            last_over: false,
            next_sample: None,
            samples: 0,
            over_samples: 0,
        }
    }

    /// Whether a sample is due at `now` (none taken yet, or `interval` since the last).
    #[inline]
    pub fn sample_due(&self, now: Time) -> bool {
        self.next_sample.is_none_or(|t| now >= t)
    }

    /// A sample at `now`: `runnable` threads on the machine, the caller included (`None`:
    /// unknown, treated as not oversubscribed, and it breaks a run of samples above).
    pub fn sampled(&mut self, now: Time, runnable: Option<u32>) {
        self.next_sample = Some(now.saturating_add(self.interval));
        self.samples += 1;
        let over = runnable.is_some_and(|r| r > self.cpus);
        if over {
            self.over_samples += 1;
        }
        self.holds = over && self.last_over;
        self.last_over = over;
    }

    /// Takes a sample with `runnable` (e.g. [`runnable_threads`]) if one is due at `now`;
    /// returns [`holds`](Self::holds).
    #[inline]
    pub fn check(&mut self, now: Time, runnable: impl FnOnce() -> Option<u32>) -> bool {
        if self.sample_due(now) {
            self.sampled(now, runnable());
        }
        self.holds
    }

    /// Whether the last two samples found the machine oversubscribed.
    #[inline]
    pub fn holds(&self) -> bool {
        self.holds
    }

    /// Samples taken so far.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Samples that found more runnable threads than CPUs.
    pub fn oversubscribed_samples(&self) -> u64 {
        self.over_samples
    }
}

/// The spin-then-block decision of an event loop (see the [module docs](self)).
#[derive(Clone, Debug)]
pub struct SpinThenBlock {
    cfg: IdleConfig,
    /// Current poll window, ns.
    window: Time,
    /// Start of the current idle episode (`None`: the last iteration had work).
    idle_since: Option<Time>,
    /// Rule 3.
    over: Oversubscription,
    /// Yields made in the current idle episode (rule 3).
    yields: u32,
    stats: IdleStats,
}

/// What a loop does after an iteration that found nothing ([`SpinThenBlock::idle`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleAction {
    /// Poll on (a spin-loop hint, then the next iteration).
    Poll,
    /// Give the CPU to another runnable thread (`std::thread::yield_now`), then iterate.
    Yield,
    /// Block in the transport until a datagram may be waiting.
    Block,
}

impl SpinThenBlock {
    /// A policy with window 0 for a process that may use `cpus` CPUs (at least 1).
    pub fn new(cfg: IdleConfig, cpus: u32) -> Self {
        SpinThenBlock {
            cfg,
            window: 0,
            idle_since: None,
            over: Oversubscription::new(cpus, cfg.sample_interval),
            yields: 0,
            stats: IdleStats::default(),
        }
    }

    /// The settings.
    pub fn config(&self) -> IdleConfig {
        self.cfg
    }

    /// The current poll window, ns.
    pub fn window(&self) -> Time {
        self.window
    }

    /// Whether the last run-queue sample found the machine oversubscribed (rule 3).
    pub fn oversubscribed(&self) -> bool {
        self.over.holds()
    }

    /// The counters.
    pub fn stats(&self) -> IdleStats {
        IdleStats {
            samples: self.over.samples(),
            oversubscribed_samples: self.over.oversubscribed_samples(),
            ..self.stats
        }
    }

    /// An iteration found work: the idle episode (if any) ends.
    #[inline]
    pub fn busy(&mut self) {
        self.idle_since = None;
        self.yields = 0;
    }

    /// Whether a run-queue sample is due at `now` (the first idle iteration, then every
    /// `sample_interval`); the caller then takes one and reports it with
    /// [`sampled`](Self::sampled) before calling [`idle`](Self::idle).
    #[inline]
    pub fn sample_due(&self, now: Time) -> bool {
        self.over.sample_due(now)
    }

    /// A run-queue sample at `now`: `runnable` threads on the machine, the caller included
    /// (`None`: unknown, treated as not oversubscribed).
    pub fn sampled(&mut self, now: Time, runnable: Option<u32>) {
        self.over.sampled(now, runnable);
    }

    /// An iteration at `now` found nothing: what to do next. Oversubscribed (rule 3):
    /// [`IdleAction::Yield`] for the episode's first `oversubscribed_yields` iterations,
    /// then [`IdleAction::Block`]. Otherwise [`IdleAction::Block`] once the episode is at
    /// least `window` ns old (rule 1), else [`IdleAction::Poll`].
    #[inline]
    pub fn idle(&mut self, now: Time) -> IdleAction {
        let since = *self.idle_since.get_or_insert(now);
        if self.over.holds() {
            if self.yields < self.cfg.oversubscribed_yields {
                self.yields += 1;
                self.stats.yields += 1;
                return IdleAction::Yield;
            }
            return IdleAction::Block;
        }
        if now.saturating_sub(since) >= self.window {
            IdleAction::Block
        } else {
            IdleAction::Poll
        }
    }

    /// The caller blocked (after [`idle`](Self::idle) said [`IdleAction::Block`]) and woke
    /// at `now`,
    /// because a datagram may have arrived (`ready`) or because the block's bound passed.
    /// Adapts the window (rule 2, unless rule 3 holds) to the whole wait, polling included
    /// (the episode's age at `now`, as KVM measures a halt), and starts a new idle episode.
    pub fn woke(&mut self, now: Time, ready: bool) {
        let waited = self
            .idle_since
            .take()
            .map_or(0, |since| now.saturating_sub(since));
        self.yields = 0;
        self.stats.blocks += 1;
        if !ready {
            self.stats.timeouts += 1;
        }
        if self.over.holds() {
            self.stats.oversubscribed_blocks += 1;
        } else if ready && waited > self.cfg.max_spin {
            self.window /= 2;
            if self.window < self.cfg.grow_start {
                self.window = 0;
            }
        } else if ready && waited > self.window {
            // A window of `waited` would have caught this wake without the block.
            self.window = (self.window * 2)
                .max(self.cfg.grow_start)
                .min(self.cfg.max_spin);
        }
    }
}

/// Counters of a [`CallWait`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallWaitStats {
    /// Times [`CallWait::should_block`] said to block.
    pub blocks: u64,
    /// Of those, because the machine was oversubscribed (the rest: the call had waited
    /// `max_spin`).
    pub oversubscribed_blocks: u64,
    /// Run-queue samples taken.
    pub samples: u64,
}

/// Whether a blocking call that found no response in its polls should block in the
/// transport until a datagram arrives (the module docs' "A blocking call"): only when the
/// machine is oversubscribed (rule 3), or when the call has waited
/// [`IdleConfig::max_spin`] already. Driven by the caller's clock ([`Time`], ns); asked
/// only after the caller's own spin-then-yield backoff (the typed client's
/// `crossbeam_utils::Backoff`) has completed. A loop with its own backoff (the `kv`
/// benchmark's eRPC daemons) applies it the same way, with the time since its last work.
#[derive(Clone, Debug)]
pub struct CallWait {
    cfg: IdleConfig,
    over: Oversubscription,
    stats: CallWaitStats,
}

impl CallWait {
    /// A policy for a process that may use `cpus` CPUs; of `cfg`, `max_spin` and
    /// `sample_interval` apply.
    pub fn new(cfg: IdleConfig, cpus: u32) -> Self {
        CallWait {
            cfg,
            over: Oversubscription::new(cpus, cfg.sample_interval),
            stats: CallWaitStats::default(),
        }
    }

    /// The settings.
    pub fn config(&self) -> IdleConfig {
        self.cfg
    }

    /// At `now`, a call that has polled without a response for `waited` ns (its backoff
    /// completed): `true` if it should block now. Takes a run-queue sample with `runnable`
    /// when one is due.
    #[inline]
    pub fn should_block(
        &mut self,
        now: Time,
        waited: Time,
        runnable: impl FnOnce() -> Option<u32>,
    ) -> bool {
        let over = self.over.check(now, runnable);
        if !over && waited < self.cfg.max_spin {
            return false;
        }
        self.stats.blocks += 1;
        if over {
            self.stats.oversubscribed_blocks += 1;
        }
        true
    }

    /// The counters.
    pub fn stats(&self) -> CallWaitStats {
        CallWaitStats {
            samples: self.over.samples(),
            ..self.stats
        }
    }
}

/// How long a loop may block at `now` (ns), given the earliest pending protocol deadline
/// `next_timer` (`None`: none armed): at most `max` ns, and `None` if a deadline is due or
/// `max` is 0 (the loop must not block).
pub fn block_bound(now: Time, next_timer: Option<Time>, max: Time) -> Option<Duration> {
    let until_timer = next_timer.map_or(Time::MAX, |t| t.saturating_sub(now));
    let ns = until_timer.min(max);
    (ns > 0).then(|| Duration::from_nanos(ns))
}

/// Threads runnable on the machine now, the caller included: the first number of the fourth
/// field of `/proc/loadavg` ("running/total" scheduling entities, Linux `proc(5)`). `None` if
/// the file cannot be read or parsed (not Linux, no `/proc`). Rule 3's sample; reads into a
/// stack buffer, no allocation.
pub fn runnable_threads() -> Option<u32> {
    let mut buf = [0u8; 128];
    let mut f = std::fs::File::open("/proc/loadavg").ok()?;
    let n = f.read(&mut buf).ok()?;
    parse_runnable(&buf[..n])
}

/// The running count of a `/proc/loadavg` line (`"0.50 0.40 0.30 3/120 4567\n"` → 3).
fn parse_runnable(line: &[u8]) -> Option<u32> {
    let s = std::str::from_utf8(line).ok()?;
    s.split_ascii_whitespace()
        .nth(3)?
        .split_once('/')?
        .0
        .parse()
        .ok()
}

/// Whether the calling thread may run on more than one CPU (its `sched_getaffinity(2)`
/// mask); `true` if the mask cannot be read. Rule 5 of the module docs: a thread pinned to
/// one CPU must not sleep on a shared-memory word, since its wake-up waits for that CPU.
pub fn may_migrate() -> bool {
    // SAFETY: `cpu_set_t` is plain data (all zeroes is an empty set); the call writes at most
    // `size_of::<cpu_set_t>()` bytes into it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return true;
        }
        libc::CPU_COUNT(&set) > 1
    }
}

/// Nanoseconds on a process-wide monotonic clock (since its first reading), for a
/// [`CallWait`] whose caller has no clock of its own (the shared-memory transports).
pub fn idle_clock() -> Time {
    static BASE: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let base = *BASE.get_or_init(std::time::Instant::now);
    Time::try_from(base.elapsed().as_nanos()).unwrap_or(Time::MAX)
}

/// [`may_migrate`], read once per thread and remembered (an affinity changed later is not
/// seen): for checks on paths that run often.
pub fn thread_may_migrate() -> bool {
    thread_local! {
        static MIGRATES: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
    }
    MIGRATES.with(|m| {
        m.get().unwrap_or_else(|| {
            let v = may_migrate();
            m.set(Some(v));
            v
        })
    })
}

/// CPUs this process may use (`std::thread::available_parallelism`: the affinity mask and
/// cgroup quota), 1 if unknown.
pub fn usable_cpus() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_pinned_to_one_cpu_may_not_migrate() {
        std::thread::spawn(|| {
            // SAFETY: plain data; `sched_getaffinity`/`sched_setaffinity` of this thread.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                let size = std::mem::size_of::<libc::cpu_set_t>();
                assert_eq!(libc::sched_getaffinity(0, size, &mut set), 0);
                let n = libc::CPU_COUNT(&set);
                assert_eq!(may_migrate(), n > 1);
                let first = (0..libc::CPU_SETSIZE as usize)
                    .find(|&c| libc::CPU_ISSET(c, &set))
                    .unwrap();
                let mut one: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(first, &mut one);
                assert_eq!(libc::sched_setaffinity(0, size, &one), 0);
            }
            assert!(!may_migrate());
            assert!(!thread_may_migrate());
        })
        .join()
        .unwrap();
    }

    const US: Time = 1_000;
    const MS: Time = 1_000_000;

    /// Whether the idle iteration at `t` blocks (polls otherwise: yields are rule 3's, and
    /// tested there).
    fn blocks(p: &mut SpinThenBlock, t: Time) -> bool {
        match p.idle(t) {
            IdleAction::Block => true,
            IdleAction::Poll => false,
            IdleAction::Yield => panic!("a yield outside rule 3"),
        }
    }

    /// `n` episodes, 1 ms apart from time 0, each woken by a datagram 190 µs in (short: the
    /// window grows each time, up to its cap).
    fn short_episodes(p: &mut SpinThenBlock, n: u64) {
        for k in 0..n {
            episode(p, k * MS, 190 * US);
        }
    }

    fn policy() -> SpinThenBlock {
        SpinThenBlock::new(IdleConfig::default(), 2)
    }

    /// An idle episode from `start` that blocks once the window is over and wakes for a
    /// datagram after a wait of `waited` (polling included) in all.
    fn episode(p: &mut SpinThenBlock, start: Time, waited: Time) {
        assert!(!blocks(p, start) || p.window() == 0);
        assert!(
            blocks(p, start + p.window()),
            "blocks when the window is over"
        );
        p.woke(start + waited, true);
    }

    #[test]
    fn the_first_idle_iteration_blocks_and_short_waits_grow_the_window_to_its_cap() {
        let mut p = policy();
        assert!(blocks(&mut p, 0), "window 0: block at once");
        p.woke(190 * US, true);
        let mut windows = vec![p.window() / US];
        for k in 1..8 {
            episode(&mut p, k * MS, 190 * US);
            windows.push(p.window() / US);
        }
        assert_eq!(windows, [10, 20, 40, 80, 160, 200, 200, 200]);
        assert_eq!(p.stats().blocks, 8);
    }

    #[test]
    fn the_loop_polls_until_the_episode_is_window_old_and_work_ends_the_episode() {
        let mut p = policy();
        episode(&mut p, 0, 100 * US);
        episode(&mut p, MS, 100 * US);
        assert_eq!(p.window(), 20 * US);
        assert!(!blocks(&mut p, 2_000 * US));
        assert!(!blocks(&mut p, 2_019 * US));
        assert!(blocks(&mut p, 2_020 * US));
        p.woke(2_030 * US, true);
        assert_eq!(
            p.window(),
            40 * US,
            "woken 10 µs into the block: 30 µs > 20 µs"
        );
        // Work in between: the episode restarts at the next idle iteration.
        assert!(!blocks(&mut p, 3_000 * US));
        p.busy();
        assert!(!blocks(&mut p, 3_015 * US));
        assert!(!blocks(&mut p, 3_054 * US));
        assert!(blocks(&mut p, 3_055 * US));
    }

    #[test]
    fn long_waits_halve_the_window_down_to_zero() {
        let mut p = policy();
        short_episodes(&mut p, 6);
        assert_eq!(p.window(), 200 * US);
        let mut windows = Vec::new();
        for k in 6..12 {
            episode(&mut p, k * MS, 900 * US);
            windows.push(p.window() / US);
        }
        assert_eq!(windows, [100, 50, 25, 12, 0, 0]);
    }

    #[test]
    fn a_wake_within_the_window_leaves_it() {
        let mut p = policy();
        short_episodes(&mut p, 4);
        assert_eq!(p.window(), 80 * US);
        // Woken right at the window's end: a longer window would not have helped.
        episode(&mut p, 5 * MS, 80 * US);
        assert_eq!(p.window(), 80 * US);
        episode(&mut p, 6 * MS, 150 * US);
        assert_eq!(p.window(), 160 * US);
    }

    #[test]
    fn a_wait_that_ended_at_its_bound_leaves_the_window() {
        let mut p = policy();
        episode(&mut p, 0, 190 * US);
        assert_eq!(p.window(), 10 * US);
        // Timed out: short (a timer 30 µs away) or long (max_block), nothing is learned.
        for (k, waited) in [(1, 40 * US), (2, 1_010 * US)] {
            assert!(!blocks(&mut p, k * 10 * MS));
            assert!(blocks(&mut p, k * 10 * MS + 10 * US));
            p.woke(k * 10 * MS + waited, false);
            assert_eq!(p.window(), 10 * US);
        }
        assert_eq!(p.stats().blocks, 3);
        assert_eq!(p.stats().timeouts, 2);
    }

    #[test]
    fn an_oversubscribed_machine_yields_then_blocks_and_freezes_the_window() {
        let mut p = policy();
        assert!(p.sample_due(0), "the first idle iteration samples");
        p.sampled(0, Some(2));
        assert!(!p.oversubscribed(), "2 runnable on 2 CPUs");
        assert!(!p.sample_due(4 * MS));
        for k in 0..3 {
            episode(&mut p, k * US * 500, 190 * US);
        }
        assert_eq!(p.window(), 40 * US);
        // One sample above the CPUs (a kernel thread woke): not yet.
        assert!(p.sample_due(5 * MS));
        p.sampled(5 * MS, Some(3));
        assert!(!p.oversubscribed(), "one sample is not enough");
        p.sampled(10 * MS, Some(2));
        p.sampled(15 * MS, Some(3));
        assert!(!p.oversubscribed(), "nor two apart");
        p.sampled(20 * MS, Some(4));
        assert!(p.oversubscribed(), "two in a row");
        // Yields 4 times, then blocks, whatever the window; short waits do not grow it.
        for k in 0..4 {
            let t = 21 * MS + k * 100 * US;
            for y in 0..4 {
                assert_eq!(p.idle(t + y), IdleAction::Yield, "yield {y} of episode {k}");
            }
            assert_eq!(p.idle(t + 4), IdleAction::Block);
            p.woke(t + 20 * US, true);
            assert_eq!(p.window(), 40 * US);
        }
        // Work ends an episode and its yields with it.
        assert_eq!(p.idle(22 * MS), IdleAction::Yield);
        p.busy();
        assert_eq!(p.idle(22 * MS + US), IdleAction::Yield);
        p.busy();
        assert_eq!(p.stats().oversubscribed_blocks, 4);
        assert_eq!(p.stats().yields, 18);
        // The next sample finds room again: rules 1 and 2 as before.
        assert!(!p.sample_due(24 * MS));
        assert!(p.sample_due(25 * MS));
        p.sampled(25 * MS, Some(1));
        assert!(!p.oversubscribed());
        assert!(!blocks(&mut p, 26 * MS));
        assert!(blocks(&mut p, 26 * MS + 40 * US));
        assert_eq!(p.stats().samples, 6);
        assert_eq!(p.stats().oversubscribed_samples, 3);
        // An unknown count is not oversubscription.
        p.sampled(30 * MS, Some(3));
        p.sampled(35 * MS, None);
        assert!(!p.oversubscribed());
        p.sampled(40 * MS, Some(3));
        assert!(!p.oversubscribed(), "the unknown sample broke the run");
    }

    #[test]
    fn a_blocking_call_blocks_when_oversubscribed_or_after_max_spin() {
        let mut w = CallWait::new(IdleConfig::default(), 2);
        // Quiet machine: the call polls and yields on until it has waited 200 µs.
        assert!(!w.should_block(0, 5 * US, || Some(2)));
        assert!(!w.should_block(US, 199 * US, || unreachable!("not due yet")));
        assert!(w.should_block(2 * US, 200 * US, || unreachable!("not due yet")));
        assert_eq!(w.stats().samples, 1);
        // Two samples in a row above the CPUs: every call blocks once its backoff is over.
        assert!(!w.should_block(5 * MS, 5 * US, || Some(3)), "one sample");
        assert!(w.should_block(10 * MS, 5 * US, || Some(3)), "two in a row");
        assert!(w.should_block(11 * MS, 0, || unreachable!("not due yet")));
        // Room again.
        assert!(!w.should_block(15 * MS, 5 * US, || Some(2)));
        assert!(!w.should_block(20 * MS, 5 * US, || Some(3)));
        assert!(
            !w.should_block(25 * MS, 5 * US, || None),
            "unknown breaks the run"
        );
        assert_eq!(
            w.stats(),
            CallWaitStats {
                blocks: 3,
                oversubscribed_blocks: 2,
                samples: 6,
            }
        );
    }

    #[test]
    fn the_sampler_needs_two_samples_in_a_row() {
        let mut o = Oversubscription::new(0, 5 * MS);
        assert!(o.sample_due(0));
        assert!(!o.check(0, || Some(2)), "cpus 0 counts as 1; one sample");
        assert!(!o.check(MS, || unreachable!("not due")));
        assert!(o.check(5 * MS, || Some(2)));
        assert_eq!((o.samples(), o.oversubscribed_samples()), (2, 2));
    }

    #[test]
    fn a_block_is_bounded_by_the_next_timer_and_max_block() {
        let max = IdleConfig::default().max_block;
        assert_eq!(
            block_bound(100, None, max),
            Some(Duration::from_nanos(1_000_000))
        );
        assert_eq!(
            block_bound(100, Some(10_100), max),
            Some(Duration::from_nanos(10_000))
        );
        assert_eq!(
            block_bound(100, Some(5_000_000), max),
            Some(Duration::from_nanos(1_000_000))
        );
        assert_eq!(block_bound(100, Some(100), max), None, "a timer is due");
        assert_eq!(block_bound(100, Some(50), max), None, "a timer is overdue");
    }

    #[test]
    fn the_running_count_of_proc_loadavg() {
        assert_eq!(parse_runnable(b"0.50 0.40 0.30 3/120 4567\n"), Some(3));
        assert_eq!(parse_runnable(b"1.47 1.43 1.41 12/80 31192"), Some(12));
        assert_eq!(parse_runnable(b"0.50 0.40 0.30 3-120 4567\n"), None);
        assert_eq!(parse_runnable(b"0.50 0.40"), None);
        assert_eq!(parse_runnable(b"\xff\xfe"), None);
        // This thread is running while it reads the file.
        assert!(runnable_threads().expect("/proc/loadavg") >= 1);
        assert!(usable_cpus() >= 1);
    }
}
