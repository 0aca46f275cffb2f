//! Issue 15: variable-length arguments and results, end to end on every transport.
//!
//! One service with `&[u8]`, `&str`, `&[u64]` arguments and `Vec<u8>`, `Option<&[u8]>`
//! results runs on delegation, ipc, copyrpc, eRPC (UDP) and ScaleRPC with the zero-copy
//! server path (`dispatch_raw`), and on the delegation ring with the owned path
//! (`dispatch`). Each run checks sizes 0, 1, the largest allowed and one byte over it (refused
//! with `MessageTooLarge` before anything is sent), a result over the limit (answered with
//! `ResponseTooLarge`), and three forged requests (bad UTF-8, a slice past the message, a
//! misaligned `&[u64]`), each answered with `BadArguments` and counted.

mod typed_common;

use std::collections::HashMap;
use std::time::Duration;

use typed_common::connect_polling;

use rpc::copyrpc::{ContextConfig, Copyrpc, CopyrpcAddr, CopyrpcServer, EndpointConfig};
use rpc::delegation::{Delegation, DelegationConfig, DelegationServer};
use rpc::erpc::{Erpc, ErpcServer};
use rpc::ipc::{Ipc, IpcConfig, IpcServer};
use rpc::mlx5::sim::{Fabric, SimConfig};
use rpc::scalerpc::{ScaleRpc, ScaleRpcAddr, ScaleRpcServer, ServerConfig};
use rpc::varlen::WireSlice;
use rpc::wire::{HEADER_BYTES, MsgHeader, Status};
use rpc::{ClientTransport, RpcError, Server, ServerTransport, Service, rpc_service};
use zerocopy::IntoBytes;

/// Bytes of variable-length data per message in this service.
const MAX: usize = 1024;

#[rpc_service(
    transport = "delegation",
    derive(Debug, PartialEq),
    max_var_bytes = 1024
)]
pub trait Blob {
    /// Returns `data`.
    fn echo(&self, data: &[u8]) -> Vec<u8>;
    /// Length of `s` in bytes.
    fn len_str(&self, s: &str) -> u64;
    /// Sum of `w`.
    fn sum(&self, w: &[u64]) -> u64;
    /// The value stored under `key`, borrowed from the server's state.
    fn get(&self, key: &str) -> Option<&[u8]>;
    /// Stores `value` under `key`.
    fn put(&mut self, key: &str, value: &[u8]);
    /// `n` bytes of `7`.
    fn fill(&self, n: u32) -> Vec<u8>;
    /// The server's name if `who` is `None`, else `who`'s length as a string.
    fn greet(&self, who: Option<&str>, scale: Option<u8>) -> String;
    /// The server's name, borrowed from its state.
    fn name(&self) -> &str;
}

struct State(HashMap<String, Vec<u8>>, String);

impl BlobServer for State {
    fn echo(&self, data: &[u8]) -> Vec<u8> {
        data.to_vec()
    }
    fn len_str(&self, s: &str) -> u64 {
        s.len() as u64
    }
    fn sum(&self, w: &[u64]) -> u64 {
        // Wrapping: the property tests feed arbitrary words, and a handler that panics on
        // overflow (debug builds) would be reported as dispatch_raw panicking.
        w.iter().fold(0u64, |a, &x| a.wrapping_add(x))
    }
    fn get(&self, key: &str) -> Option<&[u8]> {
        self.0.get(key).map(|v| &v[..])
    }
    fn put(&mut self, key: &str, value: &[u8]) {
        self.0.insert(key.to_string(), value.to_vec());
    }
    fn fill(&self, n: u32) -> Vec<u8> {
        // Anything over MAX is refused the same way; the cap keeps the property tests'
        // arbitrary `n` from allocating gigabytes.
        vec![7; (n as usize).min(MAX + 1)]
    }
    fn greet(&self, who: Option<&str>, scale: Option<u8>) -> String {
        match who {
            Some(w) => (w.len() * usize::from(scale.unwrap_or(1))).to_string(),
            None => self.1.clone(),
        }
    }
    fn name(&self) -> &str {
        &self.1
    }
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 % 251) as u8).collect()
}

