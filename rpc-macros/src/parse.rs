//! Parsing: the attribute's arguments, the annotated trait, and the syntactic lowering of
//! signature types to their wire form.
//!
//! Nothing here knows about traits or layouts: the macro runs before type checking, so a type
//! is classified only by how it is *written*. `Option<T>`, `Result<T, E>` and `[T; N]` are
//! recognised by their spelling (`Option`, `std::option::Option`, `core::option::Option`,
//! likewise for `Result`); a type alias of either is **not** seen through and is treated as an
//! ordinary (leaf) type, which must then be a zerocopy type itself.

use proc_macro2::{Delimiter, Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{
    Expr, ExprLit, GenericArgument, Ident, Lit, LitStr, Meta, Path, PathArguments, Token, Type,
};

/// Collects errors so that all of them are reported at once (like serde_derive's `Ctxt`).
#[derive(Default)]
pub(crate) struct Errors {
    combined: Option<syn::Error>,
    count: usize,
}

impl Errors {
    /// Records an error.
    pub(crate) fn push(&mut self, err: syn::Error) {
        self.count += 1;
        match &mut self.combined {
            Some(all) => all.combine(err),
            None => self.combined = Some(err),
        }
    }

    /// Records an error at `span`.
    pub(crate) fn error(&mut self, span: Span, msg: impl std::fmt::Display) {
        self.push(syn::Error::new(span, msg));
    }

    /// Records an error spanning the tokens of `tokens`.
    pub(crate) fn error_spanned(&mut self, tokens: impl ToTokens, msg: impl std::fmt::Display) {
        self.push(syn::Error::new_spanned(tokens, msg));
    }

    /// How many errors were recorded so far.
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// `Err` with every recorded error, or `Ok(())`.
    pub(crate) fn finish(self) -> syn::Result<()> {
        match self.combined {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }
}

/// The `transport` argument as written.
pub(crate) enum TransportArg {
    /// A built-in transport's name: `transport = "delegation"`.
    Name(LitStr),
    /// The path of a type implementing `rpc::ClientTransport`: `transport = my::Loopback`.
    Path(Path),
}

/// The arguments of `#[rpc_service(...)]`, as written.
pub(crate) struct AttrArgs {
    /// `transport = "..."` or `transport = path::To::Type`, if given.
    pub transport: Option<TransportArg>,
    /// Whether a `transport` argument was written at all (even a malformed one, already
    /// reported, so it is not also reported as missing).
    pub transport_written: bool,
    /// `derive(...)`: extra derives for the argument structs and the request/response enums.
    pub derives: Vec<Path>,
    /// `max_var_bytes = N`: bytes of variable-length data per message (`None`: the runtime's
    /// default, `rpc::varlen::DEFAULT_MAX_VAR_BYTES`).
    pub max_var_bytes: Option<syn::LitInt>,
}

/// What `transport = ...` accepts, for errors.
const TRANSPORT_FORMS: &str = "`transport` takes a built-in transport's name as a string, e.g. `transport = \"delegation\"`, or the path of a type implementing `rpc::ClientTransport`, e.g. `transport = my_crate::Loopback` (write a generic type through a type alias)";

/// Parses the attribute's arguments, recording every problem in `errors`.
pub(crate) fn parse_attr(attr: TokenStream, errors: &mut Errors) -> AttrArgs {
    let mut out = AttrArgs {
        transport: None,
        transport_written: false,
        derives: Vec::new(),
        max_var_bytes: None,
    };
    let metas = match syn::parse::Parser::parse2(
        Punctuated::<Meta, Token![,]>::parse_terminated,
        attr,
    ) {
        Ok(metas) => metas,
        Err(err) => {
            errors.push(syn::Error::new(
                err.span(),
                format!(
                    "{err}; expected `#[rpc_service(transport = \"delegation\")]`, optionally followed by `, derive(...)`"
                ),
            ));
            return out;
        }
    };
    let mut derive_seen = false;
    for meta in metas {
        let key = meta.path().get_ident().map(|i| i.unraw().to_string());
        if key.as_deref() == Some("transport") {
            out.transport_written = true;
        }
        match (key.as_deref(), &meta) {
            (Some("transport"), Meta::NameValue(nv)) => {
                if out.transport.is_some() {
                    errors.error_spanned(&nv.path, "duplicate `transport` argument");
                    continue;
                }
                match &nv.value {
                    Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) => {
                        out.transport = Some(TransportArg::Name(s.clone()))
                    }
                    Expr::Path(p) if p.qself.is_none() && p.attrs.is_empty() => {
                        out.transport = Some(TransportArg::Path(p.path.clone()))
                    }
                    other => errors.error_spanned(other, TRANSPORT_FORMS),
                }
            }
            (Some("transport"), _) => errors.error_spanned(&meta, TRANSPORT_FORMS),
            (Some("derive"), Meta::List(list)) => {
                if derive_seen {
                    errors.error_spanned(&list.path, "duplicate `derive(...)` argument");
                    continue;
                }
                derive_seen = true;
                match list.parse_args_with(Punctuated::<Path, Token![,]>::parse_terminated) {
                    Ok(paths) => out.derives.extend(paths),
                    Err(err) => errors.push(err),
                }
            }
            (Some("max_var_bytes"), Meta::NameValue(nv)) => {
                if out.max_var_bytes.is_some() {
                    errors.error_spanned(&nv.path, "duplicate `max_var_bytes` argument");
                    continue;
                }
                match &nv.value {
                    Expr::Lit(ExprLit { lit: Lit::Int(i), .. })
                        if i.base10_parse::<u32>().is_ok_and(|n| n > 0) =>
                    {
                        out.max_var_bytes = Some(i.clone())
                    }
                    other => errors.error_spanned(
                        other,
                        "`max_var_bytes` takes a positive integer below 2^32 (bytes of variable-length data per message), e.g. `max_var_bytes = 65536`",
                    ),
                }
            }
            (Some("max_var_bytes"), _) => errors.error_spanned(
                &meta,
                "expected `max_var_bytes = N`, e.g. `max_var_bytes = 65536`",
            ),
            (Some("derive"), _) => errors.error_spanned(
                &meta,
                "expected `derive(...)` with a list of derive macros, e.g. `derive(Debug, PartialEq)`",
            ),
            _ => errors.error_spanned(
                meta.path(),
                format!(
                    "unknown `#[rpc_service]` argument `{}`; expected `transport = \"...\"` (or `transport = path::To::Type`), `derive(...)` or `max_var_bytes = N`",
                    normalize_tokens(meta.path().to_token_stream())
                ),
            ),
        }
    }
    out
}

/// Parses the annotated item, which must be a trait.
pub(crate) fn parse_item(item: TokenStream) -> syn::Result<syn::ItemTrait> {
    syn::parse2::<ItemTraitOnly>(item).map(|t| t.0)
}

struct ItemTraitOnly(syn::ItemTrait);

impl Parse for ItemTraitOnly {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let item: syn::Item = input.parse()?;
        match item {
            syn::Item::Trait(t) => Ok(ItemTraitOnly(t)),
            other => Err(syn::Error::new(
                item_keyword_span(&other),
                "`#[rpc_service]` applies to a trait: `pub trait Name { fn method(&mut self, ...) -> ...; }`",
            )),
        }
    }
}

