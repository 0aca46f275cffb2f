//! Runtime behaviour of `#[rpc_service]` code without any transport: every request and
//! response of a service using all supported types round-trips through the generated
//! `rpc::Service` codec and `dispatch`; the descriptor has the right ids, sizes and type names,
//! and its fingerprint changes with the schema; malformed bytes decode to the right
//! `WireError`.

use rpc::wire::{HEADER_BYTES, MsgHeader, Status, WireError};
use rpc::{Service, rpc_service};
use zerocopy::{FromZeros, Immutable, IntoBytes, KnownLayout, TryFromBytes};

#[derive(Clone, Copy, Debug, PartialEq, Eq, FromZeros, IntoBytes, KnownLayout, Immutable)]
/// A plain `#[repr(C)]` struct argument (8 bytes, no padding).
#[repr(C)]
pub struct Point {
    /// First coordinate.
    pub x: i32,
    /// Second coordinate.
    pub y: i32,
}

/// A zerocopy enum without a zero discriminant: `TryFromBytes` but not `FromZeros` (see
/// `tests/option_wire.rs` for it inside `Option`/`Result`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, TryFromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(u8)]
pub enum Color {
    /// Discriminant 1.
    Red = 1,
    /// Discriminant 2.
    Green = 2,
}

/// Length of the array arguments.
pub const N: usize = 3;

#[rpc_service(transport = "delegation", derive(Debug, PartialEq))]
pub trait All {
    #[allow(clippy::too_many_arguments)] // carried over to `AllServer::ints`
    fn ints(&mut self, a: u8, b: i16, c: u32, d: i64, e: u128, f: usize, g: isize) -> i128;
    fn floats(&self, a: f32, b: f64) -> f64;
    fn bool_char(&self, b: bool, c: char) -> char;
    fn arrays(&mut self, a: [u8; 32], b: [[u16; 2]; N]) -> [u8; 4];
    fn unit(&mut self, u: ()) -> ();
    fn nothing(&self);
    fn user(&mut self, p: Point, c: Color) -> Color;
    fn options(
        &mut self,
        a: Option<u64>,
        b: Option<Point>,
        c: std::option::Option<bool>,
    ) -> core::option::Option<char>;
    fn results(
        &mut self,
        r: Result<u32, Point>,
        s: ::std::result::Result<(), i8>,
    ) -> core::result::Result<(), u16>;
    fn nested(
        &mut self,
        n: Option<[Option<u8>; 2]>,
        m: [Option<Result<bool, char>>; 2],
    ) -> Option<Option<u8>>;
    /// An argument named like a constructor.
    fn make(&self, new: u8) -> u8;
}

/// A server whose answers are pure functions of the arguments, so the test can predict them.
#[derive(Default)]
struct Calc {
    calls: usize,
}

impl AllServer for Calc {
    #[allow(clippy::too_many_arguments)]
    fn ints(&mut self, a: u8, b: i16, c: u32, d: i64, e: u128, f: usize, g: isize) -> i128 {
        self.calls += 1;
        a as i128 + b as i128 + c as i128 + d as i128 + e as i128 + f as i128 + g as i128
    }
    fn floats(&self, a: f32, b: f64) -> f64 {
        a as f64 * b
    }
    fn bool_char(&self, b: bool, c: char) -> char {
        if b { c.to_ascii_uppercase() } else { c }
    }
    fn arrays(&mut self, a: [u8; 32], b: [[u16; 2]; N]) -> [u8; 4] {
        self.calls += 1;
        [a[0], a[31], b[0][0] as u8, b[N - 1][1] as u8]
    }
    fn unit(&mut self, u: ()) {
        self.calls += 1;
        u
    }
    fn nothing(&self) {}
    fn user(&mut self, p: Point, c: Color) -> Color {
        self.calls += 1;
        if p.x > p.y { c } else { Color::Green }
    }
    fn options(&mut self, a: Option<u64>, b: Option<Point>, c: Option<bool>) -> Option<char> {
        self.calls += 1;
        match (a, b, c) {
            (Some(a), _, _) => char::from_digit((a % 10) as u32, 10),
            (None, Some(_), Some(true)) => Some('p'),
            _ => None,
        }
    }
    fn results(&mut self, r: Result<u32, Point>, s: Result<(), i8>) -> Result<(), u16> {
        self.calls += 1;
        match (r, s) {
            (Ok(_), Ok(())) => Ok(()),
            (Ok(v), Err(_)) => Err(v as u16),
            (Err(p), _) => Err(p.x as u16),
        }
    }
    fn nested(
        &mut self,
        n: Option<[Option<u8>; 2]>,
        m: [Option<Result<bool, char>>; 2],
    ) -> Option<Option<u8>> {
        self.calls += 1;
        match (n, m[1]) {
            (Some([a, _]), _) => Some(a),
            (None, Some(Ok(true))) => Some(None),
            _ => None,
        }
    }
    fn make(&self, new: u8) -> u8 {
        new.wrapping_add(1)
    }
}

