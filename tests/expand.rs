//! Snapshot of what `#[rpc_service]` expands to, for a representative service.
//!
//! A proc-macro crate can export nothing but its macros, so this test compiles the macro's
//! implementation (`rpc-macros/src/{parse,validate,generate,expand}.rs`, which use only
//! `proc_macro2`) into the test crate itself and calls its `expand` directly. The output is
//! formatted with prettyplease and compared with `tests/snapshots/expand__*.snap` by insta;
//! review changes with `cargo insta review` or `INSTA_UPDATE=always cargo test --test expand`.

#[allow(dead_code)]
#[path = "../rpc-macros/src/expand.rs"]
mod expand;
#[allow(dead_code)]
#[path = "../rpc-macros/src/generate.rs"]
mod generate;
#[allow(dead_code)]
#[path = "../rpc-macros/src/parse.rs"]
mod parse;
#[allow(dead_code)]
#[path = "../rpc-macros/src/validate.rs"]
mod validate;

use quote::quote;

fn pretty(tokens: proc_macro2::TokenStream) -> String {
    let file: syn::File = syn::parse2(tokens).expect("the expansion parses as a file");
    prettyplease::unparse(&file)
}

#[test]
fn kv_service() {
    let attr = quote!(transport = "delegation", derive(Debug, PartialEq));
    let item = quote! {
        /// A key-value store.
        pub trait Kv {
            /// Looks a key up.
            fn get(&mut self, rank: u32, key: u64) -> Option<u64>;
            fn put(&mut self, rank: u32, key: u64, value: u64);
            fn stat(&self) -> [Option<u32>; 2];
            /// Variable-length arguments and result (`rpc::varlen`).
            fn swap(&mut self, key: &str, words: &[u64], value: Option<&[u8]>) -> Option<Vec<u8>>;
            fn cas(&mut self, key: Key, expected: Option<Value>, new: Value) -> Result<(), Option<Value>>;
        }
    };
    insta::assert_snapshot!(pretty(expand::expand(attr, item)));
}

#[test]
fn empty_service() {
    let attr = quote!(transport = "delegation");
    let item = quote!(
        trait Nothing {}
    );
    insta::assert_snapshot!(pretty(expand::expand(attr, item)));
}

#[test]
fn path_transport() {
    let attr = quote!(transport = crate::transports::Loopback);
    let item = quote! {
        pub trait Echo {
            fn echo(&self, x: u64) -> u64;
        }
    };
    insta::assert_snapshot!(pretty(expand::expand(attr, item)));
}

#[test]
fn errors_are_all_reported() {
    let attr = quote!(transport = "rdma", colour = "blue");
    let item = quote! {
        pub trait Bad<T>: Send {
            async fn a(&self);
            fn b(self, x: &u8);
            fn c(&self, (p, q): (u32, u32)) {}
            fn get_value(&self);
            fn getValue(&self);
            type Assoc;
        }
    };
    let out = expand::expand(attr, item).to_string();
    let messages: Vec<&str> = out.split("compile_error !").skip(1).collect();
    for needle in [
        "unknown transport `rdma`; built-in transports: delegation, copyrpc, erpc, scalerpc",
        "unknown `#[rpc_service]` argument `colour`",
        "cannot have type parameters",
        "cannot have supertraits",
        "cannot be `async fn`",
        "take `&self` or `&mut self`",
        "a reference cannot be sent",
        "must be plain names",
        "cannot have a default body",
        "method `getValue` collides with method `get_value`",
        "a tuple cannot be sent",
        "associated types are not supported",
    ] {
        assert!(out.contains(needle), "missing error {needle:?} in:\n{out}");
    }
    assert_eq!(messages.len(), 12, "{out}");
}
