//! The transport-independent message format and the zerocopy lowering of `Option`/`Result`.
//!
//! Every message, request or response, is an 8-byte [`MsgHeader`] followed by `len` body bytes:
//!
//! | offset | size | field       | request                | response                           |
//! |--------|------|-------------|------------------------|------------------------------------|
//! | 0      | 2 B  | `method_id` | method called          | method answered (echoed)           |
//! | 2      | 2 B  | `status`    | 0                      | [`Status`]: 0 ok, else an error    |
//! | 4      | 4 B  | `len`       | argument struct bytes  | return value bytes (0 on error)    |
//! | 8      | len  | body        | `<Method>Args` bytes   | lowered return type bytes          |
//!
//! All integers are native-endian: every transport in this project connects machines of one
//! architecture (x86-64 or aarch64 clusters, both little-endian).
//!
//! Encoding is a copy of the argument struct's bytes (`IntoBytes`); decoding is a validated cast
//! (`TryFromBytes::try_read_from_bytes`), so a malformed body (bad `bool`, bad `char`, bad enum
//! tag, wrong length) is a [`WireError`], never undefined behaviour. The body length must equal
//! the size the receiver's schema expects exactly, which also catches most schema mismatches
//! that slipped past the attach-time fingerprint check.

use zerocopy::{FromZeros, Immutable, IntoBytes, KnownLayout, TryFromBytes};

/// Size of [`MsgHeader`] in bytes.
pub const HEADER_BYTES: usize = 8;

/// The 8-byte header in front of every request and response body (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, TryFromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct MsgHeader {
    /// Method id: the method's index in the service trait, in declaration order.
    pub method_id: u16,
    /// 0 in requests; a [`Status`] code in responses.
    pub status: u16,
    /// Body length in bytes.
    pub len: u32,
}

/// Response status codes carried in [`MsgHeader::status`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Status {
    /// The body holds the method's return value.
    Ok = 0,
    /// The server does not know the request's method id.
    UnknownMethod = 1,
    /// The request's body length differs from the argument struct's size.
    BadLength = 2,
    /// The request's body is not a valid value of the argument struct (bad `bool`, `char`,
    /// enum or `Option`/`Result` tag).
    BadArguments = 3,
    /// The request was too short to hold a header.
    Truncated = 4,
    /// A forwarder could not deliver the request: its target rank or shard does not exist,
    /// no connection leads there, or that connection failed (seeds/004 §4 forwarding,
    /// [`crate::delegation::forward`]).
    Unreachable = 5,
    /// A forwarder received a response it could not pass on: malformed, or larger than the
    /// caller's response slot or allowance ([`crate::delegation::forward`]).
    BadForwardedResponse = 6,
}

impl Status {
    /// Maps a wire code to a status; `None` for codes this build does not know.
    #[inline]
    pub fn from_code(code: u16) -> Option<Self> {
        Some(match code {
            0 => Status::Ok,
            1 => Status::UnknownMethod,
            2 => Status::BadLength,
            3 => Status::BadArguments,
            4 => Status::Truncated,
            5 => Status::Unreachable,
            6 => Status::BadForwardedResponse,
            _ => return None,
        })
    }
}

/// Why a message could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Fewer than [`HEADER_BYTES`] bytes, or fewer body bytes than the header's `len`.
    #[error("message truncated: {got} bytes, need {need}")]
    Truncated {
        /// Bytes available.
        got: usize,
        /// Bytes required.
        need: usize,
    },
    /// The method id is not part of this service.
    #[error("unknown method id {0}")]
    UnknownMethod(u16),
    /// The body length differs from the size the schema expects for this method.
    #[error("method {method_id}: body is {got} bytes, schema expects {expected}")]
    BadLength {
        /// Method id from the header.
        method_id: u16,
        /// Body length from the header.
        got: usize,
        /// `size_of` the argument (or lowered return) type.
        expected: usize,
    },
    /// The body bytes are not a valid value of the expected type.
    #[error("method {method_id}: invalid body bytes (bad bool, char or tag)")]
    BadValue {
        /// Method id from the header.
        method_id: u16,
    },
    /// A request carried a non-zero status (only responses do): not a request.
    #[error("method {method_id}: request carries status {code} (only responses carry a status)")]
    NotARequest {
        /// Method id from the header.
        method_id: u16,
        /// The status field's value.
        code: u16,
    },
    /// A response answered a different method than the one called.
    #[error("response for method {got}, but method {expected} was called")]
    MethodMismatch {
        /// Method id the call was issued with.
        expected: u16,
        /// Method id in the response header.
        got: u16,
    },
    /// The server answered with an error status (see [`Status`]); `code` is the raw value.
    #[error("server rejected the request: {status:?} (code {code})")]
    Rejected {
        /// Decoded status, `None` if this build does not know the code.
        status: Option<Status>,
        /// Raw status code.
        code: u16,
    },
}

