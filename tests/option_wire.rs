//! `Option`/`Result` of types that reject all-zero bytes (issue 17, point 5): an enum without
//! a zero variant works inside `Option`/`Result` in `#[rpc_service]` signatures. The wire form
//! keeps each side as raw bytes, sends the inactive side zeroed and never reads it, and
//! validates the active side when a request or response is decoded:
//! - values round-trip through the generated codec, nested forms included;
//! - the wire bytes of services that worked before are unchanged (exact bytes and fingerprint
//!   recorded before the change);
//! - an invalid active side is `WireError::BadValue`: the server answers `BadArguments` (the
//!   typed client gets `RpcError::BadRequest`), the client reports `RpcError::BadResponse`;
//! - garbage in an inactive side decodes fine.

mod typed_common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use rpc::delegation::{Delegation, DelegationConfig, DelegationServer};
use rpc::wire::{HEADER_BYTES, MsgHeader, Status, WireError};
use rpc::{RpcError, Service, rpc_service};
use zerocopy::{Immutable, IntoBytes, KnownLayout, TryFromBytes};

/// No zero discriminant: all-zero bytes are not a `Color`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, TryFromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(u8)]
pub enum Color {
    /// Discriminant 1.
    Red = 1,
    /// Discriminant 2.
    Green = 2,
    /// Discriminant 3.
    Blue = 3,
}

#[rpc_service(transport = "delegation", derive(Debug, PartialEq))]
pub trait Paint {
    fn set(&mut self, c: Option<Color>) -> Option<Color>;
    fn mix(&mut self, r: Result<Color, Color>) -> Result<Color, Color>;
    fn nested(
        &mut self,
        a: Option<Option<Color>>,
        b: Result<Option<Color>, Color>,
        c: [Option<Color>; 3],
        d: Option<[Color; 2]>,
    ) -> Result<Option<Color>, Color>;
}

/// Answers are pure functions of the arguments.
struct Painter;

impl PaintServer for Painter {
    fn set(&mut self, c: Option<Color>) -> Option<Color> {
        c
    }
    fn mix(&mut self, r: Result<Color, Color>) -> Result<Color, Color> {
        r.map_err(|c| if c == Color::Red { Color::Blue } else { c })
    }
    fn nested(
        &mut self,
        a: Option<Option<Color>>,
        b: Result<Option<Color>, Color>,
        c: [Option<Color>; 3],
        d: Option<[Color; 2]>,
    ) -> Result<Option<Color>, Color> {
        match (a, d) {
            (Some(inner), _) => Ok(inner.or(c[2])),
            (None, Some([_, x])) => Err(x),
            (None, None) => b,
        }
    }
}

/// A service of types that worked before the change (all `FromZeros`): its wire bytes and
/// fingerprint must not change.
#[rpc_service(transport = "delegation")]
pub trait Legacy {
    fn get(&mut self, key: Option<u64>, r: Result<u32, u16>) -> Option<u64>;
    fn nested(
        &mut self,
        n: Option<[Option<u8>; 2]>,
        m: [Option<Result<bool, char>>; 2],
    ) -> Result<Option<u16>, u8>;
}

fn header(msg: &[u8]) -> MsgHeader {
    rpc::wire::read_header(msg).unwrap()
}

/// A request message for `method_id` with `body`.
fn request(method_id: u16, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&method_id.to_ne_bytes());
    v.extend_from_slice(&0u16.to_ne_bytes());
    v.extend_from_slice(&(body.len() as u32).to_ne_bytes());
    v.extend_from_slice(body);
    v
}

fn paint_requests() -> Vec<PaintRequest> {
    use Color::*;
    vec![
        PaintRequest::set(Some(Green)),
        PaintRequest::set(None),
        PaintRequest::mix(Ok(Blue)),
        PaintRequest::mix(Err(Red)),
        PaintRequest::mix(Err(Green)),
        PaintRequest::nested(Some(Some(Red)), Ok(None), [None; 3], None),
        PaintRequest::nested(
            Some(None),
            Err(Blue),
            [None, None, Some(Green)],
            Some([Red, Red]),
        ),
        PaintRequest::nested(
            None,
            Ok(Some(Blue)),
            [Some(Red), None, Some(Blue)],
            Some([Green, Blue]),
        ),
        PaintRequest::nested(None, Ok(Some(Green)), [Some(Red); 3], None),
        PaintRequest::nested(None, Err(Red), [None; 3], None),
    ]
}