fn item_keyword_span(item: &syn::Item) -> Span {
    match item {
        syn::Item::Struct(s) => s.struct_token.span,
        syn::Item::Enum(e) => e.enum_token.span,
        syn::Item::Fn(f) => f.sig.fn_token.span,
        syn::Item::Impl(i) => i.impl_token.span,
        syn::Item::Mod(m) => m.mod_token.span,
        syn::Item::Union(u) => u.union_token.span,
        syn::Item::TraitAlias(t) => t.trait_token.span,
        other => other.span(),
    }
}

/// A signature type, classified syntactically for lowering to its wire form.
#[derive(Clone, Debug)]
pub(crate) enum WireTy {
    /// Sent as is: must itself be a zerocopy type.
    Leaf(Type),
    /// `Option<T>`, sent as `WireOption<L(T), [u8; size_of L(T)]>`.
    Option {
        /// The whole type as written.
        written: Type,
        /// `T`.
        inner: Box<WireTy>,
    },
    /// `Result<T, E>`, sent as `WireResult<L(T), L(E), ..>` (with byte storage for each side).
    Result {
        /// The whole type as written.
        written: Type,
        /// `T`.
        ok: Box<WireTy>,
        /// `E`.
        err: Box<WireTy>,
    },
    /// `[T; N]`, sent as `[L(T); N]`.
    Array {
        /// The whole type as written.
        written: Type,
        /// `T`.
        elem: Box<WireTy>,
        /// `N` as written.
        len: Expr,
    },
    /// A variable-length value (`&str`, `&[T]`, `String`, `Vec<T>`, or an `Option` of one),
    /// sent as a `WireSlice` plus data (`rpc::varlen`). Only a whole argument or a whole
    /// return type; never nested.
    Var(VarTy),
}