fn requests() -> Vec<AllRequest> {
    vec![
        AllRequest::ints(1, -2, 3, -4, u128::MAX / 3, 5, -6),
        AllRequest::floats(1.5, -2.25),
        AllRequest::bool_char(true, 'q'),
        AllRequest::bool_char(false, '\u{10FFFF}'),
        AllRequest::arrays([7; 32], [[1, 2], [3, 4], [5, 6]]),
        AllRequest::unit(()),
        AllRequest::nothing(),
        AllRequest::user(Point { x: 2, y: 1 }, Color::Red),
        AllRequest::options(Some(42), None, None),
        AllRequest::options(None, Some(Point { x: -1, y: 1 }), Some(true)),
        AllRequest::options(None, None, Some(false)),
        AllRequest::results(Ok(9), Ok(())),
        AllRequest::results(Ok(9), Err(-1)),
        AllRequest::results(Err(Point { x: 3, y: 4 }), Err(0)),
        AllRequest::nested(Some([Some(5), None]), [None, Some(Err('x'))]),
        AllRequest::nested(None, [Some(Ok(false)), Some(Ok(true))]),
        AllRequest::nested(None, [None, None]),
        AllRequest::make(255),
    ]
}

/// The answers `Calc` gives to `requests()`, in order.
fn expected_responses() -> Vec<AllResponse> {
    vec![
        AllResponse::Ints(1 - 2 + 3 - 4 + (u128::MAX / 3) as i128 + 5 - 6),
        AllResponse::Floats(1.5 * -2.25),
        AllResponse::BoolChar('Q'),
        AllResponse::BoolChar('\u{10FFFF}'),
        AllResponse::Arrays([7, 7, 1, 6]),
        AllResponse::Unit(()),
        AllResponse::Nothing(()),
        AllResponse::User(Color::Red),
        AllResponse::Options(Some('2')),
        AllResponse::Options(Some('p')),
        AllResponse::Options(None),
        AllResponse::Results(Ok(())),
        AllResponse::Results(Err(9)),
        AllResponse::Results(Err(3)),
        AllResponse::Nested(Some(Some(5))),
        AllResponse::Nested(Some(None)),
        AllResponse::Nested(None),
        AllResponse::Make(0),
    ]
}

fn buf() -> Vec<u8> {
    vec![
        0xAA;
        AllService::DESCRIPTOR
            .max_request_bytes
            .max(AllService::DESCRIPTOR.max_response_bytes)
    ]
}

fn header(msg: &[u8]) -> MsgHeader {
    MsgHeader::try_read_from_prefix(msg).unwrap().0
}

#[test]
fn every_request_and_response_round_trips() {
    let mut server = Calc::default();
    let mut out = buf();
    for (req, want) in requests().into_iter().zip(expected_responses()) {
        // Request: encode, check the header and length, decode, compare.
        let n = AllService::encode_request(&req, &mut out);
        let id = AllService::request_method_id(&req);
        let method = &AllService::DESCRIPTOR.methods[id as usize];
        assert_eq!(n, method.request_bytes, "{req:?}");
        let hdr = header(&out);
        assert_eq!(
            (hdr.method_id, hdr.status, hdr.len as usize),
            (id, 0, n - HEADER_BYTES)
        );
        let bytes = out[..n].to_vec();
        let decoded = AllService::decode_request(&bytes).unwrap();
        assert_eq!(decoded, req);
        // Re-encoding the decoded request gives the same bytes.
        let mut again = buf();
        let m = AllService::encode_request(&decoded, &mut again);
        assert_eq!(&again[..m], &bytes[..]);

        // Dispatch and response.
        let resp = AllService::dispatch(&mut server, decoded);
        assert_eq!(resp, want, "{req:?}");
        let n = AllService::encode_response(&resp, &mut out);
        assert_eq!(n, method.response_bytes, "{req:?}");
        assert_eq!(header(&out).method_id, id);
        assert_eq!(AllService::decode_response(id, &out[..n]).unwrap(), want);
    }
    assert_eq!(server.calls, 13);
}

