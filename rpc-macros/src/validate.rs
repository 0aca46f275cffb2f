//! Validation: checks the parsed attribute and trait against what `#[rpc_service]` can
//! generate, reporting every problem at once with a span on the offending tokens, and builds
//! the [`Service`] model that [`crate::generate`] turns into code.

use heck::{ToShoutySnakeCase, ToUpperCamelCase};
use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote};
use syn::ext::IdentExt;
use syn::{Attribute, FnArg, Ident, Pat, Path, ReturnType, Signature, TraitItem, Type, Visibility};

use crate::parse::{AttrArgs, Errors, TransportArg, WireTy, normalize_tokens};

/// Built-in transports the attribute may name by a string (`transport = "copyrpc"`), with
/// the path of their client transport type relative to `::rpc`. Any other transport is named
/// by its type's path (`transport = my_crate::Loopback`).
pub(crate) const TRANSPORTS: &[(&str, &str)] = &[
    ("delegation", "delegation::Delegation"),
    ("copyrpc", "copyrpc::Copyrpc"),
    ("erpc", "erpc::Erpc"),
    ("scalerpc", "scalerpc::ScaleRpc"),
    ("ipc", "ipc::Ipc"),
];

/// Method names that `<Trait>Client` already uses for its inherent methods.
pub(crate) const CLIENT_METHODS: &[&str] = &[
    "connect",
    "from_transport",
    "issue",
    "issue_request",
    "poll",
    "poll_with",
    "in_flight",
    "max_in_flight",
    "transport",
    "transport_mut",
    "with_deadline",
    "set_default_deadline",
    "default_deadline",
    "stats",
    "zombies",
    "core",
    "core_mut",
    "poll_ref",
];

/// Traits the generated argument structs and enums always derive.
pub(crate) const ALWAYS_DERIVED: &[&str] = &[
    "Clone",
    "Copy",
    "TryFromBytes",
    "IntoBytes",
    "KnownLayout",
    "Immutable",
];

/// Prefix reserved for generated locals and helper items (compared case-insensitively).
pub(crate) const RESERVED_PREFIX: &str = "__rpc";

/// Most methods a service may have: ids are `u16`, and `u16::MAX` is never a valid id (the
/// server echoes it for requests too short to carry one).
pub(crate) const MAX_METHODS: usize = u16::MAX as usize;

/// A validated service.
pub(crate) struct Service {
    /// Attributes of the trait (docs included), carried over to `<Trait>Server`.
    pub attrs: Vec<Attribute>,
    /// Visibility of the trait, given to every generated item.
    pub vis: Visibility,
    /// The trait's name as written (`Kv`).
    pub ident: Ident,
    /// The trait's name without `r#`.
    pub name: String,
    /// The default client transport.
    pub transport: DefaultTransport,
    /// Extra derives for the argument structs and the request/response enums.
    pub derives: Vec<Path>,
    /// `max_var_bytes = N` as written, if given.
    pub max_var_bytes: Option<syn::LitInt>,
    /// Methods in declaration order.
    pub methods: Vec<Method>,
}

/// The default client transport, from `transport = ...`.
pub(crate) struct DefaultTransport {
    /// The type: `::rpc::delegation::Delegation` for a built-in name, the path as written
    /// otherwise (with its spans, so that a path that does not resolve is reported on it).
    pub ty: TokenStream,
    /// Span of the `rpc::ClientTransport` bound on the default: the path's, if one was
    /// given, so that a type not implementing the trait is reported on the path.
    pub span: Span,
    /// The argument as written, for docs: `"delegation"` (with the quotes) or the path.
    pub written: String,
    /// The type's path for an intra-doc link: `rpc::delegation::Delegation`, or the path.
    pub doc_path: String,
}

