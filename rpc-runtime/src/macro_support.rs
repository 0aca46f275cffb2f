//! Compile-time checks and helpers used only by code that `#[rpc_service]` generates.
//!
//! For every "leaf" type of a signature (a type that is not `Option`, `Result` or an array,
//! after those are peeled off), the macro emits one check per required trait, spanned at the
//! type as written, as the fields of a never-constructed struct placed before everything
//! else it generates:
//!
//! ```ignore
//! const _: () = {
//!     #[allow(dead_code)]
//!     struct __RpcChecks(
//!         ::rpc::__private::AssertIntoBytes<MyType>,
//!         ::rpc::__private::AssertTryFromBytes<MyType>,
//!         // ... AssertKnownLayout, AssertImmutable, AssertCopy,
//!         // and AssertFromZeros for leaves inside an `Option`/`Result`.
//!     );
//! };
//! ```
//!
//! Each check is bounded by a wrapper trait that is implemented for exactly the types that
//! implement the real trait and carries a `#[diagnostic::on_unimplemented]` message; the
//! blanket impl is `#[diagnostic::do_not_recommend]`, so rustc reports the wrapper (our
//! message, naming the type and the missing trait, pointing at the type) instead of listing
//! every type that does implement zerocopy's trait.
//!
//! Struct fields rather than `const fn` calls:
//! rustc checks item signatures, in order, before it type-checks bodies, so these errors come
//! *first*, before the follow-on errors of the generated code that uses the type (the zerocopy
//! derives on the argument struct, `Copy` on the request enum, the codec calls).

use core::marker::PhantomData;

use zerocopy::{FromZeros, Immutable, IntoBytes, KnownLayout, TryFromBytes};

/// Implemented for `T: zerocopy::IntoBytes` (encoding copies the value's bytes).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used in an `#[rpc_service]` signature: it does not implement `zerocopy::IntoBytes`",
    label = "`{Self}` is not `IntoBytes`",
    note = "arguments and return values are sent as their bytes: each must be a zerocopy type, e.g. a `#[repr(C)]` struct with `#[derive(zerocopy::TryFromBytes, zerocopy::IntoBytes, zerocopy::KnownLayout, zerocopy::Immutable, Clone, Copy)]` and no padding"
)]
pub trait RpcIntoBytes {}

#[diagnostic::do_not_recommend]
impl<T: ?Sized + IntoBytes> RpcIntoBytes for T {}

/// Well-formed only if `T: IntoBytes`; never constructed.
pub struct AssertIntoBytes<T: ?Sized + RpcIntoBytes>(PhantomData<T>);

/// Implemented for `T: zerocopy::TryFromBytes` (decoding is a validated cast).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used in an `#[rpc_service]` signature: it does not implement `zerocopy::TryFromBytes`",
    label = "`{Self}` is not `TryFromBytes`",
    note = "received bytes are checked and cast to the argument or return type: it must `#[derive(zerocopy::TryFromBytes)]` (with `IntoBytes`, `KnownLayout`, `Immutable`, `Clone`, `Copy`)"
)]
pub trait RpcTryFromBytes {}

#[diagnostic::do_not_recommend]
impl<T: ?Sized + TryFromBytes> RpcTryFromBytes for T {}

/// Well-formed only if `T: TryFromBytes`; never constructed.
pub struct AssertTryFromBytes<T: ?Sized + RpcTryFromBytes>(PhantomData<T>);

/// Implemented for `T: zerocopy::KnownLayout`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used in an `#[rpc_service]` signature: it does not implement `zerocopy::KnownLayout`",
    label = "`{Self}` is not `KnownLayout`",
    note = "add `zerocopy::KnownLayout` to the type's derives (with `TryFromBytes`, `IntoBytes`, `Immutable`, `Clone`, `Copy`)"
)]
pub trait RpcKnownLayout {}

#[diagnostic::do_not_recommend]
impl<T: ?Sized + KnownLayout> RpcKnownLayout for T {}

/// Well-formed only if `T: KnownLayout`; never constructed.
pub struct AssertKnownLayout<T: ?Sized + RpcKnownLayout>(PhantomData<T>);

/// Implemented for `T: zerocopy::Immutable` (no interior mutability).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used in an `#[rpc_service]` signature: it does not implement `zerocopy::Immutable`",
    label = "`{Self}` is not `Immutable`",
    note = "add `zerocopy::Immutable` to the type's derives; types with interior mutability (`Cell`, atomics) cannot be sent"
)]
pub trait RpcImmutable {}

#[diagnostic::do_not_recommend]
impl<T: ?Sized + Immutable> RpcImmutable for T {}

/// Well-formed only if `T: Immutable`; never constructed.
pub struct AssertImmutable<T: ?Sized + RpcImmutable>(PhantomData<T>);

/// Implemented for `T: Copy` (requests and responses are `Copy` values).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used in an `#[rpc_service]` signature: it does not implement `Copy`",
    label = "`{Self}` is not `Copy`",
    note = "requests and responses are `Copy` values: add `#[derive(Clone, Copy)]` to the type"
)]
pub trait RpcCopy {}

#[diagnostic::do_not_recommend]
impl<T: Copy> RpcCopy for T {}

/// Well-formed only if `T: Copy`; never constructed.
pub struct AssertCopy<T: ?Sized + RpcCopy>(PhantomData<T>);

/// Implemented for `T: zerocopy::FromZeros` (required inside `Option`/`Result`).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used inside an `Option` or `Result` in an `#[rpc_service]` signature: it does not implement `zerocopy::FromZeros`",
    label = "`{Self}` is not `FromZeros`",
    note = "`Option<T>` and `Result<T, E>` are sent as a tag plus both sides, the inactive side zeroed, so `T` and `E` must `#[derive(zerocopy::FromZeros)]` (all-zero bytes must be a valid value)"
)]
pub trait RpcFromZeros {}

#[diagnostic::do_not_recommend]
impl<T: ?Sized + FromZeros> RpcFromZeros for T {}

/// Well-formed only if `T: FromZeros`; never constructed.
pub struct AssertFromZeros<T: ?Sized + RpcFromZeros>(PhantomData<T>);

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, FromZeros, IntoBytes, KnownLayout, Immutable)]
    #[repr(C)]
    struct Point {
        x: u32,
        y: u32,
    }

    #[allow(dead_code)]
    struct Checks(
        AssertIntoBytes<Point>,
        AssertTryFromBytes<[Point; 2]>,
        AssertKnownLayout<Point>,
        AssertImmutable<Point>,
        AssertCopy<Point>,
        AssertFromZeros<Point>,
        AssertTryFromBytes<bool>,
        AssertFromZeros<char>,
        AssertIntoBytes<[u8; 3]>,
        AssertCopy<()>,
    );
}
