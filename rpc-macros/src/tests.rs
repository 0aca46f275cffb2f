//! Unit tests of parsing, lowering and validation (the compile errors as users see them are
//! covered by the trybuild tests in the workspace's `tests/ui`).

use proc_macro2::TokenStream;
use quote::quote;

use crate::expand::expand;
use crate::generate::{doc_lowered, lower_expr, lowered, raise_expr};
use crate::parse::{Errors, TransportArg, WireTy, normalize_tokens, parse_attr};
use crate::validate::{CLIENT_METHODS, type_text};

fn classify(ty: TokenStream) -> Result<WireTy, String> {
    let ty: syn::Type = syn::parse2(ty).expect("a type");
    let mut errors = Errors::default();
    let out = WireTy::classify(&ty, &mut errors);
    match errors.finish() {
        Ok(()) => Ok(out.expect("no error, so a type")),
        Err(e) => Err(e.to_string()),
    }
}

/// Tokens as text without any whitespace.
fn compact(tokens: TokenStream) -> String {
    tokens
        .to_string()
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect()
}

/// The wire form as the docs show it (without the byte storage parameters).
fn lowered_text(ty: TokenStream) -> String {
    let ty = classify(ty).expect("supported type");
    let short = normalize_tokens(doc_lowered(&ty));
    // The emitted form is the same tree with byte storage for every `Option`/`Result` side.
    let full = normalize_tokens(lowered(&ty)).replace("::rpc::__private::", "");
    let storage_free = strip_storage(&full);
    assert_eq!(storage_free, short, "{full}");
    short
}

/// Removes the `, [u8; ::core::mem::size_of::<..>()]` storage parameters from a lowered type.
fn strip_storage(text: &str) -> String {
    const START: &str = ", [u8;::core::mem::size_of::<";
    let mut out = text.to_owned();
    while let Some(i) = out.find(START) {
        // Skip to the `()]` that closes this storage parameter (balanced `<`/`>`).
        let rest = &out[i + START.len()..];
        let mut depth = 1;
        let mut end = None;
        for (j, c) in rest.char_indices() {
            match c {
                '<' => depth += 1,
                '>' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(j);
                        break;
                    }
                }
                _ => {}
            }
        }
        let end = end.expect("balanced storage parameter");
        assert!(rest[end..].starts_with(">()]"), "{text}");
        out = format!("{}{}", &out[..i], &rest[end + 4..]);
    }
    out
}

/// Every error message of an expansion.
fn errors_of(attr: TokenStream, item: TokenStream) -> Vec<String> {
    let out = expand(attr, item);
    let file: syn::File = syn::parse2(out).expect("the expansion parses");
    file.items
        .iter()
        .filter_map(|item| match item {
            syn::Item::Macro(m)
                if m.mac
                    .path
                    .segments
                    .last()
                    .is_some_and(|s| s.ident == "compile_error") =>
            {
                let lit: syn::LitStr = m.mac.parse_body().expect("a string");
                Some(lit.value())
            }
            _ => None,
        })
        .collect()
}

fn kv_errors(item: TokenStream) -> Vec<String> {
    errors_of(quote!(transport = "delegation"), item)
}

