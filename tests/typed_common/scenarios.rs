//! Typed-transport scenarios shared by every transport's end-to-end tests: each transport's
//! test file implements [`Fixture`] (how to make a server and what its clients connect to)
//! and runs these through it, then adds the assertions only that transport can make (its
//! connection counts, statistics and limits).

use std::borrow::Borrow;
use std::time::{Duration, Instant};

use idl::echo::{EchoClient, EchoResponse, EchoService};
use idl::kv::{KvClient, KvRequest, KvResponse, KvService};
use rpc::wire::Status;
use rpc::{Client, ClientTransport, RpcError, Server, ServerTransport, Service};

use super::header;

/// How one transport makes a server and connects typed clients to it.
pub(crate) trait Fixture {
    /// The client transport.
    type Client: ClientTransport;
    /// The server transport.
    type Server: ServerTransport + Send + 'static;
    /// What clients connect to: the transport's address, or an owned ring name.
    type Addr: Borrow<<Self::Client as ClientTransport>::Addr> + Clone + Send + 'static;
    /// A server of `S` (not yet serving) and the address its clients connect to.
    fn server<S: Service>(&mut self) -> (Server<S, Self::Server>, Self::Addr);
}

/// What [`blocking_calls`] leaves for transport-specific checks.
pub(crate) struct Blocking<F: Fixture> {
    /// The client.
    pub kv: KvClient<F::Client>,
    /// The stopped server.
    pub server: Server<KvService, F::Server>,
    /// The address the client connected to.
    pub addr: F::Addr,
}

/// 2003 blocking `Kv` calls against a served store: every answer is the stored value. The
/// stopped server's statistics show 2003 requests, none bad and no dropped reply.
pub(crate) fn blocking_calls<F: Fixture>(fx: &mut F) -> Blocking<F> {
    let (server, addr) = fx.server::<KvService>();
    let h = super::spawn_kv(server);
    let mut kv = KvClient::<F::Client>::connect(addr.borrow()).unwrap();
    // This scenario is about results, not latency: on an oversubscribed host the server
    // thread can be descheduled past the 1 s default deadline (seen once, load average 17),
    // so calls are bounded by 60 s instead; a hang still fails.
    let default_deadline = kv.default_deadline();
    kv.set_default_deadline(Duration::from_secs(60));
    assert_eq!(kv.get(0, 1).unwrap(), None);
    kv.put(0, 1, 10).unwrap();
    assert_eq!(kv.get(0, 1).unwrap(), Some(10));
    for k in 0..1000 {
        kv.put(0, k, k * 3).unwrap();
    }
    for k in 0..1000 {
        assert_eq!(kv.get(0, k).unwrap(), Some(k * 3));
    }
    let server = h.join().unwrap();
    assert_eq!(server.stats().requests, 2003);
    assert_eq!(server.stats().bad_requests, 0);
    assert_eq!(server.stats().dropped_replies, 0);
    kv.set_default_deadline(default_deadline);
    Blocking { kv, server, addr }
}

/// An `Echo` client connecting to a `Kv` server fails with `SchemaMismatch` naming both
/// fingerprints; `then` sees that error and the address while the server still runs; a `Kv`
/// client then connects and calls. Returns the stopped server (to check that the refused
/// client left nothing behind).
pub(crate) fn schema_mismatch_fails_at_connect<F: Fixture>(
    fx: &mut F,
    then: impl FnOnce(&RpcError, &F::Addr),
) -> Server<KvService, F::Server> {
    let (server, addr) = fx.server::<KvService>();
    let h = super::spawn_kv(server);
    match EchoClient::<F::Client>::connect(addr.borrow()) {
        Err(
            e @ RpcError::SchemaMismatch {
                service: "Echo",
                expected,
                found,
            },
        ) => {
            assert_eq!(expected, EchoService::DESCRIPTOR.fingerprint);
            assert_eq!(found, KvService::DESCRIPTOR.fingerprint);
            then(&e, &addr);
        }
        Err(e) => panic!("expected SchemaMismatch, got {e}"),
        Ok(_) => panic!("expected SchemaMismatch, connected"),
    }
    let mut kv = KvClient::<F::Client>::connect(addr.borrow()).unwrap();
    kv.put(0, 1, 2).unwrap();
    h.join().unwrap()
}

/// What [`pipelined_echo`] saw.
pub(crate) struct Pipelined<F: Fixture> {
    /// The client, all calls completed.
    pub echo: EchoClient<F::Client>,
    /// The stopped server.
    pub server: Server<EchoService, F::Server>,
    /// Issues refused with `WouldBlock` (transport credit or ring space) and retried.
    pub would_block: u64,
    /// Most calls in flight at once.
    pub most_in_flight: usize,
}

