//! [`Refused`]: a call an RC transport did not issue, with the caller's user data handed
//! back. copyrpc's [`crate::copyrpc::CallError`] and ScaleRPC's
//! [`crate::scalerpc::ScaleCallError`] are this type over each transport's own reasons
//! ([`crate::copyrpc::CallErrorKind`], [`crate::scalerpc::ScaleCallErrorKind`]).

use std::fmt;

/// A call that was not issued: why (`kind`, a small `Copy` enum of the transport's
/// reasons) and the caller's user data (`user`), handed back so that nothing the caller
/// attached to the call is lost.
///
/// Match on it as a struct, e.g. `Err(CallError { kind: CallErrorKind::RingFull, user })`.
/// Displays as its `kind`; [`std::error::Error::source`] is `None` (the kind is the whole
/// message).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused<K, U> {
    /// Why the call was not issued.
    pub kind: K,
    /// The caller's user data, handed back.
    pub user: U,
}

impl<K, U> Refused<K, U> {
    /// A refusal for `kind`, handing `user` back.
    #[inline]
    pub fn new(kind: K, user: U) -> Self {
        Refused { kind, user }
    }

    /// The user data handed back.
    #[inline]
    pub fn into_inner(self) -> U {
        self.user
    }
}

impl<K: fmt::Display, U> fmt::Display for Refused<K, U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.kind.fmt(f)
    }
}

impl<K: std::error::Error, U: fmt::Debug> std::error::Error for Refused<K, U> {}
