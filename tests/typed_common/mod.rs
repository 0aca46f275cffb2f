//! Helpers shared by the typed end-to-end tests of the transports
//! (`copyrpc_typed.rs`, `scalerpc_typed.rs`, `erpc_typed.rs`, `ipc_typed.rs`,
//! `delegation_typed.rs`): an in-memory KV handler, a server thread (the runtime's runner,
//! `Server::spawn`), a server that withholds answers on purpose, and reading a wire header;
//! and [`scenarios`], the scenarios every transport runs through its [`scenarios::Fixture`].
#![allow(dead_code)]

pub(crate) mod scenarios;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;

use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;
use idl::kv::{KvServer, KvService};
use rpc::delegation::{DelegationServer, RingClient};
use rpc::wire::MsgHeader;
use rpc::{RpcError, Server, ServerHandle, ServerTransport, Service};

/// The KV handler: a hash map of the keys put (ranks ignored).
#[derive(Default)]
pub(crate) struct Store(pub HashMap<u64, u64>);

impl KvServer for Store {
    fn put(&mut self, _rank: u32, key: u64, value: u64) {
        self.0.insert(key, value);
    }
    fn get(&mut self, _rank: u32, key: u64) -> Option<u64> {
        self.0.get(&key).copied()
    }
}

/// Runs `server` on its own thread with `handler` ([`Server::spawn`], default idle backoff)
/// until the handle is joined or dropped.
pub(crate) fn spawn<S: Service, T: ServerTransport + Send + 'static>(
    server: Server<S, T>,
    handler: impl FnMut(S::Request) -> S::Response + Send + 'static,
) -> ServerHandle<S, T> {
    server.spawn(handler)
}

/// How long [`connect_polling`] waits for a connect at most.
pub(crate) const CONNECT_BOUND: Duration = Duration::from_secs(60);

/// Runs `connect` on another thread while this one polls `server` (which must answer the
/// connect request: copyrpc and ScaleRPC accept in `poll`, eRPC runs its handshake there);
/// returns what `connect` returned. Fails the test after [`CONNECT_BOUND`].
pub(crate) fn connect_polling<S: Service, T: ServerTransport, C: Send + 'static>(
    server: &mut Server<S, T>,
    connect: impl FnOnce() -> C + Send + 'static,
) -> C {
    connect_polling_within(server, CONNECT_BOUND, connect)
}

/// [`connect_polling`] of a client that connects to `addr` with `connect` (e.g.
/// `KvClient::<Copyrpc>::connect`), for tests that drive the server by hand.
pub(crate) fn connect_polling_to<S: Service, T: ServerTransport, A: Clone + Send + 'static, C>(
    server: &mut Server<S, T>,
    addr: &A,
    connect: fn(&A) -> Result<C, RpcError>,
) -> Result<C, RpcError>
where
    C: Send + 'static,
{
    let addr = addr.clone();
    connect_polling(server, move || connect(&addr))
}

/// [`connect_polling`] failing the test after `bound`.
pub(crate) fn connect_polling_within<S: Service, T: ServerTransport, C: Send + 'static>(
    server: &mut Server<S, T>,
    bound: Duration,
    connect: impl FnOnce() -> C + Send + 'static,
) -> C {
    let h = thread::spawn(connect);
    let deadline = Instant::now() + bound;
    while !h.is_finished() {
        assert!(
            Instant::now() < deadline,
            "connect did not finish in {bound:?}"
        );
        server.poll();
        thread::yield_now();
    }
    h.join().unwrap()
}

/// Writes one raw request message `msg` into the delegation ring `name` through a raw ring
/// client, serves it on this thread (a request that reaches the handler fails the test) and
/// returns the response message. At most 10 s.
pub(crate) fn raw_ring_roundtrip<S: Service>(
    name: &str,
    server: &mut Server<S, DelegationServer>,
    msg: &[u8],
) -> Vec<u8> {
    let mut raw = RingClient::attach(name).unwrap();
    let slot = raw.try_call(msg).unwrap();
    let mut out = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.is_none() {
        assert!(Instant::now() < deadline, "no response to a bad request");
        server.serve_once(|_| panic!("a bad request reached the handler"));
        raw.poll(|s, bytes| {
            assert_eq!(s, slot);
            out = Some(bytes.to_vec());
        })
        .unwrap();
    }
    out.unwrap()
}