/// A validated method.
pub(crate) struct Method {
    /// All attributes (docs included), for the `<Trait>Server` method.
    pub attrs: Vec<Attribute>,
    /// The doc attributes only, repeated on the client stubs.
    pub docs: Vec<Attribute>,
    /// The `#[allow(...)]` attributes, repeated on every generated item named after the
    /// method (client stubs, request constructor) so that e.g. `non_snake_case` stays allowed.
    pub allows: Vec<Attribute>,
    /// The signature as written, for the `<Trait>Server` method.
    pub sig: Signature,
    /// Name as written (possibly raw, `r#type`).
    pub ident: Ident,
    /// Name without `r#`.
    pub name: String,
    /// `UpperCamelCase` name: the enum variant (`GetValue`).
    pub camel: Ident,
    /// `SHOUTY_SNAKE_CASE` name: the method-id constant (`GET_VALUE`).
    pub shouty: Ident,
    /// Method id: the declaration index.
    pub id: u16,
    /// Arguments after the receiver.
    pub args: Vec<Arg>,
    /// Return type (`()` when omitted).
    pub ret: WireTy,
    /// Whether the return type was written (`false`: omitted, i.e. `()`).
    pub ret_written: bool,
}

/// A validated argument.
pub(crate) struct Arg {
    /// Name as written.
    pub ident: Ident,
    /// Name without `r#`.
    pub name: String,
    /// The type, classified for lowering.
    pub ty: WireTy,
}

impl Method {
    /// Type text of the return type for the descriptor (`"()"` when omitted).
    pub(crate) fn ret_text(&self) -> String {
        if self.ret_written {
            type_text(self.ret.written())
        } else {
            "()".to_owned()
        }
    }
}