/// `calls` pipelined `Echo` calls kept at the client's `max_in_flight`, every eighth a 256 B
/// `echo256` (so batches mix sizes), the rest `ping`s; each response is checked against its
/// tag and completes exactly once, within `bound`. Then `max_in_flight` calls fill every
/// token, one more is `WouldBlock`, and polling one at a time delivers them all, after
/// which nothing is left. The server answers `calls + max_in_flight` requests.
pub(crate) fn pipelined_echo<F: Fixture>(fx: &mut F, calls: u64, bound: Duration) -> Pipelined<F> {
    let (server, addr) = fx.server::<EchoService>();
    let h = super::spawn(server, |req| {
        EchoService::dispatch(&mut idl::echo::Echoer, req)
    });
    let mut echo = EchoClient::<F::Client>::connect(addr.borrow()).unwrap();
    let depth = echo.max_in_flight();
    let mut seen = vec![false; calls as usize];
    let (mut next, mut done) = (0u64, 0u64);
    let (mut would_block, mut most) = (0u64, 0usize);
    let deadline = Instant::now() + bound;
    while done < calls {
        assert!(Instant::now() < deadline, "stalled at {done} of {calls}");
        while next < calls && echo.in_flight() < depth {
            let r = if next % 8 == 0 {
                let mut p = [0u8; 256];
                p[..8].copy_from_slice(&next.to_le_bytes());
                p[255] = next as u8;
                echo.issue(next).echo256(p)
            } else {
                echo.issue(next).ping(next ^ 0xabcd)
            };
            match r {
                Ok(()) => next += 1,
                // Credit or ring space exhausted: poll and retry.
                Err(RpcError::WouldBlock) => {
                    would_block += 1;
                    break;
                }
                Err(e) => panic!("issue {next}: {e}"),
            }
        }
        most = most.max(echo.in_flight());
        done += echo
            .poll_with(|tag, r| {
                match r.unwrap() {
                    EchoResponse::Ping(v) => assert_eq!(v, tag ^ 0xabcd),
                    EchoResponse::Echo256(p) => {
                        assert_eq!(p[..8], tag.to_le_bytes());
                        assert_eq!(p[255], tag as u8);
                        assert!(p[8..255].iter().all(|&b| b == 0));
                    }
                    other => panic!("unexpected {other:?}"),
                }
                assert!(
                    !std::mem::replace(&mut seen[tag as usize], true),
                    "tag {tag} completed twice"
                );
            })
            .unwrap() as u64;
    }
    assert!(seen.iter().all(|&s| s));
    // Depth-limited: one call beyond max_in_flight needs a free token.
    for k in 0..depth as u64 {
        echo.issue(k).ping(k).unwrap();
    }
    assert!(matches!(echo.issue(99).ping(0), Err(RpcError::WouldBlock)));
    // Poll one at a time: the rest of each batch waits for the next polls.
    let mut left = depth;
    let deadline = Instant::now() + Duration::from_secs(10);
    while left > 0 {
        assert!(
            Instant::now() < deadline,
            "{left} of {depth} calls did not complete"
        );
        if let Some((tag, r)) = echo.poll().unwrap() {
            assert_eq!(r, EchoResponse::Ping(tag));
            left -= 1;
        }
    }
    assert!(echo.poll().unwrap().is_none());
    let server = h.join().unwrap();
    assert_eq!(server.stats().requests, calls + depth as u64);
    Pipelined {
        echo,
        server,
        would_block,
        most_in_flight: most,
    }
}

/// Pipelined `Kv` calls complete with their tags: `max_in_flight` puts fill every slot (one
/// more is `WouldBlock`, not corruption), each completes once; whole-request `Get`s issued
/// with `issue_request` come back through `poll_with`; and a completion that arrives during a
/// blocking call is kept for `poll`. Returns the client's `max_in_flight`.
pub(crate) fn pipelined_calls_complete_with_their_tags<F: Fixture>(fx: &mut F) -> usize {
    let (server, addr) = fx.server::<KvService>();
    let h = super::spawn_kv(server);
    let mut kv = KvClient::<F::Client>::connect(addr.borrow()).unwrap();
    let depth = kv.max_in_flight() as u64;
    for k in 0..depth {
        kv.issue(k).put(0, k, k + 100).unwrap();
    }
    // All slots are in use now: issuing more is backpressure, not corruption.
    assert!(matches!(
        kv.issue(999).put(0, 0, 0),
        Err(RpcError::WouldBlock)
    ));
    let mut seen = vec![false; depth as usize];
    while seen.iter().any(|s| !s) {
        if let Some((tag, resp)) = kv.poll().unwrap() {
            assert_eq!(resp, KvResponse::Put(()));
            assert!(!seen[tag as usize], "tag {tag} completed twice");
            seen[tag as usize] = true;
        }
    }
    for k in 0..depth {
        kv.issue_request(
            1000 + k,
            &KvRequest::Get(idl::kv::KvGetArgs { rank: 0, key: k }),
        )
        .unwrap();
    }
    let mut got = 0;
    while got < depth {
        got += kv
            .poll_with(|tag, r| assert_eq!(r.unwrap(), KvResponse::Get(Some(tag - 1000 + 100))))
            .unwrap() as u64;
    }
    // Blocking and pipelined calls mix: completions that arrive during a blocking call are
    // kept for poll.
    kv.issue(7).get(0, 3).unwrap();
    assert_eq!(kv.get(0, 4).unwrap(), Some(104));
    let mut r = None;
    while r.is_none() {
        r = kv.poll().unwrap();
    }
    assert_eq!(r, Some((7, KvResponse::Get(Some(103)))));
    h.join().unwrap();
    depth as usize
}

