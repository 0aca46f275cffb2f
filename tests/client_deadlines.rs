//! Deadlines of the generic client (`rpc::Client`, generated `with_deadline`/`issue(..).with_deadline`)
//! over a scripted in-process transport that withholds responses until the test releases them:
//! expiry of blocking and pipelined calls, late responses dropped and counted (never completing
//! the later call that reuses their token), waits for room bounded by the deadline, stray
//! responses. No timing luck: a withheld response stays withheld until the test releases it,
//! so the deadline always passes first.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rpc::client::{BLOCKING_TAG, ClientStats};
use rpc::{ClientTransport, RpcError, Service, ServiceDescriptor, rpc_service};

#[rpc_service(transport = "delegation", derive(Debug, PartialEq))]
pub trait Calc {
    fn add(&self, a: u32, b: u32) -> u64;
    fn touch(&self);
}

struct Calculator;

impl CalcServer for Calculator {
    fn add(&self, a: u32, b: u32) -> u64 {
        a as u64 + b as u64
    }
    fn touch(&self) {}
}

/// A transport whose "server" answers at once, but whose responses are withheld while
/// `hold` is set (until [`Scripted::release`]), and which can refuse to send (`full`).
struct Scripted {
    service: &'static ServiceDescriptor,
    free: Vec<u32>,
    held: VecDeque<(u32, Vec<u8>)>,
    done: VecDeque<(u32, Vec<u8>)>,
    hold: bool,
    full: bool,
    sent: usize,
    /// `wait_for_response` says it waited (without waiting: a transport whose waits end at
    /// once) when set; else it declines, as the default does.
    can_wait: bool,
    /// Polls that delivered nothing so far.
    empty_polls: usize,
    /// Each `wait_for_response`: the empty polls before it, `waited` and `max`.
    waits: Vec<(usize, Duration, Duration)>,
}

impl Scripted {
    fn new(tokens: u32) -> Self {
        Scripted {
            service: CalcService::DESCRIPTOR,
            free: (0..tokens).rev().collect(),
            held: VecDeque::new(),
            done: VecDeque::new(),
            hold: false,
            full: false,
            sent: 0,
            can_wait: false,
            empty_polls: 0,
            waits: Vec::new(),
        }
    }

    /// Makes every withheld response deliverable, in order.
    fn release(&mut self) {
        self.done.extend(self.held.drain(..));
    }
}

impl ClientTransport for Scripted {
    type Addr = ();

    fn connect(_: &(), _: &'static ServiceDescriptor) -> Result<Self, RpcError> {
        Ok(Scripted::new(1))
    }

    fn max_in_flight(&self) -> usize {
        self.free.len() + self.held.len() + self.done.len()
    }