/// A forged request of method `id` with one `WireSlice` and `data` after it.
fn forged(id: u16, s: WireSlice, data: &[u8]) -> impl FnMut(&mut [u8]) -> usize {
    let data = data.to_vec();
    move |out: &mut [u8]| {
        let body = size_of::<WireSlice>() + data.len();
        let hdr = MsgHeader {
            method_id: id,
            status: 0,
            len: body as u32,
        };
        out[..HEADER_BYTES].copy_from_slice(hdr.as_bytes());
        out[HEADER_BYTES..HEADER_BYTES + 8].copy_from_slice(s.as_bytes());
        out[HEADER_BYTES + 8..HEADER_BYTES + body].copy_from_slice(&data);
        HEADER_BYTES + body
    }
}

/// Sends a forged request and expects the server to answer `BadArguments`.
fn expect_bad_arguments<T: ClientTransport>(
    c: &mut BlobClient<T>,
    id: u16,
    s: WireSlice,
    data: &[u8],
) {
    let len = HEADER_BYTES + 8 + data.len();
    let got = c.core_mut().call_raw_within(
        Duration::from_secs(30),
        id,
        len,
        forged(id, s, data),
        |msg| rpc::wire::check_response_header(id, rpc::wire::read_header(msg)?),
    );
    match got {
        Err(RpcError::BadRequest {
            status: Some(Status::BadArguments),
            ..
        }) => {}
        other => panic!("method {id}, {s:?}: expected BadArguments, got {other:?}"),
    }
}