#[test]
fn non_zero_enum_round_trips_through_the_codec() {
    let mut server = Painter;
    let mut buf = [0u8; 256];
    let mut out = [0u8; 256];
    for req in paint_requests() {
        let n = PaintService::encode_request(&req, &mut buf);
        let decoded = PaintService::decode_request(&buf[..n]).unwrap();
        assert_eq!(decoded, req);
        let id = header(&buf[..n]).method_id;
        let want = match req {
            PaintRequest::Set(a) => PaintResponse::Set(Painter.set(a.c())),
            PaintRequest::Mix(a) => PaintResponse::Mix(Painter.mix(a.r())),
            PaintRequest::Nested(a) => {
                PaintResponse::Nested(Painter.nested(a.a(), a.b(), a.c(), a.d()))
            }
        };
        let resp = PaintService::dispatch(&mut server, decoded);
        assert_eq!(resp, want, "{req:?}");
        let m = PaintService::encode_response(&resp, &mut out);
        assert_eq!(PaintService::decode_response(id, &out[..m]).unwrap(), want);
    }
    // The accessors give the values back as written.
    let PaintRequest::Nested(a) = PaintRequest::nested(
        Some(None),
        Ok(Some(Color::Blue)),
        [Some(Color::Red), None, Some(Color::Green)],
        Some([Color::Green, Color::Red]),
    ) else {
        unreachable!()
    };
    assert_eq!(a.a(), Some(None));
    assert_eq!(a.b(), Ok(Some(Color::Blue)));
    assert_eq!(a.c(), [Some(Color::Red), None, Some(Color::Green)]);
    assert_eq!(a.d(), Some([Color::Green, Color::Red]));
    // The layout: a tag byte, then each side's bytes (the inactive side zeroed).
    let mut body = |req: PaintRequest| {
        let n = PaintService::encode_request(&req, &mut buf);
        buf[HEADER_BYTES..n].to_vec()
    };
    assert_eq!(body(PaintRequest::set(Some(Color::Green))), [1, 2]);
    assert_eq!(body(PaintRequest::set(None)), [0, 0]);
    assert_eq!(body(PaintRequest::mix(Ok(Color::Blue))), [0, 3, 0]);
    assert_eq!(body(PaintRequest::mix(Err(Color::Red))), [1, 0, 1]);
    assert_eq!(
        body(PaintRequest::nested(
            Some(Some(Color::Red)),
            Err(Color::Green),
            [None, Some(Color::Blue), None],
            Some([Color::Red, Color::Green]),
        )),
        [
            1, 1, 1, /* b */ 1, 0, 0, 2, /* c */ 0, 0, 1, 3, 0, 0, /* d */ 1, 1, 2
        ]
    );
    let m = &PaintService::DESCRIPTOR.methods;
    assert_eq!((m[0].args[0].size, m[0].ret_size), (2, 2));
    assert_eq!((m[1].args[0].size, m[1].ret_size), (3, 3));
    let sizes: Vec<usize> = m[2].args.iter().map(|a| a.size).collect();
    assert_eq!((sizes, m[2].ret_size), (vec![3, 4, 6, 3], 4));
}

