//! A ready-made serve loop: [`Server::spawn`] moves a server to its own thread, which calls
//! [`Server::serve_once`] until told to stop, and returns a [`ServerHandle`] to stop it
//! ([`ServerHandle::stop`], or dropping the handle) and to get the server back
//! ([`ServerHandle::join`]).
//!
//! # Idle policy
//!
//! [`IdlePolicy::Backoff`] (the default) keeps an idle server from burning a core: after a
//! round that handled no request the thread first spins and yields a few times
//! ([`crossbeam_utils::Backoff`], a few microseconds), then parks for 50 µs, doubling each
//! further empty round up to `max_sleep` (default 1 ms); any handled request resets it. The
//! cost is latency on an idle server: the first request after a quiet period waits for the
//! thread to wake, at most `max_sleep` plus the OS timer slack (Linux: 50 µs by default), so
//! about 1.05 ms with the defaults. While requests keep coming (a round finds one at least
//! every few microseconds) no sleep happens. A transport that can wait for its requests
//! ([`ServerTransport::wait_for_request`]: eRPC over UDP, in its socket; the delegation ring
//! and ipc, on their futex words) waits there instead of parking, so an idle server wakes for the first
//! request at once; it then sees
//! [`ServerHandle::stop`] after that wait (at most `max_sleep`) rather than at the unpark.
//! Transports that do background work in
//! [`ServerTransport::poll`] (eRPC retransmissions and sessions, liveness probes) get it done
//! at least every `max_sleep` while idle. ScaleRPC with several connection groups switches
//! groups from `poll`, so a parked server ends a time slice up to `max_sleep` late: the
//! calls of the waiting groups are delayed, never lost (the typed test
//! `clients_in_small_groups_switch_during_the_run` runs three groups with 300 µs slices on the
//! default backoff). For slices much shorter than 1 ms, lower `max_sleep` or use
//! [`IdlePolicy::BusyPoll`].
//!
//! [`IdlePolicy::BusyPoll`] never sleeps nor yields (a `spin_loop` hint between empty rounds):
//! the lowest latency, at the price of one core at 100% for as long as the server runs. Use it
//! for benchmarks on dedicated cores.
//!
//! # Stopping
//!
//! [`ServerHandle::stop`] sets a flag and unparks the thread; the thread sees it before its
//! next round, so it ends after the round in progress (whose requests are all answered: a
//! round answers every request it receives). Requests that arrive later are not served; the
//! transport is dropped with the [`Server`] unless [`ServerHandle::join`] takes it back. A
//! handler that never returns keeps the thread from ending: join and drop wait for the
//! handler's current call.
//!
//! # Panics in the handler
//!
//! A panic in the handler (or in the transport) ends the serve loop; the thread catches it,
//! drops the server (so clients see the server gone, or their deadline) and
//! [`ServerHandle::join`] returns [`RunError::HandlerPanicked`] (or
//! [`RunError::TransportPanicked`]) with the panic message and the counters at that point.
//! Dropping the handle of such a server logs the error (`tracing::error!`) and returns.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, JoinHandle, Thread};
use std::time::Duration;

use crossbeam_utils::Backoff;

use crate::server::{Server, ServerStats, ServerTransport};
use crate::service::Service;
use crate::wire::WireError;

/// The first park of an idle [`IdlePolicy::Backoff`] server, doubled each further empty
/// round up to `max_sleep`. 50 µs is Linux's default timer slack: a shorter park would not
/// be shorter in practice.
pub const FIRST_SLEEP: Duration = Duration::from_micros(50);

/// What the serve thread does after a round that handled no request. See the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdlePolicy {
    /// Spin and yield briefly, then park for [`FIRST_SLEEP`], doubling up to `max_sleep`
    /// (wall time; `Duration::ZERO` means never park: spin, then yield each empty round).
    /// An idle server answers its first request up to `max_sleep` (+ timer slack) late.
    Backoff {
        /// Longest park between two rounds of an idle server.
        max_sleep: Duration,
    },
    /// Poll continuously with a `spin_loop` hint between empty rounds: lowest latency, one
    /// core fully used. For benchmarks.
    BusyPoll,
}

impl Default for IdlePolicy {
    /// `Backoff { max_sleep: 1 ms }`.
    fn default() -> Self {
        IdlePolicy::Backoff {
            max_sleep: Duration::from_millis(1),
        }
    }
}