/// The scenario every transport runs; returns the number of forged requests it sent.
fn scenario<T: ClientTransport>(c: &mut BlobClient<T>) -> u64 {
    c.set_default_deadline(Duration::from_secs(30));
    // Sizes 0, 1, the largest allowed.
    for n in [0, 1, 100, MAX] {
        let d = pattern(n);
        assert_eq!(c.echo(&d).unwrap(), d, "echo {n} bytes");
        assert!(c.echo_with(&d, |v| v == &d[..]).unwrap());
    }
    assert_eq!(
        c.core().max_request_bytes(BlobService::ECHO),
        HEADER_BYTES + 8 + MAX
    );
    assert_eq!(
        c.core().max_response_bytes(BlobService::ECHO),
        HEADER_BYTES + 8 + MAX
    );
    // One byte over: refused before anything is sent.
    match c.echo(&pattern(MAX + 1)) {
        Err(RpcError::MessageTooLarge { len, cap, setting }) => {
            assert_eq!(
                (len, cap),
                (HEADER_BYTES + 8 + MAX + 1, HEADER_BYTES + 8 + MAX)
            );
            assert!(setting.contains("max_var_bytes"), "{setting}");
        }
        other => panic!("expected MessageTooLarge, got {other:?}"),
    }
    assert_eq!(c.len_str("").unwrap(), 0);
    assert_eq!(c.len_str("h\u{e9}llo").unwrap(), 6);
    let words: Vec<u64> = (0..(MAX / 8) as u64).collect();
    assert_eq!(c.sum(&words).unwrap(), words.iter().sum::<u64>());
    assert!(matches!(
        c.sum(&(0..=(MAX / 8) as u64).collect::<Vec<_>>()),
        Err(RpcError::MessageTooLarge { .. })
    ));
    // A result borrowed from the server's state, and `None`.
    assert_eq!(c.get("k").unwrap(), None);
    c.put("k", b"value").unwrap();
    assert_eq!(c.get("k").unwrap(), Some(b"value".to_vec()));
    assert_eq!(c.get_with("k", |v| v.map(<[u8]>::len)).unwrap(), Some(5));
    // Optional arguments, a `String` result, a `&str` result borrowed from the server.
    assert_eq!(c.greet(Some("abcd"), Some(3)).unwrap(), "12");
    assert_eq!(c.greet(Some(""), None).unwrap(), "0");
    assert_eq!(c.greet(None, None).unwrap(), "blob");
    assert_eq!(c.name().unwrap(), "blob");
    assert!(c.name_with(|n| n == "blob").unwrap());
    // A result at the limit, and one byte over it.
    assert_eq!(c.fill(MAX as u32).unwrap(), vec![7; MAX]);
    match c.fill(MAX as u32 + 1) {
        Err(RpcError::BadRequest {
            status: Some(Status::ResponseTooLarge),
            ..
        }) => {}
        other => panic!("expected ResponseTooLarge, got {other:?}"),
    }
    // Pipelined: the response owns its data.
    c.issue(5).echo(b"pipelined").unwrap();
    let done = loop {
        if let Some(d) = c.poll().unwrap() {
            break d;
        }
    };
    assert_eq!(done, (5, BlobResponse::Echo(b"pipelined".to_vec())));
    // Lending poll: the pipelined result borrowed from the receive buffer...
    let want = pattern(MAX);
    c.issue(8).echo(&want).unwrap();
    let mut seen = 0;
    while seen == 0 {
        seen = c
            .poll_ref(|tag, r| {
                assert_eq!(tag, 8);
                match r.unwrap() {
                    BlobResponseRef::Echo(v) => assert_eq!(v, &want[..]),
                    other => panic!("{other:?}"),
                }
            })
            .unwrap();
    }
    // ... and one that arrived while a blocking call waited (decoded then, lent now).
    c.issue(9).get("k").unwrap();
    assert_eq!(c.len_str("xy").unwrap(), 2);
    let mut got = None;
    while got.is_none() {
        c.poll_ref(|tag, r| got = Some((tag, format!("{:?}", r.unwrap()))))
            .unwrap();
    }
    assert_eq!(
        got.unwrap(),
        (9, "Get(Some([118, 97, 108, 117, 101]))".to_string())
    );
    c.issue_request(6, &BlobRequest::len_str("abc")).unwrap();
    let done = loop {
        if let Some(d) = c.poll().unwrap() {
            break d;
        }
    };
    assert_eq!(done, (6, BlobResponse::LenStr(3)));
    // Forged requests: bad UTF-8, a slice past the message, a misaligned `&[u64]`.
    let start = (HEADER_BYTES + 8) as u32;
    expect_bad_arguments(
        c,
        BlobService::LEN_STR,
        WireSlice { off: start, len: 2 },
        &[0xc3, 0x28],
    );
    expect_bad_arguments(
        c,
        BlobService::ECHO,
        WireSlice {
            off: start,
            len: 1000,
        },
        &[1, 2, 3],
    );
    expect_bad_arguments(
        c,
        BlobService::SUM,
        WireSlice {
            off: start + 1,
            len: 8,
        },
        &[0; 9],
    );
    // The server still serves.
    assert_eq!(c.echo(b"after").unwrap(), b"after".to_vec());
    3
}

fn run_raw<T, C>(server: Server<BlobService, T>, c: impl FnOnce() -> BlobClient<C>)
where
    T: ServerTransport + Send + 'static,
    C: ClientTransport,
{
    let mut state = State(HashMap::new(), "blob".to_string());
    let h = server.spawn_raw(move |msg, out| BlobService::dispatch_raw(&mut state, msg, out));
    let mut client = c();
    let bad = scenario(&mut client);
    drop(client);
    let server = h.join().unwrap();
    assert_eq!(server.stats().bad_requests, bad, "{:?}", server.stats());
    assert_eq!(
        server.stats().oversized_responses,
        1,
        "{:?}",
        server.stats()
    );
}

fn shm_name(tag: &str) -> String {
    format!("rpc-varlen-{}-{tag}", std::process::id())
}

#[test]
fn delegation_zero_copy() {
    let n = shm_name("deleg");
    let server = DelegationServer::serve::<BlobService>(&n, DelegationConfig::default()).unwrap();
    run_raw(server, || BlobClient::<Delegation>::connect(&n).unwrap());
}

