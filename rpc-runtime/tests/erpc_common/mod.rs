//! Helpers shared by the eRPC end-to-end tests over UDP (`erpc_udp_e2e.rs`) and over mlx5 UD
//! on the device model (`erpc_ud_e2e.rs`): payloads, an echo server thread that counts handler
//! executions, connecting sessions, and a windowed call driver that checks every response.
//!
//! Every loop yields its thread after an iteration that found no work ([`spin`]): on a loaded
//! 2-core machine (parallel tests, other builds) two busy-polling threads sharing a core
//! otherwise take turns only once per scheduler time slice (milliseconds), above eRPC's 5 ms
//! retransmission timeout.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rpc_runtime::erpc::core::{Config, Event, MS, SessionError, SessionId};
use rpc_runtime::erpc::datagram::DatagramTransport;
use rpc_runtime::erpc::event_loop::Endpoint;

/// Longest a test waits for connections or calls.
pub(crate) const DEADLINE: Duration = Duration::from_secs(20);

/// One event-loop iteration; yields the thread if it found nothing to do (see the module docs).
pub(crate) fn spin<T: DatagramTransport>(ep: &mut Endpoint<T>) {
    if ep.run_event_loop_once() == 0 {
        thread::yield_now();
    }
}

/// Request/response payload: `client id | tag | pattern`.
pub(crate) fn payload(client: u64, tag: u64, len: usize) -> Vec<u8> {
    let len = len.max(16);
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&client.to_le_bytes());
    v.extend_from_slice(&tag.to_le_bytes());
    v.extend((16..len).map(|i| (i as u64).wrapping_mul(31).wrapping_add(tag) as u8));
    v
}

pub(crate) fn parse(data: &[u8]) -> (u64, u64) {
    let c = u64::from_le_bytes(data[..8].try_into().unwrap());
    let t = u64::from_le_bytes(data[8..16].try_into().unwrap());
    (c, t)
}

/// Handler executions per (client id, tag).
pub(crate) type Counts = Arc<Mutex<HashMap<(u64, u64), u32>>>;

pub(crate) struct Server<T: DatagramTransport> {
    /// Where clients connect.
    pub addr: T::Addr,
    /// Set to stop the server thread (it also sets it when `stop_after` is reached).
    pub stop: Arc<AtomicBool>,
    counts: Counts,
    handle: thread::JoinHandle<Endpoint<T>>,
}

/// An echo server running in its own thread until `stop`, or until it handled `stop_after`
/// requests (then it stops answering, i.e. fails, with the last request unanswered).
pub(crate) fn spawn_server<T>(transport: T, cfg: Config, stop_after: Option<u64>) -> Server<T>
where
    T: DatagramTransport + Send + 'static,
    T::Addr: Send,
{
    let mut ep = Endpoint::new(transport, cfg).expect("server config");
    let addr = ep.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let counts: Counts = Arc::default();
    let (s2, c2) = (stop.clone(), counts.clone());
    let handle = thread::spawn(move || {
        let mut handled = 0u64;
        while !s2.load(Ordering::Relaxed) {
            spin(&mut ep);
            while let Some(ev) = ep.poll_event() {
                if let Event::Request { token, data, .. } = ev {
                    *c2.lock().unwrap().entry(parse(&data)).or_insert(0) += 1;
                    handled += 1;
                    if stop_after.is_some_and(|n| handled >= n) {
                        s2.store(true, Ordering::Relaxed);
                        break;
                    }
                    ep.reply(token, &data).expect("reply");
                }
            }
        }
        ep
    });
    Server {
        addr,
        stop,
        counts,
        handle,
    }
}

impl<T: DatagramTransport> Server<T> {
    /// Stops the server; returns its endpoint and the handler executions per (client, tag).
    pub(crate) fn finish(self) -> (Endpoint<T>, HashMap<(u64, u64), u32>) {
        self.stop.store(true, Ordering::Relaxed);
        let ep = self.handle.join().expect("server thread");
        let counts = std::mem::take(&mut *self.counts.lock().unwrap());
        (ep, counts)
    }
}

/// Opens `n` sessions to `peer` and waits until all are connected.
pub(crate) fn connect<T: DatagramTransport>(
    ep: &mut Endpoint<T>,
    peer: T::Addr,
    n: usize,
) -> Vec<SessionId> {
    let sessions: Vec<_> = (0..n)
        .map(|_| ep.create_session(peer).expect("create_session"))
        .collect();
    let start = Instant::now();
    let mut connected = 0;
    while connected < n {
        assert!(start.elapsed() < DEADLINE, "connect timed out");
        spin(ep);
        while let Some(ev) = ep.poll_event() {
            match ev {
                Event::SessionConnected(_) => connected += 1,
                other => panic!("unexpected event while connecting: {other:?}"),
            }
        }
    }
    sessions
}