/// How [`Server::spawn_with`] runs the serve loop.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunnerConfig {
    /// What to do between rounds that found no request (default: [`IdlePolicy::Backoff`],
    /// 1 ms).
    pub idle: IdlePolicy,
    /// Name of the serve thread (default: `rpc-<service name>`).
    pub thread_name: Option<String>,
}

impl RunnerConfig {
    /// The default configuration with [`IdlePolicy::BusyPoll`].
    pub fn busy_poll() -> Self {
        RunnerConfig {
            idle: IdlePolicy::BusyPoll,
            thread_name: None,
        }
    }
}

/// Why a serve loop ended other than by [`ServerHandle::stop`]; returned by
/// [`ServerHandle::join`].
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The handler panicked; the server was dropped on its thread.
    #[error(
        "the handler of service {service} panicked after {} requests: {message}",
        stats.requests
    )]
    HandlerPanicked {
        /// The service's name.
        service: &'static str,
        /// The panic message (`"<non-string panic payload>"` if it was not a string).
        message: String,
        /// The server's counters when it panicked (the panicking request included).
        stats: ServerStats,
    },
    /// The transport (or the request decoder) panicked inside [`Server::serve_once`]; the
    /// server was dropped on its thread.
    #[error(
        "the serve loop of service {service} panicked outside the handler after {} requests: {message}",
        stats.requests
    )]
    TransportPanicked {
        /// The service's name.
        service: &'static str,
        /// The panic message (`"<non-string panic payload>"` if it was not a string).
        message: String,
        /// The server's counters when it panicked.
        stats: ServerStats,
    },
}

/// A server running on its own thread, started by [`Server::spawn`] /
/// [`Server::spawn_with`]. Dropping it stops the server and waits for its thread (the
/// transport is then dropped); [`ServerHandle::join`] does the same and returns the server.
#[must_use = "dropping the handle stops the server at once"]
pub struct ServerHandle<S: Service, T: ServerTransport> {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<Server<S, T>, RunError>>>,
}

impl<S: Service, T: ServerTransport> ServerHandle<S, T> {
    /// Asks the serve thread to stop after its current round and wakes it if it is parked.
    /// Returns at once; [`ServerHandle::join`] waits for the thread.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
    }

    /// Whether the serve thread has ended (stopped, or its handler panicked).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// The serve thread.
    pub fn thread(&self) -> &Thread {
        self.thread
            .as_ref()
            .expect("the thread is only taken by join/drop")
            .thread()
    }

    /// Stops the server (as [`ServerHandle::stop`]), waits for its thread to end (at most
    /// one round: the round in progress, see the module docs), and returns the server, with
    /// its transport ([`Server::transport`]) and counters ([`Server::stats`]).
    ///
    /// # Errors
    /// [`RunError::HandlerPanicked`] / [`RunError::TransportPanicked`] if the serve loop
    /// ended by a panic (the server is then gone).
    pub fn join(mut self) -> Result<Server<S, T>, RunError> {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> Result<Server<S, T>, RunError> {
        self.stop();
        let t = self.thread.take().expect("joined once");
        match t.join() {
            Ok(r) => r,
            // The loop catches every panic; this is a panic while dropping the server after
            // one, or in a panic hook. Resume it on the joining thread.
            Err(payload) => std::panic::resume_unwind(payload),
        }
    }
}

impl<S: Service, T: ServerTransport> Drop for ServerHandle<S, T> {
    fn drop(&mut self) {
        if self.thread.is_none() {
            return;
        }
        if let Err(e) = self.stop_and_join() {
            tracing::error!(error = %e, "server thread ended by a panic");
        }
    }
}