impl WireError {
    /// The status a server answers with when a request fails to decode with this error.
    #[inline]
    pub fn status(&self) -> Status {
        match self {
            WireError::Truncated { .. } => Status::Truncated,
            WireError::UnknownMethod(_) => Status::UnknownMethod,
            WireError::BadLength { .. } => Status::BadLength,
            _ => Status::BadArguments,
        }
    }
}

/// Reads the header at the start of `msg`.
///
/// # Errors
/// [`WireError::Truncated`] if `msg` is shorter than [`HEADER_BYTES`] or than the header's
/// `len` says.
#[inline]
pub fn read_header(msg: &[u8]) -> Result<MsgHeader, WireError> {
    let Ok((hdr, rest)) = MsgHeader::try_read_from_prefix(msg) else {
        return Err(WireError::Truncated {
            got: msg.len(),
            need: HEADER_BYTES,
        });
    };
    if rest.len() < hdr.len as usize {
        return Err(WireError::Truncated {
            got: msg.len(),
            need: HEADER_BYTES + hdr.len as usize,
        });
    }
    Ok(hdr)
}

/// Reads the header of a request: [`read_header`], and the status field must be 0.
///
/// # Errors
/// Those of [`read_header`]; [`WireError::NotARequest`] for a non-zero status.
#[inline]
pub fn read_request_header(msg: &[u8]) -> Result<MsgHeader, WireError> {
    let hdr = read_header(msg)?;
    if hdr.status != 0 {
        return Err(not_a_request(hdr));
    }
    Ok(hdr)
}

#[cold]
fn not_a_request(hdr: MsgHeader) -> WireError {
    WireError::NotARequest {
        method_id: hdr.method_id,
        code: hdr.status,
    }
}

/// Writes header + `body` into `out` and returns the message length in bytes
/// (`HEADER_BYTES + size_of::<B>()`).
///
/// # Panics
/// If `out` is shorter than the message. Transports size their buffers from
/// [`crate::ServiceDescriptor::max_request_bytes`]/`max_response_bytes`, which bound every
/// body of the service, so this is a bug in the caller, not bad input.
#[inline(always)]
pub fn encode<B: IntoBytes + Immutable>(
    method_id: u16,
    status: u16,
    body: &B,
    out: &mut [u8],
) -> usize {
    let body = body.as_bytes();
    let hdr = MsgHeader {
        method_id,
        status,
        len: body.len() as u32,
    };
    let total = HEADER_BYTES + body.len();
    out[..HEADER_BYTES].copy_from_slice(hdr.as_bytes());
    out[HEADER_BYTES..total].copy_from_slice(body);
    total
}

/// Writes a body-less error response for `method_id` with `status`; returns [`HEADER_BYTES`].
#[inline]
pub fn encode_status(method_id: u16, status: Status, out: &mut [u8]) -> usize {
    let hdr = MsgHeader {
        method_id,
        status: status as u16,
        len: 0,
    };
    out[..HEADER_BYTES].copy_from_slice(hdr.as_bytes());
    HEADER_BYTES
}

/// Decodes the body of a message whose header `hdr` was read by [`read_header`] from `msg`,
/// as a `B` (validated cast: the bytes are copied, then checked).
///
/// # Errors
/// [`WireError::BadLength`] if `hdr.len != size_of::<B>()`; [`WireError::BadValue`] if the
/// bytes are not a valid `B`.
#[inline(always)]
pub fn decode_body<B: TryFromBytes + KnownLayout + Immutable>(
    hdr: MsgHeader,
    msg: &[u8],
) -> Result<B, WireError> {
    let len = hdr.len as usize;
    if len != size_of::<B>() {
        return Err(WireError::BadLength {
            method_id: hdr.method_id,
            got: len,
            expected: size_of::<B>(),
        });
    }
    match msg.get(HEADER_BYTES..HEADER_BYTES + len) {
        Some(body) => B::try_read_from_bytes(body).map_err(|_| WireError::BadValue {
            method_id: hdr.method_id,
        }),
        None => Err(WireError::Truncated {
            got: msg.len(),
            need: HEADER_BYTES + len,
        }),
    }
}