/// The first half of a deferred-reply scenario: issues pipelined gets of keys `0..n`
/// (tagged by key) and takes all `n` requests at the server without answering them
/// (releasing their receive space after each round). `client_polls`: the client polls after
/// each server round (a transport that sends on poll needs it; a first poll right after
/// issuing, which delivers nothing, sends the calls). Returns `(token, key)` in arrival
/// order.
pub(crate) fn take_deferred_gets<C: ClientTransport, T: ServerTransport>(
    kv: &mut KvClient<C>,
    server: &mut Server<KvService, T>,
    n: u64,
    client_polls: bool,
) -> Vec<(T::ReplyToken, u64)> {
    for k in 0..n {
        kv.issue(k).get(0, k).unwrap();
    }
    if client_polls {
        // Pipelined calls are sent when the client polls.
        assert!(kv.poll().unwrap().is_none());
    }
    let mut taken = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while (taken.len() as u64) < n {
        assert!(Instant::now() < deadline, "requests did not arrive");
        server.poll();
        while let Some((token, req)) = server.recv() {
            let KvRequest::Get(args) = req else {
                panic!("unexpected {req:?}")
            };
            taken.push((token, args.key()));
        }
        server.flush();
        if client_polls {
            assert!(kv.poll().unwrap().is_none(), "a response before any reply");
        }
    }
    let mut keys: Vec<u64> = taken.iter().map(|t| t.1).collect();
    keys.sort_unstable();
    assert_eq!(keys, (0..n).collect::<Vec<_>>());
    taken
}

/// The second half: polls the client (running `between` before each poll, e.g. a server
/// poll) until `got` holds `n` tags, each delivered with `Get(Some(tag * 10))`, the reply of
/// [`take_deferred_gets`]'s calls.
pub(crate) fn await_deferred_replies<C: ClientTransport>(
    kv: &mut KvClient<C>,
    got: &mut Vec<u64>,
    n: usize,
    mut between: impl FnMut(),
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < n {
        assert!(Instant::now() < deadline, "replies did not arrive");
        between();
        if let Some((tag, resp)) = kv.poll().unwrap() {
            assert_eq!(resp, KvResponse::Get(Some(tag * 10)));
            got.push(tag);
        }
    }
}

/// Sends one raw request message through a bare client transport and returns the response
/// bytes; the server's handler must not run (the request is undecodable).
pub(crate) fn raw_roundtrip<C: ClientTransport, T: ServerTransport>(
    t: &mut C,
    server: &mut Server<KvService, T>,
    msg: &[u8],
) -> Vec<u8> {
    let token = t
        .send(Duration::from_secs(5), 0, |b| {
            b[..msg.len()].copy_from_slice(msg);
            msg.len()
        })
        .unwrap();
    let mut out = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.is_none() {
        assert!(Instant::now() < deadline, "no response to a bad request");
        server.serve_once(|_| panic!("a bad request reached the handler"));
        t.poll(|tok, bytes| {
            assert_eq!(tok, token);
            out = Some(bytes.to_vec());
        })
        .unwrap();
    }
    out.unwrap()
}