impl<S: Service, T: ServerTransport + Send + 'static> Server<S, T> {
    /// Serves on a new thread with `handler` and the default [`RunnerConfig`] (idle backoff
    /// up to 1 ms, see the module docs) until the returned handle is stopped or dropped.
    ///
    /// # Panics
    /// If the OS cannot create a thread, as [`std::thread::spawn`].
    pub fn spawn(
        self,
        handler: impl FnMut(S::Request) -> S::Response + Send + 'static,
    ) -> ServerHandle<S, T> {
        self.spawn_with(RunnerConfig::default(), handler)
            .expect("failed to spawn the server thread")
    }

    /// [`Server::spawn`] with a configuration (idle policy, thread name).
    ///
    /// # Errors
    /// The OS error if the thread cannot be created (the server is dropped).
    pub fn spawn_with(
        self,
        cfg: RunnerConfig,
        mut handler: impl FnMut(S::Request) -> S::Response + Send + 'static,
    ) -> std::io::Result<ServerHandle<S, T>> {
        self.spawn_loop(cfg, move |server, in_handler| {
            server.serve_once(|req| {
                in_handler.set(true);
                let resp = handler(req);
                in_handler.set(false);
                resp
            })
        })
    }

    /// Serves on a new thread with a raw handler ([`Server::serve_once_raw`]: the zero-copy
    /// path, e.g. `move |msg, out| KvService::dispatch_raw(&mut store, msg, out)`) and the
    /// default [`RunnerConfig`], until the returned handle is stopped or dropped.
    ///
    /// # Panics
    /// If the OS cannot create a thread, as [`std::thread::spawn`].
    pub fn spawn_raw(
        self,
        handler: impl FnMut(&[u8], &mut [u8]) -> Result<usize, WireError> + Send + 'static,
    ) -> ServerHandle<S, T> {
        self.spawn_raw_with(RunnerConfig::default(), handler)
            .expect("failed to spawn the server thread")
    }

    /// [`Server::spawn_raw`] with a configuration (idle policy, thread name).
    ///
    /// # Errors
    /// The OS error if the thread cannot be created (the server is dropped).
    pub fn spawn_raw_with(
        self,
        cfg: RunnerConfig,
        mut handler: impl FnMut(&[u8], &mut [u8]) -> Result<usize, WireError> + Send + 'static,
    ) -> std::io::Result<ServerHandle<S, T>> {
        self.spawn_loop(cfg, move |server, in_handler| {
            server.serve_once_raw(|msg, out| {
                in_handler.set(true);
                let r = handler(msg, out);
                in_handler.set(false);
                r
            })
        })
    }

    fn spawn_loop(
        self,
        cfg: RunnerConfig,
        step: impl FnMut(&mut Server<S, T>, &Cell<bool>) -> usize + Send + 'static,
    ) -> std::io::Result<ServerHandle<S, T>> {
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let name = cfg
            .thread_name
            .unwrap_or_else(|| format!("rpc-{}", S::DESCRIPTOR.name));
        let idle = cfg.idle;
        let thread = thread::Builder::new()
            .name(name)
            .spawn(move || run(self, step, &st, idle))?;
        Ok(ServerHandle {
            stop,
            thread: Some(thread),
        })
    }
}

/// The serve loop of a [`ServerHandle`]'s thread: `step` runs one round (it sets the flag
/// while the user's handler runs, so that a panic is attributed to it).
fn run<S: Service, T: ServerTransport>(
    mut server: Server<S, T>,
    mut step: impl FnMut(&mut Server<S, T>, &Cell<bool>) -> usize,
    stop: &AtomicBool,
    policy: IdlePolicy,
) -> Result<Server<S, T>, RunError> {
    let in_handler = Cell::new(false);
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let mut idle = Idle::new(policy);
        while !stop.load(Ordering::Acquire) {
            let n = step(&mut server, &in_handler);
            if n == 0 {
                idle.wait(server.transport_mut());
            } else {
                idle.reset();
            }
        }
    }));
    match outcome {
        Ok(()) => Ok(server),
        Err(payload) => Err(panicked(&server, in_handler.get(), &*payload)),
    }
}

#[cold]
fn panicked<S: Service, T: ServerTransport>(
    server: &Server<S, T>,
    in_handler: bool,
    payload: &(dyn std::any::Any + Send),
) -> RunError {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "<non-string panic payload>".to_string());
    let (service, stats) = (S::DESCRIPTOR.name, *server.stats());
    if in_handler {
        RunError::HandlerPanicked {
            service,
            message,
            stats,
        }
    } else {
        RunError::TransportPanicked {
            service,
            message,
            stats,
        }
    }
}

/// The idle state of the serve loop (see [`IdlePolicy`]).
struct Idle {
    policy: IdlePolicy,
    backoff: Backoff,
    sleep: Duration,
}

impl Idle {
    fn new(policy: IdlePolicy) -> Self {
        Idle {
            policy,
            backoff: Backoff::new(),
            sleep: FIRST_SLEEP,
        }
    }

