//! Hygiene and naming: user types named like the generated generics (`S`, `T`), raw
//! identifiers, method names that are not reserved (`new`, `dispatch`), non-snake-case names,
//! restricted visibility, and a type macro in a signature.

mod inner {
    use rpc::rpc_service;
    use zerocopy::{FromZeros, Immutable, IntoBytes, KnownLayout};

    #[derive(Clone, Copy, Debug, PartialEq, FromZeros, IntoBytes, KnownLayout, Immutable)]
    #[repr(transparent)]
    pub struct T(pub u32);

    #[derive(Clone, Copy, Debug, PartialEq, FromZeros, IntoBytes, KnownLayout, Immutable)]
    #[repr(C)]
    pub struct S {
        pub a: u16,
        pub b: u16,
    }

    macro_rules! byte {
        () => {
            u8
        };
    }

    /// A crate-private service.
    #[rpc_service(transport = "delegation", derive(Debug, PartialEq))]
    pub(crate) trait Odd {
        fn r#type(&self, r#match: T, s: S) -> Option<T>;
        fn new(&self) -> byte!();
        fn dispatch(&mut self, s: [S; 2]);
        #[allow(non_snake_case)]
        fn getValue(&self, t: Result<T, S>) -> T;
    }

    pub(crate) struct Impl;

    impl OddServer for Impl {
        fn r#type(&self, r#match: T, _s: S) -> Option<T> {
            Some(r#match)
        }
        fn new(&self) -> u8 {
            7
        }
        fn dispatch(&mut self, _s: [S; 2]) {}
        fn getValue(&self, t: Result<T, S>) -> T {
            t.unwrap_or(T(0))
        }
    }
}

use inner::*;

fn main() {
    let resp = OddService::dispatch(&mut Impl, OddRequest::r#type(T(5), S { a: 1, b: 2 }));
    assert_eq!(resp, OddResponse::Type(Some(T(5))));
    assert_eq!(
        OddService::dispatch(&mut Impl, OddRequest::new()),
        OddResponse::New(7)
    );
    assert_eq!(
        OddService::dispatch(&mut Impl, OddRequest::getValue(Err(S { a: 0, b: 0 }))),
        OddResponse::GetValue(T(0))
    );
    let _ = OddService::dispatch(&mut Impl, OddRequest::dispatch([S { a: 0, b: 0 }; 2]));
    assert_eq!(
        [
            OddService::TYPE,
            OddService::NEW,
            OddService::DISPATCH,
            OddService::GET_VALUE
        ],
        [0, 1, 2, 3]
    );
    let d = <OddService as rpc::Service>::DESCRIPTOR;
    assert_eq!(d.methods[0].name, "type");
    assert_eq!(d.methods[0].args[0].name, "match");
    assert_eq!(d.methods[1].ret_ty, "byte!()");
    let _: Option<OddClient> = None;
}