#[test]
fn wire_bytes_and_fingerprint_of_earlier_types_are_unchanged() {
    // Recorded with the previous wire form (`WireOption<T>` zeroing `T`) before the change.
    assert_eq!(LegacyService::DESCRIPTOR.fingerprint, 0x404d_ac65_9cec_24d8);
    let mut out = [0u8; 64];
    let cases: [(LegacyRequest, &[u8]); 4] = [
        (
            LegacyRequest::get(Some(0x0102_0304_0506_0708), Ok(0x0a0b_0c0d)),
            &[
                0, 0, 0, 0, 16, 0, 0, 0, 1, 8, 7, 6, 5, 4, 3, 2, 1, 0, 13, 12, 11, 10, 0, 0,
            ],
        ),
        (
            LegacyRequest::get(None, Err(0x1234)),
            &[
                0, 0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 52, 18,
            ],
        ),
        (
            LegacyRequest::nested(Some([Some(7), None]), [None, Some(Err('x'))]),
            &[
                1, 0, 0, 0, 19, 0, 0, 0, 1, 1, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 120, 0, 0, 0,
            ],
        ),
        (
            LegacyRequest::nested(None, [Some(Ok(true)), Some(Err('\u{1F600}'))]),
            &[
                1, 0, 0, 0, 19, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 246, 1, 0,
            ],
        ),
    ];
    if cfg!(target_endian = "little") {
        for (req, bytes) in cases {
            let n = LegacyService::encode_request(&req, &mut out);
            assert_eq!(&out[..n], bytes, "{}", req_name(&req));
            assert!(LegacyService::decode_request(bytes).is_ok());
        }
    }
    let resps: [(LegacyResponse, &[u8]); 5] = [
        (
            LegacyResponse::Get(Some(5)),
            &[0, 0, 0, 0, 9, 0, 0, 0, 1, 5, 0, 0, 0, 0, 0, 0, 0],
        ),
        (
            LegacyResponse::Get(None),
            &[0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        ),
        (
            LegacyResponse::Nested(Ok(Some(0x0102))),
            &[1, 0, 0, 0, 5, 0, 0, 0, 0, 1, 2, 1, 0],
        ),
        (
            LegacyResponse::Nested(Ok(None)),
            &[1, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0],
        ),
        (
            LegacyResponse::Nested(Err(9)),
            &[1, 0, 0, 0, 5, 0, 0, 0, 1, 0, 0, 0, 9],
        ),
    ];
    if cfg!(target_endian = "little") {
        for (resp, bytes) in resps {
            let n = LegacyService::encode_response(&resp, &mut out);
            assert_eq!(&out[..n], bytes);
            let id = header(bytes).method_id;
            assert!(LegacyService::decode_response(id, bytes).is_ok());
        }
    }
}

fn req_name(req: &LegacyRequest) -> &'static str {
    match req {
        LegacyRequest::Get(_) => "get",
        LegacyRequest::Nested(_) => "nested",
    }
}

/// Request bodies whose active side holds an invalid value, per method.
fn invalid_request_bodies() -> Vec<(u16, Vec<u8>)> {
    let mut v = Vec::new();
    for bad in [0u8, 4, 7, 0xFF] {
        v.push((PaintService::SET, vec![1, bad]));
        v.push((PaintService::MIX, vec![0, bad, 1]));
        v.push((PaintService::MIX, vec![1, 1, bad]));
        let nested_ok: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        // a = Some(Some(bad))
        let mut b = nested_ok;
        b[..3].copy_from_slice(&[1, 1, bad]);
        v.push((PaintService::NESTED, b.to_vec()));
        // b = Ok(Some(bad))
        let mut b = nested_ok;
        b[3..7].copy_from_slice(&[0, 1, bad, 0]);
        v.push((PaintService::NESTED, b.to_vec()));
        // b = Err(bad)
        let mut b = nested_ok;
        b[3..7].copy_from_slice(&[1, 0, 0, bad]);
        v.push((PaintService::NESTED, b.to_vec()));
        // c[2] = Some(bad)
        let mut b = nested_ok;
        b[11..13].copy_from_slice(&[1, bad]);
        v.push((PaintService::NESTED, b.to_vec()));
        // d = Some([Red, bad])
        let mut b = nested_ok;
        b[13..16].copy_from_slice(&[1, 1, bad]);
        v.push((PaintService::NESTED, b.to_vec()));
    }
    // a = Some(x) where x's own tag is invalid (checked when the outer side is raised).
    let mut b = [0u8; 16];
    b[..3].copy_from_slice(&[1, 2, 1]);
    v.push((PaintService::NESTED, b.to_vec()));
    v
}