#[test]
fn accessors_return_the_values_as_written() {
    let AllRequest::Nested(args) =
        AllRequest::nested(Some([Some(5), None]), [None, Some(Err('x'))])
    else {
        unreachable!()
    };
    assert_eq!(args.n(), Some([Some(5), None]));
    assert_eq!(args.m(), [None, Some(Err('x'))]);
    let AllRequest::Options(args) = AllRequest::options(Some(1), None, Some(true)) else {
        unreachable!()
    };
    assert_eq!((args.a(), args.b(), args.c()), (Some(1), None, Some(true)));
    let AllRequest::Make(args) = AllRequest::make(3) else {
        unreachable!()
    };
    assert_eq!(args.new(), 3);
    // The fields themselves are the wire form.
    let wire: rpc::__private::WireOption<u64, [u8; 8]> =
        AllRequest::options(Some(1), None, None).options_args().a;
    assert_eq!(wire.try_into_option(), Ok(Some(1)));
}

trait OptionsArgs {
    fn options_args(self) -> AllOptionsArgs;
}
impl OptionsArgs for AllRequest {
    fn options_args(self) -> AllOptionsArgs {
        match self {
            AllRequest::Options(a) => a,
            other => panic!("not options: {other:?}"),
        }
    }
}

#[test]
fn descriptor_ids_names_and_sizes() {
    let d = AllService::DESCRIPTOR;
    assert_eq!(d.name, "All");
    let names: Vec<&str> = d.methods.iter().map(|m| m.name).collect();
    assert_eq!(
        names,
        [
            "ints",
            "floats",
            "bool_char",
            "arrays",
            "unit",
            "nothing",
            "user",
            "options",
            "results",
            "nested",
            "make"
        ]
    );
    for (i, m) in d.methods.iter().enumerate() {
        assert_eq!(m.id as usize, i);
        let arg_sum: usize = m.args.iter().map(|a| a.size).sum();
        assert_eq!(
            m.request_bytes,
            HEADER_BYTES + arg_sum,
            "{}: packed, so no padding",
            m.name
        );
        assert_eq!(m.response_bytes, HEADER_BYTES + m.ret_size);
    }
    assert_eq!(
        [
            AllService::INTS,
            AllService::FLOATS,
            AllService::NESTED,
            AllService::MAKE
        ],
        [0, 1, 9, 10]
    );

    let ints = &d.methods[0];
    let sizes: Vec<usize> = ints.args.iter().map(|a| a.size).collect();
    assert_eq!(sizes, [1, 2, 4, 8, 16, 8, 8]);
    assert_eq!((ints.ret_ty, ints.ret_size), ("i128", 16));
    assert_eq!(size_of::<AllIntsArgs>(), 47);

    let arrays = &d.methods[3];
    let tys: Vec<(&str, &str, usize)> =
        arrays.args.iter().map(|a| (a.name, a.ty, a.size)).collect();
    assert_eq!(tys, [("a", "[u8; 32]", 32), ("b", "[[u16; 2]; N]", 12)]);
    assert_eq!((arrays.ret_ty, arrays.ret_size), ("[u8; 4]", 4));

    let unit = &d.methods[4];
    assert_eq!(
        (
            unit.args[0].ty,
            unit.args[0].size,
            unit.ret_ty,
            unit.ret_size
        ),
        ("()", 0, "()", 0)
    );
    let nothing = &d.methods[5];
    assert!(nothing.args.is_empty());
    assert_eq!(
        (
            nothing.ret_ty,
            nothing.request_bytes,
            nothing.response_bytes
        ),
        ("()", 8, 8)
    );
    assert_eq!(size_of::<AllNothingArgs>(), 0);

    let options = &d.methods[7];
    let tys: Vec<(&str, usize)> = options.args.iter().map(|a| (a.ty, a.size)).collect();
    assert_eq!(
        tys,
        [
            ("Option<u64>", 9),
            ("Option<Point>", 9),
            ("std::option::Option<bool>", 2)
        ]
    );
    assert_eq!(
        (options.ret_ty, options.ret_size),
        ("core::option::Option<char>", 5)
    );

    let results = &d.methods[8];
    let tys: Vec<(&str, usize)> = results.args.iter().map(|a| (a.ty, a.size)).collect();
    assert_eq!(
        tys,
        [
            ("Result<u32, Point>", 13),
            ("::std::result::Result<(), i8>", 2)
        ]
    );
    assert_eq!(
        (results.ret_ty, results.ret_size),
        ("core::result::Result<(), u16>", 3)
    );

    let nested = &d.methods[9];
    let tys: Vec<(&str, usize)> = nested.args.iter().map(|a| (a.ty, a.size)).collect();
    assert_eq!(
        tys,
        [
            ("Option<[Option<u8>; 2]>", 5),
            ("[Option<Result<bool, char>>; 2]", 14)
        ]
    );
    assert_eq!((nested.ret_ty, nested.ret_size), ("Option<Option<u8>>", 3));

    let max_req = d.methods.iter().map(|m| m.request_bytes).max().unwrap();
    let max_resp = d.methods.iter().map(|m| m.response_bytes).max().unwrap();
    assert_eq!(
        (d.max_request_bytes, d.max_response_bytes),
        (max_req, max_resp)
    );
    assert_eq!(d.fingerprint, rpc::service::fingerprint(d.name, d.methods));
}

