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
//!         // ... AssertKnownLayout, AssertImmutable, AssertCopy.
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
use core::mem::MaybeUninit;

use zerocopy::{Immutable, IntoBytes, KnownLayout, TryFromBytes};

use crate::RpcError;
use crate::client::BLOCKING_TAG;
use crate::wire::{InvalidValue, WireError, WireOption, WireResult};

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

/// Raises a [`WireOption`] whose value is itself lowered: validates the tag's active side as
/// `T`, then raises it with `raise`.
///
/// # Errors
/// [`InvalidValue`] if the `Some` side is not a valid `T` or `raise` fails.
#[inline(always)]
pub fn raise_option<T, B, U>(
    wire: WireOption<T, B>,
    raise: impl FnOnce(T) -> Result<U, InvalidValue>,
) -> Result<Option<U>, InvalidValue>
where
    T: TryFromBytes,
    B: IntoBytes + Immutable + Copy,
{
    match wire.try_into_option()? {
        Some(value) => raise(value).map(Some),
        None => Ok(None),
    }
}

/// Raises a [`WireResult`] whose sides are lowered: validates the active side, then raises
/// it with `raise_ok` or `raise_err`.
///
/// # Errors
/// [`InvalidValue`] if the active side is not a valid value or its raise fails.
#[inline(always)]
pub fn raise_result<T, E, BT, BE, U, F>(
    wire: WireResult<T, E, BT, BE>,
    raise_ok: impl FnOnce(T) -> Result<U, InvalidValue>,
    raise_err: impl FnOnce(E) -> Result<F, InvalidValue>,
) -> Result<Result<U, F>, InvalidValue>
where
    T: TryFromBytes,
    E: TryFromBytes,
    BT: IntoBytes + Immutable + Copy,
    BE: IntoBytes + Immutable + Copy,
{
    match wire.try_into_result()? {
        Ok(ok) => raise_ok(ok).map(Ok),
        Err(err) => raise_err(err).map(Err),
    }
}

/// Raises every element of an array of lowered values with `raise`, stopping at the first
/// invalid one. No allocation.
///
/// # Errors
/// [`InvalidValue`] if `raise` fails for any element.
#[inline(always)]
pub fn raise_array<T, U: Copy, const N: usize>(
    wire: [T; N],
    mut raise: impl FnMut(T) -> Result<U, InvalidValue>,
) -> Result<[U; N], InvalidValue> {
    let mut out = [const { MaybeUninit::<U>::uninit() }; N];
    for (slot, value) in out.iter_mut().zip(wire) {
        slot.write(raise(value)?);
    }
    // SAFETY: both iterators have N items, so the loop wrote every element of `out` (an early
    // return leaves nothing to drop: `U: Copy`). `MaybeUninit<U>` has the size, alignment
    // and ABI of `U`, so `[MaybeUninit<U>; N]` has the layout of `[U; N]`.
    Ok(unsafe { core::mem::transmute_copy::<[MaybeUninit<U>; N], [U; N]>(&out) })
}

/// Reached by an argument accessor (`<Method>Args::arg()`) whose `Option`/`Result` argument
/// holds an invalid active side: possible only for an argument struct cast from bytes by
/// hand, since the generated `rpc::Service::decode_request` validates every argument (and
/// rejects the request with `WireError::BadValue`) before a request reaches `dispatch`.
#[cold]
#[inline(never)]
#[track_caller]
pub fn unvalidated_argument(_: InvalidValue) -> ! {
    panic!(
        "argument struct holds an invalid Option/Result value: it was not decoded by \
         rpc::Service::decode_request, which validates every argument"
    )
}

/// The error of a blocking call whose response carries an invalid `Option`/`Result` value:
/// `RpcError::BadResponse` with [`WireError::BadValue`], as for any undecodable response.
#[cold]
#[inline(never)]
pub fn bad_response_value(method: &'static str, method_id: u16) -> RpcError {
    RpcError::from_wire(BLOCKING_TAG, method, WireError::BadValue { method_id })
}

#[cfg(test)]
mod tests {
    use super::*;

    use zerocopy::FromZeros;

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
        AssertTryFromBytes<bool>,
        AssertKnownLayout<char>,
        AssertIntoBytes<[u8; 3]>,
        AssertCopy<()>,
    );

    #[derive(Clone, Copy, Debug, PartialEq, TryFromBytes, IntoBytes, KnownLayout, Immutable)]
    #[repr(u8)]
    enum Color {
        Red = 1,
        Green = 2,
    }

    type O = WireOption<Color, [u8; 1]>;

    #[test]
    fn raise_helpers_validate_nested_active_sides() {
        let ok = |c: Color| Ok(c);
        // [Option<Color>; 3]
        let arr = [
            O::from_option(Some(Color::Red)),
            O::from_option(None),
            O::from_option(Some(Color::Green)),
        ];
        let raised = raise_array(arr, |w| w.try_into_option());
        assert_eq!(raised, Ok([Some(Color::Red), None, Some(Color::Green)]));
        let mut bad = arr;
        bad[2] = O::try_read_from_bytes(&[1, 0][..]).unwrap();
        assert_eq!(raise_array(bad, |w| w.try_into_option()), Err(InvalidValue));
        assert_eq!(raise_array([(); 0], |()| Ok(1u8)), Ok([]));
        // Option<Option<Color>>
        type OO = WireOption<O, [u8; 2]>;
        let some_none = OO::from_option(Some(O::from_option(None)));
        assert_eq!(some_none.as_bytes(), [1, 0, 0]);
        let raise = |w: OO| raise_option(w, |o: O| o.try_into_option());
        assert_eq!(raise(some_none), Ok(Some(None)));
        assert_eq!(
            raise(OO::try_read_from_bytes(&[1, 1, 2][..]).unwrap()),
            Ok(Some(Some(Color::Green)))
        );
        assert_eq!(
            raise(OO::try_read_from_bytes(&[0, 9, 9][..]).unwrap()),
            Ok(None)
        );
        assert_eq!(
            raise(OO::try_read_from_bytes(&[1, 1, 0][..]).unwrap()),
            Err(InvalidValue)
        );
        // An invalid inner tag is caught when the outer side is raised.
        assert_eq!(
            raise(OO::try_read_from_bytes(&[1, 5, 1][..]).unwrap()),
            Err(InvalidValue)
        );
        // Result<Option<Color>, Color>
        type R = WireResult<O, Color, [u8; 2], [u8; 1]>;
        let raise = |w: R| raise_result(w, |o: O| o.try_into_option(), ok);
        assert_eq!(
            raise(R::from_result(Ok(O::from_option(Some(Color::Red))))),
            Ok(Ok(Some(Color::Red)))
        );
        assert_eq!(
            raise(R::from_result(Err(Color::Green))),
            Ok(Err(Color::Green))
        );
        assert_eq!(
            raise(R::try_read_from_bytes(&[1, 0xFF, 0xFF, 1][..]).unwrap()),
            Ok(Err(Color::Red))
        );
        assert_eq!(
            raise(R::try_read_from_bytes(&[0, 1, 7, 1][..]).unwrap()),
            Err(InvalidValue)
        );
        assert_eq!(
            raise(R::try_read_from_bytes(&[1, 1, 1, 0][..]).unwrap()),
            Err(InvalidValue)
        );
    }
}