/// Issues `calls` (session index, length) with at most `window` outstanding, checks every
/// response byte for byte and that each tag completes exactly once.
pub(crate) fn run_calls<T: DatagramTransport>(
    ep: &mut Endpoint<T>,
    client: u64,
    sessions: &[SessionId],
    calls: &[(usize, usize)],
    window: usize,
) {
    // Payloads are built up front: building 8 MiB in a debug build between loop iterations
    // would stall the event loop.
    let mut payloads: Vec<Option<Vec<u8>>> = calls
        .iter()
        .enumerate()
        .map(|(tag, &(_, len))| Some(payload(client, tag as u64, len)))
        .collect();
    let mut outstanding: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut next = 0usize;
    let mut done = 0usize;
    let start = Instant::now();
    while done < calls.len() {
        assert!(
            start.elapsed() < DEADLINE,
            "calls timed out: {done}/{} done, stats {:?} {:?} {:?}",
            calls.len(),
            ep.core_stats(),
            ep.loop_stats(),
            ep.transport().stats()
        );
        while next < calls.len() && outstanding.len() < window {
            let s = calls[next].0;
            let tag = next as u64;
            let p = payloads[next].take().expect("payload");
            ep.enqueue_request(sessions[s], 7, &p, tag)
                .expect("enqueue");
            outstanding.insert(tag, p);
            next += 1;
        }
        spin(ep);
        while let Some(ev) = ep.poll_event() {
            match ev {
                Event::Response { session, tag, data } => {
                    let want = outstanding
                        .remove(&tag)
                        .unwrap_or_else(|| panic!("response for tag {tag} not outstanding"));
                    assert_eq!(session, sessions[calls[tag as usize].0]);
                    assert!(data == want, "response of tag {tag} differs");
                    done += 1;
                }
                other => panic!("unexpected client event: {other:?}"),
            }
        }
    }
}

/// A server that handles 40 requests and then stops (with the 40th unanswered) while 200
/// calls are queued on 4 sessions: every call gets exactly one outcome, only handled requests
/// succeed, every session fails with `PeerFailed`, and the failure is detected within the
/// failure timeout (300 ms) plus 200 ms of loop and scan slack after the stop.
pub(crate) fn server_failure_fails_pending_calls<T>(server_t: T, client_t: T)
where
    T: DatagramTransport + Send + 'static,
    T::Addr: Send,
{
    let failure_timeout = 300 * MS;
    let cfg = Config {
        failure_timeout,
        keepalive: 50 * MS,
        ..Config::default()
    };
    // The server handles 40 requests, then drops its endpoint with the 40th unanswered.
    let server = spawn_server(server_t, cfg.clone(), Some(40));
    let stopped = server.stop.clone();
    let mut client = Endpoint::new(client_t, cfg).unwrap();
    let sessions = connect(&mut client, server.addr, 4);
    let n = 200u64;
    for tag in 0..n {
        let s = sessions[(tag % 4) as usize];
        client
            .enqueue_request(s, 1, &payload(6, tag, 64), tag)
            .unwrap();
    }
    let mut outcome: HashMap<u64, Result<(), SessionError>> = HashMap::new();
    let mut failed_sessions = 0;
    let mut stop_seen: Option<Instant> = None;
    let start = Instant::now();
    let mut last_fail = start;
    while failed_sessions < sessions.len() {
        assert!(start.elapsed() < DEADLINE, "failure not detected");
        if stop_seen.is_none() && stopped.load(Ordering::Relaxed) {
            stop_seen = Some(Instant::now());
        }
        spin(&mut client);
        while let Some(ev) = client.poll_event() {
            match ev {
                Event::Response { tag, data, .. } => {
                    assert_eq!(data, payload(6, tag, 64));
                    assert!(outcome.insert(tag, Ok(())).is_none(), "tag {tag} twice");
                }
                Event::RequestFailed { tag, error, .. } => {
                    assert_eq!(error, SessionError::PeerFailed);
                    assert!(outcome.insert(tag, Err(error)).is_none(), "tag {tag} twice");
                    last_fail = Instant::now();
                }
                Event::SessionFailed { error, .. } => {
                    assert_eq!(error, SessionError::PeerFailed);
                    failed_sessions += 1;
                }
                other => panic!("unexpected event {other:?}"),
            }
        }
    }
    let stop_seen = stop_seen.expect("server stopped");
    let (_, counts) = server.finish();
    let detect = last_fail - stop_seen;
    eprintln!("server failure detected {detect:?} after it stopped");
    assert_eq!(
        outcome.len() as u64,
        n,
        "every call has exactly one outcome"
    );
    // Only requests the server handled can have succeeded (replies enqueued in the server's
    // last iteration may never have left, so fewer than 39 is possible).
    let ok: Vec<u64> = outcome
        .iter()
        .filter(|(_, r)| r.is_ok())
        .map(|(t, _)| *t)
        .collect();
    assert_eq!(counts.len(), 40);
    assert!(ok.len() <= 39 && !ok.is_empty(), "{} succeeded", ok.len());
    for t in &ok {
        assert_eq!(
            counts.get(&(6, *t)),
            Some(&1),
            "tag {t} succeeded unhandled"
        );
    }
    // The last server packet arrived before the server stopped; allow loop and scan slack.
    assert!(
        detect < Duration::from_nanos(failure_timeout) + Duration::from_millis(200),
        "failure took {detect:?}"
    );
}