/// [`spawn_kv`] with a runner configuration (ScaleRPC with several groups: never park).
pub(crate) fn spawn_kv_with<T: ServerTransport + Send + 'static>(
    server: Server<KvService, T>,
    cfg: rpc::RunnerConfig,
) -> ServerHandle<KvService, T> {
    let mut store = Store::default();
    server
        .spawn_with(cfg, move |req| KvService::dispatch(&mut store, req))
        .unwrap()
}

/// [`spawn`] with a fresh [`Store`] as the KV handler.
pub(crate) fn spawn_kv<T: ServerTransport + Send + 'static>(
    server: Server<KvService, T>,
) -> ServerHandle<KvService, T> {
    let mut store = Store::default();
    server.spawn(move |req| KvService::dispatch(&mut store, req))
}

/// The wire header of a raw response message.
pub(crate) fn header(msg: &[u8]) -> MsgHeader {
    rpc::wire::read_header(msg).unwrap()
}

/// The key whose `get` the [`spawn_late`] server answers only when told to.
pub(crate) const LATE_KEY: u64 = u64::MAX - 1;

/// Controls of a server started by [`spawn_late`].
pub(crate) struct LateServer<S> {
    /// Send `v`: answer every withheld `get(LATE_KEY)` with `Some(v)` (late).
    pub answer: std::sync::mpsc::Sender<u64>,
    /// While set, the serve loop does nothing at all (a stopped server). Set it with
    /// [`LateServer::pause`], which waits until the loop has stopped.
    pub paused: Arc<AtomicBool>,
    /// Set by the serve loop once it has seen `paused` and stopped (cleared when it resumes).
    pub pause_seen: Arc<AtomicBool>,
    /// Stops the serve loop; the thread returns the server.
    pub stop: Arc<AtomicBool>,
    /// The serve loop's thread.
    pub handle: thread::JoinHandle<S>,
}

impl<S> LateServer<S> {
    /// Stops the serve loop and returns once it is stopped: a round already under way when
    /// `paused` was set could otherwise still answer the next call. At most 10 s.
    pub(crate) fn pause(&self) {
        self.paused.store(true, Ordering::Release);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !self.pause_seen.load(Ordering::Acquire) {
            assert!(
                std::time::Instant::now() < deadline,
                "the server never paused"
            );
            thread::yield_now();
        }
    }
}

/// Serves KV on a thread like [`spawn_kv`], but withholds the answer to `get(_, LATE_KEY)`
/// until told to answer (deferred replies), and stops serving entirely while `paused` is set.
pub(crate) fn spawn_late<T: ServerTransport + Send + 'static>(
    mut server: Server<KvService, T>,
) -> LateServer<Server<KvService, T>> {
    use idl::kv::{KvRequest, KvResponse};
    let (answer, rx) = std::sync::mpsc::channel::<u64>();
    let stop = Arc::new(AtomicBool::new(false));
    let paused = Arc::new(AtomicBool::new(false));
    let pause_seen = Arc::new(AtomicBool::new(false));
    let (st, pa, seen) = (stop.clone(), paused.clone(), pause_seen.clone());
    let handle = thread::spawn(move || {
        let mut store = Store::default();
        let mut held = Vec::new();
        let backoff = Backoff::new();
        while !st.load(Ordering::Relaxed) {
            if pa.load(Ordering::Acquire) {
                seen.store(true, Ordering::Release);
                thread::yield_now();
                continue;
            }
            seen.store(false, Ordering::Release);
            let mut n = server.poll();
            while let Some((token, req)) = server.recv() {
                match req {
                    KvRequest::Get(a) if a.key() == LATE_KEY => held.push(token),
                    req => {
                        let _ = server.reply(token, &KvService::dispatch(&mut store, req));
                    }
                }
            }
            server.flush();
            if let Ok(v) = rx.try_recv() {
                for token in held.drain(..) {
                    let _ = server.reply(token, &KvResponse::Get(Some(v)));
                    n += 1;
                }
            }
            server.flush();
            if n == 0 {
                backoff.snooze();
            } else {
                backoff.reset();
            }
        }
        server
    });
    LateServer {
        answer,
        paused,
        pause_seen,
        stop,
        handle,
    }
}

