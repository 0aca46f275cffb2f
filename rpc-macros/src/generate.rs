//! Code generation: turns a validated [`Service`] into the server trait, the wire argument
//! structs, the request/response enums, the service marker with its `rpc::Service` impl and
//! descriptor, the client and its pipelined-call builder, and the compile-time checks.
//!
//! Every path goes through `::rpc` / `::rpc::__private`, and every local or helper name starts
//! with `__rpc` (a prefix the validator reserves), so the output does not depend on what the
//! user's module has in scope.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, Type};

use crate::parse::WireTy;
use crate::validate::{Method, Service, type_text};

/// Names of the generated items of one service.
struct Names {
    server: Ident,
    service: Ident,
    client: Ident,
    issue: Ident,
    with_deadline: Ident,
    request: Ident,
    response: Ident,
}

impl Names {
    fn new(svc: &Service) -> Self {
        let n = &svc.name;
        Names {
            // The server trait is the user's trait renamed: it keeps the trait's span.
            server: format_ident!("{n}Server", span = svc.ident.span()),
            service: format_ident!("{n}Service"),
            client: format_ident!("{n}Client"),
            issue: format_ident!("{n}Issue"),
            with_deadline: format_ident!("{n}WithDeadline"),
            request: format_ident!("{n}Request"),
            response: format_ident!("{n}Response"),
        }
    }

    fn args(&self, svc: &Service, m: &Method) -> Ident {
        format_ident!("{}{}Args", svc.name, m.camel)
    }
}

/// Generates the whole expansion of a valid service.
pub(crate) fn generate(svc: &Service) -> TokenStream {
    let names = Names::new(svc);
    let server = gen_server(svc, &names);
    let args = svc.methods.iter().map(|m| {
        if has_var_args(m) {
            gen_var_args_struct(svc, &names, m)
        } else {
            gen_args_struct(svc, &names, m)
        }
    });
    let enums = gen_enums(svc, &names);
    let service = gen_service(svc, &names);
    let client = gen_client(svc, &names);
    let checks = gen_checks(svc);
    // The checks go first: rustc reports their errors (which name the type and the missing
    // trait, at the type) before the follow-on errors of the items that use the type.
    quote! {
        #checks
        #server
        #(#args)*
        #enums
        #service
        #client
    }
}