/// A variable-length argument or return type.
#[derive(Clone, Debug)]
pub(crate) struct VarTy {
    /// The whole type as written.
    pub written: Type,
    /// Written as `Option<..>`.
    pub optional: bool,
    /// Written as an owned `String`/`Vec<T>` (return types only) rather than a reference.
    pub owned: bool,
    /// `None`: a string (`str`); `Some(T)`: a slice of `T` (`[u8]` for bytes).
    pub elem: Option<Type>,
}

/// Where a type appears in a signature.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Position {
    /// An argument.
    Arg,
    /// The return type.
    Ret,
}

/// The two generic types recognised by their spelling.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Known {
    Option,
    Result,
}

impl WireTy {
    /// Classifies `ty`, recording an error for every type that cannot be sent (references,
    /// slices, `impl Trait`, `dyn Trait`, tuples other than `()`, pointers, fn pointers, `!`,
    /// `_`, `Self`, non-`'static` lifetimes). Returns `None` if any was recorded.
    pub(crate) fn classify(ty: &Type, errors: &mut Errors) -> Option<WireTy> {
        let before = errors.count();
        let out = classify(ty, errors);
        if errors.count() > before { None } else { out }
    }

    /// Classifies a whole argument or return type: a variable-length form
    /// ([`WireTy::Var`]) if it is one, else as [`WireTy::classify`].
    pub(crate) fn classify_sig(ty: &Type, pos: Position, errors: &mut Errors) -> Option<WireTy> {
        let before = errors.count();
        match var_form(ty, pos, errors) {
            Some(v) if errors.count() == before => Some(WireTy::Var(v)),
            Some(_) => None,
            None if errors.count() > before => None,
            None => WireTy::classify(ty, errors),
        }
    }

    /// The variable-length form, if this is one.
    pub(crate) fn var(&self) -> Option<&VarTy> {
        match self {
            WireTy::Var(v) => Some(v),
            _ => None,
        }
    }

    /// The type as written in the trait.
    pub(crate) fn written(&self) -> &Type {
        match self {
            WireTy::Leaf(t) => t,
            WireTy::Var(v) => &v.written,
            WireTy::Option { written, .. }
            | WireTy::Result { written, .. }
            | WireTy::Array { written, .. } => written,
        }
    }

    /// Whether the wire form is the written type itself (no `Option`/`Result` inside).
    pub(crate) fn is_identity(&self) -> bool {
        match self {
            WireTy::Leaf(_) => true,
            WireTy::Option { .. } | WireTy::Result { .. } | WireTy::Var(_) => false,
            WireTy::Array { elem, .. } => elem.is_identity(),
        }
    }

    /// Visits every leaf (every type that is not an `Option`, `Result` or array), in order.
    pub(crate) fn for_each_leaf(&self, f: &mut impl FnMut(&Type)) {
        match self {
            WireTy::Leaf(t) => f(t),
            WireTy::Option { inner, .. } => inner.for_each_leaf(f),
            WireTy::Result { ok, err, .. } => {
                ok.for_each_leaf(f);
                err.for_each_leaf(f);
            }
            WireTy::Array { elem, .. } => elem.for_each_leaf(f),
            WireTy::Var(v) => {
                if let Some(e) = &v.elem {
                    f(e)
                }
            }
        }
    }
}