    fn send(
        &mut self,
        _timeout: Duration,
        _method_id: u16,
        encode: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<u32, RpcError> {
        if self.full {
            return Err(RpcError::WouldBlock);
        }
        let token = self.free.pop().ok_or(RpcError::WouldBlock)?;
        let mut req = vec![0u8; self.service.max_request_bytes];
        let n = encode(&mut req);
        let req = CalcService::decode_request(&req[..n]).unwrap();
        let mut resp = vec![0u8; self.service.max_response_bytes];
        let m =
            CalcService::encode_response(&CalcService::dispatch(&mut Calculator, req), &mut resp);
        resp.truncate(m);
        if self.hold {
            self.held.push_back((token, resp));
        } else {
            self.done.push_back((token, resp));
        }
        self.sent += 1;
        Ok(token)
    }

    fn poll(&mut self, mut on_response: impl FnMut(u32, &[u8])) -> Result<usize, RpcError> {
        let mut n = 0;
        while let Some((token, resp)) = self.done.pop_front() {
            self.free.push(token);
            on_response(token, &resp);
            n += 1;
        }
        if n == 0 {
            self.empty_polls += 1;
        }
        Ok(n)
    }

    fn wait_for_response(&mut self, waited: Duration, max: Duration) -> bool {
        self.waits.push((self.empty_polls, waited, max));
        self.can_wait
    }
}

fn client(tokens: u32) -> CalcClient<Scripted> {
    CalcClient::from_transport(Scripted::new(tokens))
}

const SHORT: Duration = Duration::from_millis(5);

#[test]
fn the_default_deadline_is_one_second_and_settable() {
    let mut c = client(1);
    assert_eq!(c.default_deadline(), Duration::from_secs(1));
    assert_eq!(c.default_deadline(), rpc::client::DEFAULT_DEADLINE);
    c.set_default_deadline(SHORT);
    assert_eq!(c.default_deadline(), SHORT);
    c.transport_mut().hold = true;
    let t = Instant::now();
    let e = c.add(1, 2).unwrap_err();
    assert!(
        matches!(e, RpcError::DeadlineExceeded { tag: BLOCKING_TAG, method: "add", timeout } if timeout == SHORT),
        "{e}"
    );
    assert!(t.elapsed() >= SHORT);
}

#[test]
fn a_late_response_never_completes_the_call_that_reuses_its_token() {
    // One token: the call after the expired one must reuse it.
    let mut c = client(1);
    c.transport_mut().hold = true;
    let e = c.with_deadline(SHORT).add(1, 2).unwrap_err();
    assert!(
        matches!(e, RpcError::DeadlineExceeded { method: "add", .. }),
        "{e}"
    );
    assert_eq!(c.zombies(), 1);
    assert_eq!(c.in_flight(), 0);
    assert_eq!(
        c.stats(),
        ClientStats {
            expired: 1,
            ..Default::default()
        }
    );
    // The server answers the expired call (3) late; the next call (30) must get its own answer.
    c.transport_mut().hold = false;
    c.transport_mut().release();
    assert_eq!(c.add(10, 20).unwrap(), 30);
    assert_eq!(c.zombies(), 0);
    assert_eq!(
        c.stats(),
        ClientStats {
            expired: 1,
            late_responses: 1,
            ..Default::default()
        }
    );
    assert_eq!(c.transport().sent, 2);
}

#[test]
fn pipelined_calls_expire_with_their_tags() {
    let mut c = client(4);
    c.transport_mut().hold = true;
    c.issue(7).with_deadline(SHORT).add(1, 1).unwrap();
    c.issue(8)
        .with_deadline(Duration::from_secs(3600))
        .add(2, 2)
        .unwrap();
    assert_eq!(c.in_flight(), 2);
    let until = Instant::now() + Duration::from_secs(10);
    let e = loop {
        assert!(Instant::now() < until, "the call never expired");
        match c.poll() {
            Ok(None) => std::thread::yield_now(),
            Err(e) => break e,
            Ok(Some(r)) => panic!("unexpected completion {r:?}"),
        }
    };
    assert!(
        matches!(
            e,
            RpcError::DeadlineExceeded {
                tag: 7,
                method: "add",
                ..
            }
        ),
        "{e}"
    );
    // Tag 8 (long deadline) is still in flight; tag 7 is a zombie.
    assert_eq!((c.in_flight(), c.zombies()), (1, 1));
    c.transport_mut().release();
    let mut got = Vec::new();
    while got.is_empty() {
        assert!(Instant::now() < until);
        c.poll_with(|tag, r| got.push((tag, r.unwrap()))).unwrap();
    }
    assert_eq!(got, [(8, CalcResponse::Add(4))]);
    assert_eq!((c.in_flight(), c.zombies()), (0, 0));
    assert_eq!(c.stats().late_responses, 1);
}

#[test]
fn poll_with_reports_expiry_to_the_callback() {
    let mut c = client(2);
    c.transport_mut().hold = true;
    c.issue(5).with_deadline(SHORT).touch().unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    while got.is_empty() {
        assert!(Instant::now() < until, "the call never expired");
        c.poll_with(|tag, r| got.push((tag, r))).unwrap();
    }
    assert!(
        matches!(
            got[..],
            [(5, Err(RpcError::DeadlineExceeded { tag: 5, .. }))]
        ),
        "{got:?}"
    );
    assert_eq!(c.stats().expired, 1);
}

#[test]
fn a_blocking_call_keeps_pipelined_expiries_for_poll() {
    let mut c = client(2);
    c.transport_mut().hold = true;
    c.issue(1).with_deadline(SHORT).touch().unwrap();
    // The blocking call outlives the pipelined one's deadline; it finds the expiry and keeps it.
    let e = c
        .with_deadline(Duration::from_millis(50))
        .add(1, 1)
        .unwrap_err();
    assert!(
        matches!(
            e,
            RpcError::DeadlineExceeded {
                tag: BLOCKING_TAG,
                ..
            }
        ),
        "{e}"
    );
    assert!(matches!(
        c.poll(),
        Err(RpcError::DeadlineExceeded { tag: 1, .. })
    ));
    assert_eq!(c.zombies(), 2);
}

#[test]
fn waiting_for_room_to_send_is_bounded_by_the_deadline() {
    let mut c = client(2);
    c.transport_mut().full = true;
    let e = c.with_deadline(SHORT).touch().unwrap_err();
    assert!(
        matches!(
            e,
            RpcError::DeadlineExceeded {
                method: "touch",
                ..
            }
        ),
        "{e}"
    );
    // Nothing was sent, so nothing is left behind.
    assert_eq!(
        (c.transport().sent, c.zombies(), c.stats().expired),
        (0, 0, 0)
    );
    // All tokens held by zombies: the next blocking call waits for room, then fails in time.
    c.transport_mut().full = false;
    c.transport_mut().hold = true;
    for _ in 0..2 {
        assert!(c.with_deadline(SHORT).touch().is_err());
    }
    assert_eq!(c.zombies(), 2);
    let e = c.with_deadline(SHORT).touch().unwrap_err();
    assert!(matches!(e, RpcError::DeadlineExceeded { .. }), "{e}");
    assert_eq!(c.transport().sent, 2);
}

#[test]
fn a_response_for_a_token_without_a_call_is_dropped_and_counted() {
    let mut c = client(2);
    // A response under a token nobody used (a broken transport or peer).
    c.transport_mut().done.push_back((1, vec![0; 8]));
    c.transport_mut().free.retain(|&t| t != 1);
    assert_eq!(c.add(2, 2).unwrap(), 4);
    assert_eq!(c.stats().stray_responses, 1);
}

#[test]
fn a_blocking_call_asks_its_transport_to_wait_only_after_its_backoff_and_within_its_deadline() {
    for can_wait in [false, true] {
        let mut c = client(1);
        let t = c.transport_mut();
        t.hold = true;
        t.can_wait = can_wait;
        let start = Instant::now();
        let e = c.with_deadline(SHORT).add(1, 2).unwrap_err();
        assert!(
            matches!(e, RpcError::DeadlineExceeded { method: "add", .. }),
            "{e}"
        );
        let elapsed = start.elapsed();
        assert!(elapsed >= SHORT);
        let waits = &c.transport().waits;
        assert!(!waits.is_empty(), "5 ms of empty polls ask for waits");
        // crossbeam's Backoff: 7 rounds of spinning and 4 yields (11 empty polls) first.
        assert!(waits[0].0 >= 11, "asked after {} empty polls", waits[0].0);
        let mut last = Duration::ZERO;
        for &(_, waited, max) in waits {
            assert!(waited >= last, "the wait's age only grows");
            assert!(waited <= elapsed);
            last = waited;
            assert!(max > Duration::ZERO && max <= Duration::from_millis(1));
            assert!(max <= SHORT, "never past the deadline");
        }
        // A transport that declines is asked again after each yield; one that waits (here:
        // returns at once, as a wait woken by other traffic does) does not end the call
        // early or keep it past its deadline.
        assert_eq!(c.stats().expired, 1);
    }
}