#[test]
fn invalid_active_side_is_bad_value() {
    for (id, body) in invalid_request_bodies() {
        assert_eq!(
            PaintService::decode_request(&request(id, &body)),
            Err(WireError::BadValue { method_id: id }),
            "request {id} {body:?}"
        );
    }
    let response = |id: u16, body: &[u8]| {
        let mut m = request(id, body);
        m[2..4].copy_from_slice(&0u16.to_ne_bytes());
        m
    };
    for bad in [0u8, 4, 7, 0xFF] {
        for (id, body) in [
            (PaintService::SET, vec![1, bad]),
            (PaintService::MIX, vec![0, bad, 0]),
            (PaintService::MIX, vec![1, 0, bad]),
            (PaintService::NESTED, vec![0, 1, bad, 0]),
            (PaintService::NESTED, vec![1, 0, 0, bad]),
        ] {
            assert_eq!(
                PaintService::decode_response(id, &response(id, &body)),
                Err(WireError::BadValue { method_id: id }),
                "response {id} {body:?}"
            );
        }
    }
}

#[test]
fn garbage_in_an_inactive_side_decodes() {
    use Color::*;
    let g = 0xFF;
    let cases: Vec<(u16, Vec<u8>, PaintRequest)> = vec![
        (PaintService::SET, vec![0, g], PaintRequest::set(None)),
        (
            PaintService::MIX,
            vec![0, 2, g],
            PaintRequest::mix(Ok(Green)),
        ),
        (
            PaintService::MIX,
            vec![1, g, 1],
            PaintRequest::mix(Err(Red)),
        ),
        (
            PaintService::NESTED,
            vec![
                0, g, g, /* b */ 0, 0, g, g, /* c */ 0, g, 1, 3, 0, g, /* d */ 0, g,
                g,
            ],
            PaintRequest::nested(None, Ok(None), [None, Some(Blue), None], None),
        ),
        (
            PaintService::NESTED,
            vec![
                1, 0, g, /* b */ 1, g, g, 3, /* c */ 0, 0, 0, 0, 0, 0, /* d */ 1, 2,
                1,
            ],
            PaintRequest::nested(Some(None), Err(Blue), [None; 3], Some([Green, Red])),
        ),
    ];
    for (id, body, want) in cases {
        assert_eq!(
            PaintService::decode_request(&request(id, &body)),
            Ok(want),
            "{body:?}"
        );
    }
    let mut m = request(PaintService::MIX, &[1, g, 2]);
    assert_eq!(
        PaintService::decode_response(PaintService::MIX, &m),
        Ok(PaintResponse::Mix(Err(Green)))
    );
    m[HEADER_BYTES..].copy_from_slice(&[0, 3, g]);
    assert_eq!(
        PaintService::decode_response(PaintService::MIX, &m),
        Ok(PaintResponse::Mix(Ok(Blue)))
    );
}

/// An argument struct cast from bytes by hand skips `decode_request`'s validation; its
/// accessor refuses the invalid value with a panic (documented), never an invalid `Color`.
#[test]
#[should_panic(expected = "not decoded by rpc::Service::decode_request")]
fn accessor_of_an_unvalidated_struct_panics() {
    let args = PaintSetArgs::try_read_from_bytes(&[1, 9][..]).unwrap();
    let _ = args.c();
}

fn name(tag: &str) -> String {
    format!("rpc-optwire-{}-{tag}", std::process::id())
}

