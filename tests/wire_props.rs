//! Property tests of the decoders that read bytes written by another process: arbitrary bytes
//! never panic and never decode to a value that does not re-encode to the same bytes, and
//! every encodable value round-trips. (cargo-fuzz needs a nightly toolchain, which our
//! machines do not have; these run in every `cargo test`.)

use idl::echo::{EchoRequest, EchoService};
use idl::kv::{KvRequest, KvResponse, KvService};
use proptest::prelude::*;
use rpc::Service;
use rpc::wire::{self, HEADER_BYTES};

fn kv_request() -> impl Strategy<Value = KvRequest> {
    prop_oneof![
        (any::<u32>(), any::<u64>(), any::<u64>()).prop_map(|(r, k, v)| KvRequest::put(r, k, v)),
        (any::<u32>(), any::<u64>()).prop_map(|(r, k)| KvRequest::get(r, k)),
    ]
}

fn kv_response() -> impl Strategy<Value = KvResponse> {
    prop_oneof![
        Just(KvResponse::Put(())),
        any::<Option<u64>>().prop_map(KvResponse::Get),
    ]
}

/// Messages with a plausible header: method ids around the valid range, a length that is often
/// exactly right, arbitrary status and body bytes.
fn plausible_message() -> impl Strategy<Value = Vec<u8>> {
    (
        0u16..4,
        any::<u16>(),
        prop_oneof![Just(0u32), Just(9), Just(12), Just(20), 0u32..40],
        proptest::collection::vec(any::<u8>(), 0..40),
        any::<bool>(),
    )
        .prop_map(|(method, status, len, body, zero_status)| {
            let status = if zero_status { 0 } else { status };
            let mut m = Vec::new();
            m.extend_from_slice(&method.to_ne_bytes());
            m.extend_from_slice(&status.to_ne_bytes());
            m.extend_from_slice(&len.to_ne_bytes());
            m.extend_from_slice(&body);
            m
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Arbitrary bytes: decoding a request either fails with a WireError or yields a request
    /// whose encoding is exactly the header + body that was decoded.
    #[test]
    fn arbitrary_request_bytes(bytes in prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64),
        plausible_message(),
    ]) {
        let _ = wire::read_header(&bytes);
        if let Ok(req) = KvService::decode_request(&bytes) {
            let mut out = [0u8; 64];
            let n = KvService::encode_request(&req, &mut out);
            prop_assert_eq!(&out[..n], &bytes[..n]);
        }
        let _ = EchoService::decode_request(&bytes);
    }

    /// Arbitrary bytes as the response to each method: never a panic; accepted responses
    /// re-encode to the same bytes, except the inactive side of an `Option`, which is never
    /// read and is re-sent zeroed (`rpc::wire::WireOption`; tests/option_wire.rs checks that
    /// garbage there decodes). The re-encoding decodes to the same response.
    #[test]
    fn arbitrary_response_bytes(
        bytes in prop_oneof![proptest::collection::vec(any::<u8>(), 0..64), plausible_message()],
        method in 0u16..4,
    ) {
        if let Ok(resp) = KvService::decode_response(method, &bytes) {
            let mut out = [0u8; 64];
            let n = KvService::encode_response(&resp, &mut out);
            let mut expected = bytes[..n].to_vec();
            if resp == KvResponse::Get(None) {
                // `Get` answers with a `WireOption<u64>`: tag byte, then the 8 value bytes.
                prop_assert_eq!(n, HEADER_BYTES + 1 + 8);
                expected[HEADER_BYTES + 1..].fill(0);
            }
            prop_assert_eq!(&out[..n], &expected[..]);
            prop_assert_eq!(KvService::decode_response(method, &out[..n]), Ok(resp));
        }
        let _ = EchoService::decode_response(method, &bytes);
    }

    /// Valid encodings round-trip, and every strict prefix is rejected as truncated.
    #[test]
    fn requests_roundtrip(req in kv_request()) {
        let mut out = [0u8; 64];
        let n = KvService::encode_request(&req, &mut out);
        prop_assert_eq!(KvService::decode_request(&out[..n]), Ok(req));
        for cut in 0..n {
            let is_truncated = matches!(
                KvService::decode_request(&out[..cut]),
                Err(wire::WireError::Truncated { .. })
            );
            prop_assert!(is_truncated);
        }
    }

    #[test]
    fn responses_roundtrip(resp in kv_response()) {
        let mut out = [0u8; 64];
        let n = KvService::encode_response(&resp, &mut out);
        let method = match resp { KvResponse::Put(()) => KvService::PUT, KvResponse::Get(_) => KvService::GET };
        prop_assert_eq!(KvService::decode_response(method, &out[..n]), Ok(resp));
        // The echoed method id is checked.
        let other = if method == KvService::PUT { KvService::GET } else { KvService::PUT };
        let is_mismatch = matches!(
            KvService::decode_response(other, &out[..n]),
            Err(wire::WireError::MethodMismatch { .. })
        );
        prop_assert!(is_mismatch);
    }

    /// The 256 B echo payload survives a round trip byte for byte.
    #[test]
    fn echo256_roundtrip(payload in proptest::collection::vec(any::<u8>(), 256)) {
        let p: [u8; 256] = payload.try_into().unwrap();
        let req = EchoRequest::echo256(p);
        let mut out = [0u8; HEADER_BYTES + 256];
        let n = EchoService::encode_request(&req, &mut out);
        prop_assert_eq!(n, HEADER_BYTES + 256);
        prop_assert_eq!(EchoService::decode_request(&out[..n]), Ok(req));
    }
}