/// The variable-length form of a whole argument or return type, or `None` (with no error
/// recorded) when `ty` is not one; misuses of such forms record an error and return `None`.
fn var_form(ty: &Type, pos: Position, errors: &mut Errors) -> Option<VarTy> {
    let (optional, inner) = match ty {
        Type::Paren(p) => return var_form(&p.elem, pos, errors),
        Type::Group(g) => return var_form(&g.elem, pos, errors),
        Type::Path(p) if p.qself.is_none() => match known_generic(&p.path) {
            Some((Known::Option, args)) => (true, args[0]),
            _ => (false, ty),
        },
        _ => (false, ty),
    };
    let inner = match inner {
        Type::Paren(p) => &*p.elem,
        Type::Group(g) => &*g.elem,
        t => t,
    };
    let (owned, elem) = match inner {
        Type::Reference(r) => {
            let elem = match &*r.elem {
                Type::Path(p) if p.qself.is_none() && p.path.is_ident("str") => None,
                Type::Slice(s) => Some((*s.elem).clone()),
                _ => return None,
            };
            if let Some(m) = &r.mutability {
                errors.error_spanned(
                    m,
                    "a variable-length value is passed by shared reference: write `&str` or `&[T]` (the server gets it borrowed from the receive buffer, which it must not change)",
                );
                return None;
            }
            if let Some(lt) = r.lifetime.as_ref().filter(|l| l.ident != "_") {
                errors.error_spanned(
                    lt,
                    "write the reference without a lifetime (`&str`, `&[T]`): an argument borrows from the request for the handler's call, a result from `&self`",
                );
                return None;
            }
            (false, elem)
        }
        Type::Path(p) if p.qself.is_none() => {
            let segs: Vec<_> = p.path.segments.iter().collect();
            let (last, prefix) = segs.split_last()?;
            if prefix.iter().any(|s| !s.arguments.is_none()) {
                return None;
            }
            let prefix: Vec<String> = prefix.iter().map(|s| s.ident.to_string()).collect();
            let prefix_is = |module: &str| match prefix.as_slice() {
                [] => p.path.leading_colon.is_none(),
                [krate, m] => (krate == "std" || krate == "alloc") && m == module,
                _ => false,
            };
            let elem = match last.ident.to_string().as_str() {
                "String" if prefix_is("string") && last.arguments.is_none() => None,
                "Vec" if prefix_is("vec") => match &last.arguments {
                    PathArguments::AngleBracketed(a) if a.args.len() == 1 => match &a.args[0] {
                        GenericArgument::Type(t) => Some(t.clone()),
                        _ => return None,
                    },
                    _ => return None,
                },
                _ => return None,
            };
            if pos == Position::Arg {
                let (what, instead) = match &elem {
                    None => ("`String`".to_string(), "`&str`".to_string()),
                    Some(t) => {
                        let t = normalize_tokens(t.to_token_stream());
                        (format!("`Vec<{t}>`"), format!("`&[{t}]`"))
                    }
                };
                errors.error_spanned(
                    inner,
                    format!(
                        "{what} cannot be an `#[rpc_service]` argument: write {instead} instead (the client stub writes the borrowed bytes straight into the transport's send buffer, and the handler gets them borrowed from the receive buffer; owned values are for return types)"
                    ),
                );
                return None;
            }
            (true, elem)
        }
        _ => return None,
    };
    if let Some(e) = &elem {
        let before = errors.count();
        let ok = WireTy::classify(e, errors).is_some_and(|w| w.is_identity());
        if errors.count() > before {
            return None;
        }
        if !ok {
            errors.error_spanned(
                e,
                "the element type of a variable-length slice must be a fixed-size zerocopy type sent as is: `Option`/`Result` elements are not supported (use a `#[repr(C)]` struct with an explicit tag)",
            );
            return None;
        }
    }
    Some(VarTy {
        written: ty.clone(),
        optional,
        owned,
        elem,
    })
}

