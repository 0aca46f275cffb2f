//! The `#[rpc_service]` attribute macro. Use it through the `rpc` facade crate
//! (`use rpc::rpc_service;`), whose paths the generated code names.
//!
//! The crate is split like serde_derive or tarpc's plugin crate: `parse` reads the attribute
//! and the trait, `validate` checks them and builds the service model (collecting every
//! error, each spanned on the offending tokens), and `generate` emits the code.

mod expand;
mod generate;
mod parse;
mod validate;

#[cfg(test)]
mod tests;

use proc_macro::TokenStream;

/// Turns a trait into a typed RPC service.
///
/// ```ignore
/// use rpc::rpc_service;
///
/// #[rpc_service(transport = "delegation")]          // optional: , derive(Debug, PartialEq)
/// pub trait Kv {
///     /// Looks a key up.
///     fn get(&mut self, rank: u32, key: u64) -> Option<u64>;
///     fn put(&mut self, rank: u32, key: u64, value: u64); // no return type: `()`
/// }
/// ```
///
/// # Arguments
/// - `transport = "..."` or `transport = path::To::Type` (required): the default transport
///   of the generated client (`KvClient` is `KvClient<Type>`; `KvClient<T>` runs the same
///   service over any other transport `T`). A string names a built-in transport:
///   `delegation` (`rpc::delegation::Delegation`), `copyrpc` (`rpc::copyrpc::Copyrpc`),
///   `scalerpc` (`rpc::scalerpc::ScaleRpc`), `erpc` (`rpc::erpc::Erpc`, over UDP by default
///   or the mlx5 UD transport) and `ipc` (`rpc::ipc::Ipc`, per-client shared-memory rings).
///   A path (unquoted, without generic arguments: name a generic type through a type alias)
///   names any type implementing `rpc::ClientTransport`, e.g. one defined by the user; the
///   compiler reports on the path a type that does not implement it. A transport's own
///   errors reach the caller as `rpc::RpcError::Transport`.
/// - `derive(...)` (optional): extra derives for the argument structs and the request and
///   response enums (`Clone`, `Copy` and the zerocopy traits are always derived).
/// - `max_var_bytes = N` (optional, default `rpc::varlen::DEFAULT_MAX_VAR_BYTES`, 4096):
///   bytes of variable-length data (all `&[u8]`/`&str`/`&[T]` values of one request, or the
///   variable-length result, alignment padding included) one message may carry besides its
///   fixed part. Transports size their buffers from it and refuse at connect what they cannot
///   carry.
///
/// # Generated items (for a trait `Kv`, with the trait's visibility)
/// - `trait KvServer`: the trait's methods, docs and attributes; the server implements it.
///   The trait `Kv` itself is not emitted.
/// - Per method, `KvGetArgs` (`{Trait}{CamelMethod}Args`): the request body, a
///   `#[repr(C, packed)]` zerocopy struct with one `pub` field per argument in its wire form,
///   and one accessor per argument returning it as written.
///   A method with variable-length arguments gets instead an owned `KvPutArgs` (`String`,
///   `Vec<T>` for them; used by the request enum only) and a hidden wire struct.
/// - `enum KvRequest` (variants hold the argument structs; a constructor per method,
///   `KvRequest::get(rank, key)`) and `enum KvResponse` (variants hold the return values as
///   written; a variable-length result as its owned form). Both are `Copy` unless some method
///   is of variable length.
/// - `struct KvService`: method-id constants (`KvService::GET`, the declaration index),
///   `KvService::dispatch(&mut server, req) -> KvResponse`,
///   `KvService::dispatch_raw(&mut server, msg, out) -> Result<usize, WireError>` (the
///   zero-copy handler for `Server::serve_once_raw`/`spawn_raw`: decodes in place, borrows
///   variable-length arguments from the request, writes the result into the reply buffer),
///   and `impl rpc::Service` with the wire codec and the `DESCRIPTOR` (names, types, sizes,
///   fingerprint).
/// - `struct KvClient<T: rpc::ClientTransport = Default>` (`Default`: the `transport`
///   argument's type): `connect`, one blocking method
///   per RPC (`client.get(rank, key)?`), for a variable-length result also a lending one
///   (`client.get_with(key, |view| ..)?`, the result borrowed from the receive buffer),
///   `issue(tag)` returning `KvIssue` with one pipelined method per RPC
///   (`client.issue(tag).get(rank, key)?`), `issue_request`, `poll`, `poll_with`,
///   `in_flight`, `max_in_flight`, `transport`, `transport_mut`, `core`, `core_mut` (and
///   `poll_ref` when a result is of variable length).
///
/// # Variable-length arguments and results
/// A whole argument may be `&[u8]`, `&str`, `&[T]` (`T` a zerocopy type as below, alignment
/// at most 8) or an `Option` of one, written without a lifetime; any number of them, in any
/// position. The client stub writes them straight into the transport's send buffer; the
/// handler gets them borrowed from the receive buffer (`dispatch_raw`), checked: `&str` as
/// UTF-8, `&[T]` for bounds, alignment and valid elements (a violation is answered with
/// `BadArguments`). The whole return type may be `Vec<T>`, `String`, `&[T]`, `&str` (borrowed
/// from `&self`: elided lifetime) or an `Option` of one; the client gets it owned from the
/// blocking call and borrowed from `<method>_with`; such a service also gets
/// `enum KvResponseRef<'a>` (variable-length results borrowed) and `KvClient::poll_ref`, a
/// lending `poll_with` for pipelined calls. Owned `String`/`Vec<T>` arguments are
/// refused (write `&str`/`&[T]`), and so is a variable-length type inside an array, `Result`,
/// nested `Option` or struct, and `&mut` slices. Wire format: `rpc::varlen`.
///
/// # Types
/// Argument and return types are lowered to their wire form by how they are *written*:
/// `Option<T>` → `WireOption<T'>`, `Result<T, E>` → `WireResult<T', E'>`, `[T; N]` →
/// `[T'; N]`, any other type unchanged (`Option`/`Result` may be written with a
/// `std::option::`/`core::option::` prefix). A type alias of `Option`/`Result` is not seen
/// through: it is taken as an ordinary type and must itself be a zerocopy type. Every other
/// ("leaf") type must implement zerocopy's `IntoBytes`, `TryFromBytes`, `KnownLayout`,
/// `Immutable`, and `Copy`, inside an `Option` or `Result` too: a wire `Option`/`Result` holds
/// each side as raw bytes, sends the inactive side zeroed and never reads it, and validates
/// the active side when the request or response is decoded (an invalid one is a bad request
/// or response), so an enum without a zero variant works as `Option<E>`. References, slices, `impl Trait`, `dyn Trait`, pointers,
/// function pointers and tuples other than `()` are rejected, except the variable-length
/// forms above. `String`, `str` and `Vec<T>` (also written `std::string::String`,
/// `alloc::vec::Vec<T>`, ...) anywhere else get one error on the type saying where they are
/// allowed and suggesting a fixed-size array (`[u8; N]`, `[T; N]`). The check goes by name, so
/// a user type called `String` or `Vec` is taken for the standard one.
///
/// # Schema evolution
/// Every transport compares the client's and the server's schema fingerprint
/// (`DESCRIPTOR.fingerprint`, computed by `rpc::service::fingerprint`) at connect and refuses
/// the connection on a difference (`RpcError::SchemaMismatch`, naming both values). The
/// fingerprint covers what the bytes depend on (method order, and per method the argument
/// and return types as written and their wire sizes) plus the trait's and the methods' names.
/// - Compatible (old and new builds still connect): renaming an argument (`key` → `k`:
///   arguments travel by position), docs and attributes, `&self` ↔ `&mut self`, spacing,
///   `-> ()` written or left out.
/// - Incompatible (refused at connect): changing an argument's or the return type (also to
///   an alias or another spelling of the same type: only the text is seen), adding,
///   removing or reordering arguments or methods (a method id is its position), renaming a
///   method or the trait. Method names are kept on purpose although the bytes do not depend
///   on them: they bind a method id to its meaning, so swapping two methods of the same
///   signature is refused instead of running the wrong one. Swapping two arguments of the
///   same type is not detected.
///
/// # Rejected (compile errors)
/// Generic traits or methods, `where` clauses, supertraits, `unsafe`/`auto` traits,
/// associated types/consts/macros, default method bodies, `async`/`const`/`unsafe`/`extern`
/// or variadic methods, receivers other than `&self`/`&mut self` (or none), argument
/// patterns (`(a, b): (u32, u32)`, `_: u32`, `mut x`), duplicate argument names, methods whose
/// generated names collide (`get_value` and `getValue`), more than 65535 methods, reserved
/// names: the method names `connect`, `issue`, `issue_request`, `poll`, `poll_with`,
/// `in_flight`, `max_in_flight`, `transport`, `transport_mut`, `core`, `core_mut`, ...
/// (methods of `KvClient`), `<m>_with` when method `m` has a variable-length result, and
/// `descriptor` (its constant would hide `Service::DESCRIPTOR`), and any identifier starting
/// with `__rpc`.
#[proc_macro_attribute]
pub fn rpc_service(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::expand(attr.into(), item.into()).into()
}