#[test]
fn lowering_is_recursive_and_syntactic() {
    assert_eq!(lowered_text(quote!(u64)), "u64");
    assert_eq!(lowered_text(quote!(Option<u64>)), "WireOption<u64>");
    // The value's storage is a byte array of its wire size.
    let ty = classify(quote!(Option<Result<Color, u16>>)).unwrap();
    assert_eq!(
        normalize_tokens(lowered(&ty)).replace("::rpc::__private::", ""),
        "WireOption<WireResult<Color, u16, [u8;::core::mem::size_of::<Color>()], \
         [u8;::core::mem::size_of::<u16>()]>, [u8;::core::mem::size_of::<WireResult<Color, \
         u16, [u8;::core::mem::size_of::<Color>()], [u8;::core::mem::size_of::<u16>()]>>()]>"
    );
    assert_eq!(
        lowered_text(quote!(std::option::Option<u64>)),
        "WireOption<u64>"
    );
    assert_eq!(
        lowered_text(quote!(::core::option::Option<u64>)),
        "WireOption<u64>"
    );
    assert_eq!(
        lowered_text(quote!(Result<u32, Err>)),
        "WireResult<u32, Err>"
    );
    assert_eq!(
        lowered_text(quote!(core::result::Result<(), u8>)),
        "WireResult<(), u8>"
    );
    assert_eq!(lowered_text(quote!([u8; 32])), "[u8; 32]");
    assert_eq!(lowered_text(quote!([[u16; 2]; N])), "[[u16; 2]; N]");
    assert_eq!(
        lowered_text(quote!(Option<[Option<u8>; 2]>)),
        "WireOption<[WireOption<u8>; 2]>"
    );
    assert_eq!(
        lowered_text(quote!([Option<Result<bool, char>>; 2])),
        "[WireOption<WireResult<bool, char>>; 2]"
    );
    assert_eq!(lowered_text(quote!((Option<u8>))), "WireOption<u8>");
    // Not recognised: aliases, other paths, wrong arity. Left as written (leaf types).
    assert_eq!(lowered_text(quote!(MaybeU64)), "MaybeU64");
    assert_eq!(lowered_text(quote!(io::Result<u8>)), "io::Result<u8>");
    assert_eq!(lowered_text(quote!(Result<u8>)), "Result<u8>");
    assert_eq!(
        lowered_text(quote!(my::option::Option<u8>)),
        "my::option::Option<u8>"
    );
    assert_eq!(lowered_text(quote!(::Option<u8>)), "::Option<u8>");
}

#[test]
fn identity_lowering_needs_no_conversion() {
    let ty = classify(quote!([[u8; 2]; 3])).unwrap();
    assert!(ty.is_identity());
    assert_eq!(lower_expr(&ty, quote!(x), 0).to_string(), "x");
    let ty = classify(quote!([Option<u8>; 3])).unwrap();
    assert!(!ty.is_identity());
    let lower = compact(lower_expr(&ty, quote!(x), 0));
    assert_eq!(
        lower,
        "x.map(|__rpc_v0|<::rpc::__private::WireOption<u8,[u8;::core::mem::size_of::<u8>()]>>\
         ::from_option(__rpc_v0))"
    );
    let raise = compact(raise_expr(&ty, quote!(x), 0));
    assert_eq!(
        raise,
        "::rpc::__private::raise_array(x,|__rpc_v0|\
         ::rpc::__private::WireOption::try_into_option(__rpc_v0))"
    );
}

#[test]
fn nested_conversions_use_distinct_closure_variables() {
    let ty = classify(quote!(Option<[Option<u8>; 2]>)).unwrap();
    let lower = compact(lower_expr(&ty, quote!(x), 0));
    assert!(
        lower.starts_with("<::rpc::__private::WireOption<[::rpc::__private::WireOption<u8,"),
        "{lower}"
    );
    assert!(
        lower.ends_with(
            ">::from_option(::core::option::Option::map(x,|__rpc_v0|__rpc_v0.map(|__rpc_v1|\
             <::rpc::__private::WireOption<u8,[u8;::core::mem::size_of::<u8>()]>>\
             ::from_option(__rpc_v1))))"
        ),
        "{lower}"
    );
    let ty = classify(quote!(Result<Option<u8>, [Option<u8>; 1]>)).unwrap();
    let raise = compact(raise_expr(&ty, quote!(x), 0));
    assert_eq!(
        raise,
        "::rpc::__private::raise_result(x,\
         |__rpc_v0|::rpc::__private::WireOption::try_into_option(__rpc_v0),\
         |__rpc_v0|::rpc::__private::raise_array(__rpc_v0,\
         |__rpc_v1|::rpc::__private::WireOption::try_into_option(__rpc_v1)))"
    );
    let ty = classify(quote!(Result<u8, Option<Option<u8>>>)).unwrap();
    let raise = compact(raise_expr(&ty, quote!(x), 0));
    assert_eq!(
        raise,
        "::rpc::__private::raise_result(x,::core::result::Result::Ok,\
         |__rpc_v0|::rpc::__private::raise_option(__rpc_v0,\
         |__rpc_v1|::rpc::__private::WireOption::try_into_option(__rpc_v1)))"
    );
}

#[test]
fn leaves_are_visited_in_order() {
    let ty = classify(quote!(Option<[Result<A, B>; 2]>)).unwrap();
    let mut leaves = Vec::new();
    ty.for_each_leaf(&mut |t| leaves.push(type_text(t)));
    assert_eq!(leaves, ["A", "B"]);
    let ty = classify(quote!([C; 2])).unwrap();
    let mut leaves = Vec::new();
    ty.for_each_leaf(&mut |t| leaves.push(type_text(t)));
    assert_eq!(leaves, ["C"]);
}