fn classify(ty: &Type, errors: &mut Errors) -> Option<WireTy> {
    const SUGGEST: &str = "use a `#[repr(C)]` struct that derives `zerocopy::{TryFromBytes, IntoBytes, KnownLayout, Immutable}` and `Clone, Copy` instead";
    let reject = |errors: &mut Errors, what: &str, why: &str| {
        errors.error_spanned(
            ty,
            format!("{what} cannot be sent by an `#[rpc_service]`: {why}; {SUGGEST}"),
        );
        None
    };
    const BYTES: &str = "arguments and return values are copied to the wire as plain bytes";
    match ty {
        Type::Paren(p) => classify(&p.elem, errors),
        Type::Group(g) => classify(&g.elem, errors),
        Type::Reference(_) => reject(errors, "a reference", BYTES),
        Type::Ptr(_) => reject(errors, "a raw pointer", BYTES),
        Type::Slice(_) => reject(
            errors,
            "a slice",
            "its length is not fixed (an array `[T; N]` is)",
        ),
        Type::ImplTrait(_) => reject(
            errors,
            "`impl Trait`",
            "the wire layout needs one concrete type",
        ),
        Type::TraitObject(_) => reject(
            errors,
            "a `dyn Trait` object",
            "the wire layout needs one concrete type",
        ),
        Type::BareFn(_) => reject(errors, "a function pointer", BYTES),
        Type::Never(_) => reject(
            errors,
            "`!`",
            "a method must return a value the client can receive",
        ),
        Type::Infer(_) => reject(errors, "`_`", "the wire layout needs the type written out"),
        Type::Tuple(t) if !t.elems.is_empty() => reject(
            errors,
            "a tuple",
            "tuples have no guaranteed layout (only `()` is allowed)",
        ),
        Type::Tuple(_) => Some(WireTy::Leaf(ty.clone())),
        Type::Array(a) => {
            let elem = classify(&a.elem, errors);
            let elem = elem?;
            Some(WireTy::Array {
                written: ty.clone(),
                elem: Box::new(elem),
                len: a.len.clone(),
            })
        }
        Type::Path(p) => {
            if mentions_self(ty) {
                errors.error_spanned(
                    ty,
                    "`Self` cannot appear in an `#[rpc_service]` signature: the wire types must not depend on the server's type",
                );
                return None;
            }
            if let Some(lt) = non_static_lifetime(ty) {
                errors.error_spanned(
                    lt,
                    "lifetimes other than `'static` cannot appear in an `#[rpc_service]` signature: values are copied to the wire and must not borrow",
                );
                return None;
            }
            let variable = p
                .qself
                .is_none()
                .then(|| crate::validate::variable_length_msg(&p.path))
                .flatten();
            if let Some(msg) = variable {
                errors.error_spanned(ty, msg);
                return None;
            }
            let known = if p.qself.is_none() {
                known_generic(&p.path)
            } else {
                None
            };
            if let Some((known, args)) = known {
                let mut inner = args
                    .into_iter()
                    .map(|t| classify(t, errors))
                    .collect::<Vec<_>>();
                return match known {
                    Known::Option => {
                        let inner = inner.pop()??;
                        Some(WireTy::Option {
                            written: ty.clone(),
                            inner: Box::new(inner),
                        })
                    }
                    Known::Result => {
                        let err = inner.pop()?;
                        let ok = inner.pop()??;
                        Some(WireTy::Result {
                            written: ty.clone(),
                            ok: Box::new(ok),
                            err: Box::new(err?),
                        })
                    }
                };
            }
            Some(WireTy::Leaf(ty.clone()))
        }
        // A macro in type position (`my_type!()`): taken as a leaf; the compile-time
        // assertions check it like any other.
        Type::Macro(_) => Some(WireTy::Leaf(ty.clone())),
        _ => reject(errors, "this type", BYTES),
    }
}