/// The owned path (`recv` → `dispatch` → `reply`): requests are decoded into owned values.
#[test]
fn delegation_owned_dispatch() {
    let n = shm_name("deleg-owned");
    let server = DelegationServer::serve::<BlobService>(&n, DelegationConfig::default()).unwrap();
    let mut state = State(HashMap::new(), "blob".to_string());
    let h = server.spawn(move |req| BlobService::dispatch(&mut state, req));
    let mut c = BlobClient::<Delegation>::connect(&n).unwrap();
    let bad = scenario(&mut c);
    drop(c);
    let server = h.join().unwrap();
    assert_eq!(server.stats().bad_requests, bad);
    assert_eq!(server.stats().oversized_responses, 1);
}

#[test]
fn ipc_zero_copy() {
    let n = shm_name("ipc");
    let server = IpcServer::serve::<BlobService>(&n, IpcConfig::default()).unwrap();
    run_raw(server, || BlobClient::<Ipc>::connect(&n).unwrap());
}

#[test]
fn copyrpc_zero_copy() {
    let fabric = Fabric::new(SimConfig::default());
    let mut server = CopyrpcServer::serve::<BlobService>(
        &fabric.open(),
        ContextConfig::default(),
        EndpointConfig::default(),
    )
    .unwrap();
    let addr = CopyrpcAddr::new(fabric.open(), server.transport().listener());
    let c = connect_polling(&mut server, move || {
        BlobClient::<Copyrpc>::connect(&addr).unwrap()
    });
    run_raw(server, || c);
}

#[test]
fn erpc_zero_copy() {
    let t = ErpcServer::bind("127.0.0.1:0".parse().unwrap(), BlobService::DESCRIPTOR).unwrap();
    let addr = t.local_addr();
    let mut server = Server::<BlobService, _>::new(t);
    let c = connect_polling(&mut server, move || {
        BlobClient::<Erpc>::connect(&addr).unwrap()
    });
    run_raw(server, || c);
}

/// eRPC over mlx5 UD on the device model: requests and replies above 60 B are gathered by
/// the NIC straight from their message buffers (no copy on the sending side).
#[test]
fn erpc_ud_zero_copy() {
    use rpc::erpc::core::Config;
    use rpc::erpc::datagram::{DatagramTransport, UdConfig, UdTransport};
    use rpc::erpc::event_loop::Endpoint;
    use rpc::erpc::transport::{UdConnectAddr, service_config};
    let fabric = Fabric::new(SimConfig::deterministic());
    let dev = fabric.open();
    let t = UdTransport::new(&dev, UdConfig::for_port(&dev.port())).unwrap();
    let svc = BlobService::DESCRIPTOR;
    let ep = Endpoint::new(t, service_config(svc, &Config::default())).unwrap();
    let t = ErpcServer::from_endpoint(ep, svc).unwrap();
    let addr = t.local_addr();
    let server = Server::<BlobService, _>::new(t);
    let mut state = State(HashMap::new(), "blob".to_string());
    let h = server.spawn_raw(move |msg, out| BlobService::dispatch_raw(&mut state, msg, out));
    let mut client =
        BlobClient::<Erpc<UdTransport>>::connect(&UdConnectAddr::new(fabric.open(), addr)).unwrap();
    let bad = scenario(&mut client);
    let sent = client.transport().endpoint().transport().stats();
    assert!(sent.tx_in_place > 0, "{sent:?}");
    drop(client);
    let server = h.join().unwrap();
    assert_eq!(server.stats().bad_requests, bad, "{:?}", server.stats());
    assert_eq!(server.stats().oversized_responses, 1);
    let served = server.transport().endpoint().transport().stats();
    assert!(served.tx_in_place > 0, "{served:?}");
}

#[test]
fn scalerpc_zero_copy() {
    let fabric = Fabric::new(SimConfig::default());
    let cfg = ServerConfig {
        max_conns: 2,
        ..ServerConfig::default()
    };
    let mut server = ScaleRpcServer::serve::<BlobService>(&fabric.open(), cfg).unwrap();
    let addr = ScaleRpcAddr::new(fabric.open(), server.transport().listener());
    let c = connect_polling(&mut server, move || {
        BlobClient::<ScaleRpc>::connect(&addr).unwrap()
    });
    run_raw(server, || c);
}