    #[inline]
    fn reset(&mut self) {
        self.backoff.reset();
        self.sleep = FIRST_SLEEP;
    }

    /// After a round that handled nothing; `transport` may wait for a request in place of
    /// the park ([`ServerTransport::wait_for_request`]).
    #[inline]
    fn wait(&mut self, transport: &mut impl ServerTransport) {
        match self.policy {
            IdlePolicy::BusyPoll => std::hint::spin_loop(),
            IdlePolicy::Backoff { max_sleep } => {
                if !self.backoff.is_completed() || max_sleep.is_zero() {
                    self.backoff.snooze();
                } else {
                    let sleep = self.sleep.min(max_sleep);
                    // Woken early by a request, by `ServerHandle::stop` (unpark; a transport
                    // that waits itself sees the flag after `sleep` at the latest) or
                    // spuriously: either way the loop checks the flag and polls again.
                    if !transport.wait_for_request(sleep) {
                        thread::park_timeout(sleep);
                    }
                    self.sleep = (self.sleep * 2).min(max_sleep);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Client;
    use crate::delegation::{Delegation, DelegationConfig, DelegationServer};
    use crate::service::{ArgDescriptor, MethodDescriptor, ServiceDescriptor};
    use crate::wire::{self, WireError};
    use std::sync::atomic::AtomicU64;
    use std::time::Instant;

    /// A one-method service: `echo(x: u64) -> u64`.
    struct Svc;
    const ARGS: &[ArgDescriptor] = &[ArgDescriptor {
        name: "x",
        ty: "u64",
        size: 8,
    }];
    const METHODS: &[MethodDescriptor] = &[MethodDescriptor {
        id: 0,
        name: "echo",
        args: ARGS,
        ret_ty: "u64",
        ret_size: 8,
        request_bytes: wire::HEADER_BYTES + 8,
        response_bytes: wire::HEADER_BYTES + 8,
        var_request: false,
        var_response: false,
        var_align: 1,
    }];
    static DESCRIPTOR: ServiceDescriptor = ServiceDescriptor::new("RunnerTest", METHODS);

    impl Service for Svc {
        type Request = u64;
        type Response = u64;
        const DESCRIPTOR: &'static ServiceDescriptor = &DESCRIPTOR;
        fn encode_request(req: &u64, out: &mut [u8]) -> usize {
            wire::encode(0, 0, req, out)
        }
        fn decode_request(msg: &[u8]) -> Result<u64, WireError> {
            let hdr = wire::read_request_header(msg)?;
            if hdr.method_id != 0 {
                return Err(WireError::UnknownMethod(hdr.method_id));
            }
            wire::decode_body(hdr, msg)
        }
        fn encode_response(resp: &u64, out: &mut [u8]) -> usize {
            wire::encode(0, 0, resp, out)
        }
        fn decode_response(method_id: u16, msg: &[u8]) -> Result<u64, WireError> {
            wire::decode_response(method_id, msg)
        }
        fn request_method_id(_: &u64) -> u16 {
            0
        }
        fn request_len(_: &u64) -> usize {
            METHODS[0].request_bytes
        }
        fn response_len(_: &u64) -> usize {
            METHODS[0].response_bytes
        }
    }

    fn name(tag: &str) -> String {
        static N: AtomicU64 = AtomicU64::new(0);
        format!(
            "runner-{}-{}-{tag}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        )
    }

    fn serve(name: &str) -> Server<Svc, DelegationServer> {
        DelegationServer::serve::<Svc>(name, DelegationConfig::default()).unwrap()
    }

    fn client(name: &str) -> Client<Svc, Delegation> {
        Client::connect(name).unwrap()
    }

    /// Every server transport can be moved to the serve thread (compile-time check).
    #[test]
    fn every_server_transport_is_send() {
        fn runnable<T: ServerTransport + Send + 'static>() {}
        runnable::<DelegationServer>();
        runnable::<crate::ipc::IpcServer>();
        runnable::<crate::copyrpc::CopyrpcServer>();
        runnable::<crate::scalerpc::ScaleRpcServer>();
        runnable::<crate::erpc::ErpcServer>();
        runnable::<crate::erpc::ErpcServer<crate::erpc::datagram::ud::UdTransport>>();
    }

    #[test]
    fn join_returns_the_server_with_its_counters() {
        let n = name("join");
        let h = serve(&n).spawn(|x| x + 1);
        assert_eq!(h.thread().name(), Some("rpc-RunnerTest"));
        let mut c = client(&n);
        for i in 0..100u64 {
            assert_eq!(c.call::<u64, u64>(0, &i).unwrap(), i + 1);
        }
        assert!(!h.is_finished());
        let server = h.join().unwrap();
        assert_eq!(server.stats().requests, 100);
        assert_eq!(server.stats().bad_requests, 0);
        assert_eq!(server.stats().dropped_replies, 0);
        // The transport came back: it still holds the ring the client is attached to.
        assert_eq!(server.transport().ring().stats().received, 100);
    }

    #[test]
    fn stop_then_join_and_busy_poll_serve_too() {
        let n = name("busy");
        let cfg = RunnerConfig {
            thread_name: Some("busy-server".into()),
            ..RunnerConfig::busy_poll()
        };
        let h = serve(&n).spawn_with(cfg, |x| x * 2).unwrap();
        assert_eq!(h.thread().name(), Some("busy-server"));
        let mut c = client(&n);
        for i in 0..50u64 {
            assert_eq!(c.call::<u64, u64>(0, &i).unwrap(), i * 2);
        }
        h.stop();
        let until = Instant::now() + Duration::from_secs(30);
        while !h.is_finished() {
            assert!(
                Instant::now() < until,
                "stop() did not end the serve thread"
            );
            thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(h.join().unwrap().stats().requests, 50);
    }

    /// Sets its flag when dropped: the handler closure owns one, and the closure is dropped
    /// only when the serve thread ends.
    struct DropFlag(Arc<AtomicBool>);
    impl Drop for DropFlag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }

    #[test]
    fn dropping_the_handle_stops_the_thread() {
        let n = name("drop");
        let dropped = Arc::new(AtomicBool::new(false));
        let guard = DropFlag(dropped.clone());
        let h = serve(&n).spawn(move |x| {
            let _keep = &guard;
            x
        });
        let mut c = client(&n);
        assert_eq!(c.call::<u64, u64>(0, &7).unwrap(), 7);
        // Let the server go idle (parked) first: drop must wake it.
        thread::sleep(Duration::from_millis(20));
        assert!(!dropped.load(Ordering::Acquire));
        let thread = h.thread().clone();
        drop(h);
        // Drop returned only after the thread ended and dropped the handler.
        assert!(
            dropped.load(Ordering::Acquire),
            "{:?} still running",
            thread.name()
        );
    }

    #[test]
    fn a_panicking_handler_surfaces_in_join() {
        let n = name("panic");
        let h = serve(&n).spawn(|x| {
            assert!(x != 13, "unlucky request");
            x
        });
        let mut c = client(&n);
        assert_eq!(c.call::<u64, u64>(0, &1).unwrap(), 1);
        // The handler panics on this one; the call ends by the server's death or deadline.
        let r = c.call_within::<u64, u64>(Duration::from_millis(200), 0, &13);
        assert!(r.is_err(), "{r:?}");
        let until = Instant::now() + Duration::from_secs(30);
        while !h.is_finished() {
            assert!(Instant::now() < until, "the panicked thread never ended");
            thread::sleep(Duration::from_millis(1));
        }
        match h.join() {
            Err(RunError::HandlerPanicked {
                service,
                message,
                stats,
            }) => {
                assert_eq!(service, "RunnerTest");
                assert!(message.contains("unlucky request"), "{message}");
                assert_eq!(stats.requests, 2);
            }
            other => panic!("expected HandlerPanicked, got {:?}", other.map(|_| ())),
        }
    }

    #[test]
    fn dropping_a_panicked_server_does_not_hang_or_panic() {
        let n = name("panic-drop");
        let h = serve(&n).spawn(|_| panic!("boom"));
        let mut c = client(&n);
        let _ = c.call_within::<u64, u64>(Duration::from_millis(200), 0, &1);
        drop(h);
    }

    /// CPU time consumed so far by `thread` (ns), from its per-thread CPU clock.
    fn cpu_ns(h: &ServerHandle<Svc, DelegationServer>) -> u64 {
        use std::os::unix::thread::JoinHandleExt;
        let pt = h.thread.as_ref().unwrap().as_pthread_t();
        let mut clock: libc::clockid_t = 0;
        // SAFETY: `pt` is a live thread (the handle has not been joined); `clock` is a valid
        // out-pointer.
        assert_eq!(unsafe { libc::pthread_getcpuclockid(pt, &mut clock) }, 0);
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid out-pointer.
        assert_eq!(unsafe { libc::clock_gettime(clock, &mut ts) }, 0);
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }

    /// CPU used by a server thread over `window` of wall time after serving one call.
    fn idle_cpu(cfg: RunnerConfig, window: Duration) -> (Duration, Duration) {
        let n = name("cpu");
        let h = serve(&n).spawn_with(cfg, |x| x).unwrap();
        let mut c = client(&n);
        assert_eq!(c.call::<u64, u64>(0, &3).unwrap(), 3);
        let (c0, t0) = (cpu_ns(&h), Instant::now());
        thread::sleep(window);
        let (c1, wall) = (cpu_ns(&h), t0.elapsed());
        assert_eq!(c.call::<u64, u64>(0, &4).unwrap(), 4, "still serving");
        assert_eq!(h.join().unwrap().stats().requests, 2);
        (Duration::from_nanos(c1 - c0), wall)
    }

    #[test]
    fn an_idle_server_uses_little_cpu() {
        let window = Duration::from_millis(200);
        let (idle, idle_wall) = idle_cpu(RunnerConfig::default(), window);
        let (busy, busy_wall) = idle_cpu(RunnerConfig::busy_poll(), window);
        eprintln!(
            "idle 200 ms: backoff runner {idle:?} CPU in {idle_wall:?}, busy-poll runner {busy:?} in {busy_wall:?}"
        );
        // Well under half a core, whatever the machine's load...
        assert!(
            idle * 2 < idle_wall,
            "backoff runner used {idle:?} of {idle_wall:?}"
        );
        // ...and a small fraction of what polling costs on this machine right now.
        assert!(
            idle * 5 < busy,
            "backoff runner used {idle:?}, busy-poll runner {busy:?}"
        );
    }

    /// A transport with no requests that records the waits the runner asks of it.
    struct Waiting {
        waits: Arc<std::sync::Mutex<Vec<Duration>>>,
        can_wait: bool,
    }

    impl ServerTransport for Waiting {
        type ReplyToken = ();
        fn poll(&mut self) -> usize {
            0
        }
        fn recv(&mut self) -> Option<((), &[u8])> {
            None
        }
        fn reply(
            &mut self,
            _: (),
            _: usize,
            _: impl FnOnce(&mut [u8]) -> usize,
        ) -> Result<(), crate::RpcError> {
            unreachable!("no request was received")
        }
        fn flush(&mut self) {}
        fn wait_for_request(&mut self, timeout: Duration) -> bool {
            self.waits.lock().unwrap().push(timeout);
            self.can_wait
        }
    }

    /// Spawns a backoff runner (max_sleep 400 µs) on a `Waiting` transport and returns the
    /// first `n` waits it asked for (10 s bound).
    fn waits_of_idle_runner(can_wait: bool, n: usize) -> Vec<Duration> {
        let waits = Arc::new(std::sync::Mutex::new(Vec::new()));
        let t = Waiting {
            waits: waits.clone(),
            can_wait,
        };
        let cfg = RunnerConfig {
            idle: IdlePolicy::Backoff {
                max_sleep: Duration::from_micros(400),
            },
            thread_name: None,
        };
        let h = Server::<Svc, _>::new(t).spawn_with(cfg, |x| x).unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        while waits.lock().unwrap().len() < n {
            assert!(
                Instant::now() < until,
                "the idle runner did not wait {n} times"
            );
            thread::sleep(Duration::from_millis(1));
        }
        h.join().unwrap();
        let w = waits.lock().unwrap();
        w[..n].to_vec()
    }

    /// An idle server's park is the transport's wait when it can wait (eRPC: in its
    /// socket), with the park's doubling durations; a transport that cannot is asked as
    /// often and the thread parks instead (same durations).
    #[test]
    fn an_idle_runner_waits_in_the_transport_for_its_park() {
        let us = Duration::from_micros;
        let want = [us(50), us(100), us(200), us(400), us(400), us(400)];
        assert_eq!(waits_of_idle_runner(true, 6), want);
        assert_eq!(waits_of_idle_runner(false, 6), want);
    }
}