/// Services that differ from `base::Fp` in exactly one respect each.
mod fp {
    pub(crate) mod base {
        #[rpc::rpc_service(transport = "delegation")]
        pub trait Fp {
            fn f(&self, a: u32, b: Option<u8>) -> u64;
            fn g(&mut self);
        }
    }
    /// Same schema, written differently: other spacing, docs, `&mut` vs `&`, `-> ()`.
    pub(crate) mod same {
        /// Docs do not matter.
        #[rpc::rpc_service(transport = "delegation", derive(Debug))]
        pub trait Fp {
            /// Neither do these.
            fn f(&mut self, a: u32, b: Option<u8>) -> u64;
            fn g(&self) -> ();
        }
    }
    pub(crate) mod arg_type {
        #[rpc::rpc_service(transport = "delegation")]
        pub trait Fp {
            fn f(&self, a: i32, b: Option<u8>) -> u64;
            fn g(&mut self);
        }
    }
    /// Only the argument names differ: the same bytes on the wire, so the same fingerprint.
    pub(crate) mod arg_name {
        #[rpc::rpc_service(transport = "delegation")]
        pub trait Fp {
            fn f(&self, x: u32, flag: Option<u8>) -> u64;
            fn g(&mut self);
        }
    }
    /// `size_a` and `size_b` write the same type text, `[u8; N]`, with another `N`: only the
    /// wire size tells them apart.
    pub(crate) mod size_a {
        const N: usize = 4;
        #[rpc::rpc_service(transport = "delegation")]
        pub trait Fp {
            fn f(&self, a: [u8; N]);
        }
    }
    pub(crate) mod size_b {
        const N: usize = 8;
        #[rpc::rpc_service(transport = "delegation")]
        pub trait Fp {
            fn f(&self, a: [u8; N]);
        }
    }
    pub(crate) mod arg_order {
        #[rpc::rpc_service(transport = "delegation")]
        pub trait Fp {
            fn f(&self, b: Option<u8>, a: u32) -> u64;
            fn g(&mut self);
        }
    }
    pub(crate) mod extra_arg {
        #[rpc::rpc_service(transport = "delegation")]
        pub trait Fp {
            fn f(&self, a: u32, b: Option<u8>) -> u64;
            fn g(&mut self, c: u8);
        }
    }
    pub(crate) mod method_name {
        #[rpc::rpc_service(transport = "delegation")]
        pub trait Fp {
            fn f2(&self, a: u32, b: Option<u8>) -> u64;
            fn g(&mut self);
        }
    }
    pub(crate) mod order {
        #[rpc::rpc_service(transport = "delegation")]
        pub trait Fp {
            fn g(&mut self);
            fn f(&self, a: u32, b: Option<u8>) -> u64;
        }
    }
    pub(crate) mod ret_type {
        #[rpc::rpc_service(transport = "delegation")]
        pub trait Fp {
            fn f(&self, a: u32, b: Option<u8>) -> u64;
            fn g(&mut self) -> u8;
        }
    }
    pub(crate) mod extra_method {
        #[rpc::rpc_service(transport = "delegation")]
        pub trait Fp {
            fn f(&self, a: u32, b: Option<u8>) -> u64;
            fn g(&mut self);
            fn h(&mut self);
        }
    }
    pub(crate) mod service_name {
        #[rpc::rpc_service(transport = "delegation")]
        pub trait Fq {
            fn f(&self, a: u32, b: Option<u8>) -> u64;
            fn g(&mut self);
        }
    }
}