/// `Option<T>` / `Result<T, E>` spelled as `Option`, `std::option::Option` or
/// `core::option::Option` (optionally with a leading `::`), with exactly the right number of
/// type arguments. Anything else (aliases, `io::Result<T>`, `Option<T, U>`) is not recognised.
fn known_generic(path: &Path) -> Option<(Known, Vec<&Type>)> {
    let segs: Vec<_> = path.segments.iter().collect();
    let (last, prefix) = segs.split_last()?;
    if prefix.iter().any(|s| !s.arguments.is_none()) {
        return None;
    }
    let last_name = last.ident.to_string();
    let known = match last_name.as_str() {
        "Option" => Known::Option,
        "Result" => Known::Result,
        _ => return None,
    };
    let module = match known {
        Known::Option => "option",
        Known::Result => "result",
    };
    let prefix: Vec<String> = prefix.iter().map(|s| s.ident.to_string()).collect();
    let prefix_ok = match prefix.as_slice() {
        [] => path.leading_colon.is_none(),
        [krate, m] => (krate == "std" || krate == "core") && m == module,
        _ => false,
    };
    if !prefix_ok {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    let tys: Vec<&Type> = args
        .args
        .iter()
        .filter_map(|a| match a {
            GenericArgument::Type(t) => Some(t),
            _ => None,
        })
        .collect();
    let want = match known {
        Known::Option => 1,
        Known::Result => 2,
    };
    (tys.len() == want && args.args.len() == want).then_some((known, tys))
}

fn mentions_self(ty: &Type) -> bool {
    struct V(bool);
    impl<'ast> syn::visit::Visit<'ast> for V {
        fn visit_ident(&mut self, i: &'ast Ident) {
            if i == "Self" {
                self.0 = true;
            }
        }
    }
    let mut v = V(false);
    syn::visit::visit_type(&mut v, ty);
    v.0
}

fn non_static_lifetime(ty: &Type) -> Option<syn::Lifetime> {
    struct V(Option<syn::Lifetime>);
    impl<'ast> syn::visit::Visit<'ast> for V {
        fn visit_lifetime(&mut self, l: &'ast syn::Lifetime) {
            if l.ident != "static" && self.0.is_none() {
                self.0 = Some(l.clone());
            }
        }
    }
    let mut v = V(None);
    syn::visit::visit_type(&mut v, ty);
    v.0
}

/// Renders tokens as text with conventional Rust spacing, independent of how the source was
/// formatted: `Option<u64>`, `[u8; 32]`, `()`, `std::option::Option<[Option<u8>; 2]>`,
/// `Result<u32, MyError>`. Used for the descriptor's type names (and so the fingerprint).
pub(crate) fn normalize_tokens(tokens: TokenStream) -> String {
    let mut out = String::new();
    write_tokens(tokens, &mut out);
    out
}

/// What was written last, for [`write_tokens`]'s spacing decisions.
#[derive(Clone, Copy)]
enum Last {
    /// Nothing yet (start of a group or of the stream).
    Start,
    /// An identifier, a literal or a closed group.
    Word,
    /// A punctuation character; `joint` if it is glued to the next one (`::`, `->`),
    /// `second` if it is the second character of such a pair, `unary` for a prefix operator
    /// (`-1`, `&T`, `*const T`, as opposed to `N - 1`).
    Punct {
        ch: char,
        joint: bool,
        second: bool,
        unary: bool,
    },
}

/// Whether a space goes between `last` and the token `next`.
fn space_between(last: Last, next: &TokenTree) -> bool {
    let punct_after = |ch: char, joint: bool, second: bool, unary: bool| -> bool {
        if joint || unary {
            return false; // first half of `::`, `->`, `'a`; `-1`, `&T`
        }
        match ch {
            ',' | ';' | '=' | '+' => true,
            ':' => !second, // `x: T`, but not `a::b`
            '>' => second,  // `-> T`; but `Vec<u8>` followed by `,`/`>` is handled by `next`
            '<' | '\'' | '#' | '!' | '$' | '.' => false,
            _ => true,
        }
    };
    match (last, next) {
        (Last::Start, _) => false,
        (_, TokenTree::Punct(p)) if matches!(p.as_char(), ',' | ';' | '.' | '>' | ':') => false,
        (
            Last::Punct {
                ch, joint, second, ..
            },
            TokenTree::Punct(p),
        ) if p.as_char() == '<' => {
            !joint && matches!(ch, ',' | ';' | '=' | '+') || (ch == ':' && !second && !joint)
        }
        (Last::Word, TokenTree::Punct(p)) if matches!(p.as_char(), '<' | '!') => false,
        (Last::Word, TokenTree::Group(g)) if g.delimiter() == Delimiter::Parenthesis => false,
        (
            Last::Punct {
                ch,
                joint,
                second,
                unary,
            },
            _,
        ) => punct_after(ch, joint, second, unary),
        (Last::Word, _) => true,
    }
}

fn write_tokens(tokens: TokenStream, out: &mut String) {
    let mut last = Last::Start;
    for tt in tokens {
        if space_between(last, &tt) {
            out.push(' ');
        }
        last = match &tt {
            TokenTree::Punct(p) => {
                out.push(p.as_char());
                let second = matches!(last, Last::Punct { joint: true, .. });
                // A prefix operator follows nothing, or punctuation other than a closing `>`.
                let unary = matches!(p.as_char(), '-' | '*' | '&' | '!')
                    && match last {
                        Last::Start => true,
                        Last::Word => false,
                        Last::Punct { ch, .. } => ch != '>',
                    };
                Last::Punct {
                    ch: p.as_char(),
                    joint: p.spacing() == proc_macro2::Spacing::Joint
                        && !matches!(p.as_char(), ',' | ';'),
                    second,
                    unary,
                }
            }
            TokenTree::Group(g) => {
                let inner = normalize_tokens(g.stream());
                match g.delimiter() {
                    Delimiter::Parenthesis => out.push_str(&format!("({inner})")),
                    Delimiter::Bracket => out.push_str(&format!("[{inner}]")),
                    Delimiter::Brace if inner.is_empty() => out.push_str("{}"),
                    Delimiter::Brace => out.push_str(&format!("{{ {inner} }}")),
                    Delimiter::None => out.push_str(&inner),
                }
                Last::Word
            }
            TokenTree::Ident(i) => {
                out.push_str(&i.to_string());
                Last::Word
            }
            TokenTree::Literal(l) => {
                out.push_str(&l.to_string());
                Last::Word
            }
        };
    }
}