mod props {
    use super::*;
    use proptest::prelude::*;

    /// An 8-byte aligned copy of `bytes`, as transports hand requests to the decoder.
    fn aligned(bytes: &[u8]) -> Vec<u64> {
        let mut v = vec![0u64; bytes.len().div_ceil(8)];
        v.as_mut_bytes()[..bytes.len()].copy_from_slice(bytes);
        v
    }

    /// Requests with a valid header for one of the methods, slice descriptors that are often
    /// near the truth, and arbitrary data.
    fn plausible_request() -> impl Strategy<Value = Vec<u8>> {
        (
            0u16..10,
            proptest::collection::vec((0u32..64, 0u32..64), 0..3),
            proptest::collection::vec(any::<u8>(), 0..96),
            any::<bool>(),
        )
            .prop_map(|(method, slices, data, exact_len)| {
                let mut body = Vec::new();
                for (off, len) in slices {
                    body.extend_from_slice(WireSlice { off, len }.as_bytes());
                }
                body.extend_from_slice(&data);
                let len = if exact_len {
                    body.len() as u32
                } else {
                    (body.len() as u32).saturating_sub(3)
                };
                let hdr = MsgHeader {
                    method_id: method,
                    status: 0,
                    len,
                };
                let mut m = hdr.as_bytes().to_vec();
                m.extend_from_slice(&body);
                m
            })
    }

    proptest! {
        /// Arbitrary requests never panic the zero-copy server path, and what it accepts it
        /// answers with a well-formed response that fits the reply buffer.
        #[test]
        fn dispatch_raw_never_panics(msg in prop_oneof![
            plausible_request(),
            proptest::collection::vec(any::<u8>(), 0..128),
        ]) {
            let words = aligned(&msg);
            let msg = &words.as_bytes()[..msg.len()];
            let mut state = State(HashMap::new(), "blob".to_string());
            let mut out = vec![0u8; BlobService::DESCRIPTOR.max_response_bytes];
            if let Ok(n) = BlobService::dispatch_raw(&mut state, msg, &mut out) {
                prop_assert!(n <= out.len());
                let hdr = rpc::wire::read_header(&out[..n]).unwrap();
                prop_assert_eq!(hdr.len as usize + HEADER_BYTES, n);
            }
            // The owned decoder agrees on what is valid.
            let owned = <BlobService as Service>::decode_request(msg);
            let raw = BlobService::dispatch_raw(&mut state, msg, &mut out);
            prop_assert_eq!(owned.is_ok(), raw.is_ok() || matches!(raw, Err(rpc::wire::WireError::ResponseTooLarge { .. })));
        }

        /// Every request the stubs can build decodes to the same values.
        #[test]
        fn requests_round_trip(key in "\\PC{0,40}", value in proptest::collection::vec(any::<u8>(), 0..200)) {
            let req = BlobRequest::put(&key, &value);
            let mut buf = aligned(&vec![0u8; BlobService::DESCRIPTOR.max_request_bytes]);
            let n = <BlobService as Service>::encode_request(&req, buf.as_mut_bytes());
            prop_assert_eq!(n, <BlobService as Service>::request_len(&req));
            let back = <BlobService as Service>::decode_request(&buf.as_bytes()[..n]).unwrap();
            prop_assert_eq!(back, req);
        }
    }
}

/// The same trait built with a larger `max_var_bytes` (another build of the client): same
/// schema fingerprint, but the server's slots cannot carry its largest request, so the
/// connect is refused with `CapacityMismatch` naming the setting, before any call.
mod bigger {
    use super::*;

    #[rpc_service(transport = "delegation", max_var_bytes = 8192)]
    pub trait Blob {
        fn echo(&self, data: &[u8]) -> Vec<u8>;
        fn len_str(&self, s: &str) -> u64;
        fn sum(&self, w: &[u64]) -> u64;
        fn get(&self, key: &str) -> Option<&[u8]>;
        fn put(&mut self, key: &str, value: &[u8]);
        fn fill(&self, n: u32) -> Vec<u8>;
        fn greet(&self, who: Option<&str>, scale: Option<u8>) -> String;
        fn name(&self) -> &str;
    }