#[test]
fn fingerprint_tracks_the_schema() {
    let base = fp::base::FpService::DESCRIPTOR.fingerprint;
    assert_eq!(fp::same::FpService::DESCRIPTOR.fingerprint, base);
    assert_eq!(
        fp::same::FpService::DESCRIPTOR,
        fp::base::FpService::DESCRIPTOR
    );
    // Renaming arguments is compatible (issue 17): the descriptors differ only in the names.
    let renamed = fp::arg_name::FpService::DESCRIPTOR;
    assert_eq!(renamed.fingerprint, base);
    assert_eq!(renamed.methods[0].args[0].name, "x");
    assert_ne!(renamed, fp::base::FpService::DESCRIPTOR);
    // The layout counts, not just the type text.
    let (a, b) = (
        fp::size_a::FpService::DESCRIPTOR,
        fp::size_b::FpService::DESCRIPTOR,
    );
    assert_eq!(a.methods[0].args[0].ty, b.methods[0].args[0].ty);
    assert_ne!(a.fingerprint, b.fingerprint);
    let others = [
        ("arg type", fp::arg_type::FpService::DESCRIPTOR.fingerprint),
        (
            "arg order",
            fp::arg_order::FpService::DESCRIPTOR.fingerprint,
        ),
        (
            "extra arg",
            fp::extra_arg::FpService::DESCRIPTOR.fingerprint,
        ),
        (
            "method name",
            fp::method_name::FpService::DESCRIPTOR.fingerprint,
        ),
        ("order", fp::order::FpService::DESCRIPTOR.fingerprint),
        (
            "return type",
            fp::ret_type::FpService::DESCRIPTOR.fingerprint,
        ),
        (
            "extra method",
            fp::extra_method::FpService::DESCRIPTOR.fingerprint,
        ),
        (
            "service name",
            fp::service_name::FqService::DESCRIPTOR.fingerprint,
        ),
    ];
    for (i, (what, f)) in others.iter().enumerate() {
        assert_ne!(*f, base, "changing the {what} must change the fingerprint");
        for (other, g) in &others[i + 1..] {
            assert_ne!(f, g, "{what} vs {other}");
        }
    }
}

/// A valid request message for `req`.
fn encoded(req: &AllRequest) -> Vec<u8> {
    let mut out = buf();
    let n = AllService::encode_request(req, &mut out);
    out.truncate(n);
    out
}

