//! The generated client (`<Trait>Client`, `<Trait>Issue`) over an in-process loopback
//! transport that answers every request synchronously through the generated codec and
//! `dispatch`: blocking calls, pipelined calls with tags, `poll`/`poll_with`, `issue_request`,
//! flow control (`WouldBlock`), mixing both forms, and server-side rejections; and a service
//! whose default transport is this user-defined type, named by its path
//! (`#[rpc_service(transport = crate::Loopback, derive(Debug, PartialEq))]`), with a transport's own error carried in
//! `RpcError::Transport`.

use std::collections::VecDeque;

use rpc::wire::{Status, encode_status};
use rpc::{ClientTransport, RpcError, Service, ServiceDescriptor, TransportError, rpc_service};

#[rpc_service(transport = "delegation", derive(Debug, PartialEq))]
pub trait Calc {
    /// Adds.
    fn add(&self, a: u32, b: u32) -> u64;
    fn div(&self, a: u32, b: u32) -> Result<u32, [u8; 4]>;
    fn find(&self, key: u64) -> Option<u64>;
    fn touch(&self);
}

struct Calculator;

impl CalcServer for Calculator {
    fn add(&self, a: u32, b: u32) -> u64 {
        a as u64 + b as u64
    }
    fn div(&self, a: u32, b: u32) -> Result<u32, [u8; 4]> {
        a.checked_div(b).ok_or(*b"div0")
    }
    fn find(&self, key: u64) -> Option<u64> {
        (key % 2 == 0).then_some(key / 2)
    }
    fn touch(&self) {}
}

/// What the loopback's "server" does with one request message.
type Handler = fn(&[u8], &mut [u8]) -> usize;

/// A transport that hands each request to a handler right away and queues the response.
struct Loopback {
    handler: Handler,
    service: &'static ServiceDescriptor,
    free: Vec<u32>,
    done: VecDeque<(u32, Vec<u8>)>,
    sent: usize,
}

impl ClientTransport for Loopback {
    type Addr = Handler;

    fn connect(addr: &Handler, service: &'static ServiceDescriptor) -> Result<Self, RpcError> {
        Ok(Loopback {
            handler: *addr,
            service,
            free: (0..2).rev().collect(),
            done: VecDeque::new(),
            sent: 0,
        })
    }

    fn max_in_flight(&self) -> usize {
        2
    }