/// Four undecodable requests through the bare client transport `raw` (an unknown method, a
/// `get` with a 4-byte body, 3 bytes, none) are each answered with their error status and
/// never reach the handler; `then` runs before the server's counts (4 bad, 0 good) are
/// checked. Then, through the typed client core over `raw`, a `get` with a 4-byte body
/// surfaces as [`RpcError::BadRequest`], tagged (5 bad requests now). Returns that client.
pub(crate) fn undecodable_requests_get_error_status<C: ClientTransport, T: ServerTransport>(
    mut raw: C,
    server: &mut Server<KvService, T>,
    then: impl FnOnce(&mut C, &mut Server<KvService, T>),
) -> Client<KvService, C> {
    let hdr = |method_id: u16, len: u32| {
        let mut v = Vec::new();
        v.extend_from_slice(&method_id.to_ne_bytes());
        v.extend_from_slice(&0u16.to_ne_bytes());
        v.extend_from_slice(&len.to_ne_bytes());
        v
    };
    // Unknown method.
    let r = raw_roundtrip(&mut raw, server, &hdr(77, 0));
    assert_eq!(header(&r).status, Status::UnknownMethod as u16);
    assert_eq!(header(&r).method_id, 77);
    // Wrong body length for get (expects 12 B).
    let mut m = hdr(KvService::GET, 4);
    m.extend_from_slice(&[0; 4]);
    assert_eq!(
        header(&raw_roundtrip(&mut raw, server, &m)).status,
        Status::BadLength as u16
    );
    // Shorter than a header; and empty.
    assert_eq!(
        header(&raw_roundtrip(&mut raw, server, &[1, 0, 0])).status,
        Status::Truncated as u16
    );
    assert_eq!(
        header(&raw_roundtrip(&mut raw, server, &[])).status,
        Status::Truncated as u16
    );
    then(&mut raw, server);
    assert_eq!(server.stats().bad_requests, 4);
    assert_eq!(server.stats().requests, 0);

    // Through the typed client core, a get with a 4-byte body is answered with an error
    // status and surfaces as RpcError::BadRequest, tagged.
    let mut kv = Client::<KvService, C>::from_transport(raw);
    kv.issue(5, KvService::GET, &0u32).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let got = loop {
        assert!(Instant::now() < deadline, "no answer");
        server.serve_once(|_| panic!("a bad request reached the handler"));
        match kv.poll() {
            Ok(None) => {}
            other => break other,
        }
    };
    match got {
        Err(RpcError::BadRequest {
            tag: 5,
            method: "get",
            status: Some(Status::BadLength),
        }) => {}
        other => panic!("expected BadRequest, got {other:?}"),
    }
    assert_eq!(server.stats().bad_requests, 5);
    kv
}

/// A client connecting to a server that never polls gives up after its connect timeout,
/// which `shorten` sets to 200 ms in the address, with the transport's timeout error
/// (`is_timeout`); once the server is dropped, connecting fails at once with
/// [`RpcError::ServerDisconnected`].
pub(crate) fn connect_times_out_when_the_server_does_not_poll<F: Fixture>(
    fx: &mut F,
    shorten: impl FnOnce(&mut F::Addr),
    is_timeout: impl FnOnce(&RpcError) -> bool,
) {
    let (server, mut addr) = fx.server::<KvService>();
    shorten(&mut addr);
    let t0 = Instant::now();
    match KvClient::<F::Client>::connect(addr.borrow()) {
        Err(e) => assert!(is_timeout(&e), "expected a timeout, got {e}"),
        Ok(_) => panic!("connected to a server that never polls"),
    }
    assert!(t0.elapsed() >= Duration::from_millis(200));
    assert!(t0.elapsed() < Duration::from_secs(5));
    // The server is gone: connecting fails at once.
    drop(server);
    assert!(matches!(
        KvClient::<F::Client>::connect(addr.borrow()),
        Err(RpcError::ServerDisconnected)
    ));
}

/// The first half of a server-gone scenario: `busy` and `idle` each make one served `put`
/// (both work), then `busy` issues gets of keys `0..n` that the server takes and never
/// answers (`between` runs after each server round, e.g. to keep `idle` polling). The
/// caller then drops the server and checks how each client learns it.
pub(crate) fn both_work_then_busy_unanswered<C: ClientTransport, T: ServerTransport>(
    server: &mut Server<KvService, T>,
    busy: &mut KvClient<C>,
    idle: &mut KvClient<C>,
    n: u64,
    mut between: impl FnMut(&mut Server<KvService, T>, &mut KvClient<C>),
) {
    let mut store = super::Store::default();
    for kv in [&mut *busy, &mut *idle] {
        kv.issue(1).put(0, 1, 1).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            assert!(Instant::now() < deadline);
            server.serve_once(|req| KvService::dispatch(&mut store, req));
            if kv.poll().unwrap().is_some() {
                break;
            }
        }
    }
    for k in 0..n {
        busy.issue(k).get(0, k).unwrap();
    }
    let mut taken = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while taken < n {
        assert!(Instant::now() < deadline, "requests did not arrive");
        assert!(busy.poll().unwrap().is_none());
        server.poll();
        while server.recv().is_some() {
            taken += 1;
        }
        between(server, idle);
    }
}