fn doc(text: impl AsRef<str>) -> TokenStream {
    let text = text.as_ref();
    quote!(#[doc = #text])
}

/// Doc lines: each line becomes one `#[doc]` attribute, as `///` comments would.
fn docs(text: &str) -> TokenStream {
    let lines = text.lines().map(|l| {
        if l.is_empty() {
            String::new()
        } else {
            format!(" {l}")
        }
    });
    quote!(#(#[doc = #lines])*)
}

/// The user-facing return type: as written, or `()` when omitted.
fn ret_type(m: &Method) -> TokenStream {
    if m.ret_written {
        let t = m.ret.written();
        quote!(#t)
    } else {
        quote!(())
    }
}

/// The wire (lowered) form of a type: `Option<T>` → `WireOption<L(T), [u8; size_of L(T)]>`,
/// `Result<T, E>` → `WireResult<L(T), L(E), [u8; size_of L(T)], [u8; size_of L(E)]>`,
/// `[T; N]` → `[L(T); N]`, others unchanged. The byte arrays store the values (validated only
/// when their side is active); their lengths are constant expressions that name no generic
/// parameter, as every place the macro emits a wire type allows.
pub(crate) fn lowered(ty: &WireTy) -> TokenStream {
    match ty {
        WireTy::Leaf(t) => quote!(#t),
        WireTy::Option { inner, .. } => {
            let inner = lowered(inner);
            quote!(::rpc::__private::WireOption<#inner, [u8; ::core::mem::size_of::<#inner>()]>)
        }
        WireTy::Result { ok, err, .. } => {
            let ok = lowered(ok);
            let err = lowered(err);
            quote!(::rpc::__private::WireResult<
                #ok,
                #err,
                [u8; ::core::mem::size_of::<#ok>()],
                [u8; ::core::mem::size_of::<#err>()]
            >)
        }
        WireTy::Array { elem, len, .. } => {
            let elem = lowered(elem);
            quote!([#elem; #len])
        }
        WireTy::Var(_) => quote!(::rpc::__private::WireSlice),
    }
}

/// The wire form's text for docs: `WireOption<T'>`, `WireResult<T', E'>` (without the byte
/// storage parameters), `[T'; N]`.
pub(crate) fn doc_lowered(ty: &WireTy) -> TokenStream {
    match ty {
        WireTy::Leaf(t) => quote!(#t),
        WireTy::Option { inner, .. } => {
            let inner = doc_lowered(inner);
            quote!(WireOption<#inner>)
        }
        WireTy::Result { ok, err, .. } => {
            let ok = doc_lowered(ok);
            let err = doc_lowered(err);
            quote!(WireResult<#ok, #err>)
        }
        WireTy::Array { elem, len, .. } => {
            let elem = doc_lowered(elem);
            quote!([#elem; #len])
        }
        WireTy::Var(_) => quote!(WireSlice),
    }
}

fn closure_var(depth: usize) -> Ident {
    format_ident!("__rpc_v{depth}")
}

/// An expression converting `expr` (of the written type) to its wire form.
pub(crate) fn lower_expr(ty: &WireTy, expr: TokenStream, depth: usize) -> TokenStream {
    if ty.is_identity() {
        return expr;
    }
    let v = closure_var(depth);
    let map = |inner: &WireTy, f: TokenStream| -> TokenStream {
        if inner.is_identity() {
            expr.clone()
        } else {
            let body = lower_expr(inner, quote!(#v), depth + 1);
            quote!(#f(#expr, |#v| #body))
        }
    };
    let wire = lowered(ty);
    match ty {
        // Variable-length values are written by `VarWriter`, never lowered in place.
        WireTy::Leaf(_) | WireTy::Var(_) => expr,
        WireTy::Option { inner, .. } => {
            let mapped = map(inner, quote!(::core::option::Option::map));
            quote!(<#wire>::from_option(#mapped))
        }
        WireTy::Result { ok, err, .. } => {
            let mut mapped = map(ok, quote!(::core::result::Result::map));
            if !err.is_identity() {
                let body = lower_expr(err, quote!(#v), depth + 1);
                mapped = quote!(::core::result::Result::map_err(#mapped, |#v| #body));
            }
            quote!(<#wire>::from_result(#mapped))
        }
        WireTy::Array { elem, .. } => {
            let body = lower_expr(elem, quote!(#v), depth + 1);
            quote!(#expr.map(|#v| #body))
        }
    }
}

/// An expression converting `expr` (of the wire type) back to the written type, validating
/// every active `Option`/`Result` side on the way: of type
/// `Result<written type, rpc::__private::InvalidValue>`. Callers handle identity types
/// (nothing to raise or validate) themselves.
pub(crate) fn raise_expr(ty: &WireTy, expr: TokenStream, depth: usize) -> TokenStream {
    let v = closure_var(depth);
    let raise_fn = |inner: &WireTy| -> TokenStream {
        if inner.is_identity() {
            quote!(::core::result::Result::Ok)
        } else {
            let body = raise_expr(inner, quote!(#v), depth + 1);
            quote!(|#v| #body)
        }
    };
    match ty {
        _ if ty.is_identity() => {
            quote!(::core::result::Result::<_, ::rpc::__private::InvalidValue>::Ok(#expr))
        }
        WireTy::Leaf(_) => unreachable!("a leaf is an identity type"),
        // Read by `read_slice`/`read_str`, never raised from a lowered value.
        WireTy::Var(_) => {
            quote!(::core::result::Result::<_, ::rpc::__private::InvalidValue>::Ok(#expr))
        }
        WireTy::Option { inner, .. } if inner.is_identity() => {
            quote!(::rpc::__private::WireOption::try_into_option(#expr))
        }
        WireTy::Option { inner, .. } => {
            let f = raise_fn(inner);
            quote!(::rpc::__private::raise_option(#expr, #f))
        }
        WireTy::Result { ok, err, .. } => {
            let (f_ok, f_err) = (raise_fn(ok), raise_fn(err));
            quote!(::rpc::__private::raise_result(#expr, #f_ok, #f_err))
        }
        WireTy::Array { elem, .. } => {
            let f = raise_fn(elem);
            quote!(::rpc::__private::raise_array(#expr, #f))
        }
    }
}

fn gen_server(svc: &Service, names: &Names) -> TokenStream {
    let Names {
        server,
        service,
        client,
        ..
    } = names;
    let vis = &svc.vis;
    let attrs = &svc.attrs;
    let sep = if attrs.iter().any(|a| a.path().is_ident("doc")) {
        doc("")
    } else {
        quote!()
    };
    let trait_doc = docs(&format!(
        "Server side of the `{name}` RPC service, generated by `#[rpc_service]` from `trait {name}`.\n\
         \n\
         Implement it on your server's state, and answer each decoded request with\n\
         [`{service}::dispatch`] (for example `server.serve_once(|req| {service}::dispatch(&mut state, req))`\n\
         on an `rpc::Server<{service}, _>`). Clients call it through [`{client}`].",
        name = svc.name
    ));
    let methods = svc.methods.iter().map(|m| {
        let attrs = &m.attrs;
        let sig = &m.sig;
        let sep = if m.docs.is_empty() { quote!() } else { doc("") };
        let id = m.id;
        let shouty = &m.shouty;
        let d = doc(format!(
            " Handles RPC method id {id} ([`{service}::{shouty}`]); called by [`{service}::dispatch`]."
        ));
        quote! {
            #(#attrs)*
            #sep
            #d
            #sig;
        }
    });
    quote! {
        #(#attrs)*
        #sep
        #trait_doc
        #vis trait #server {
            #(#methods)*
        }
    }
}

fn gen_args_struct(svc: &Service, names: &Names, m: &Method) -> TokenStream {
    let vis = &svc.vis;
    let args_ident = names.args(svc, m);
    let Names {
        server, service, ..
    } = names;
    let name = &m.name;
    let shouty = &m.shouty;
    let derives = &svc.derives;
    let extra = if derives.is_empty() {
        quote!()
    } else {
        quote!(#[derive(#(#derives),*)])
    };
    let layout = if m.args.is_empty() {
        "Layout: no fields, 0 bytes (the request is the 8-byte header alone).".to_owned()
    } else {
        let fields: Vec<String> = m
            .args
            .iter()
            .map(|a| format!("`{}: {}`", a.name, wire_text(&a.ty)))
            .collect();
        let tagged = if m.args.iter().all(|a| a.ty.is_identity()) {
            ""
        } else {
            "\n`Option`/`Result` arguments are stored as `WireOption`/`WireResult` (a tag byte, then\n\
             the value(s) as bytes, the inactive side zeroed when sent and ignored when received);\n\
             `rpc::Service::decode_request` validates the active sides, and the accessor methods\n\
             return them as written."
        };
        format!(
            "Layout: `#[repr(C, packed)]`: {}, in this order and without padding, so the size is\n\
             the sum of the fields' sizes.{tagged}",
            fields.join(", ")
        )
    };
    let struct_doc = docs(&format!(
        "Wire arguments of RPC method `{name}` ([`{server}::{name}`], method id [`{service}::{shouty}`]):\n\
         the request body sent after the 8-byte message header.\n\
         \n\
         {layout}"
    ));
    let fields = m.args.iter().map(|a| {
        let ident = &a.ident;
        let ty = lowered(&a.ty);
        let written = type_text(a.ty.written());
        let d = if a.ty.is_identity() {
            doc(format!(" Argument `{}: {written}`.", a.name))
        } else {
            doc(format!(
                " Argument `{}: {written}`, in its wire form; [`Self::{}`] returns it as written.",
                a.name, a.name
            ))
        };
        quote! {
            #d
            pub #ident: #ty
        }
    });
    let accessors = m.args.iter().map(|a| {
        let ident = &a.ident;
        let written = a.ty.written();
        // Copy the (packed) struct out first: no reference to a packed field is ever taken.
        let (body, panics) = if a.ty.is_identity() {
            (quote!(__rpc_this.#ident), quote!())
        } else {
            let raised = raise_expr(&a.ty, quote!(__rpc_this.#ident), 0);
            (
                quote! {
                    match #raised {
                        ::core::result::Result::Ok(__rpc_v) => __rpc_v,
                        ::core::result::Result::Err(__rpc_e) => ::rpc::__private::unvalidated_argument(__rpc_e),
                    }
                },
                docs(
                    "\n\
                     # Panics\n\
                     If an active `Option`/`Result` side holds an invalid value, which only a struct\n\
                     cast from bytes by hand can: `rpc::Service::decode_request` rejects such a\n\
                     request (`WireError::BadValue`) before it reaches `dispatch`.",
                ),
            )
        };
        let d = doc(format!(
            " Argument `{}` as written in the trait (`{}`).",
            a.name,
            type_text(written)
        ));
        quote! {
            #d
            #panics
            #[inline]
            pub fn #ident(&self) -> #written {
                let __rpc_this = *self;
                #body
            }
        }
    });
    let accessors_impl = if m.args.is_empty() {
        quote!()
    } else {
        quote! {
            impl #args_ident {
                #(#accessors)*
            }
        }
    };
    quote! {
        #struct_doc
        #[derive(
            ::rpc::__private::zerocopy::TryFromBytes,
            ::rpc::__private::zerocopy::IntoBytes,
            ::rpc::__private::zerocopy::KnownLayout,
            ::rpc::__private::zerocopy::Immutable,
            ::core::clone::Clone,
            ::core::marker::Copy
        )]
        #extra
        #[zerocopy(crate = "::rpc::__private::zerocopy")]
        #[repr(C, packed)]
        #vis struct #args_ident {
            #(#fields,)*
        }
        #accessors_impl
    }
}

/// Text of a type's wire form, for docs.
fn wire_text(ty: &WireTy) -> String {
    crate::parse::normalize_tokens(doc_lowered(ty))
}

fn gen_enums(svc: &Service, names: &Names) -> TokenStream {
    let vis = &svc.vis;
    let Names {
        server,
        service,
        request,
        response,
        client,
        ..
    } = names;
    let name = &svc.name;
    let derives = &svc.derives;
    let extra = if derives.is_empty() {
        quote!()
    } else {
        quote!(#[derive(#(#derives),*)])
    };
    let req_variants = svc.methods.iter().map(|m| {
        let camel = &m.camel;
        let args = names.args(svc, m);
        let d = doc(format!(
            " Call of [`{server}::{}`] (method id [`{service}::{}`] = {}).",
            m.name, m.shouty, m.id
        ));
        quote!(#d #camel(#args))
    });
    let resp_variants = svc.methods.iter().map(|m| {
        let camel = &m.camel;
        let ret = owned_ret_ty(m);
        let d = doc(format!(
            " Return value of [`{server}::{}`] (method id [`{service}::{}`] = {}).",
            m.name, m.shouty, m.id
        ));
        quote!(#d #camel(#ret))
    });
    let ctors = svc.methods.iter().map(|m| {
        let ident = &m.ident;
        let allows = &m.allows;
        let camel = &m.camel;
        let args_ident = names.args(svc, m);
        let params = m.args.iter().map(|a| {
            let i = &a.ident;
            let t = a.ty.written();
            quote!(#i: #t)
        });
        let init = if has_var_args(m) {
            let fields = m.args.iter().map(|a| {
                let i = &a.ident;
                match a.ty.var() {
                    Some(v) => {
                        let o = var_to_owned(v, quote!(#i));
                        quote!(#i: #o)
                    }
                    None => quote!(#i),
                }
            });
            quote!(#args_ident { #(#fields),* })
        } else {
            struct_init(&args_ident, m)
        };
        let d = doc(format!(
            " A request for [`{server}::{}`], with its arguments as written in the trait.",
            m.name
        ));
        quote! {
            #d
            #(#allows)*
            #[inline]
            #[allow(clippy::too_many_arguments)]
            pub fn #ident(#(#params),*) -> Self {
                #request::#camel(#init)
            }
        }
    });
    let req_doc = docs(&format!(
        "A request of the `{name}` service: one variant per method, holding the method's wire\n\
         arguments. `Copy`; build one with the constructor named after the method.\n\
         \n\
         On the wire (`<{service} as rpc::Service>::encode_request`): the 8-byte header\n\
         (method id, status 0, body length), then the argument struct's bytes. Send one with\n\
         [`{client}::issue_request`]; a server gets them from `rpc::Server::recv`."
    ));
    let resp_doc = docs(&format!(
        "A successful response of the `{name}` service: one variant per method, holding its return\n\
         value as written in the trait (`()` when none).\n\
         \n\
         On the wire: the 8-byte header (method id echoed, status 0, body length), then the\n\
         return value's bytes in its wire form (`Option`/`Result` as `WireOption`/`WireResult`,\n\
         whose active side `rpc::Service::decode_response` validates).\n\
         Produced by [`{service}::dispatch`]; delivered to clients with their tag by\n\
         [`{client}::poll`]/[`{client}::poll_with`]."
    ));
    let ctors_impl = if svc.methods.is_empty() {
        quote!()
    } else {
        quote! {
            impl #request {
                #(#ctors)*
            }
        }
    };
    let response_ref = gen_response_ref(svc, names);
    let copy = if svc_variable(svc) {
        quote!()
    } else {
        quote!(, ::core::marker::Copy)
    };
    quote! {
        #req_doc
        #[derive(::core::clone::Clone #copy)]
        #extra
        #vis enum #request {
            #(#req_variants,)*
        }
        #ctors_impl
        #response_ref
        #resp_doc
        #[derive(::core::clone::Clone #copy)]
        #extra
        #vis enum #response {
            #(#resp_variants,)*
        }
    }
}

/// `Args { a: lower(a), b: lower(b) }` from the method's parameters in scope.
fn struct_init(args_ident: &Ident, m: &Method) -> TokenStream {
    let fields = m.args.iter().map(|a| {
        let i = &a.ident;
        if a.ty.is_identity() {
            quote!(#i)
        } else {
            let value = lower_expr(&a.ty, quote!(#i), 0);
            quote!(#i: #value)
        }
    });
    quote!(#args_ident { #(#fields),* })
}

/// `<Trait>Service`: method-id constants, `dispatch`, the raw and variable-length codecs, and
/// the `rpc::Service` implementation (descriptor, encode/decode, lengths). Each part is built
/// by its own function below.
fn gen_service(svc: &Service, names: &Names) -> TokenStream {
    let vis = &svc.vis;
    let Names {
        server,
        service,
        request,
        response,
        ..
    } = names;
    let name = &svc.name;
    let consts = gen_method_ids(svc, names);
    let dispatch_body = gen_dispatch_body(svc, names);
    let method_descs = gen_method_descriptors(svc, names);
    let (req_len, resp_len) = gen_lengths(svc, names);
    let encode_req = gen_encode_request(svc, names);
    let decode_req = gen_decode_request(svc, names);
    let encode_resp = gen_encode_response(svc, names);
    let decode_resp = gen_decode_response(svc, names);
    let req_id = gen_request_method_id(svc, names);
    let dispatch_raw = gen_dispatch_raw(svc, names);
    let var_codec = gen_var_codec(svc, names);
    let svc_doc = docs(&format!(
        "The `{name}` RPC service: method ids, the server-side [`{service}::dispatch`], and the\n\
         `rpc::Service` implementation (wire encoding and decoding of [`{request}`] and\n\
         [`{response}`], and the schema descriptor whose fingerprint clients check when they\n\
         connect). Method ids are declaration indices."
    ));
    let dispatch_doc = docs(&format!(
        "Calls the [`{server}`] method that `req` names on `server`, with the request's arguments\n\
         as written in the trait, and wraps its return value in the matching [`{response}`]\n\
         variant. Use it as the handler of `rpc::Server::serve_once`, or after\n\
         `rpc::Server::recv` to answer later with `rpc::Server::reply`."
    ));
    quote! {
        #svc_doc
        #[derive(::core::clone::Clone, ::core::marker::Copy, ::core::fmt::Debug, ::core::default::Default)]
        #vis struct #service;

        impl #service {
            #consts

            #dispatch_doc
            #[inline]
            pub fn dispatch<__RpcS: #server + ?::core::marker::Sized>(server: &mut __RpcS, req: #request) -> #response {
                #dispatch_body
            }

            #dispatch_raw

            #var_codec
        }

        impl ::rpc::Service for #service {
            type Request = #request;
            type Response = #response;
            const DESCRIPTOR: &'static ::rpc::ServiceDescriptor = {
                const __RPC_METHODS: &[::rpc::MethodDescriptor] = &[#method_descs];
                &::rpc::ServiceDescriptor::new(#name, __RPC_METHODS)
            };

            #[inline]
            fn encode_request(req: &#request, out: &mut [u8]) -> usize {
                #encode_req
            }

            #[inline]
            fn decode_request(msg: &[u8]) -> ::core::result::Result<#request, ::rpc::wire::WireError> {
                #decode_req
            }

            #[inline]
            fn encode_response(resp: &#response, out: &mut [u8]) -> usize {
                #encode_resp
            }

            #[inline]
            fn decode_response(method_id: u16, msg: &[u8]) -> ::core::result::Result<#response, ::rpc::wire::WireError> {
                #decode_resp
            }

            #[inline]
            fn request_method_id(req: &#request) -> u16 {
                #req_id
            }

            #[inline]
            fn request_len(req: &#request) -> usize {
                #req_len
            }

            #[inline]
            fn response_len(resp: &#response) -> usize {
                #resp_len
            }
        }
    }
}

/// The method-id constants of `<Trait>Service` (declaration indices).
fn gen_method_ids(svc: &Service, names: &Names) -> TokenStream {
    let server = &names.server;
    let consts = svc.methods.iter().map(|m| {
        let shouty = &m.shouty;
        let id = m.id;
        let d = doc(format!(
            " Method id of [`{server}::{}`]: its declaration index, {id}.",
            m.name
        ));
        quote!(#d pub const #shouty: u16 = #id;)
    });
    quote!(#(#consts)*)
}

/// The body of `<Trait>Service::dispatch`: one arm per method, calling the server method
/// with the request's arguments as written and wrapping its result.
fn gen_dispatch_body(svc: &Service, names: &Names) -> TokenStream {
    let Names {
        server,
        request,
        response,
        ..
    } = names;
    let dispatch_arms = svc.methods.iter().map(|m| {
        let camel = &m.camel;
        let ident = &m.ident;
        let args_ident = names.args(svc, m);
        let getters: Vec<TokenStream> = m.args.iter().map(|a| {
            let i = &a.ident;
            match a.ty.var() {
                Some(v) => var_view(v, quote!(__rpc_args.#i)),
                None if has_var_args(m) => quote!(__rpc_args.#i),
                None => quote!(#args_ident::#i(&__rpc_args)),
            }
        }).collect();
        if let Some(v) = m.ret.var() {
            let bind = if m.args.is_empty() { quote!(_) } else { quote!(__rpc_args) };
            let owned = var_ret_owned(v, quote!(__rpc_ret));
            return quote! {
                #request::#camel(#bind) => {
                    let __rpc_ret = <__RpcS as #server>::#ident(server #(, #getters)*);
                    #response::#camel(#owned)
                }
            };
        }
        let bind = if m.args.is_empty() {
            quote!(_)
        } else {
            quote!(__rpc_args)
        };
        quote! {
            #request::#camel(#bind) => #response::#camel(<__RpcS as #server>::#ident(server #(, #getters)*))
        }
    });
    if svc.methods.is_empty() {
        quote! {
            let _ = server;
            match req {}
        }
    } else {
        quote! {
            match req {
                #(#dispatch_arms,)*
            }
        }
    }
}

/// The `rpc::MethodDescriptor`s of the service descriptor, comma-separated.
fn gen_method_descriptors(svc: &Service, names: &Names) -> TokenStream {
    let method_descs = svc.methods.iter().map(|m| {
        let id = m.id;
        let mname = &m.name;
        let args_ident = names.args(svc, m);
        let arg_descs = m.args.iter().map(|a| {
            let aname = &a.name;
            let ty = type_text(a.ty.written());
            let lowered = lowered(&a.ty);
            quote! {
                ::rpc::ArgDescriptor {
                    name: #aname,
                    ty: #ty,
                    size: ::core::mem::size_of::<#lowered>(),
                }
            }
        });
        let ret_ty = m.ret_text();
        let ret_lowered = lowered(&m.ret);
        let mv = max_var(svc);
        let (var_request, var_response) = (has_var_args(m), m.ret.var().is_some());
        let aligns: Vec<TokenStream> = m
            .args
            .iter()
            .map(|a| &a.ty)
            .chain(std::iter::once(&m.ret))
            .filter_map(|t| t.var()?.elem.as_ref())
            .map(|e| quote!(::core::mem::align_of::<#e>()))
            .collect();
        let var_align = quote! {{
            let mut __rpc_a = 1usize;
            #(if #aligns > __rpc_a { __rpc_a = #aligns; })*
            __rpc_a
        }};
        let request_bytes = if var_request {
            let wire = wire_ident(svc, m);
            quote!(::rpc::wire::HEADER_BYTES + ::core::mem::size_of::<#wire>() + #mv)
        } else {
            quote!(::rpc::wire::HEADER_BYTES + ::core::mem::size_of::<#args_ident>())
        };
        let response_bytes = if var_response {
            quote!(::rpc::__private::RESPONSE_DATA_START + #mv)
        } else {
            quote!(::rpc::wire::HEADER_BYTES + ::core::mem::size_of::<#ret_lowered>())
        };
        quote! {
            ::rpc::MethodDescriptor {
                id: #id,
                name: #mname,
                args: &[#(#arg_descs),*],
                ret_ty: #ret_ty,
                ret_size: ::core::mem::size_of::<#ret_lowered>(),
                request_bytes: #request_bytes,
                response_bytes: #response_bytes,
                var_request: #var_request,
                var_response: #var_response,
                var_align: #var_align,
            }
        }
    });

    quote!(#(#method_descs),*)
}

/// The bodies of `request_len` and `response_len`: the encoded length of each variant.
fn gen_lengths(svc: &Service, names: &Names) -> (TokenStream, TokenStream) {
    let Names {
        service,
        request,
        response,
        ..
    } = names;
    if svc.methods.is_empty() {
        (quote!(match *req {}), quote!(match *resp {}))
    } else {
        let req_len = svc.methods.iter().map(|m| {
            let camel = &m.camel;
            if has_var_args(m) {
                let f = fn_ident(m, "req_len");
                let vals = m.args.iter().map(|a| {
                    let i = &a.ident;
                    match a.ty.var() {
                        Some(v) => var_view(v, quote!(__rpc_args.#i)),
                        None => quote!(__rpc_args.#i),
                    }
                });
                quote!(#request::#camel(__rpc_args) => #service::#f(#(#vals),*))
            } else {
                let args_ident = names.args(svc, m);
                quote!(#request::#camel(_) => ::rpc::wire::HEADER_BYTES + ::core::mem::size_of::<#args_ident>())
            }
        });
        let resp_len = svc.methods.iter().map(|m| {
            let camel = &m.camel;
            match m.ret.var() {
                Some(v) => {
                    let f = fn_ident(m, "resp_len");
                    let view = var_view(v, quote!(*__rpc_ret));
                    quote!(#response::#camel(__rpc_ret) => #service::#f(#view))
                }
                None => {
                    let lowered = lowered(&m.ret);
                    quote!(#response::#camel(_) => ::rpc::wire::HEADER_BYTES + ::core::mem::size_of::<#lowered>())
                }
            }
        });
        (
            quote!(match req { #(#req_len,)* }),
            quote!(match resp { #(#resp_len,)* }),
        )
    }
}

/// The body of `encode_request`: one arm per method.
fn gen_encode_request(svc: &Service, names: &Names) -> TokenStream {
    let Names {
        service, request, ..
    } = names;
    if svc.methods.is_empty() {
        return quote!(match *req {});
    }
    let encode_req = svc.methods.iter().map(|m| {
        let camel = &m.camel;
        let shouty = &m.shouty;
        if has_var_args(m) {
            let f = fn_ident(m, "req_write");
            let vals = m.args.iter().map(|a| {
                let i = &a.ident;
                match a.ty.var() {
                    Some(v) => var_view(v, quote!(__rpc_args.#i)),
                    None => quote!(__rpc_args.#i),
                }
            });
            return quote!(#request::#camel(__rpc_args) => #service::#f(out #(, #vals)*));
        }
        quote!(#request::#camel(__rpc_args) => ::rpc::__private::encode(#service::#shouty, 0, __rpc_args, out))
    });
    quote! {
        match req {
            #(#encode_req,)*
        }
    }
}

/// The body of `decode_request`: read the header, then one arm per method id; an unknown id is
/// `WireError::UnknownMethod`.
fn gen_decode_request(svc: &Service, names: &Names) -> TokenStream {
    let Names {
        service, request, ..
    } = names;
    if svc.methods.is_empty() {
        return quote! {
            let __rpc_hdr = ::rpc::__private::read_request_header(msg)?;
            ::core::result::Result::Err(::rpc::wire::WireError::UnknownMethod(__rpc_hdr.method_id))
        };
    }
    let decode_req = svc.methods.iter().map(|m| {
        let camel = &m.camel;
        let id = m.id;
        let args_ident = names.args(svc, m);
        if has_var_args(m) {
            let f = fn_ident(m, "req_read");
            let locals: Vec<Ident> = m.args.iter().map(local).collect();
            let fields = m.args.iter().map(|a| {
                let i = &a.ident;
                let l = local(a);
                match a.ty.var() {
                    Some(v) => {
                        let o = var_to_owned(v, quote!(#l));
                        quote!(#i: #o)
                    }
                    None => quote!(#i: #l),
                }
            });
            return quote! {
                #id => {
                    let (#(#locals,)*) = #service::#f(__rpc_hdr, msg)?;
                    ::core::result::Result::Ok(#request::#camel(#args_ident { #(#fields),* }))
                }
            };
        }
        // The cast validates every byte except the `Option`/`Result` sides, which are
        // validated here, when active.
        let check = option_checks(m.args.iter(), quote!(__rpc_args), id);
        if check.is_empty() {
            quote! {
                #id => ::core::result::Result::Ok(#request::#camel(
                    ::rpc::__private::decode_body::<#args_ident>(__rpc_hdr, msg)?,
                ))
            }
        } else {
            quote! {
                #id => {
                    let __rpc_args = ::rpc::__private::decode_body::<#args_ident>(__rpc_hdr, msg)?;
                    #check
                    ::core::result::Result::Ok(#request::#camel(__rpc_args))
                }
            }
        }
    });
    quote! {
        let __rpc_hdr = ::rpc::__private::read_request_header(msg)?;
        match __rpc_hdr.method_id {
            #(#decode_req,)*
            __rpc_id => ::core::result::Result::Err(::rpc::wire::WireError::UnknownMethod(__rpc_id)),
        }
    }
}

/// The body of `encode_response`: one arm per method.
fn gen_encode_response(svc: &Service, names: &Names) -> TokenStream {
    let Names {
        service, response, ..
    } = names;
    if svc.methods.is_empty() {
        return quote!(match *resp {});
    }
    let encode_resp = svc.methods.iter().map(|m| {
        let camel = &m.camel;
        let shouty = &m.shouty;
        if let Some(v) = m.ret.var() {
            let f = fn_ident(m, "resp_write");
            let view = var_view(v, quote!(*__rpc_ret));
            return quote!(#response::#camel(__rpc_ret) => #service::#f(out, #view));
        }
        let value = lower_expr(&m.ret, quote!(__rpc_ret), 0);
        quote! {
            #response::#camel(__rpc_ret) => {
                let __rpc_ret = *__rpc_ret;
                ::rpc::__private::encode(#service::#shouty, 0, &#value, out)
            }
        }
    });
    quote! {
        match resp {
            #(#encode_resp,)*
        }
    }
}

/// The body of `decode_response`: one arm per method id; an unknown id is
/// `WireError::UnknownMethod`.
fn gen_decode_response(svc: &Service, names: &Names) -> TokenStream {
    let Names {
        service, response, ..
    } = names;
    if svc.methods.is_empty() {
        return quote!(::core::result::Result::Err(
            ::rpc::wire::WireError::UnknownMethod(method_id)
        ));
    }
    let decode_resp = svc.methods.iter().map(|m| {
        let camel = &m.camel;
        let id = m.id;
        if let Some(v) = m.ret.var() {
            let f = fn_ident(m, "resp_read");
            let owned = var_to_owned(v, quote!(#service::#f(msg)?));
            return quote!(#id => ::core::result::Result::Ok(#response::#camel(#owned)));
        }
        fixed_response_arm(m, quote!(#response::#camel))
    });
    quote! {
        match method_id {
            #(#decode_resp,)*
            __rpc_id => ::core::result::Result::Err(::rpc::wire::WireError::UnknownMethod(__rpc_id)),
        }
    }
}

/// The body of `request_method_id`: one arm per variant.
fn gen_request_method_id(svc: &Service, names: &Names) -> TokenStream {
    let Names {
        service, request, ..
    } = names;
    if svc.methods.is_empty() {
        return quote!(match *req {});
    }
    let req_id = svc.methods.iter().map(|m| {
        let camel = &m.camel;
        let shouty = &m.shouty;
        quote!(#request::#camel(_) => #service::#shouty)
    });
    quote! {
        match req {
            #(#req_id,)*
        }
    }
}

/// `<Trait>Client` (blocking stubs and the client API), `<Trait>Issue` (pipelined stubs) and
/// `<Trait>WithDeadline` (blocking stubs with their own deadline).
fn gen_client(svc: &Service, names: &Names) -> TokenStream {
    let client_type = gen_client_type(svc, names);
    let issue_type = gen_issue_type(svc, names);
    let with_deadline_type = gen_with_deadline_type(svc, names);
    quote!(#client_type #issue_type #with_deadline_type)
}

/// `<Trait>Client`: connect, the blocking stubs, and the client API over `rpc::Client`.
fn gen_client_type(svc: &Service, names: &Names) -> TokenStream {
    let vis = &svc.vis;
    let Names {
        service,
        client,
        issue,
        with_deadline,
        request,
        response,
        ..
    } = names;
    let name = &svc.name;
    let transport = &svc.transport.ty;
    let transport_written = &svc.transport.written;
    let transport_path = &svc.transport.doc_path;
    // The bound carries the path's span: a default that does not implement the trait is
    // reported on the path the user wrote.
    let transport_bound = quote_spanned!(svc.transport.span=> ::rpc::ClientTransport);

    let blocking = svc
        .methods
        .iter()
        .map(|m| gen_blocking_stub(svc, names, m, false));
    let client_doc = docs(&format!(
        "Client of the `{name}` RPC service over transport `T` (default\n\
         [`{transport_path}`], from `#[rpc_service(transport = {transport_written})]`; name\n\
         another `rpc::ClientTransport` to run the same service over it).\n\
         \n\
         Every method has a blocking form, `client.method(args)?`, which sends the request and\n\
         waits for its response, and a pipelined form, `client.issue(tag).method(args)?`, whose\n\
         response is delivered later, with its `tag`, by [`{client}::poll`] or\n\
         [`{client}::poll_with`]. Both may be mixed; up to [`{client}::max_in_flight`] calls can\n\
         be in flight. Every call has a deadline (1 s unless [`{client}::set_default_deadline`],\n\
         [`{client}::with_deadline`] or [`{issue}::with_deadline`] says otherwise) and ends with\n\
         `RpcError::DeadlineExceeded` if it passes first."
    ));
    let connect_doc = docs(&format!(
        "Connects to a `{name}` server at `addr` (the transport's `ClientTransport::Addr`: see\n\
         the transport's docs), checking this build's schema fingerprint and message sizes\n\
         against the server's.\n\
         \n\
         # Errors\n\
         `RpcError::SchemaMismatch` if the server was built from a different `{name}` trait;\n\
         `RpcError::CapacityMismatch`; and the transport's own setup errors\n\
         (`RpcError::Transport`)."
    ));
    let from_transport_doc = docs(&format!(
        "Wraps a transport already connected to a `{name}` server, e.g. one built from endpoint\n\
         information exchanged by an MPI bootstrap (through the transport's own constructor).\n\
         The transport's constructor must have checked this service's schema fingerprint and\n\
         message sizes, as [`Self::connect`] does."
    ));
    let issue_fn_doc = docs(&format!(
        "Starts a pipelined call tagged `tag`: call one method on the returned [`{issue}`], e.g.\n\
         `client.issue(tag).method(args)?`. The response arrives later through\n\
         [`{client}::poll`] or [`{client}::poll_with`] with the same `tag`."
    ));
    let issue_request_doc = docs(&format!(
        "Pipelined call of a whole [`{request}`] value, tagged `tag`; the response arrives through\n\
         [`{client}::poll`]/[`{client}::poll_with`].\n\
         \n\
         # Errors\n\
         `RpcError::WouldBlock` when [`{client}::max_in_flight`] calls are in flight (nothing was\n\
         sent: poll, then issue again); `RpcError::ServerDisconnected`."
    ));
    let poll_doc = docs(
        "Returns one completed pipelined call as `(tag, response)`, or `None` if none has\n\
         completed yet. Never blocks.\n\
         \n\
         # Errors\n\
         `RpcError::BadRequest`/`RpcError::BadResponse` for a call that failed (its tag is in the\n\
         error; the call is consumed); `RpcError::ServerDisconnected`.",
    );
    let poll_ref = gen_poll_ref(svc, names);
    let poll_with_doc = docs(
        "Delivers every completed pipelined call to `f(tag, result)` and returns how many.\n\
         Never blocks; cheaper than [`Self::poll`] when many calls complete at once.\n\
         \n\
         # Errors\n\
         `RpcError::ServerDisconnected` (failures of single calls go to `f`).",
    );
    quote! {
        #client_doc
        #vis struct #client<__RpcT: #transport_bound = #transport> {
            inner: ::rpc::Client<#service, __RpcT>,
        }

        impl<__RpcT: ::rpc::ClientTransport> #client<__RpcT> {
            #connect_doc
            pub fn connect(addr: &<__RpcT as ::rpc::ClientTransport>::Addr) -> ::core::result::Result<Self, ::rpc::RpcError> {
                ::core::result::Result::Ok(Self {
                    inner: ::rpc::Client::connect(addr)?,
                })
            }

            #from_transport_doc
            pub fn from_transport(transport: __RpcT) -> Self {
                Self {
                    inner: ::rpc::Client::from_transport(transport),
                }
            }

            #(#blocking)*

            /// Blocking calls with their own deadline: `client.with_deadline(d).method(args)?`
            /// waits at most `timeout` for the response, then fails with
            /// `RpcError::DeadlineExceeded` (a response arriving later is dropped and counted).
            #[inline]
            pub fn with_deadline(&mut self, timeout: ::core::time::Duration) -> #with_deadline<'_, __RpcT> {
                #with_deadline {
                    client: &mut self.inner,
                    timeout,
                }
            }

            /// Sets the deadline of later calls that do not set their own (default
            /// `rpc::client::DEFAULT_DEADLINE`, 1 s).
            #[inline]
            pub fn set_default_deadline(&mut self, timeout: ::core::time::Duration) {
                self.inner.set_default_deadline(timeout)
            }

            /// The deadline of calls that do not set their own.
            #[inline]
            pub fn default_deadline(&self) -> ::core::time::Duration {
                self.inner.default_deadline()
            }

            /// Counters: calls that expired, and late or stray responses that were dropped.
            #[inline]
            pub fn stats(&self) -> ::rpc::client::ClientStats {
                self.inner.stats()
            }

            /// Expired calls whose transport token is still held until their late response
            /// arrives (`rpc::Client` docs, "Deadlines").
            #[inline]
            pub fn zombies(&self) -> usize {
                self.inner.zombies()
            }

            #issue_fn_doc
            #[inline]
            pub fn issue(&mut self, tag: u64) -> #issue<'_, __RpcT> {
                let timeout = self.inner.default_deadline();
                #issue {
                    client: &mut self.inner,
                    tag,
                    timeout,
                }
            }

            #issue_request_doc
            #[inline]
            pub fn issue_request(&mut self, tag: u64, req: &#request) -> ::core::result::Result<(), ::rpc::RpcError> {
                self.inner.issue_request(tag, req)
            }

            #poll_doc
            #[inline]
            pub fn poll(&mut self) -> ::core::result::Result<::core::option::Option<(u64, #response)>, ::rpc::RpcError> {
                self.inner.poll()
            }

            #poll_with_doc
            #[inline]
            pub fn poll_with(
                &mut self,
                f: impl ::core::ops::FnMut(u64, ::core::result::Result<#response, ::rpc::RpcError>),
            ) -> ::core::result::Result<usize, ::rpc::RpcError> {
                self.inner.poll_with(f)
            }

            #poll_ref

            /// Calls issued and not yet delivered by [`Self::poll`]/[`Self::poll_with`]
            /// (including completions received and waiting to be polled).
            #[inline]
            pub fn in_flight(&self) -> usize {
                self.inner.in_flight()
            }

            /// Most calls that can be in flight at once.
            #[inline]
            pub fn max_in_flight(&self) -> usize {
                self.inner.max_in_flight()
            }

            /// The transport.
            #[inline]
            pub fn transport(&self) -> &__RpcT {
                self.inner.transport()
            }

            /// The transport, mutably.
            #[inline]
            pub fn transport_mut(&mut self) -> &mut __RpcT {
                self.inner.transport_mut()
            }

            /// The untyped client core (`rpc::Client`): counters, the limits of each method.
            #[inline]
            pub fn core(&self) -> &::rpc::Client<#service, __RpcT> {
                &self.inner
            }

            /// The untyped client core (`rpc::Client`), for calls the stubs do not make,
            /// e.g. a raw message with `rpc::Client::call_raw_within`.
            #[inline]
            pub fn core_mut(&mut self) -> &mut ::rpc::Client<#service, __RpcT> {
                &mut self.inner
            }
        }
    }
}

/// `<Trait>Issue`: a pipelined call about to be sent with a tag, and its stubs.
fn gen_issue_type(svc: &Service, names: &Names) -> TokenStream {
    let vis = &svc.vis;
    let Names {
        service,
        client,
        issue,
        ..
    } = names;
    let name = &svc.name;
    let issue_doc = docs(&format!(
        "A pipelined call of the `{name}` service about to be issued with a tag: returned by\n\
         [`{client}::issue`]. Call exactly one method on it, e.g. `client.issue(tag).method(args)?`;\n\
         the response arrives through [`{client}::poll`]/[`{client}::poll_with`] with that tag."
    ));
    let pipelined = svc
        .methods
        .iter()
        .map(|m| gen_pipelined_stub(svc, names, m));
    quote! {
        #issue_doc
        #[must_use = "a pipelined call is sent only when one of its methods is called"]
        #vis struct #issue<'__rpc_a, __RpcT: ::rpc::ClientTransport> {
            client: &'__rpc_a mut ::rpc::Client<#service, __RpcT>,
            tag: u64,
            timeout: ::core::time::Duration,
        }

        impl<'__rpc_a, __RpcT: ::rpc::ClientTransport> #issue<'__rpc_a, __RpcT> {
            /// Gives this call its own deadline, `timeout` from when it is sent (instead of
            /// the client's default): `client.issue(tag).with_deadline(d).method(args)?`.
            #[inline]
            pub fn with_deadline(mut self, timeout: ::core::time::Duration) -> Self {
                self.timeout = timeout;
                self
            }

            #(#pipelined)*
        }
    }
}

/// `<Trait>WithDeadline`: blocking stubs with their own deadline.
fn gen_with_deadline_type(svc: &Service, names: &Names) -> TokenStream {
    let vis = &svc.vis;
    let Names {
        service,
        client,
        with_deadline,
        ..
    } = names;
    let name = &svc.name;
    let with_deadline_doc = docs(&format!(
        "Blocking calls of the `{name}` service with their own deadline: returned by\n\
         [`{client}::with_deadline`]. Call one method on it, e.g.\n\
         `client.with_deadline(Duration::from_millis(5)).method(args)?`."
    ));
    let blocking_within = svc
        .methods
        .iter()
        .map(|m| gen_blocking_stub(svc, names, m, true));
    quote! {
        #with_deadline_doc
        #[must_use = "a call is sent only when one of its methods is called"]
        #vis struct #with_deadline<'__rpc_a, __RpcT: ::rpc::ClientTransport> {
            client: &'__rpc_a mut ::rpc::Client<#service, __RpcT>,
            timeout: ::core::time::Duration,
        }

        impl<'__rpc_a, __RpcT: ::rpc::ClientTransport> #with_deadline<'__rpc_a, __RpcT> {
            #(#blocking_within)*
        }
    }
}

/// The blocking stub of method `m` on `<Trait>Client` (`within == false`: the client's default
/// deadline; also emits the lending `<name>_with` stub) or on `<Trait>WithDeadline`
/// (`within == true`: its own deadline).
fn gen_blocking_stub(svc: &Service, names: &Names, m: &Method, within: bool) -> TokenStream {
    let Names {
        server,
        service,
        client,
        ..
    } = names;
    let ident = &m.ident;
    let allows = &m.allows;
    let args_ident = names.args(svc, m);
    let shouty = &m.shouty;
    let params = m.args.iter().map(|a| {
        let i = &a.ident;
        let t = a.ty.written();
        quote!(#i: #t)
    });
    let init = struct_init(&args_ident, m);
    let ret = owned_ret_ty(m);
    let lowered_ret = lowered(&m.ret);
    let var_body = is_var(m).then(|| var_call(svc, names, m, within, None));
    let call = if within {
        quote!(self.client.call_within::<#args_ident, #lowered_ret>(self.timeout, #service::#shouty, &#init))
    } else {
        quote!(self.inner.call::<#args_ident, #lowered_ret>(#service::#shouty, &#init))
    };
    let body = if let Some(b) = var_body {
        b
    } else if m.ret.is_identity() {
        call
    } else {
        // An invalid active `Option`/`Result` side is a bad response, like any other
        // undecodable one.
        let raised = raise_expr(&m.ret, quote!(__rpc_ret), 0);
        let mname = &m.name;
        quote! {
            match #call {
                ::core::result::Result::Ok(__rpc_ret) => match #raised {
                    ::core::result::Result::Ok(__rpc_v) => ::core::result::Result::Ok(__rpc_v),
                    ::core::result::Result::Err(_) => ::core::result::Result::Err(
                        ::rpc::__private::bad_response_value(#mname, #service::#shouty),
                    ),
                },
                ::core::result::Result::Err(__rpc_e) => ::core::result::Result::Err(__rpc_e),
            }
        }
    };
    let user_docs = &m.docs;
    let sep = if user_docs.is_empty() {
        quote!()
    } else {
        doc("")
    };
    let within_doc = if within {
        "the timeout given to [`{client}::with_deadline`]"
    } else {
        "the client's default deadline ([`{client}::set_default_deadline`]; 1 s unless changed)"
    }
    .replace("{client}", &client.to_string());
    let d = docs(&format!(
        "Blocking call of [`{server}::{}`]: sends a [`{args_ident}`] request (method id\n\
         [`{service}::{shouty}`]) and waits for the response, at most {within_doc}.\n\
         Responses of pipelined calls that arrive meanwhile are kept for [`{client}::poll`].\n\
         \n\
         # Errors\n\
         `RpcError::DeadlineExceeded` if the deadline passes first;\n\
         `RpcError::ServerDisconnected` if the server is gone; `RpcError::BadRequest` if the\n\
         server rejected the request; `RpcError::BadResponse` if the response does not decode.",
        m.name
    ));
    let params: Vec<TokenStream> = params.collect();
    let with_fn = if within {
        quote!()
    } else {
        gen_lending_stub(svc, names, m, &params)
    };
    quote! {
        #(#user_docs)*
        #sep
        #d
        #(#allows)*
        #[inline]
        #[allow(clippy::too_many_arguments)]
        pub fn #ident(&mut self #(, #params)*) -> ::core::result::Result<#ret, ::rpc::RpcError> {
            #body
        }

        #with_fn
    }
}

/// The lending stub `<name>_with` of a method with a variable-length result: `f` gets the
/// result borrowed from the receive buffer. Empty for other methods.
fn gen_lending_stub(
    svc: &Service,
    names: &Names,
    m: &Method,
    params: &[TokenStream],
) -> TokenStream {
    let server = &names.server;
    let allows = &m.allows;
    let Some(v) = m.ret.var() else {
        return quote!();
    };
    let with_ident = format_ident!("{}_with", m.name);
    let view_ty = var_view_ty(v);
    let body = var_call(svc, names, m, false, Some(quote!(__rpc_f)));
    let d = docs(&format!(
        "Blocking call of [`{server}::{}`] that lends the result: `f` gets it borrowed\n\
         from the transport's receive buffer (no copy), and its value is returned. Otherwise\n\
         as [`Self::{}`].\n\
         \n\
         # Errors\n\
         As [`Self::{}`].",
        m.name, m.name, m.name
    ));
    quote! {
        #d
        #(#allows)*
        #[inline]
        #[allow(clippy::too_many_arguments)]
        pub fn #with_ident<__RpcR>(&mut self #(, #params)*, __rpc_f: impl ::core::ops::FnOnce(#view_ty) -> __RpcR) -> ::core::result::Result<__RpcR, ::rpc::RpcError> {
            #body
        }
    }
}

/// The pipelined stub of method `m` on `<Trait>Issue`: sends without waiting.
fn gen_pipelined_stub(svc: &Service, names: &Names, m: &Method) -> TokenStream {
    let Names {
        server,
        service,
        client,
        issue,
        response,
        ..
    } = names;
    let ident = &m.ident;
    let allows = &m.allows;
    let camel = &m.camel;
    let args_ident = names.args(svc, m);
    let shouty = &m.shouty;
    let params = m.args.iter().map(|a| {
        let i = &a.ident;
        let t = a.ty.written();
        quote!(#i: #t)
    });
    let init = struct_init(&args_ident, m);
    let issue_body = if has_var_args(m) {
        let (len_fn, write_fn) = (fn_ident(m, "req_len"), fn_ident(m, "req_write"));
        let idents: Vec<&Ident> = m.args.iter().map(|a| &a.ident).collect();
        quote! {
            let __rpc_len = #service::#len_fn(#(#idents),*);
            self.client.issue_raw_within(self.tag, self.timeout, #service::#shouty, __rpc_len, |__rpc_out| {
                #service::#write_fn(__rpc_out #(, #idents)*)
            })
        }
    } else {
        quote!(self.client.issue_within(self.tag, self.timeout, #service::#shouty, &#init))
    };
    let user_docs = &m.docs;
    let sep = if user_docs.is_empty() {
        quote!()
    } else {
        doc("")
    };
    let d = docs(&format!(
        "Pipelined call of [`{server}::{}`]: sends a [`{args_ident}`] request (method id\n\
         [`{service}::{shouty}`]) without waiting. Its response arrives later through\n\
         [`{client}::poll`] or [`{client}::poll_with`] as `(tag, {response}::{camel}(..))`, with\n\
         the tag given to [`{client}::issue`], or as `RpcError::DeadlineExceeded` with that tag\n\
         once its deadline passes ([`{issue}::with_deadline`], else the client's default).\n\
         \n\
         # Errors\n\
         `RpcError::WouldBlock` when [`{client}::max_in_flight`] calls are in flight (nothing\n\
         was sent: poll, then issue again); `RpcError::ServerDisconnected`.",
        m.name
    ));
    quote! {
        #(#user_docs)*
        #sep
        #d
        #(#allows)*
        #[inline]
        #[allow(clippy::too_many_arguments)]
        pub fn #ident(self #(, #params)*) -> ::core::result::Result<(), ::rpc::RpcError> {
            #issue_body
        }
    }
}

/// Compile-time checks, one per leaf type and required trait, each spanned at the type as
/// written so that an error points at it and names the type and the missing trait (see
/// `rpc_runtime::macro_support`).
fn gen_checks(svc: &Service) -> TokenStream {
    // One check per distinct (type, trait): a type used twice is checked (and reported) at
    // its first use. Primitive types always pass and are skipped.
    let mut seen: Vec<(String, &str)> = Vec::new();
    let mut checks = Vec::new();
    let mut check_leaf = |ty: &Type| {
        let text = type_text(ty);
        if is_primitive(&text) {
            return;
        }
        let span = ty.span();
        let traits = [
            "AssertIntoBytes",
            "AssertTryFromBytes",
            "AssertKnownLayout",
            "AssertImmutable",
            "AssertCopy",
        ];
        for check in &traits {
            if !seen.iter().any(|(t, c)| *t == text && c == check) {
                seen.push((text.clone(), check));
                checks.push(check_type(span, check, ty));
            }
        }
    };
    for m in &svc.methods {
        for a in &m.args {
            a.ty.for_each_leaf(&mut check_leaf);
        }
        if m.ret_written {
            m.ret.for_each_leaf(&mut check_leaf);
        }
    }
    if checks.is_empty() {
        return quote!();
    }
    quote! {
        const _: () = {
            #[allow(dead_code)]
            struct __RpcChecks(#(#checks),*);
        };
    }
}

/// Types that implement every required trait: integers, floats, `bool`, `char`, `()`.
fn is_primitive(text: &str) -> bool {
    matches!(
        text,
        "u8" | "u16"
            | "u32"
            | "u64"
            | "u128"
            | "usize"
            | "i8"
            | "i16"
            | "i32"
            | "i64"
            | "i128"
            | "isize"
            | "f32"
            | "f64"
            | "bool"
            | "char"
            | "()"
    )
}

fn check_type(span: Span, check: &str, ty: &Type) -> TokenStream {
    let check = Ident::new(check, span);
    quote_spanned! {span=>
        ::rpc::__private::#check<#ty>
    }
}

// ---------------------------------------------------------------------------------------
// Variable-length arguments and results (`rpc::varlen`).
// ---------------------------------------------------------------------------------------

use crate::parse::VarTy;
use crate::validate::Arg;

/// The method has a variable-length argument (its request struct owns its data, and a
/// hidden wire struct carries `WireSlice`s).
fn has_var_args(m: &Method) -> bool {
    m.args.iter().any(|a| a.ty.var().is_some())
}

/// The method's request or response is of variable length.
fn is_var(m: &Method) -> bool {
    has_var_args(m) || m.ret.var().is_some()
}

/// Some method of the service is of variable length (its enums are then not `Copy`).
fn svc_variable(svc: &Service) -> bool {
    svc.methods.iter().any(is_var)
}

/// The fixed part of a variable-length request: `__Rpc<Trait><Method>Wire`.
fn wire_ident(svc: &Service, m: &Method) -> Ident {
    format_ident!("__Rpc{}{}Wire", svc.name, m.camel)
}

/// `max_var_bytes` of the service, as an expression.
fn max_var(svc: &Service) -> TokenStream {
    match &svc.max_var_bytes {
        Some(n) => quote!((#n as usize)),
        None => quote!(::rpc::varlen::DEFAULT_MAX_VAR_BYTES),
    }
}

/// Element type: `u8` for a string.
fn var_elem(v: &VarTy) -> TokenStream {
    match &v.elem {
        Some(t) => quote!(#t),
        None => quote!(u8),
    }
}

/// The unsized view target: `str` or `[T]`.
fn var_unsized(v: &VarTy) -> TokenStream {
    match &v.elem {
        Some(t) => quote!([#t]),
        None => quote!(str),
    }
}

/// The owned type (`String`, `Vec<T>`, optionally in an `Option`).
fn var_owned_ty(v: &VarTy) -> TokenStream {
    let t = match &v.elem {
        Some(t) => quote!(::std::vec::Vec<#t>),
        None => quote!(::std::string::String),
    };
    if v.optional {
        quote!(::core::option::Option<#t>)
    } else {
        t
    }
}

/// The borrowed view type (`&str`, `&[T]`, optionally in an `Option`).
fn var_view_ty(v: &VarTy) -> TokenStream {
    let u = var_unsized(v);
    if v.optional {
        quote!(::core::option::Option<&#u>)
    } else {
        quote!(&#u)
    }
}

/// `expr` (any of the owned, borrowed or written forms) as its view.
fn var_view(v: &VarTy, expr: TokenStream) -> TokenStream {
    let u = var_unsized(v);
    if v.optional {
        quote!(::core::option::Option::map(
            ::core::option::Option::as_ref(&#expr),
            |__rpc_v| ::core::convert::AsRef::<#u>::as_ref(__rpc_v)
        ))
    } else {
        quote!(::core::convert::AsRef::<#u>::as_ref(&#expr))
    }
}

/// A view as its elements (`&[E]`, or `Option<&[E]>`): strings as their bytes.
fn var_elems(v: &VarTy, view: TokenStream) -> TokenStream {
    match (&v.elem, v.optional) {
        (Some(_), _) => view,
        (None, false) => quote!(::core::primitive::str::as_bytes(#view)),
        (None, true) => {
            quote!(::core::option::Option::map(#view, ::core::primitive::str::as_bytes))
        }
    }
}

/// The message length after appending the value `view` at `end`.
fn var_len(v: &VarTy, end: TokenStream, view: TokenStream) -> TokenStream {
    let e = var_elem(v);
    let elems = var_elems(v, view);
    if v.optional {
        quote!(::rpc::__private::var_end_opt::<#e>(#end, #elems))
    } else {
        quote!(::rpc::__private::var_end::<#e>(#end, <[#e]>::len(#elems)))
    }
}

/// Writes the value `view` with the `VarWriter` `w`; evaluates to its `WireSlice`.
fn var_put(v: &VarTy, w: &Ident, view: TokenStream) -> TokenStream {
    let e = var_elem(v);
    let elems = var_elems(v, view);
    if v.optional {
        quote!(#w.put_opt::<#e>(#elems))
    } else {
        quote!(#w.put::<#e>(#elems))
    }
}

/// Reads a value: `Result<view, WireError>`.
fn var_read(
    v: &VarTy,
    msg: TokenStream,
    start: TokenStream,
    s: TokenStream,
    id: u16,
) -> TokenStream {
    match (&v.elem, v.optional) {
        (Some(t), false) => quote!(::rpc::__private::read_slice::<#t>(#msg, #start, #s, #id)),
        (Some(t), true) => quote!(::rpc::__private::read_opt_slice::<#t>(#msg, #start, #s, #id)),
        (None, false) => quote!(::rpc::__private::read_str(#msg, #start, #s, #id)),
        (None, true) => quote!(::rpc::__private::read_opt_str(#msg, #start, #s, #id)),
    }
}

/// A view as the owned type (one copy).
fn var_to_owned(v: &VarTy, view: TokenStream) -> TokenStream {
    let f = match &v.elem {
        Some(t) => quote!(<[#t]>::to_vec),
        None => quote!(::std::string::String::from),
    };
    if v.optional {
        quote!(::core::option::Option::map(#view, #f))
    } else {
        quote!(#f(#view))
    }
}

/// A handler's return value (as written) as the owned type: moved if written owned.
fn var_ret_owned(v: &VarTy, expr: TokenStream) -> TokenStream {
    if v.owned {
        expr
    } else {
        var_to_owned(v, var_view(v, expr))
    }
}

/// Local name of an argument in generated bodies (never shadows `server`, `msg`, `out`).
fn local(a: &Arg) -> Ident {
    format_ident!("__rpc_a_{}", a.name)
}

fn fn_ident(m: &Method, what: &str) -> Ident {
    format_ident!("__rpc_{}_{}", m.name, what)
}

/// The type of an argument in the request's owned struct (variable-length: owned).
fn owned_arg_ty(a: &Arg) -> TokenStream {
    match a.ty.var() {
        Some(v) => var_owned_ty(v),
        None => {
            let t = a.ty.written();
            quote!(#t)
        }
    }
}

/// The type of a method's value in the response enum and the client's blocking result.
fn owned_ret_ty(m: &Method) -> TokenStream {
    match m.ret.var() {
        Some(v) => var_owned_ty(v),
        None => ret_type(m),
    }
}

/// The owned request struct of a variable-length method, and its hidden wire struct.
fn gen_var_args_struct(svc: &Service, names: &Names, m: &Method) -> TokenStream {
    let vis = &svc.vis;
    let args_ident = names.args(svc, m);
    let Names {
        server, service, ..
    } = names;
    let name = &m.name;
    let shouty = &m.shouty;
    let derives = &svc.derives;
    let extra = if derives.is_empty() {
        quote!()
    } else {
        quote!(#[derive(#(#derives),*)])
    };
    let fields = m.args.iter().map(|a| {
        let ident = &a.ident;
        let ty = owned_arg_ty(a);
        let d = doc(format!(
            " Argument `{}: {}`{}.",
            a.name,
            type_text(a.ty.written()),
            if a.ty.var().is_some() { ", owned" } else { "" }
        ));
        quote!(#d pub #ident: #ty)
    });
    let d = docs(&format!(
        "Arguments of RPC method `{name}` ([`{server}::{name}`], method id [`{service}::{shouty}`]),\n\
         owned: variable-length ones as `String`/`Vec<T>`. Held by the request enum (built by\n\
         `rpc::Service::decode_request` for deferred replies: one copy of each value).\n\
         Client stubs and `{service}::dispatch_raw` do not use it: they write and read the\n\
         message in place (`rpc::varlen`)."
    ));
    let wire = wire_ident(svc, m);
    let wire_fields = m.args.iter().map(|a| {
        let ident = &a.ident;
        let ty = lowered(&a.ty);
        quote!(pub #ident: #ty)
    });
    let accessors = m.args.iter().filter(|a| a.ty.var().is_none()).map(|a| {
        let ident = &a.ident;
        let written = a.ty.written();
        let body = if a.ty.is_identity() {
            quote!(__rpc_this.#ident)
        } else {
            let raised = raise_expr(&a.ty, quote!(__rpc_this.#ident), 0);
            quote! {
                match #raised {
                    ::core::result::Result::Ok(__rpc_v) => __rpc_v,
                    ::core::result::Result::Err(__rpc_e) => ::rpc::__private::unvalidated_argument(__rpc_e),
                }
            }
        };
        quote! {
            #[inline]
            pub fn #ident(&self) -> #written {
                let __rpc_this = *self;
                #body
            }
        }
    });
    quote! {
        #d
        #[derive(::core::clone::Clone)]
        #extra
        #vis struct #args_ident {
            #(#fields,)*
        }

        #[doc(hidden)]
        #[derive(
            ::rpc::__private::zerocopy::TryFromBytes,
            ::rpc::__private::zerocopy::IntoBytes,
            ::rpc::__private::zerocopy::KnownLayout,
            ::rpc::__private::zerocopy::Immutable,
            ::core::clone::Clone,
            ::core::marker::Copy
        )]
        #[zerocopy(crate = "::rpc::__private::zerocopy")]
        #[repr(C, packed)]
        #vis struct #wire {
            #(#wire_fields,)*
        }

        #[doc(hidden)]
        impl #wire {
            #(#accessors)*
        }
    }
}

/// Hidden codec functions on `<Trait>Service` for the variable-length methods: request
/// length/write/read from views, response length/write/read.
fn gen_var_codec(svc: &Service, names: &Names) -> TokenStream {
    let service = &names.service;
    let fns = svc.methods.iter().filter(|m| is_var(m)).map(|m| {
        let id = m.id;
        let shouty = &m.shouty;
        let mut out = TokenStream::new();
        if has_var_args(m) {
            let wire = wire_ident(svc, m);
            let (len_fn, write_fn, read_fn) =
                (fn_ident(m, "req_len"), fn_ident(m, "req_write"), fn_ident(m, "req_read"));
            let params: Vec<TokenStream> = m
                .args
                .iter()
                .map(|a| {
                    let l = local(a);
                    let t = match a.ty.var() {
                        Some(v) => var_view_ty(v),
                        None => {
                            let t = a.ty.written();
                            quote!(#t)
                        }
                    };
                    quote!(#l: #t)
                })
                .collect();
            let lens = m.args.iter().filter_map(|a| {
                let v = a.ty.var()?;
                let l = local(a);
                let e = var_len(v, quote!(__rpc_end), quote!(#l));
                Some(quote!(let __rpc_end = #e;))
            });
            let w = format_ident!("__rpc_w");
            let puts = m.args.iter().filter_map(|a| {
                let v = a.ty.var()?;
                let l = local(a);
                let sl = format_ident!("__rpc_s_{}", a.name);
                let e = var_put(v, &w, quote!(#l));
                Some(quote!(let #sl = #e;))
            });
            let inits = m.args.iter().map(|a| {
                let i = &a.ident;
                let l = local(a);
                if a.ty.var().is_some() {
                    let sl = format_ident!("__rpc_s_{}", a.name);
                    quote!(#i: #sl)
                } else {
                    let e = lower_expr(&a.ty, quote!(#l), 0);
                    quote!(#i: #e)
                }
            });
            let check = option_checks(m.args.iter(), quote!(__rpc_fixed), id);
            let reads = m.args.iter().map(|a| {
                let l = local(a);
                let i = &a.ident;
                match a.ty.var() {
                    Some(v) => {
                        let r = var_read(v, quote!(__rpc_m), quote!(__RPC_START), quote!(__rpc_fixed.#i), id);
                        quote!(let #l = #r?;)
                    }
                    None => quote!(let #l = #wire::#i(&__rpc_fixed);),
                }
            });
            let locals: Vec<Ident> = m.args.iter().map(local).collect();
            let tys = m.args.iter().map(|a| match a.ty.var() {
                Some(v) => {
                    let u = var_unsized(v);
                    if v.optional {
                        quote!(::core::option::Option<&'__rpc_m #u>)
                    } else {
                        quote!(&'__rpc_m #u)
                    }
                }
                None => {
                    let t = a.ty.written();
                    quote!(#t)
                }
            });
            out.extend(quote! {
                #[doc(hidden)]
                #[inline]
                #[allow(clippy::too_many_arguments)]
                pub fn #len_fn(#(#params),*) -> usize {
                    let __rpc_end = ::rpc::wire::HEADER_BYTES + ::core::mem::size_of::<#wire>();
                    #(#lens)*
                    __rpc_end
                }

                #[doc(hidden)]
                #[inline]
                #[allow(clippy::too_many_arguments)]
                pub fn #write_fn(__rpc_out: &mut [u8] #(, #params)*) -> usize {
                    let mut #w = ::rpc::__private::VarWriter::new(
                        __rpc_out,
                        ::rpc::wire::HEADER_BYTES + ::core::mem::size_of::<#wire>(),
                    );
                    #(#puts)*
                    #w.finish(#service::#shouty, 0, &#wire { #(#inits),* })
                }

                #[doc(hidden)]
                #[inline]
                #[allow(clippy::type_complexity)]
                pub fn #read_fn<'__rpc_m>(
                    __rpc_hdr: ::rpc::wire::MsgHeader,
                    __rpc_msg: &'__rpc_m [u8],
                ) -> ::core::result::Result<(#(#tys,)*), ::rpc::wire::WireError> {
                    const __RPC_START: usize = ::rpc::wire::HEADER_BYTES + ::core::mem::size_of::<#wire>();
                    let (__rpc_fixed, __rpc_m) = ::rpc::__private::decode_fixed::<#wire>(__rpc_hdr, __rpc_msg)?;
                    #check
                    #(#reads)*
                    ::core::result::Result::Ok((#(#locals,)*))
                }
            });
        }
        if let Some(v) = m.ret.var() {
            let (len_fn, write_fn, read_fn) =
                (fn_ident(m, "resp_len"), fn_ident(m, "resp_write"), fn_ident(m, "resp_read"));
            let view_ty = var_view_ty(v);
            let len = var_len(v, quote!(::rpc::__private::RESPONSE_DATA_START), quote!(__rpc_ret));
            let w = format_ident!("__rpc_w");
            let put = var_put(v, &w, quote!(__rpc_ret));
            let read = var_read(v, quote!(__rpc_m), quote!(::rpc::__private::RESPONSE_DATA_START), quote!(__rpc_s), id);
            out.extend(quote! {
                #[doc(hidden)]
                #[inline]
                pub fn #len_fn(__rpc_ret: #view_ty) -> usize {
                    #len
                }

                #[doc(hidden)]
                #[inline]
                pub fn #write_fn(__rpc_out: &mut [u8], __rpc_ret: #view_ty) -> usize {
                    let mut #w = ::rpc::__private::VarWriter::new(__rpc_out, ::rpc::__private::RESPONSE_DATA_START);
                    let __rpc_s = #put;
                    #w.finish(#service::#shouty, 0, &__rpc_s)
                }

                #[doc(hidden)]
                #[inline]
                pub fn #read_fn(__rpc_msg: &[u8]) -> ::core::result::Result<#view_ty, ::rpc::wire::WireError> {
                    let (__rpc_s, __rpc_m) = ::rpc::__private::read_var_response(#id, __rpc_msg)?;
                    #read
                }
            });
        }
        out
    });
    let decode_ref = gen_decode_ref(svc, names);
    quote!(#(#fns)* #decode_ref)
}

/// `<Trait>Service::dispatch_raw`: decodes in place, calls the handler with borrowed
/// arguments, encodes the result straight into the reply buffer.
fn gen_dispatch_raw(svc: &Service, names: &Names) -> TokenStream {
    let Names {
        server, service, ..
    } = names;
    let mv = max_var(svc);
    let arms = svc.methods.iter().map(|m| {
        let id = m.id;
        let ident = &m.ident;
        let shouty = &m.shouty;
        let locals: Vec<Ident> = m.args.iter().map(local).collect();
        let decode = if has_var_args(m) {
            let read_fn = fn_ident(m, "req_read");
            quote!(let (#(#locals,)*) = #service::#read_fn(__rpc_hdr, msg)?;)
        } else {
            let args_ident = names.args(svc, m);
            let check = option_checks(m.args.iter(), quote!(__rpc_args), id);
            let gets = m.args.iter().map(|a| {
                let i = &a.ident;
                let l = local(a);
                quote!(let #l = #args_ident::#i(&__rpc_args);)
            });
            let bind = if m.args.is_empty() {
                quote!(let _ = ::rpc::__private::decode_body::<#args_ident>(__rpc_hdr, msg)?;)
            } else {
                quote!(let __rpc_args = ::rpc::__private::decode_body::<#args_ident>(__rpc_hdr, msg)?;)
            };
            quote! {
                #bind
                #check
                #(#gets)*
            }
        };
        let call = quote!(<__RpcS as #server>::#ident(server #(, #locals)*));
        let reply = match m.ret.var() {
            Some(v) => {
                let (len_fn, write_fn) = (fn_ident(m, "resp_len"), fn_ident(m, "resp_write"));
                let view = var_view(v, quote!(__rpc_ret));
                quote! {
                    let __rpc_ret = #call;
                    let __rpc_view = #view;
                    let __rpc_len = #service::#len_fn(__rpc_view);
                    let __rpc_cap = ::core::cmp::min(out.len(), ::rpc::__private::RESPONSE_DATA_START + #mv);
                    if __rpc_len > __rpc_cap {
                        return ::core::result::Result::Err(::rpc::wire::WireError::ResponseTooLarge {
                            method_id: #id,
                            len: __rpc_len,
                            cap: __rpc_cap,
                        });
                    }
                    ::core::result::Result::Ok(#service::#write_fn(out, __rpc_view))
                }
            }
            None => {
                let value = lower_expr(&m.ret, quote!(__rpc_ret), 0);
                quote! {
                    let __rpc_ret = #call;
                    ::core::result::Result::Ok(::rpc::__private::encode(#service::#shouty, 0, &#value, out))
                }
            }
        };
        quote! {
            #id => {
                #decode
                #reply
            }
        }
    });
    let d = docs(&format!(
        "The zero-copy handler: decodes the request in `msg` in place (variable-length arguments\n\
         are borrowed from it), calls the [`{server}`] method it names on `server`, and writes\n\
         the response message into `out` (the transport's reply buffer); returns its length.\n\
         Use it with `rpc::Server::serve_once_raw` or `spawn_raw`, e.g.\n\
         `server.spawn_raw(move |msg, out| {service}::dispatch_raw(&mut state, msg, out))`.\n\
         \n\
         # Errors\n\
         The `rpc::wire::WireError` of a request that does not decode (unknown method, bad\n\
         length, invalid value, a slice outside the message, bad UTF-8, a misaligned slice), or\n\
         `WireError::ResponseTooLarge` when a variable-length result exceeds the service's\n\
         `max_var_bytes` or `out`: the server loop answers it with an error status and counts it."
    ));
    quote! {
        #d
        #[inline]
        pub fn dispatch_raw<__RpcS: #server + ?::core::marker::Sized>(
            server: &mut __RpcS,
            msg: &[u8],
            out: &mut [u8],
        ) -> ::core::result::Result<usize, ::rpc::wire::WireError> {
            let __rpc_hdr = ::rpc::__private::read_request_header(msg)?;
            match __rpc_hdr.method_id {
                #(#arms,)*
                __rpc_id => {
                    let _ = (server, out);
                    ::core::result::Result::Err(::rpc::wire::WireError::UnknownMethod(__rpc_id))
                }
            }
        }
    }
}

/// The body of a blocking stub of a variable-length method: computes the request's length,
/// writes it straight into the transport's buffer, and reads the response in place; with
/// `lend`, the result's view is passed to that closure instead of being copied out.
fn var_call(
    svc: &Service,
    names: &Names,
    m: &Method,
    within: bool,
    lend: Option<TokenStream>,
) -> TokenStream {
    let service = &names.service;
    let shouty = &m.shouty;
    let id = m.id;
    let idents: Vec<&Ident> = m.args.iter().map(|a| &a.ident).collect();
    let (len, write) = if has_var_args(m) {
        let (len_fn, write_fn) = (fn_ident(m, "req_len"), fn_ident(m, "req_write"));
        (
            quote!(#service::#len_fn(#(#idents),*)),
            quote!(|__rpc_out: &mut [u8]| #service::#write_fn(__rpc_out #(, #idents)*)),
        )
    } else {
        let args_ident = names.args(svc, m);
        let init = struct_init(&args_ident, m);
        (
            quote!(::rpc::wire::HEADER_BYTES + ::core::mem::size_of::<#args_ident>()),
            quote!(|__rpc_out: &mut [u8]| ::rpc::__private::encode(#service::#shouty, 0, &#init, __rpc_out)),
        )
    };
    let read = match (m.ret.var(), lend) {
        (Some(_), Some(f)) => {
            let read_fn = fn_ident(m, "resp_read");
            quote!(|__rpc_msg: &[u8]| ::core::result::Result::map(#service::#read_fn(__rpc_msg), #f))
        }
        (Some(v), None) => {
            let read_fn = fn_ident(m, "resp_read");
            let owned = var_to_owned(v, quote!(__rpc_v));
            quote!(|__rpc_msg: &[u8]| ::core::result::Result::map(#service::#read_fn(__rpc_msg), |__rpc_v| #owned))
        }
        (None, _) => {
            let lowered = lowered(&m.ret);
            if m.ret.is_identity() {
                quote!(|__rpc_msg: &[u8]| ::rpc::__private::decode_response::<#lowered>(#id, __rpc_msg))
            } else {
                let raised = raise_expr(&m.ret, quote!(__rpc_ret), 0);
                quote!(|__rpc_msg: &[u8]| {
                    let __rpc_ret = ::rpc::__private::decode_response::<#lowered>(#id, __rpc_msg)?;
                    ::core::result::Result::map_err(#raised, |_| ::rpc::wire::WireError::BadValue { method_id: #id })
                })
            }
        }
    };
    let (client, timeout) = if within {
        (quote!(self.client), quote!(self.timeout))
    } else {
        (quote!(self.inner), quote!(self.inner.default_deadline()))
    };
    quote! {
        let __rpc_timeout = #timeout;
        let __rpc_len = #len;
        #client.call_raw_within(__rpc_timeout, #service::#shouty, __rpc_len, #write, #read)
    }
}

/// `if <some active Option/Result side of these fixed-size arguments is invalid> { return
/// Err(BadValue) }`, reading each from `base.<arg>` (the decoded wire struct); nothing when
/// every argument is sent as is.
fn option_checks<'a>(
    args: impl Iterator<Item = &'a Arg>,
    base: TokenStream,
    id: u16,
) -> TokenStream {
    let checks: Vec<TokenStream> = args
        .filter(|a| a.ty.var().is_none() && !a.ty.is_identity())
        .map(|a| {
            let i = &a.ident;
            let raised = raise_expr(&a.ty, quote!(#base.#i), 0);
            quote!(::core::result::Result::is_err(&#raised))
        })
        .collect();
    if checks.is_empty() {
        return quote!();
    }
    quote! {
        if #(#checks)||* {
            return ::core::result::Result::Err(::rpc::wire::WireError::BadValue { method_id: #id });
        }
    }
}

/// Some method returns a variable-length value: the service gets `<Trait>ResponseRef` and the
/// client `poll_ref`.
fn has_var_results(svc: &Service) -> bool {
    svc.methods.iter().any(|m| m.ret.var().is_some())
}

fn response_ref_ident(svc: &Service) -> Ident {
    format_ident!("{}ResponseRef", svc.name)
}

/// The view type of a variable-length value with lifetime `'a`.
fn var_view_ty_a(v: &VarTy) -> TokenStream {
    let u = var_unsized(v);
    if v.optional {
        quote!(::core::option::Option<&'a #u>)
    } else {
        quote!(&'a #u)
    }
}

/// `<Trait>ResponseRef<'a>`: the response enum with variable-length results borrowed.
fn gen_response_ref(svc: &Service, names: &Names) -> TokenStream {
    if !has_var_results(svc) {
        return quote!();
    }
    let vis = &svc.vis;
    let Names {
        server,
        service,
        response,
        client,
        ..
    } = names;
    let rr = response_ref_ident(svc);
    let derives = &svc.derives;
    let extra = if derives.is_empty() {
        quote!()
    } else {
        quote!(#[derive(#(#derives),*)])
    };
    let variants = svc.methods.iter().map(|m| {
        let camel = &m.camel;
        let ty = match m.ret.var() {
            Some(v) => var_view_ty_a(v),
            None => ret_type(m),
        };
        let d = doc(format!(
            " Return value of [`{server}::{}`] (method id [`{service}::{}`] = {}).",
            m.name, m.shouty, m.id
        ));
        quote!(#d #camel(#ty))
    });
    let from_arms = svc.methods.iter().map(|m| {
        let camel = &m.camel;
        match m.ret.var() {
            Some(v) => {
                let view = var_view(v, quote!(*__rpc_v));
                quote!(#response::#camel(__rpc_v) => #rr::#camel(#view))
            }
            None => quote!(#response::#camel(__rpc_v) => #rr::#camel(*__rpc_v)),
        }
    });
    let d = docs(&format!(
        "A response of the `{name}` service with its variable-length result borrowed: what\n\
         [`{client}::poll_ref`] lends, from the transport's receive buffer (no copy) or from a\n\
         [`{response}`] decoded earlier. Fixed-size results are held by value.",
        name = svc.name
    ));
    quote! {
        #d
        #[derive(::core::clone::Clone, ::core::marker::Copy)]
        #extra
        #vis enum #rr<'a> {
            #(#variants,)*
        }

        impl<'a> #rr<'a> {
            /// Borrows an owned response.
            #[inline]
            pub fn from_response(r: &'a #response) -> Self {
                match r {
                    #(#from_arms,)*
                }
            }
        }
    }
}

/// `<Trait>Service::__rpc_decode_ref`: a response message as a `<Trait>ResponseRef`.
fn gen_decode_ref(svc: &Service, names: &Names) -> TokenStream {
    if !has_var_results(svc) {
        return quote!();
    }
    let rr = response_ref_ident(svc);
    let service = &names.service;
    let arms = svc.methods.iter().map(|m| {
        let camel = &m.camel;
        let id = m.id;
        if m.ret.var().is_some() {
            let f = fn_ident(m, "resp_read");
            return quote!(#id => ::core::result::Result::Ok(#rr::#camel(#service::#f(msg)?)));
        }
        fixed_response_arm(m, quote!(#rr::#camel))
    });
    quote! {
        #[doc(hidden)]
        #[inline]
        pub fn __rpc_decode_ref(
            method_id: u16,
            msg: &[u8],
        ) -> ::core::result::Result<#rr<'_>, ::rpc::wire::WireError> {
            match method_id {
                #(#arms,)*
                __rpc_id => ::core::result::Result::Err(::rpc::wire::WireError::UnknownMethod(__rpc_id)),
            }
        }
    }
}

/// `<Trait>Client::poll_ref` for services with variable-length results.
fn gen_poll_ref(svc: &Service, names: &Names) -> TokenStream {
    if !has_var_results(svc) {
        return quote!();
    }
    let rr = response_ref_ident(svc);
    let service = &names.service;
    let d = docs(&format!(
        "[`Self::poll_with`] that lends each completed call's result as a [`{rr}`]:\n\
         variable-length results are borrowed from the transport's receive buffer, not copied\n\
         into an owned response. Returns how many calls were delivered; never blocks.\n\
         \n\
         # Errors\n\
         `RpcError::ServerDisconnected` (failures of single calls go to `f`)."
    ));
    quote! {
        #d
        #[inline]
        pub fn poll_ref(
            &mut self,
            mut f: impl ::core::ops::FnMut(u64, ::core::result::Result<#rr<'_>, ::rpc::RpcError>),
        ) -> ::core::result::Result<usize, ::rpc::RpcError> {
            self.inner.poll_raw_with(|__rpc_tag, __rpc_c| match __rpc_c {
                ::rpc::Completion::Msg { method_id, msg } => f(
                    __rpc_tag,
                    ::core::result::Result::map_err(#service::__rpc_decode_ref(method_id, msg), |__rpc_e| {
                        ::rpc::RpcError::from_wire(
                            __rpc_tag,
                            ::rpc::client::method_name_of::<#service>(method_id),
                            __rpc_e,
                        )
                    }),
                ),
                ::rpc::Completion::Decoded(__rpc_r) => {
                    f(__rpc_tag, ::core::result::Result::Ok(#rr::from_response(&__rpc_r)))
                }
                ::rpc::Completion::Failed(__rpc_e) => f(__rpc_tag, ::core::result::Result::Err(__rpc_e)),
            })
        }
    }
}

/// The match arm `id => ..` decoding the fixed-size response of `m` from `msg` (validating
/// the active `Option`/`Result` sides) and wrapping it with `ctor` (an enum variant path).
fn fixed_response_arm(m: &Method, ctor: TokenStream) -> TokenStream {
    let id = m.id;
    let lowered = lowered(&m.ret);
    let raised = if m.ret.is_identity() {
        quote!(__rpc_ret)
    } else {
        let raised = raise_expr(&m.ret, quote!(__rpc_ret), 0);
        quote! {
            match #raised {
                ::core::result::Result::Ok(__rpc_v) => __rpc_v,
                ::core::result::Result::Err(_) => {
                    return ::core::result::Result::Err(::rpc::wire::WireError::BadValue { method_id: #id });
                }
            }
        }
    };
    quote! {
        #id => {
            let __rpc_ret = ::rpc::__private::decode_response::<#lowered>(#id, msg)?;
            ::core::result::Result::Ok(#ctor(#raised))
        }
    }
}