    fn send(
        &mut self,
        _timeout: std::time::Duration,
        _method_id: u16,
        encode: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<u32, RpcError> {
        let token = self.free.pop().ok_or(RpcError::WouldBlock)?;
        let mut req = vec![0u8; self.service.max_request_bytes];
        let n = encode(&mut req);
        let mut resp = vec![0u8; self.service.max_response_bytes];
        let m = (self.handler)(&req[..n], &mut resp);
        resp.truncate(m);
        self.done.push_back((token, resp));
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
        Ok(n)
    }
}

/// The server side: decode, dispatch, encode; undecodable requests get an error status.
fn serve(req: &[u8], out: &mut [u8]) -> usize {
    match CalcService::decode_request(req) {
        Ok(req) => CalcService::encode_response(&CalcService::dispatch(&mut Calculator, req), out),
        Err(e) => encode_status(u16::from_ne_bytes([req[0], req[1]]), e.status(), out),
    }
}

/// A server that rejects everything.
fn reject(req: &[u8], out: &mut [u8]) -> usize {
    encode_status(
        u16::from_ne_bytes([req[0], req[1]]),
        Status::BadArguments,
        out,
    )
}

fn client() -> CalcClient<Loopback> {
    CalcClient::<Loopback>::connect(&(serve as Handler)).unwrap()
}

#[test]
fn blocking_calls() {
    let mut c = client();
    assert_eq!(c.add(2, 3).unwrap(), 5);
    assert_eq!(c.div(7, 2).unwrap(), Ok(3));
    assert_eq!(c.div(7, 0).unwrap(), Err(*b"div0"));
    assert_eq!(c.find(10).unwrap(), Some(5));
    assert_eq!(c.find(11).unwrap(), None);
    c.touch().unwrap();
    assert_eq!(c.in_flight(), 0);
    assert_eq!(c.max_in_flight(), 2);
    assert_eq!(c.transport().sent, 6);
    c.transport_mut().sent = 0;
    assert_eq!(c.transport().sent, 0);
}

#[test]
fn pipelined_calls_complete_with_their_tags() {
    let mut c = client();
    c.issue(10).add(1, 1).unwrap();
    c.issue(11).find(4).unwrap();
    assert_eq!(c.in_flight(), 2);
    // Both slots are taken: nothing is sent.
    assert!(matches!(c.issue(12).touch(), Err(RpcError::WouldBlock)));
    assert_eq!(c.transport().sent, 2);
    assert_eq!(c.poll().unwrap(), Some((10, CalcResponse::Add(2))));
    assert_eq!(c.poll().unwrap(), Some((11, CalcResponse::Find(Some(2)))));
    assert_eq!(c.poll().unwrap(), None);
    assert_eq!(c.in_flight(), 0);

    c.issue_request(20, &CalcRequest::div(9, 3)).unwrap();
    c.issue(21).touch().unwrap();
    let mut got = Vec::new();
    let n = c.poll_with(|tag, r| got.push((tag, r.unwrap()))).unwrap();
    assert_eq!(n, 2);
    assert_eq!(
        got,
        [
            (20, CalcResponse::Div(Ok(3))),
            (21, CalcResponse::Touch(()))
        ]
    );
}

#[test]
fn blocking_call_keeps_pipelined_completions_for_poll() {
    let mut c = client();
    c.issue(7).add(40, 2).unwrap();
    assert_eq!(c.find(8).unwrap(), Some(4));
    assert_eq!(c.in_flight(), 1);
    assert_eq!(c.poll().unwrap(), Some((7, CalcResponse::Add(42))));
}

#[test]
fn rejected_requests_fail_with_the_tag_and_method() {
    let mut c = CalcClient::<Loopback>::connect(&(reject as Handler)).unwrap();
    match c.add(1, 2) {
        Err(RpcError::BadRequest { method, status, .. }) => {
            assert_eq!((method, status), ("add", Some(Status::BadArguments)));
        }
        other => panic!("expected BadRequest, got {other:?}"),
    }
    c.issue(99).find(1).unwrap();
    match c.poll() {
        Err(RpcError::BadRequest { tag, method, .. }) => assert_eq!((tag, method), (99, "find")),
        other => panic!("expected BadRequest, got {other:?}"),
    }
}

#[test]
fn the_default_transport_is_the_attributes() {
    fn default_client_is_delegation(
        _: Option<CalcClient>,
    ) -> Option<CalcClient<rpc::delegation::Delegation>> {
        None
    }
    assert!(default_client_is_delegation(None).is_none());
    assert_eq!(<CalcService as Service>::DESCRIPTOR.name, "Calc");
}

/// A service whose default transport is a type defined here, named by its path.
#[rpc_service(transport = crate::Loopback, derive(Debug, PartialEq))]
trait Echo {
    fn echo(&self, x: u64) -> u64;
}

struct Echoer;

impl EchoServer for Echoer {
    fn echo(&self, x: u64) -> u64 {
        x
    }
}

fn serve_echo(req: &[u8], out: &mut [u8]) -> usize {
    let req = EchoService::decode_request(req).unwrap();
    EchoService::encode_response(&EchoService::dispatch(&mut Echoer, req), out)
}

#[test]
fn a_user_defined_transport_is_named_by_its_path() {
    // `EchoClient` without a type argument is `EchoClient<Loopback>`.
    let mut c: EchoClient = EchoClient::connect(&(serve_echo as Handler)).unwrap();
    assert_eq!(c.echo(7).unwrap(), 7);
    c.issue(3).echo(9).unwrap();
    assert_eq!(c.poll().unwrap(), Some((3, EchoResponse::Echo(9))));
    let loopback: &Loopback = c.transport();
    assert_eq!(loopback.sent, 2);
}

/// A transport's own error, unknown to the runtime.
#[derive(Debug, PartialEq)]
struct Unreachable(u16);

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "port {} unreachable", self.0)
    }
}

impl std::error::Error for Unreachable {}

/// A transport that never connects, failing with its own error.
struct Unconnectable;

impl ClientTransport for Unconnectable {
    type Addr = u16;

    fn connect(port: &u16, _: &'static ServiceDescriptor) -> Result<Self, RpcError> {
        Err(TransportError::new("unconnectable", Unreachable(*port)).into())
    }

    fn max_in_flight(&self) -> usize {
        1
    }

    fn send(
        &mut self,
        _: std::time::Duration,
        _: u16,
        _: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<u32, RpcError> {
        unreachable!()
    }

    fn poll(&mut self, _: impl FnMut(u32, &[u8])) -> Result<usize, RpcError> {
        unreachable!()
    }
}

#[test]
fn a_user_defined_transport_error_is_carried_and_recovered() {
    let Err(e) = EchoClient::<Unconnectable>::connect(&7) else {
        panic!("connected")
    };
    assert_eq!(e.transport::<Unreachable>(), Some(&Unreachable(7)));
    assert_eq!(e.to_string(), "port 7 unreachable");
    assert!(e.transport::<std::io::Error>().is_none());
    match e {
        RpcError::Transport(t) => {
            assert_eq!(t.transport(), "unconnectable");
            assert_eq!(*t.downcast::<Unreachable>().unwrap(), Unreachable(7));
        }
        other => panic!("expected RpcError::Transport, got {other:?}"),
    }
    assert!(RpcError::WouldBlock.transport::<Unreachable>().is_none());
}