#[test]
fn server_answers_an_invalid_active_side_with_bad_arguments() {
    let n = name("badreq");
    let mut server =
        DelegationServer::serve::<PaintService>(&n, DelegationConfig::default()).unwrap();
    let bodies = invalid_request_bodies();
    for (id, body) in &bodies {
        let r = typed_common::raw_ring_roundtrip(&n, &mut server, &request(*id, body));
        assert_eq!(
            header(&r).status,
            Status::BadArguments as u16,
            "{id} {body:?}"
        );
        assert_eq!(header(&r).method_id, *id);
    }
    assert_eq!(server.stats().bad_requests, bodies.len() as u64);
    assert_eq!(server.stats().requests, 0);

    // Through the typed client: a request whose argument struct was cast from bad bytes by
    // hand is rejected by the server, and the call ends with `RpcError::BadRequest`; a valid
    // one with garbage in its inactive side is served.
    let mut client = PaintClient::<Delegation>::connect(&n).unwrap();
    let bad = PaintSetArgs::try_read_from_bytes(&[1, 7][..]).unwrap();
    client.issue_request(1, &PaintRequest::Set(bad)).unwrap();
    let garbage = PaintMixArgs::try_read_from_bytes(&[1, 0xFF, 2][..]).unwrap();
    client
        .issue_request(2, &PaintRequest::Mix(garbage))
        .unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < 2 {
        assert!(Instant::now() < deadline, "calls did not complete");
        server.serve_once(|req| PaintService::dispatch(&mut Painter, req));
        match client.poll() {
            Ok(None) => {}
            Ok(Some((tag, resp))) => got.push((tag, Ok(resp))),
            Err(e) => got.push((u64::MAX, Err(e))),
        }
    }
    got.sort_by_key(|(tag, _)| *tag);
    assert_eq!(got[0].0, 2);
    assert_eq!(
        got[0].1.as_ref().unwrap(),
        &PaintResponse::Mix(Err(Color::Green))
    );
    match &got[1].1 {
        Err(RpcError::BadRequest {
            tag: 1,
            method: "set",
            status: Some(Status::BadArguments),
        }) => {}
        other => panic!("expected BadRequest, got {other:?}"),
    }
    assert_eq!(server.stats().bad_requests, bodies.len() as u64 + 1);
}

/// A server thread that answers every request with `body` as a successful response.
fn spawn_raw_server(name: &str, body: Vec<u8>) -> (Arc<AtomicBool>, thread::JoinHandle<()>) {
    let mut server =
        DelegationServer::serve::<PaintService>(name, DelegationConfig::default()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let h = thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !stop2.load(Ordering::Relaxed) && Instant::now() < deadline {
            server.poll();
            match server.recv() {
                Some((token, req)) => {
                    let mut b = Vec::new();
                    b.extend_from_slice(&PaintService::request_method_id(&req).to_ne_bytes());
                    b.extend_from_slice(&0u16.to_ne_bytes());
                    b.extend_from_slice(&(body.len() as u32).to_ne_bytes());
                    b.extend_from_slice(&body);
                    server.transport_mut().ring_mut().reply(token, &b).unwrap();
                    server.flush();
                }
                None => thread::yield_now(),
            }
        }
    });
    (stop, h)
}

#[test]
fn client_reports_an_invalid_response_value_as_bad_response() {
    let n = name("badresp");
    // `set` answered with `Some(7)`: 7 is not a `Color`.
    let (stop, h) = spawn_raw_server(&n, vec![1, 7]);
    let mut client = PaintClient::<Delegation>::connect(&n).unwrap();
    // Blocking call.
    match client.set(Some(Color::Red)) {
        Err(RpcError::BadResponse {
            method: "set",
            error: WireError::BadValue { method_id: 0 },
            ..
        }) => {}
        other => panic!("expected BadResponse, got {other:?}"),
    }
    // Pipelined call.
    client.issue(4).set(None).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let got = loop {
        assert!(Instant::now() < deadline, "call did not complete");
        match client.poll() {
            Ok(None) => thread::yield_now(),
            other => break other,
        }
    };
    match got {
        Err(RpcError::BadResponse {
            tag: 4,
            method: "set",
            error: WireError::BadValue { method_id: 0 },
        }) => {}
        other => panic!("expected BadResponse, got {other:?}"),
    }
    stop.store(true, Ordering::Relaxed);
    h.join().unwrap();

    // Garbage in the inactive side of a response is fine.
    let n = name("inactive");
    let (stop, h) = spawn_raw_server(&n, vec![0, 0xFF]);
    let mut client = PaintClient::<Delegation>::connect(&n).unwrap();
    assert_eq!(client.set(Some(Color::Red)).unwrap(), None);
    stop.store(true, Ordering::Relaxed);
    h.join().unwrap();
}