    #[test]
    fn a_client_with_a_larger_limit_is_refused_at_connect() {
        assert_eq!(
            BlobService::DESCRIPTOR.fingerprint,
            super::BlobService::DESCRIPTOR.fingerprint,
            "the limit is not part of the schema: capacity is checked instead"
        );
        let n = shm_name("bigger");
        let _server =
            DelegationServer::serve::<super::BlobService>(&n, DelegationConfig::default()).unwrap();
        match BlobClient::<Delegation>::connect(&n) {
            Err(e @ RpcError::CapacityMismatch { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("request"), "{msg}");
            }
            Err(e) => panic!("expected CapacityMismatch, got {e}"),
            Ok(_) => panic!("expected CapacityMismatch, got a client"),
        }
        // The other way round works: a smaller limit fits the server's slots.
        let n2 = shm_name("smaller");
        let _server2 =
            DelegationServer::serve::<BlobService>(&n2, DelegationConfig::default()).unwrap();
        assert!(super::BlobClient::<Delegation>::connect(&n2).is_ok());
    }
}

/// eRPC's `ServerTransport::serve_next` hands the handler the session slot's response
/// message buffer (from which the reply's packets are sent), not a staging buffer: four calls
/// in flight together are answered in four slots' buffers, at four addresses, none of them
/// the scratch buffer; a request of several packets (a 600-byte UDP MTU) is read from its
/// reassembly buffer and its multi-packet reply written in place too.
#[test]
fn erpc_replies_are_written_into_slot_buffers() {
    let cfg = rpc::erpc::ErpcConfig {
        udp_mtu: Some(600),
        core: rpc::erpc::core::Config {
            max_msg_size: 64 << 10,
            ..Default::default()
        },
        ..Default::default()
    };
    let t = ErpcServer::bind_with(
        "127.0.0.1:0".parse().unwrap(),
        BlobService::DESCRIPTOR,
        &cfg,
    )
    .unwrap();
    let addr = t.local_addr();
    let mut server = Server::<BlobService, _>::new(t);
    let mut c = connect_polling(&mut server, move || {
        BlobClient::from_transport(
            Erpc::<rpc::erpc::datagram::UdpTransport>::connect_with(
                &addr,
                BlobService::DESCRIPTOR,
                &cfg,
            )
            .unwrap(),
        )
    });
    let t = server.transport_mut();
    let mut state = State(HashMap::new(), "blob".to_string());
    let mut scratch = vec![0u8; BlobService::DESCRIPTOR.max_response_bytes];
    let data: Vec<Vec<u8>> = [10, 100, 600, MAX].iter().map(|&n| pattern(n)).collect();
    for (tag, d) in data.iter().enumerate() {
        c.issue(tag as u64).echo(d).unwrap();
    }
    let mut outs = Vec::new();
    let mut got = HashMap::new();
    for _ in 0..100_000 {
        t.poll();
        while let Some(r) = t.serve_next(&mut scratch, |m, o| {
            outs.push(o.as_ptr() as usize);
            BlobService::dispatch_raw(&mut state, m, o).expect("a well-formed request")
        }) {
            r.unwrap();
        }
        t.flush();
        while let Some((tag, r)) = c.poll().unwrap() {
            got.insert(tag, r);
        }
        if got.len() == data.len() {
            break;
        }
    }
    for (tag, d) in data.iter().enumerate() {
        assert_eq!(
            got[&(tag as u64)],
            BlobResponse::Echo(d.clone()),
            "call {tag}"
        );
    }
    let mut at = outs.clone();
    at.sort_unstable();
    at.dedup();
    assert_eq!(at.len(), data.len(), "reply buffers {outs:x?}");
    assert!(!outs.contains(&(scratch.as_ptr() as usize)));
}