/// Decodes a response to a call of `method_id`: checks the status and the echoed method id,
/// then decodes the body as `R`.
///
/// # Errors
/// [`WireError::Rejected`] for a non-zero status, [`WireError::MethodMismatch`], and the errors
/// of [`read_header`] and [`decode_body`].
#[inline(always)]
pub fn decode_response<R: TryFromBytes + KnownLayout + Immutable>(
    method_id: u16,
    msg: &[u8],
) -> Result<R, WireError> {
    let hdr = read_header(msg)?;
    check_response_header(method_id, hdr)?;
    decode_body(hdr, msg)
}

/// Checks a response header's status and echoed method id (see [`decode_response`]).
#[inline(always)]
pub fn check_response_header(method_id: u16, hdr: MsgHeader) -> Result<(), WireError> {
    if hdr.status != 0 {
        return Err(rejected(hdr.status));
    }
    if hdr.method_id != method_id {
        return Err(WireError::MethodMismatch {
            expected: method_id,
            got: hdr.method_id,
        });
    }
    Ok(())
}

#[cold]
fn rejected(code: u16) -> WireError {
    WireError::Rejected {
        status: Status::from_code(code),
        code,
    }
}

/// Tag of [`WireOption`]: validated on decode (any other byte is [`WireError::BadValue`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromZeros, IntoBytes, KnownLayout, Immutable)]
#[repr(u8)]
pub enum OptionTag {
    /// `None`; the value bytes are all zero.
    None = 0,
    /// `Some(value)`.
    Some = 1,
}

/// The zerocopy form of `Option<T>`: a tag byte followed by `T` (zeroed when `None`), packed,
/// `1 + size_of::<T>()` bytes. All-zero bytes are `None`, so it is `FromZeros` and nests. `#[rpc_service]` lowers `Option<T>` in signatures to this type;
/// users never write it.
#[derive(Clone, Copy, Debug, FromZeros, IntoBytes, KnownLayout, Immutable)]
#[repr(C, packed)]
pub struct WireOption<T> {
    tag: OptionTag,
    value: T,
}

impl<T: FromZeros + Copy> WireOption<T> {
    /// Lowers an `Option`.
    #[inline(always)]
    pub fn from_option(o: Option<T>) -> Self {
        match o {
            Some(value) => WireOption {
                tag: OptionTag::Some,
                value,
            },
            None => WireOption {
                tag: OptionTag::None,
                value: T::new_zeroed(),
            },
        }
    }
}

impl<T: Copy> WireOption<T> {
    /// Raises back to an `Option`.
    #[inline(always)]
    pub fn into_option(self) -> Option<T> {
        match self.tag {
            OptionTag::Some => Some(self.value),
            OptionTag::None => None,
        }
    }
}

/// Tag of [`WireResult`]: validated on decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromZeros, IntoBytes, KnownLayout, Immutable)]
#[repr(u8)]
pub enum ResultTag {
    /// `Ok(ok)`; the `err` bytes are zero.
    Ok = 0,
    /// `Err(err)`; the `ok` bytes are zero.
    Err = 1,
}

/// The zerocopy form of `Result<T, E>`: a tag byte, then `T`, then `E` (the inactive one
/// zeroed), packed, `1 + size_of::<T>() + size_of::<E>()` bytes. `#[rpc_service]` lowers
/// `Result<T, E>` in signatures to this type; users never write it.
#[derive(Clone, Copy, Debug, FromZeros, IntoBytes, KnownLayout, Immutable)]
#[repr(C, packed)]
pub struct WireResult<T, E> {
    tag: ResultTag,
    ok: T,
    err: E,
}