/// The text of a type as written, whitespace-normalised (`Option<u64>`, `[u8; 32]`).
pub(crate) fn type_text(ty: &Type) -> String {
    normalize_tokens(quote!(#ty))
}

/// The message for a variable-length standard type written as an argument or return type
/// (`String`, `str`, `Vec<T>`, also as `std::string::String`, `alloc::vec::Vec<T>`, ...), or
/// `None` for any other path.
///
/// Such a type would otherwise surface as a handful of raw E0277 errors (not `IntoBytes`,
/// not `Copy`, ...) per use; this says what to write instead. The macro sees names only: a
/// user type named `String` or `Vec` is taken for the standard one (rename it to send it).
pub(crate) fn variable_length_msg(path: &Path) -> Option<String> {
    let segs: Vec<_> = path.segments.iter().collect();
    let (last, prefix) = segs.split_last()?;
    let prefix: Vec<String> = prefix.iter().map(|s| s.ident.to_string()).collect();
    let prefix_is = |module: &str| match prefix.as_slice() {
        [] => path.leading_colon.is_none(),
        [krate, m] => (krate == "std" || krate == "alloc") && m == module,
        _ => false,
    };
    const WHY: &str = "its length is not fixed and its bytes are not stored inline, while arguments and return values are copied to the wire as fixed-size plain bytes";
    const PLANNED: &str = "(a variable-length value can be a whole argument, `&str`, `&[T]` or an `Option` of one, or the whole return type, `String`, `Vec<T>`, `&str`, `&[T]` or an `Option` of one; not part of an array, `Result`, nested `Option` or struct)";
    let name = last.ident.to_string();
    let (what, instead) = match name.as_str() {
        "String" if prefix_is("string") && last.arguments.is_none() => (
            "`String`",
            "a fixed-size byte array such as `[u8; N]` (the UTF-8 bytes, with the length in another argument or a `#[repr(C)]` struct)".to_string(),
        ),
        "str" if prefix.is_empty() && path.leading_colon.is_none() => (
            "`str`",
            "a fixed-size byte array such as `[u8; N]` (the UTF-8 bytes, with the length in another argument or a `#[repr(C)]` struct)".to_string(),
        ),
        "Vec" if prefix_is("vec") => {
            let elem = match &last.arguments {
                syn::PathArguments::AngleBracketed(a) => match a.args.first() {
                    Some(syn::GenericArgument::Type(t)) if a.args.len() == 1 => {
                        normalize_tokens(quote!(#t))
                    }
                    _ => "T".to_string(),
                },
                _ => "T".to_string(),
            };
            (
                "`Vec`",
                format!(
                    "a fixed-size array such as `[{elem}; N]` (with the length in another argument or a `#[repr(C)]` struct)"
                ),
            )
        }
        _ => return None,
    };
    Some(format!(
        "{what} cannot be sent by an `#[rpc_service]`: {WHY}; use {instead} instead {PLANNED}"
    ))
}

fn reserved_prefix(name: &str) -> bool {
    name.len() >= RESERVED_PREFIX.len()
        && name[..RESERVED_PREFIX.len()].eq_ignore_ascii_case(RESERVED_PREFIX)
}

fn reserved_msg(what: &str, name: &str) -> String {
    format!(
        "{what} `{name}` is reserved: identifiers starting with `{RESERVED_PREFIX}` are used by the code `#[rpc_service]` generates"
    )
}

/// Validates the attribute and the trait; `Err` carries every error found.
pub(crate) fn validate(
    attr: AttrArgs,
    item: syn::ItemTrait,
    mut errors: Errors,
) -> syn::Result<Service> {
    let transport = check_transport(&attr, &mut errors);
    check_derives(&attr.derives, &mut errors);
    let name = item.ident.unraw().to_string();
    check_trait_header(&item, &name, &mut errors);
    let methods = check_items(item.items, &item.ident, &name, &mut errors);
    check_with_stubs(&methods, &name, &mut errors);

    errors.finish()?;
    let transport = transport.expect("no transport error recorded");
    Ok(Service {
        attrs: item.attrs,
        vis: item.vis,
        ident: item.ident,
        name,
        transport,
        derives: attr.derives,
        max_var_bytes: attr.max_var_bytes,
        methods,
    })
}

/// `derive(...)` lists only additional derives: [`ALWAYS_DERIVED`] ones are already there.
fn check_derives(derives: &[Path], errors: &mut Errors) {
    for path in derives {
        let last = path
            .segments
            .last()
            .map(|s| s.ident.to_string())
            .unwrap_or_default();
        if ALWAYS_DERIVED.contains(&last.as_str()) {
            errors.error_spanned(
                path,
                format!(
                    "`{last}` is always derived by `#[rpc_service]`; list only additional derives (e.g. `Debug`, `PartialEq`)"
                ),
            );
        }
    }
}

/// The trait itself: an unreserved name, not `unsafe` or `auto`, no generics, `where` clause
/// or supertraits (the schema is concrete and describes only the wire interface).
fn check_trait_header(item: &syn::ItemTrait, name: &str, errors: &mut Errors) {
    if reserved_prefix(name) {
        errors.error_spanned(&item.ident, reserved_msg("trait name", name));
    }
    if let Some(unsafety) = &item.unsafety {
        errors.error_spanned(
            unsafety,
            "an `#[rpc_service]` trait cannot be `unsafe`: remote callers cannot uphold a safety contract; remove `unsafe`",
        );
    }
    if let Some(auto) = &item.auto_token {
        errors.error_spanned(auto, "an `#[rpc_service]` trait cannot be an `auto` trait");
    }
    for param in &item.generics.params {
        let what = match param {
            syn::GenericParam::Type(_) => "type parameters",
            syn::GenericParam::Lifetime(_) => "lifetime parameters",
            syn::GenericParam::Const(_) => "const parameters",
        };
        errors.error_spanned(
            param,
            format!(
                "an `#[rpc_service]` trait cannot have {what}: every argument and return type must be concrete, because its wire layout is fixed by the service schema"
            ),
        );
    }
    if let Some(wc) = &item.generics.where_clause {
        errors.error_spanned(
            wc,
            "an `#[rpc_service]` trait cannot have a `where` clause: the service schema has no type parameters to constrain",
        );
    }
    if let Some(colon) = &item.colon_token {
        let bounds = &item.supertraits;
        errors.error_spanned(
            quote!(#colon #bounds),
            format!(
                "an `#[rpc_service]` trait cannot have supertraits: it describes only the wire interface, and `{name}Server` is generated from its methods; put such bounds on your server type, or where you use it"
            ),
        );
    }
}

/// The trait's items: only methods, each valid and not colliding with an earlier one, at
/// most [`MAX_METHODS`]. Method ids are declaration indices, rejected methods included.
fn check_items(
    items: Vec<TraitItem>,
    trait_ident: &Ident,
    name: &str,
    errors: &mut Errors,
) -> Vec<Method> {
    let mut methods: Vec<Method> = Vec::new();
    let mut taken = Taken::default();
    let mut index = 0;
    for trait_item in items {
        match trait_item {
            TraitItem::Fn(f) => {
                match check_method(f, index, name, errors) {
                    Some(m) if check_collisions(&m, methods.len(), &mut taken, &methods, name, errors) => {
                        methods.push(m);
                    }
                    _ => {}
                }
                index += 1;
            }
            TraitItem::Const(c) => errors.error_spanned(
                {
                    let (kw, id) = (&c.const_token, &c.ident);
                    quote!(#kw #id)
                },
                "associated constants are not supported in an `#[rpc_service]` trait: it may contain only methods",
            ),
            TraitItem::Type(t) => errors.error_spanned(
                {
                    let (kw, id) = (&t.type_token, &t.ident);
                    quote!(#kw #id)
                },
                "associated types are not supported in an `#[rpc_service]` trait: it may contain only methods, with concrete types",
            ),
            TraitItem::Macro(m) => errors.error_spanned(
                &m.mac,
                "macro invocations are not supported in an `#[rpc_service]` trait: the macro cannot see the methods they would expand to; write the methods out",
            ),
            other => errors.error_spanned(
                other,
                "unsupported item in an `#[rpc_service]` trait: it may contain only methods",
            ),
        }
    }
    if index > MAX_METHODS {
        errors.error_spanned(
            methods.get(MAX_METHODS).map_or_else(|| trait_ident.clone(), |m| m.ident.clone()),
            format!(
                "too many methods: an `#[rpc_service]` trait may have at most {MAX_METHODS} (method ids are `u16`, and {} is reserved)",
                u16::MAX
            ),
        );
    }
    methods
}

/// A variable-length result also gets a borrowing stub `<name>_with`, which must not collide
/// with another method or a client method.
fn check_with_stubs(methods: &[Method], name: &str, errors: &mut Errors) {
    for m in methods.iter().filter(|m| m.ret.var().is_some()) {
        let with = format!("{}_with", m.name);
        if methods.iter().any(|o| o.name == with) || CLIENT_METHODS.contains(&with.as_str()) {
            errors.error_spanned(
                &m.ident,
                format!(
                    "method `{}` returns a variable-length value, so `{name}Client` gets a borrowing stub `{with}` as well, which collides with another name; rename one of them",
                    m.name
                ),
            );
        }
    }
}

fn check_transport(attr: &AttrArgs, errors: &mut Errors) -> Option<DefaultTransport> {
    let available: Vec<&str> = TRANSPORTS.iter().map(|(name, _)| *name).collect();
    let available = available.join(", ");
    let lit = match &attr.transport {
        Some(TransportArg::Name(lit)) => lit,
        Some(TransportArg::Path(path)) => return check_transport_path(path, errors),
        None => {
            if !attr.transport_written {
                errors.error(
                    Span::call_site(),
                    format!(
                        "missing transport: write `#[rpc_service(transport = \"delegation\")]` (built-in transports: {available}; or `transport = path::To::Type` for a type implementing `rpc::ClientTransport`)"
                    ),
                );
            } // else malformed, and reported as such
            return None;
        }
    };
    let value = lit.value();
    match TRANSPORTS.iter().find(|(name, _)| *name == value) {
        Some((_, path)) => {
            let rel: TokenStream = path.parse().expect("valid transport path");
            Some(DefaultTransport {
                ty: quote!(::rpc::#rel),
                span: Span::call_site(),
                written: format!("{value:?}"),
                doc_path: format!("rpc::{path}"),
            })
        }
        None => {
            errors.error_spanned(
                lit,
                format!(
                    "unknown transport `{value}`; built-in transports: {available} (another transport is named by its type's path, unquoted: `transport = path::To::Type`)"
                ),
            );
            None
        }
    }
}

/// `transport = path::To::Type`: any type implementing `rpc::ClientTransport` (checked by
/// the compiler, on the path); a bare built-in name (`transport = copyrpc`) is a forgotten
/// pair of quotes.
fn check_transport_path(path: &Path, errors: &mut Errors) -> Option<DefaultTransport> {
    if let Some(ident) = path.get_ident() {
        let name = ident.unraw().to_string();
        if TRANSPORTS.iter().any(|(n, _)| *n == name) {
            errors.error_spanned(
                path,
                format!(
                    "built-in transports are named by a string: write `transport = \"{name}\"` (an unquoted path names a type implementing `rpc::ClientTransport`)"
                ),
            );
            return None;
        }
    }
    if let Some(seg) = path.segments.iter().find(|s| !s.arguments.is_none()) {
        errors.error_spanned(
            &seg.arguments,
            "`transport` takes a type path without generic arguments: name a generic type through a type alias",
        );
        return None;
    }
    let written = normalize_tokens(path.to_token_stream());
    Some(DefaultTransport {
        ty: path.to_token_stream(),
        span: syn::spanned::Spanned::span(path),
        doc_path: written.clone(),
        written,
    })
}

/// Validates one trait method (seeds' "one wire struct per method" model): every check runs
/// and reports into `errors`; `None` if any failed.
fn check_method(
    f: syn::TraitItemFn,
    index: usize,
    trait_name: &str,
    errors: &mut Errors,
) -> Option<Method> {
    let errors_before = errors.count();
    let ident = f.sig.ident.clone();
    let name = ident.unraw().to_string();

    check_method_attrs(&f.attrs, errors);
    check_method_name(&ident, &name, trait_name, errors);
    let (camel_ident, shouty_ident) = method_idents(&ident, &name, errors);
    check_qualifiers(&f.sig, errors);
    check_generics(&f.sig, errors);
    check_default_body(&f, &name, trait_name, errors);
    let inputs = check_receiver(&f.sig, &ident, &name, errors);
    let args = check_args(inputs, trait_name, &name, errors);
    let (ret, ret_written) = check_ret(&f.sig.output, errors);
    let ret = ret?;
    if errors.count() > errors_before {
        return None;
    }
    let docs = attrs_named(&f.attrs, "doc");
    let allows = attrs_named(&f.attrs, "allow");
    Some(Method {
        attrs: f.attrs,
        docs,
        allows,
        sig: f.sig,
        ident,
        name,
        camel: camel_ident?,
        shouty: shouty_ident?,
        id: u16::try_from(index).unwrap_or(u16::MAX),
        args,
        ret,
        ret_written,
    })
}

/// The attributes of `attrs` whose path is `name` (`doc`, `allow`).
fn attrs_named(attrs: &[Attribute], name: &str) -> Vec<Attribute> {
    attrs
        .iter()
        .filter(|a| a.path().is_ident(name))
        .cloned()
        .collect()
}

/// `#[cfg]`/`#[cfg_attr]` on a method would make the wire schema depend on the build.
fn check_method_attrs(attrs: &[Attribute], errors: &mut Errors) {
    for attr in attrs {
        if attr.path().is_ident("cfg") || attr.path().is_ident("cfg_attr") {
            errors.push(syn::Error::new_spanned(
                    attr,
                    "`#[cfg]` is not supported on methods of an `#[rpc_service]` trait: the method list is the wire schema and must be the same in every build",
                ),
            );
        }
    }
}

/// The method name must not shadow generated locals, `<Trait>Client`'s inherent methods or
/// the service descriptor.
fn check_method_name(ident: &Ident, name: &str, trait_name: &str, errors: &mut Errors) {
    if reserved_prefix(name) {
        errors.push(syn::Error::new_spanned(
            ident,
            reserved_msg("method name", name),
        ));
    } else if CLIENT_METHODS.contains(&name) {
        errors.push(syn::Error::new_spanned(
                ident,
                format!(
                    "method name `{name}` is reserved: `{trait_name}Client` has an inherent method `{name}`; rename the method (reserved method names: {}, descriptor)",
                    CLIENT_METHODS.join(", ")
                ),
            ),
        );
    } else if name == "descriptor" {
        errors.push(syn::Error::new_spanned(
                ident,
                format!(
                    "method name `descriptor` is reserved: its method-id constant `{trait_name}Service::DESCRIPTOR` would hide the service descriptor `<{trait_name}Service as rpc::Service>::DESCRIPTOR`; rename the method"
                ),
            ),
        );
    }
}

/// The enum variant (`UpperCamelCase`) and method-id constant (`SHOUTY_SNAKE_CASE`) names;
/// `None` (and an error) where the converted name is not an identifier.
fn method_idents(ident: &Ident, name: &str, errors: &mut Errors) -> (Option<Ident>, Option<Ident>) {
    let camel = name.to_upper_camel_case();
    let shouty = name.to_shouty_snake_case();
    let camel_ident = syn::parse_str::<Ident>(&camel).ok();
    let shouty_ident = syn::parse_str::<Ident>(&shouty).ok();
    if camel_ident.is_none() || shouty_ident.is_none() {
        errors.push(syn::Error::new_spanned(
                ident,
                format!(
                    "method name `{name}` cannot be used: its generated names (variant `{camel}`, constant `{shouty}`) are not valid identifiers"
                ),
            ),
        );
    }
    (camel_ident, shouty_ident)
}

/// No `const`, `async`, `unsafe`, `extern` or variadic methods.
fn check_qualifiers(sig: &Signature, errors: &mut Errors) {
    if let Some(c) = &sig.constness {
        errors.push(syn::Error::new_spanned(
            c,
            "RPC methods cannot be `const fn`: they run on the server when a request arrives",
        ));
    }
    if let Some(a) = &sig.asyncness {
        errors.push(syn::Error::new_spanned(
                a,
                "RPC methods cannot be `async fn`: the server calls handlers synchronously from its polling loop; write a plain `fn` (clients still get blocking and pipelined calls, and a server can answer later with `rpc::Server::recv` + `rpc::Server::reply`)",
            ),
        );
    }
    if let Some(u) = &sig.unsafety {
        errors.push(syn::Error::new_spanned(
            u,
            "RPC methods cannot be `unsafe fn`: a remote caller cannot uphold a safety contract",
        ));
    }
    if let Some(abi) = &sig.abi {
        errors.push(syn::Error::new_spanned(
            abi,
            "RPC methods cannot have an ABI (`extern`): remove it",
        ));
    }
    if let Some(v) = &sig.variadic {
        errors.push(syn::Error::new_spanned(
            v,
            "RPC methods cannot be variadic: the arguments form a fixed-size wire struct",
        ));
    }
}

/// No generic parameters or `where` clause: each method has one concrete wire layout.
fn check_generics(sig: &Signature, errors: &mut Errors) {
    if !sig.generics.params.is_empty() {
        errors.push(syn::Error::new_spanned(
                &sig.generics,
                "RPC methods cannot be generic: each method's arguments and return value need one concrete wire layout",
            ),
        );
    }
    if let Some(wc) = &sig.generics.where_clause {
        errors.push(syn::Error::new_spanned(
            wc,
            "RPC methods cannot have a `where` clause: their types must be concrete",
        ));
    }
}

/// No default body: the server implements every method.
fn check_default_body(f: &syn::TraitItemFn, name: &str, trait_name: &str, errors: &mut Errors) {
    if let Some(body) = &f.default {
        errors.push(syn::Error::new_spanned(
                body,
                format!(
                    "RPC methods cannot have a default body: implement `{name}` in your `impl {trait_name}Server for ...` instead"
                ),
            ),
        );
    }
}

/// The receiver must be `&self` or `&mut self`; returns the inputs after it.
fn check_receiver<'a>(
    sig: &'a Signature,
    ident: &Ident,
    name: &str,
    errors: &mut Errors,
) -> std::iter::Peekable<syn::punctuated::Iter<'a, FnArg>> {
    let mut inputs = sig.inputs.iter().peekable();
    match inputs.peek() {
        Some(FnArg::Receiver(r)) => {
            inputs.next();
            let by_ref = r.reference.is_some() && r.colon_token.is_none();
            let explicit_ref = r.colon_token.is_some() && matches!(&*r.ty, Type::Reference(_));
            if explicit_ref {
                errors.push(syn::Error::new_spanned(
                    r,
                    "write the receiver as `&self` or `&mut self` (the explicit `self: &Self` form is not supported)",
                ));
            } else if !by_ref {
                errors.push(syn::Error::new_spanned(
                        r,
                        "RPC methods take `&self` or `&mut self`: the server keeps its state across calls, so the receiver cannot be `self`, `mut self`, `self: Box<Self>` or another explicit `self` type",
                    ),
                );
            } else if let Some((_, Some(lt))) = &r.reference {
                errors.push(syn::Error::new_spanned(lt, "write the receiver as `&self` or `&mut self`, without a lifetime"),
                );
            }
        }
        _ => errors.push(syn::Error::new_spanned(
                ident,
                format!(
                    "RPC method `{name}` needs a `&self` or `&mut self` receiver: the server handles every call on its state (associated functions cannot be called remotely)"
                ),
            ),
        ),
    }
    inputs
}

/// The arguments after the receiver: plain, unique, unreserved names of supported types.
fn check_args<'a>(
    inputs: impl Iterator<Item = &'a FnArg>,
    trait_name: &str,
    method_name: &str,
    errors: &mut Errors,
) -> Vec<Arg> {
    let camel = method_name.to_upper_camel_case();
    let mut args: Vec<Arg> = Vec::new();
    for input in inputs {
        let FnArg::Typed(pt) = input else {
            continue; // a second receiver: rejected by the parser already
        };
        for attr in &pt.attrs {
            errors.push(syn::Error::new_spanned(
                attr,
                "attributes on RPC method arguments are not supported",
            ));
        }
        let arg_ident = check_arg_pattern(&pt.pat, errors);
        let ty = WireTy::classify_sig(&pt.ty, crate::parse::Position::Arg, errors);
        if let Some(arg_ident) = arg_ident {
            let arg_name = arg_ident.unraw().to_string();
            if reserved_prefix(&arg_name) {
                errors.push(syn::Error::new_spanned(
                    &arg_ident,
                    reserved_msg("argument name", &arg_name),
                ));
            }
            if args.iter().any(|a| a.name == arg_name) {
                errors.push(syn::Error::new_spanned(
                        &arg_ident,
                        format!(
                            "duplicate argument name `{arg_name}`: each argument becomes a field of `{trait_name}{camel}Args`"
                        ),
                    ),
                );
            } else if let Some(ty) = ty {
                args.push(Arg {
                    ident: arg_ident,
                    name: arg_name,
                    ty,
                });
            }
        }
    }
    args
}

/// An argument must be a plain name: it becomes a field of the argument struct.
fn check_arg_pattern(pat: &Pat, errors: &mut Errors) -> Option<Ident> {
    match pat {
        Pat::Ident(pi) if pi.by_ref.is_none() && pi.mutability.is_none() && pi.subpat.is_none() => {
            Some(pi.ident.clone())
        }
        Pat::Wild(w) => {
            errors.push(syn::Error::new_spanned(
                    w,
                    "RPC method arguments need a name: `_` cannot be used, because each argument becomes a named field of the argument struct and an accessor",
                ),
            );
            None
        }
        other => {
            errors.push(syn::Error::new_spanned(
                    other,
                    "RPC method arguments must be plain names (`name: Type`), not patterns: each argument becomes a named field of the argument struct; destructure it inside the handler",
                ),
            );
            None
        }
    }
}

/// The return type, classified (`()` when omitted), and whether it was written.
fn check_ret(output: &ReturnType, errors: &mut Errors) -> (Option<WireTy>, bool) {
    match output {
        ReturnType::Default => (Some(WireTy::Leaf(syn::parse_quote!(()))), false),
        ReturnType::Type(_, ty) => (
            WireTy::classify_sig(ty, crate::parse::Position::Ret, errors),
            true,
        ),
    }
}

/// Names already taken by earlier methods, for [`check_collisions`].
#[derive(Default)]
struct Taken {
    names: std::collections::HashMap<String, usize>,
    camel: std::collections::HashMap<String, usize>,
    shouty: std::collections::HashMap<String, usize>,
}

fn check_collisions(
    m: &Method,
    index: usize,
    taken: &mut Taken,
    earlier: &[Method],
    trait_name: &str,
    errors: &mut Errors,
) -> bool {
    if taken.names.contains_key(&m.name) {
        errors.error_spanned(&m.ident, format!("duplicate method `{}`", m.name));
        return false;
    }
    let camel = m.camel.to_string();
    let shouty = m.shouty.to_string();
    if let Some(&e) = taken
        .camel
        .get(&camel)
        .or_else(|| taken.shouty.get(&shouty))
    {
        errors.error_spanned(
            &m.ident,
            format!(
                "method `{}` collides with method `{}`: both would generate variant `{trait_name}Request::{}` / struct `{trait_name}{}Args` and constant `{trait_name}Service::{}`; rename one of them",
                m.name, earlier[e].name, m.camel, m.camel, m.shouty
            ),
        );
        return false;
    }
    taken.names.insert(m.name.clone(), index);
    taken.camel.insert(camel, index);
    taken.shouty.insert(shouty, index);
    true
}