/// The deadline scenario every transport must pass, against a [`spawn_late`] server:
/// 1. a blocking and a pipelined call the server withholds expire with
///    `RpcError::DeadlineExceeded` (the pipelined one with its tag);
/// 2. the server then answers both late with a value no later call expects: every later call
///    gets its own answer, and both late responses are dropped and counted;
/// 3. a stopped (paused) server makes calls fail with the deadline error, not block; once it
///    resumes, calls succeed again.
///
/// Returns how long the call to the stopped server took to fail.
pub(crate) fn late_and_stopped_server<T: rpc::ClientTransport, S>(
    kv: &mut idl::kv::KvClient<T>,
    server: &LateServer<S>,
) -> std::time::Duration {
    use rpc::RpcError;
    use std::time::{Duration, Instant};
    let short = Duration::from_millis(30);
    let until = Instant::now() + Duration::from_secs(30);
    kv.put(0, 5, 50).unwrap();

    // 1. Expiry, blocking and pipelined.
    let e = kv.with_deadline(short).get(0, LATE_KEY).unwrap_err();
    assert!(
        matches!(e, RpcError::DeadlineExceeded { method: "get", .. }),
        "{e}"
    );
    kv.issue(7).with_deadline(short).get(0, LATE_KEY).unwrap();
    let e = loop {
        assert!(Instant::now() < until, "the pipelined call never expired");
        match kv.poll() {
            Ok(None) => thread::yield_now(),
            Err(e) => break e,
            Ok(Some(r)) => panic!("unexpected completion {r:?}"),
        }
    };
    assert!(
        matches!(e, RpcError::DeadlineExceeded { tag: 7, .. }),
        "{e}"
    );
    assert_eq!(kv.stats().expired, 2);
    assert_eq!(kv.zombies(), 2);

    // 2. Late answers are dropped; later calls get their own.
    server.answer.send(666).unwrap();
    let mut calls = 0;
    while kv.stats().late_responses < 2 {
        assert!(
            Instant::now() < until,
            "late responses never arrived: {:?}",
            kv.stats()
        );
        assert_eq!(kv.get(0, 5).unwrap(), Some(50));
        calls += 1;
    }
    assert_eq!(kv.zombies(), 0);
    // Every token is reused, pipelined too.
    let depth = kv.max_in_flight().min(8) as u64;
    for round in 0..4 {
        for t in 0..depth {
            kv.issue(t).get(0, 5).unwrap();
        }
        let mut got = 0;
        while got < depth {
            assert!(Instant::now() < until, "round {round}: {got}/{depth}");
            if let Some((_, r)) = kv.poll().unwrap() {
                assert_eq!(r, idl::kv::KvResponse::Get(Some(50)));
                got += 1;
            }
        }
    }
    assert!(calls >= 1);
    assert_eq!(kv.stats().late_responses, 2);
    assert_eq!(kv.stats().stray_responses, 0);

    // 3. A stopped server: the deadline error, in about the deadline.
    server.pause();
    let t = Instant::now();
    let e = kv
        .with_deadline(Duration::from_millis(100))
        .get(0, 5)
        .unwrap_err();
    let took = t.elapsed();
    assert!(matches!(e, RpcError::DeadlineExceeded { .. }), "{e}");
    server.paused.store(false, Ordering::Release);
    while kv.stats().late_responses < 3 {
        assert!(
            Instant::now() < until,
            "the resumed server's late answer never came"
        );
        assert_eq!(kv.get(0, 5).unwrap(), Some(50));
    }
    took
}