impl<T: FromZeros + Copy, E: FromZeros + Copy> WireResult<T, E> {
    /// Lowers a `Result`.
    #[inline(always)]
    pub fn from_result(r: Result<T, E>) -> Self {
        match r {
            Ok(ok) => WireResult {
                tag: ResultTag::Ok,
                ok,
                err: E::new_zeroed(),
            },
            Err(err) => WireResult {
                tag: ResultTag::Err,
                ok: T::new_zeroed(),
                err,
            },
        }
    }
}

impl<T: Copy, E: Copy> WireResult<T, E> {
    /// Raises back to a `Result`.
    #[inline(always)]
    pub fn into_result(self) -> Result<T, E> {
        match self.tag {
            ResultTag::Ok => Ok(self.ok),
            ResultTag::Err => Err(self.err),
        }
    }
}

// Equality and hashing use the raised values: a validated decode does not require the inactive
// side to be zero, so comparing raw fields would be wrong.
impl<T: Copy + PartialEq> PartialEq for WireOption<T> {
    fn eq(&self, other: &Self) -> bool {
        self.into_option() == other.into_option()
    }
}
impl<T: Copy + Eq> Eq for WireOption<T> {}
impl<T: Copy + std::hash::Hash> std::hash::Hash for WireOption<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.into_option().hash(state)
    }
}

impl<T: Copy + PartialEq, E: Copy + PartialEq> PartialEq for WireResult<T, E> {
    fn eq(&self, other: &Self) -> bool {
        self.into_result() == other.into_result()
    }
}
impl<T: Copy + Eq, E: Copy + Eq> Eq for WireResult<T, E> {}
impl<T: Copy + std::hash::Hash, E: Copy + std::hash::Hash> std::hash::Hash for WireResult<T, E> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.into_result().hash(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout_is_8_bytes_native_endian() {
        let h = MsgHeader {
            method_id: 0x0102,
            status: 0x0304,
            len: 0x0506_0708,
        };
        assert_eq!(h.as_bytes().len(), HEADER_BYTES);
        let mut expect = Vec::new();
        expect.extend_from_slice(&0x0102u16.to_ne_bytes());
        expect.extend_from_slice(&0x0304u16.to_ne_bytes());
        expect.extend_from_slice(&0x0506_0708u32.to_ne_bytes());
        assert_eq!(h.as_bytes(), &expect[..]);
    }

    #[test]
    fn roundtrip_and_errors() {
        let mut buf = [0u8; 64];
        let n = encode(3, 0, &WireOption::from_option(Some(7u64)), &mut buf);
        assert_eq!(n, HEADER_BYTES + 9);
        let v: WireOption<u64> = decode_response(3, &buf[..n]).unwrap();
        assert_eq!(v.into_option(), Some(7));
        assert_eq!(
            decode_response::<WireOption<u64>>(4, &buf[..n]),
            Err(WireError::MethodMismatch {
                expected: 4,
                got: 3
            })
        );
        assert!(matches!(
            decode_response::<WireOption<u64>>(3, &buf[..n - 1]),
            Err(WireError::Truncated { .. })
        ));
        assert!(matches!(
            decode_response::<u64>(3, &buf[..n]),
            Err(WireError::BadLength {
                expected: 8,
                got: 9,
                ..
            })
        ));
        buf[HEADER_BYTES] = 2; // invalid Option tag
        assert_eq!(
            decode_response::<WireOption<u64>>(3, &buf[..n]),
            Err(WireError::BadValue { method_id: 3 })
        );
        let n = encode_status(3, Status::UnknownMethod, &mut buf);
        assert_eq!(
            decode_response::<WireOption<u64>>(3, &buf[..n]),
            Err(WireError::Rejected {
                status: Some(Status::UnknownMethod),
                code: 1
            })
        );
    }

    #[test]
    fn result_lowering_roundtrip() {
        let ok: WireResult<u32, [u8; 3]> = WireResult::from_result(Ok(5));
        assert_eq!(size_of_val(&ok), 1 + 4 + 3);
        assert_eq!(ok.into_result(), Ok(5));
        let err: WireResult<u32, [u8; 3]> = WireResult::from_result(Err([1, 2, 3]));
        assert_eq!(err.into_result(), Err([1, 2, 3]));
        let mut bytes = err.as_bytes().to_vec();
        bytes[0] = 9;
        assert!(WireResult::<u32, [u8; 3]>::try_read_from_bytes(&bytes[..]).is_err());
    }
}