#[test]
fn malformed_requests_decode_to_errors() {
    let decode = AllService::decode_request;

    // Unknown method id.
    let mut msg = encoded(&AllRequest::nothing());
    msg[..2].copy_from_slice(&99u16.to_ne_bytes());
    assert_eq!(decode(&msg).unwrap_err(), WireError::UnknownMethod(99));
    assert_eq!(WireError::UnknownMethod(99).status(), Status::UnknownMethod);

    // Bad bool: `b` is the first body byte of bool_char.
    let mut msg = encoded(&AllRequest::bool_char(true, 'a'));
    msg[HEADER_BYTES] = 2;
    assert_eq!(
        decode(&msg).unwrap_err(),
        WireError::BadValue {
            method_id: AllService::BOOL_CHAR
        }
    );

    // Bad char: a surrogate, then a value above char::MAX.
    for bad in [0xD800u32, 0x11_0000] {
        let mut msg = encoded(&AllRequest::bool_char(true, 'a'));
        msg[HEADER_BYTES + 1..HEADER_BYTES + 5].copy_from_slice(&bad.to_ne_bytes());
        assert_eq!(
            decode(&msg).unwrap_err(),
            WireError::BadValue {
                method_id: AllService::BOOL_CHAR
            }
        );
    }

    // Bad Option tag (first byte of `a`), and a bad tag nested inside an array.
    let mut msg = encoded(&AllRequest::options(Some(1), None, None));
    msg[HEADER_BYTES] = 2;
    assert_eq!(
        decode(&msg).unwrap_err(),
        WireError::BadValue {
            method_id: AllService::OPTIONS
        }
    );
    let mut msg = encoded(&AllRequest::nested(None, [None, None]));
    // n: 1 + 2 * 2 bytes; m[1] starts at 5 + 7.
    msg[HEADER_BYTES + 5 + 7] = 7;
    assert_eq!(
        decode(&msg).unwrap_err(),
        WireError::BadValue {
            method_id: AllService::NESTED
        }
    );
    // Bad Result tag inside m[0] (after its Option tag).
    let mut msg = encoded(&AllRequest::nested(None, [Some(Ok(true)), None]));
    msg[HEADER_BYTES + 5 + 1] = 2;
    assert_eq!(
        decode(&msg).unwrap_err(),
        WireError::BadValue {
            method_id: AllService::NESTED
        }
    );

    // Bad enum discriminant of a user type.
    let mut msg = encoded(&AllRequest::user(Point { x: 0, y: 0 }, Color::Red));
    msg[HEADER_BYTES + 8] = 0;
    assert_eq!(
        decode(&msg).unwrap_err(),
        WireError::BadValue {
            method_id: AllService::USER
        }
    );

    // Short messages: less than a header, and less body than the header announces.
    let msg = encoded(&AllRequest::floats(1.0, 2.0));
    assert_eq!(
        decode(&msg[..5]).unwrap_err(),
        WireError::Truncated {
            got: 5,
            need: HEADER_BYTES
        }
    );
    assert_eq!(
        decode(&[]).unwrap_err(),
        WireError::Truncated {
            got: 0,
            need: HEADER_BYTES
        }
    );
    assert_eq!(
        decode(&msg[..msg.len() - 1]).unwrap_err(),
        WireError::Truncated {
            got: msg.len() - 1,
            need: msg.len()
        }
    );

    // Wrong length: the header announces fewer or more bytes than the argument struct has.
    for len in [11u32, 13] {
        let mut msg = encoded(&AllRequest::floats(1.0, 2.0));
        msg.resize(HEADER_BYTES + 13, 0);
        msg[4..8].copy_from_slice(&len.to_ne_bytes());
        assert_eq!(
            decode(&msg).unwrap_err(),
            WireError::BadLength {
                method_id: AllService::FLOATS,
                got: len as usize,
                expected: 12
            }
        );
    }
    // Extra bytes after the announced body are ignored (a transport slot may be larger).
    let mut msg = encoded(&AllRequest::floats(1.0, 2.0));
    msg.extend_from_slice(&[0xFF; 16]);
    assert_eq!(decode(&msg).unwrap(), AllRequest::floats(1.0, 2.0));
}

#[test]
fn malformed_responses_decode_to_errors() {
    let mut out = buf();
    let n = AllService::encode_response(&AllResponse::Options(Some('x')), &mut out);
    let msg = out[..n].to_vec();
    assert_eq!(
        AllService::decode_response(AllService::OPTIONS, &msg).unwrap(),
        AllResponse::Options(Some('x'))
    );

    // Answer to another method than the one called.
    assert_eq!(
        AllService::decode_response(AllService::NESTED, &msg).unwrap_err(),
        WireError::MethodMismatch {
            expected: AllService::NESTED,
            got: AllService::OPTIONS
        }
    );
    // Unknown method id asked for.
    assert_eq!(
        AllService::decode_response(500, &msg).unwrap_err(),
        WireError::UnknownMethod(500)
    );
    // Bad char in the body.
    let mut bad = msg.clone();
    bad[HEADER_BYTES + 1..].copy_from_slice(&0xDFFFu32.to_ne_bytes());
    assert_eq!(
        AllService::decode_response(AllService::OPTIONS, &bad).unwrap_err(),
        WireError::BadValue {
            method_id: AllService::OPTIONS
        }
    );
    // Error status from the server.
    let mut rejected = vec![0u8; HEADER_BYTES];
    let n = rpc::wire::encode_status(AllService::OPTIONS, Status::BadArguments, &mut rejected);
    assert_eq!(
        AllService::decode_response(AllService::OPTIONS, &rejected[..n]).unwrap_err(),
        WireError::Rejected {
            status: Some(Status::BadArguments),
            code: 3
        }
    );
    // Truncated.
    assert_eq!(
        AllService::decode_response(AllService::OPTIONS, &msg[..3]).unwrap_err(),
        WireError::Truncated {
            got: 3,
            need: HEADER_BYTES
        }
    );
}