fn classify_sig(ty: TokenStream, pos: crate::parse::Position) -> Result<WireTy, String> {
    let ty: syn::Type = syn::parse2(ty).unwrap();
    let mut errors = Errors::default();
    match WireTy::classify_sig(&ty, pos, &mut errors) {
        Some(w) if errors.count() == 0 => Ok(w),
        _ => Err(errors.finish().unwrap_err().to_string()),
    }
}

/// Whole arguments and return types of variable length (issue 15): which forms are accepted
/// where, and what the refusals say.
#[test]
fn variable_length_forms_by_position() {
    use crate::parse::Position::{Arg, Ret};
    for (ty, pos, optional, owned, string) in [
        (quote!(&str), Arg, false, false, true),
        (quote!(&[u8]), Arg, false, false, false),
        (quote!(&'_ [u64]), Arg, false, false, false),
        (quote!(Option<&str>), Arg, true, false, true),
        (quote!(&[u8]), Ret, false, false, false),
        (quote!(String), Ret, false, true, true),
        (quote!(std::vec::Vec<u32>), Ret, false, true, false),
        (quote!(Option<Vec<u8>>), Ret, true, true, false),
    ] {
        let w = classify_sig(ty.clone(), pos).unwrap_or_else(|e| panic!("{ty}: {e}"));
        let v = w.var().unwrap_or_else(|| panic!("{ty} is variable-length"));
        assert_eq!(
            (v.optional, v.owned, v.elem.is_none()),
            (optional, owned, string),
            "{ty}"
        );
    }
    for (ty, pos, says) in [
        (quote!(String), Arg, "write `&str` instead"),
        (quote!(Vec<u8>), Arg, "write `&[u8]` instead"),
        (quote!(&mut [u8]), Arg, "passed by shared reference"),
        (quote!(&'a str), Arg, "without a lifetime"),
        (
            quote!(Vec<Option<u8>>),
            Ret,
            "element type of a variable-length slice",
        ),
        (quote!(&u64), Arg, "a reference cannot be sent"),
        (
            quote!(Result<Vec<u8>, u8>),
            Ret,
            "a variable-length value can be a whole argument",
        ),
    ] {
        let e = classify_sig(ty.clone(), pos).expect_err(&ty.to_string());
        assert!(e.contains(says), "{ty}: {e}");
    }
    // Fixed-size types are classified as before.
    assert!(classify_sig(quote!(u64), Arg).unwrap().var().is_none());
}

/// `String`, `str` and `Vec<T>` get one error each saying what to write instead (issue 17),
/// not the raw trait-bound errors of the compile-time assertions.
#[test]
fn variable_length_types_get_one_error_with_the_alternative() {
    for (ty, what, instead) in [
        (quote!(String), "`String`", "`[u8; N]`"),
        (quote!(std::string::String), "`String`", "`[u8; N]`"),
        (quote!(::alloc::string::String), "`String`", "`[u8; N]`"),
        (quote!(str), "`str`", "`[u8; N]`"),
        (quote!(Vec<u8>), "`Vec`", "`[u8; N]`"),
        (quote!(std::vec::Vec<u32>), "`Vec`", "`[u32; N]`"),
        (quote!(Vec<Option<u8>>), "`Vec`", "`[Option<u8>; N]`"),
        (quote!(Option<String>), "`String`", "`[u8; N]`"),
        (quote!([Vec<u8>; 2]), "`Vec`", "`[u8; N]`"),
    ] {
        let err = classify(ty.clone()).expect_err(&ty.to_string());
        assert!(
            err.starts_with(&format!("{what} cannot be sent by an `#[rpc_service]`")),
            "{ty}: {err}"
        );
        assert!(err.contains("use a fixed-size"), "{ty}: {err}");
        assert!(err.contains(instead), "{ty}: {err}");
        assert!(
            err.contains("a variable-length value can be a whole argument"),
            "{ty}: {err}"
        );
    }
    // Only the standard types (by name and path): these are ordinary leaf types.
    for ty in [
        quote!(MyString),
        quote!(my::String),
        quote!(mycrate::vec::Vec<u8>),
        quote!(<T as Tr>::String),
    ] {
        assert!(classify(ty.clone()).is_ok(), "{ty}");
    }
    // One error per use, spanned on it, and nothing else.
    let errors = kv_errors(quote! {
        trait Kv {
            fn set(&mut self, name: String, data: Vec<u8>) -> Vec<u8>;
            fn ok(&self, key: u64) -> [Vec<u8>; 2];
        }
    });
    // Owned arguments say to borrow; a `Vec` return is fine; a nested one is refused.
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(errors[0].starts_with("`String` cannot be an"), "{errors:?}");
    assert!(
        errors[1].starts_with("`Vec<u8>` cannot be an"),
        "{errors:?}"
    );
    assert!(errors[2].starts_with("`Vec` cannot be sent"), "{errors:?}");
}

#[test]
fn unsupported_types_are_rejected_syntactically() {
    for (ty, what) in [
        (quote!(&u8), "a reference"),
        (quote!(&'static str), "a reference"),
        (quote!([u8]), "a slice"),
        (quote!(impl Copy), "`impl Trait`"),
        (quote!(dyn Send), "a `dyn Trait` object"),
        (quote!(Box<dyn Send>), "does not matter"),
        (quote!((u8, u8)), "a tuple"),
        (quote!(*const u8), "a raw pointer"),
        (quote!(fn(u8)), "a function pointer"),
        (quote!(!), "`!`"),
        (quote!(_), "`_`"),
        (quote!(Option<&u8>), "a reference"),
        (quote!([(u8, u8); 2]), "a tuple"),
        (quote!(Self), "`Self` cannot appear"),
        (quote!(Option<Self>), "`Self` cannot appear"),
        (quote!(Foo<'a>), "lifetimes other than `'static`"),
    ] {
        let r = classify(ty.clone());
        if what == "does not matter" {
            // A leaf type: the compile-time assertions reject it, not the parser.
            assert!(r.is_ok(), "{ty}");
            continue;
        }
        let err = r.expect_err(&ty.to_string());
        assert!(err.starts_with(what), "{ty}: {err}");
    }
    assert!(classify(quote!(Foo<'static>)).is_ok());
    assert!(classify(quote!(())).is_ok());
}

#[test]
fn type_text_is_whitespace_normalised() {
    for (tokens, text) in [
        (quote!(Option<u64>), "Option<u64>"),
        (quote!([u8; 32]), "[u8; 32]"),
        (quote!(()), "()"),
        (
            quote!(std::option::Option<[Option<u8>; 2]>),
            "std::option::Option<[Option<u8>; 2]>",
        ),
        (
            quote!(::core::result::Result<(), MyError>),
            "::core::result::Result<(), MyError>",
        ),
        (quote!(Vec<Vec<u8>>), "Vec<Vec<u8>>"),
        (quote!(<T as Trait>::Assoc), "<T as Trait>::Assoc"),
        (quote!([u8; N * 2 + 1]), "[u8; N * 2 + 1]"),
        (quote!([u8; N - 1]), "[u8; N - 1]"),
        (quote!([u8; -1 as usize]), "[u8; -1 as usize]"),
        (quote!([u8; { N }]), "[u8; { N }]"),
        (quote!(Foo<'static, -1>), "Foo<'static, -1>"),
        (quote!(my_type!(u8)), "my_type!(u8)"),
    ] {
        assert_eq!(normalize_tokens(tokens), text);
    }
    // The source's spacing does not matter.
    let a: syn::Type = syn::parse_str("Option < [ u8 ;4 ] >").unwrap();
    let b: syn::Type = syn::parse_str("Option<[u8; 4]>").unwrap();
    assert_eq!(type_text(&a), type_text(&b));
}

#[test]
fn attribute_arguments() {
    let mut errors = Errors::default();
    let args = parse_attr(
        quote!(transport = "delegation", derive(Debug, PartialEq)),
        &mut errors,
    );
    assert!(errors.finish().is_ok());
    assert!(matches!(args.transport, Some(TransportArg::Name(s)) if s.value() == "delegation"));
    assert_eq!(args.derives.len(), 2);

    let item = quote!(
        trait T {}
    );
    let e = errors_of(quote!(), item.clone());
    assert_eq!(e.len(), 1);
    assert!(e[0].starts_with("missing transport"), "{e:?}");
    let e = errors_of(quote!(transport = "foo"), item.clone());
    assert_eq!(
        e,
        [
            "unknown transport `foo`; built-in transports: delegation, copyrpc, erpc, scalerpc, ipc (another transport is named by its type's path, unquoted: `transport = path::To::Type`)"
        ]
    );
    for t in ["delegation", "copyrpc", "erpc", "scalerpc", "ipc"] {
        assert!(errors_of(quote!(transport = #t), item.clone()).is_empty());
    }
    let e = errors_of(
        quote!(transport = "delegation", colour = "blue"),
        item.clone(),
    );
    assert!(
        e[0].starts_with("unknown `#[rpc_service]` argument `colour`"),
        "{e:?}"
    );
    // Any type path names a transport (the compiler checks that it implements
    // `rpc::ClientTransport`); a bare built-in name is a forgotten pair of quotes.
    for t in [
        quote!(Loopback),
        quote!(crate::transports::Loopback),
        quote!(::other::Loopback),
    ] {
        assert!(errors_of(quote!(transport = #t), item.clone()).is_empty());
    }
    let e = errors_of(quote!(transport = delegation), item.clone());
    assert_eq!(
        e,
        [
            "built-in transports are named by a string: write `transport = \"delegation\"` (an unquoted path names a type implementing `rpc::ClientTransport`)"
        ]
    );
    let e = errors_of(quote!(transport = Loopback::<u8>), item.clone());
    assert!(
        e[0].starts_with("`transport` takes a type path without generic arguments"),
        "{e:?}"
    );
    let e = errors_of(quote!(transport = 42), item.clone());
    assert!(
        e[0].starts_with("`transport` takes a built-in transport's name as a string"),
        "{e:?}"
    );
    let e = errors_of(
        quote!(transport = "delegation", transport = "delegation"),
        item.clone(),
    );
    assert_eq!(e, ["duplicate `transport` argument"]);
    let e = errors_of(
        quote!(transport = "delegation", derive(Clone)),
        item.clone(),
    );
    assert!(e[0].starts_with("`Clone` is always derived"), "{e:?}");
    let e = errors_of(
        quote!(transport = "delegation"),
        quote!(
            struct S;
        ),
    );
    assert!(
        e[0].starts_with("`#[rpc_service]` applies to a trait"),
        "{e:?}"
    );
}

#[test]
fn name_collisions_are_detected() {
    let e = kv_errors(quote! {
        trait Kv {
            fn get_value(&self);
            fn getValue(&self);
            fn GetValue(&self);
            fn get(&self);
            fn get(&self, x: u8);
        }
    });
    assert_eq!(e.len(), 3, "{e:?}");
    assert!(
        e[0].starts_with("method `getValue` collides with method `get_value`"),
        "{e:?}"
    );
    assert!(e[0].contains("`KvRequest::GetValue`"), "{e:?}");
    assert!(
        e[1].starts_with("method `GetValue` collides with method `get_value`"),
        "{e:?}"
    );
    assert_eq!(e[2], "duplicate method `get`");

    // Same SHOUTY_SNAKE constant, different CamelCase variant.
    let e = kv_errors(quote! {
        trait Kv {
            fn a_b1(&self);
            fn a_b_1(&self);
        }
    });
    assert_eq!(e.len(), 1, "{e:?}");

    let e = kv_errors(quote! {
        trait Kv {
            fn put(&self, key: u64, key: u32);
        }
    });
    assert_eq!(
        e,
        ["duplicate argument name `key`: each argument becomes a field of `KvPutArgs`"]
    );
}

#[test]
fn reserved_names_are_rejected() {
    for name in CLIENT_METHODS.iter().chain(&["descriptor"]) {
        let ident = syn::Ident::new(name, proc_macro2::Span::call_site());
        let e = kv_errors(quote! {
            trait Kv {
                fn #ident(&self);
            }
        });
        assert_eq!(e.len(), 1, "{name}: {e:?}");
        assert!(
            e[0].starts_with(&format!("method name `{name}` is reserved")),
            "{e:?}"
        );
    }
    let e = kv_errors(quote! {
        trait __rpcKv {
            fn __rpc_get(&self, __RPC_x: u8);
        }
    });
    assert_eq!(e.len(), 3, "{e:?}");
    assert!(
        e.iter()
            .all(|m| m.contains("starting with `__rpc` are used by")),
        "{e:?}"
    );
    // Names that merely contain the prefix, and keywords as raw identifiers, are fine.
    assert!(
        kv_errors(quote!(
            trait Kv {
                fn get__rpc(&self, r#type: u8);
                fn r#match(&self);
            }
        ))
        .is_empty()
    );
}

#[test]
fn method_shape_errors() {
    let e = kv_errors(quote! {
        trait Kv {
            async fn a(&self);
            const fn b(&self);
            unsafe fn c(&self);
            extern "C" fn d(&self);
            fn e<T>(&self, t: T);
            fn f(&self) where Self: Sized;
            fn g();
            fn h(self);
            fn i(mut self);
            fn j(self: Box<Self>);
            fn j2(self: &Self);
            fn k(&self, (a, b): (u32, u32));
            fn l(&self, _: u32);
            fn m(&self, mut x: u32);
            fn n(&self) {}
            #[cfg(test)]
            fn o(&self);
            fn p(&self, #[allow(unused)] x: u8);
        }
    });
    let expect = [
        "cannot be `async fn`",
        "cannot be `const fn`",
        "cannot be `unsafe fn`",
        "cannot have an ABI",
        "cannot be generic",
        "cannot have a `where` clause",
        "needs a `&self` or `&mut self` receiver",
        "take `&self` or `&mut self`",
        "take `&self` or `&mut self`",
        "take `&self` or `&mut self`",
        "the explicit `self: &Self` form is not supported",
        "must be plain names",
        "a tuple cannot be sent",
        "need a name: `_` cannot be used",
        "must be plain names",
        "cannot have a default body",
        "`#[cfg]` is not supported",
        "attributes on RPC method arguments",
    ];
    assert_eq!(e.len(), expect.len(), "{e:#?}");
    for (msg, want) in e.iter().zip(expect) {
        assert!(msg.contains(want), "{msg:?} should contain {want:?}");
    }
}

#[test]
fn trait_shape_errors() {
    let e = kv_errors(quote! {
        unsafe trait Kv<'a, T, const N: usize>: Send where T: Copy {
            type X;
            const Y: u8;
            some_macro!();
        }
    });
    let expect = [
        "cannot be `unsafe`",
        "cannot have lifetime parameters",
        "cannot have type parameters",
        "cannot have const parameters",
        "cannot have a `where` clause",
        "cannot have supertraits",
        "associated types are not supported",
        "associated constants are not supported",
        "macro invocations are not supported",
    ];
    assert_eq!(e.len(), expect.len(), "{e:#?}");
    for (msg, want) in e.iter().zip(expect) {
        assert!(msg.contains(want), "{msg:?} should contain {want:?}");
    }
}

#[test]
fn too_many_methods() {
    let methods = (0..=u16::MAX as usize).map(|i| {
        let ident = quote::format_ident!("m{i}");
        quote!(fn #ident(&self);)
    });
    let e = kv_errors(quote!(trait Kv { #(#methods)* }));
    assert_eq!(e.len(), 1);
    assert!(
        e[0].starts_with("too many methods: an `#[rpc_service]` trait may have at most 65535"),
        "{e:?}"
    );
}

#[test]
fn valid_service_expands_without_errors() {
    let out = expand(
        quote!(transport = "delegation", derive(Debug)),
        quote! {
            /// Docs.
            pub(crate) trait Kv {
                /// Get.
                fn get(&mut self, rank: u32, key: u64) -> Option<u64>;
                fn put(&mut self, rank: u32, key: u64, value: u64);
                fn ping(&self);
            }
        },
    );
    let text = out.to_string();
    assert!(!text.contains("compile_error"), "{text}");
    let file: syn::File = syn::parse2(out).unwrap();
    let names: Vec<String> = file
        .items
        .iter()
        .filter_map(|i| match i {
            syn::Item::Trait(t) => Some(t.ident.to_string()),
            syn::Item::Struct(s) => Some(s.ident.to_string()),
            syn::Item::Enum(e) => Some(e.ident.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(
        names,
        [
            "KvServer",
            "KvGetArgs",
            "KvPutArgs",
            "KvPingArgs",
            "KvRequest",
            "KvResponse",
            "KvService",
            "KvClient",
            "KvIssue",
            "KvWithDeadline"
        ]
    );
    assert!(text.contains("pub const GET : u16 = 0u16"), "{text}");
    assert!(text.contains("pub const PING : u16 = 2u16"), "{text}");
}
