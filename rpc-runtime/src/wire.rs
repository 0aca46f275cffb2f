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

use core::marker::PhantomData;

use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, TryFromBytes};

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
    /// The handler's return value does not fit the reply buffer: a variable-length result
    /// longer than the service's `max_var_bytes` or the transport's reply capacity
    /// ([`crate::varlen`]); counted in [`crate::ServerStats::oversized_responses`].
    ResponseTooLarge = 7,
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
            7 => Status::ResponseTooLarge,
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
    /// A variable-length value's [`crate::varlen::WireSlice`] does not lie inside the
    /// message's data area, or its length is not a whole number of elements.
    #[error(
        "method {method_id}: slice at offset {off}, {len} bytes, does not lie in the {msg_len}-byte message's data area"
    )]
    BadSlice {
        /// Method id from the header.
        method_id: u16,
        /// The slice's offset from the message start, as received.
        off: u32,
        /// The slice's length in bytes, as received.
        len: u32,
        /// The message's length (header + body) in bytes.
        msg_len: usize,
    },
    /// A `&[T]` value's address is not a multiple of `align_of::<T>()`.
    #[error("method {method_id}: slice at address {addr:#x} is not aligned to {align} bytes")]
    Misaligned {
        /// Method id from the header.
        method_id: u16,
        /// `align_of::<T>()`.
        align: usize,
        /// The slice's address.
        addr: usize,
    },
    /// A `&str` value is not valid UTF-8.
    #[error("method {method_id}: string is not UTF-8 (valid up to byte {valid_up_to})")]
    BadUtf8 {
        /// Method id from the header.
        method_id: u16,
        /// Length of the valid UTF-8 prefix, in bytes.
        valid_up_to: usize,
    },
    /// A handler's return value does not fit the reply buffer (server side).
    #[error("method {method_id}: response of {len} bytes exceeds the {cap}-byte reply buffer")]
    ResponseTooLarge {
        /// Method id.
        method_id: u16,
        /// The response's length in bytes.
        len: usize,
        /// The reply buffer's capacity in bytes.
        cap: usize,
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
            WireError::ResponseTooLarge { .. } => Status::ResponseTooLarge,
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
    /// `None`; the value bytes are zero when sent, and ignored when received.
    None = 0,
    /// `Some(value)`.
    Some = 1,
}

/// The active side of a [`WireOption`] or [`WireResult`] holds bytes that are not a valid
/// value of its type (a bad `bool`, `char` or enum discriminant, or a bad nested tag).
///
/// The generated codec turns it into [`WireError::BadValue`]: a server answers the request
/// with [`Status::BadArguments`] (the client sees `RpcError::BadRequest`), a client reports
/// the response as `RpcError::BadResponse`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[error("the active side of an Option/Result holds an invalid value")]
pub struct InvalidValue;

/// Copies the bytes of `value` into a `B` of the same size (checked at compile time).
#[inline(always)]
fn to_bytes<T: IntoBytes + Immutable, B: FromBytes + IntoBytes>(value: &T) -> B {
    const {
        assert!(
            size_of::<T>() == size_of::<B>(),
            "byte storage must be size_of::<T>() bytes"
        )
    };
    let mut bytes = B::new_zeroed();
    // Both are `size_of::<T>()` bytes (asserted above), so this cannot panic.
    bytes.as_mut_bytes().copy_from_slice(value.as_bytes());
    bytes
}

/// Reads a `T` from the bytes of `bytes`, validating them.
#[inline(always)]
fn from_bytes<T: TryFromBytes, B: IntoBytes + Immutable>(bytes: &B) -> Result<T, InvalidValue> {
    T::try_read_from_bytes(bytes.as_bytes()).map_err(|_| InvalidValue)
}

/// The zerocopy form of `Option<T>`: a tag byte followed by `size_of::<T>()` bytes, packed,
/// `1 + size_of::<T>()` bytes. `#[rpc_service]` lowers `Option<T>` in signatures to this
/// type, with `B = [u8; size_of::<T>()]` (the value's storage); users never write it.
///
/// The value is kept as raw bytes so that `T` need not accept all-zero bytes (an enum
/// without a zero discriminant works): a `None` is sent with zeroed value bytes and received
/// with any value bytes (they are never read); a `Some` is sent as the value's bytes and
/// validated as a `T` only when raised ([`WireOption::try_into_option`]), which the
/// generated codec does for every request and response it decodes. Decoding the struct
/// itself (`TryFromBytes`) validates the tag only.
// `FromZeros` (all-zero bytes are `None`) implies `TryFromBytes`.
#[derive(FromZeros, IntoBytes, KnownLayout, Immutable)]
#[repr(C, packed)]
pub struct WireOption<T, B> {
    tag: OptionTag,
    value: B,
    _value: PhantomData<T>,
}

// `Copy` whatever `T` is: only the bytes are stored.
impl<T, B: Copy> Clone for WireOption<T, B> {
    #[inline(always)]
    fn clone(&self) -> Self {
        *self
    }
}
impl<T, B: Copy> Copy for WireOption<T, B> {}

impl<T: IntoBytes + Immutable, B: FromBytes + IntoBytes> WireOption<T, B> {
    /// Lowers an `Option`: the value's bytes after a `Some` tag, or zeros after a `None` tag.
    #[inline(always)]
    pub fn from_option(o: Option<T>) -> Self {
        match o {
            Some(value) => WireOption {
                tag: OptionTag::Some,
                value: to_bytes(&value),
                _value: PhantomData,
            },
            None => WireOption {
                tag: OptionTag::None,
                value: B::new_zeroed(),
                _value: PhantomData,
            },
        }
    }
}

impl<T: TryFromBytes, B: IntoBytes + Immutable + Copy> WireOption<T, B> {
    /// Raises back to an `Option`, validating the value bytes if the tag is `Some`.
    ///
    /// # Errors
    /// [`InvalidValue`] if the tag is `Some` and the bytes are not a valid `T`.
    #[inline(always)]
    pub fn try_into_option(self) -> Result<Option<T>, InvalidValue> {
        match self.tag {
            OptionTag::Some => {
                let value = self.value;
                from_bytes(&value).map(Some)
            }
            OptionTag::None => Ok(None),
        }
    }
}

/// Tag of [`WireResult`]: validated on decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromZeros, IntoBytes, KnownLayout, Immutable)]
#[repr(u8)]
pub enum ResultTag {
    /// `Ok(ok)`; the `err` bytes are zero when sent, and ignored when received.
    Ok = 0,
    /// `Err(err)`; the `ok` bytes are zero when sent, and ignored when received.
    Err = 1,
}

/// The zerocopy form of `Result<T, E>`: a tag byte, then `size_of::<T>()` bytes for the `Ok`
/// side, then `size_of::<E>()` bytes for the `Err` side, packed,
/// `1 + size_of::<T>() + size_of::<E>()` bytes. `#[rpc_service]` lowers `Result<T, E>` in
/// signatures to this type with `BT = [u8; size_of::<T>()]`, `BE = [u8; size_of::<E>()]`;
/// users never write it.
///
/// As in [`WireOption`], both sides are raw bytes: the inactive side is sent zeroed and never
/// read; the active side is validated when raised ([`WireResult::try_into_result`]), so
/// neither `T` nor `E` needs to accept all-zero bytes.
#[derive(TryFromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C, packed)]
pub struct WireResult<T, E, BT, BE> {
    tag: ResultTag,
    ok: BT,
    err: BE,
    _values: PhantomData<(T, E)>,
}

impl<T, E, BT: Copy, BE: Copy> Clone for WireResult<T, E, BT, BE> {
    #[inline(always)]
    fn clone(&self) -> Self {
        *self
    }
}
impl<T, E, BT: Copy, BE: Copy> Copy for WireResult<T, E, BT, BE> {}

impl<T, E, BT, BE> WireResult<T, E, BT, BE>
where
    T: IntoBytes + Immutable,
    E: IntoBytes + Immutable,
    BT: FromBytes + IntoBytes,
    BE: FromBytes + IntoBytes,
{
    /// Lowers a `Result`: the active side's bytes, the other side zeroed.
    #[inline(always)]
    pub fn from_result(r: Result<T, E>) -> Self {
        match r {
            Ok(ok) => WireResult {
                tag: ResultTag::Ok,
                ok: to_bytes(&ok),
                err: BE::new_zeroed(),
                _values: PhantomData,
            },
            Err(err) => WireResult {
                tag: ResultTag::Err,
                ok: BT::new_zeroed(),
                err: to_bytes(&err),
                _values: PhantomData,
            },
        }
    }
}

impl<T, E, BT, BE> WireResult<T, E, BT, BE>
where
    T: TryFromBytes,
    E: TryFromBytes,
    BT: IntoBytes + Immutable + Copy,
    BE: IntoBytes + Immutable + Copy,
{
    /// Raises back to a `Result`, validating the active side's bytes.
    ///
    /// # Errors
    /// [`InvalidValue`] if the active side's bytes are not a valid `T` (`Ok`) or `E` (`Err`).
    #[inline(always)]
    pub fn try_into_result(self) -> Result<Result<T, E>, InvalidValue> {
        match self.tag {
            ResultTag::Ok => {
                let ok = self.ok;
                from_bytes(&ok).map(Ok)
            }
            ResultTag::Err => {
                let err = self.err;
                from_bytes(&err).map(Err)
            }
        }
    }
}

// Equality, hashing and `Debug` use the raised values (an invalid active side is its own
// value, `Err(InvalidValue)`): the inactive side's bytes are not part of the value.
impl<T: TryFromBytes + PartialEq, B: IntoBytes + Immutable + Copy> PartialEq for WireOption<T, B> {
    fn eq(&self, other: &Self) -> bool {
        self.try_into_option() == other.try_into_option()
    }
}
impl<T: TryFromBytes + Eq, B: IntoBytes + Immutable + Copy> Eq for WireOption<T, B> {}
impl<T: TryFromBytes + std::hash::Hash, B: IntoBytes + Immutable + Copy> std::hash::Hash
    for WireOption<T, B>
{
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.try_into_option().hash(state)
    }
}
impl<T: TryFromBytes + std::fmt::Debug, B: IntoBytes + Immutable + Copy> std::fmt::Debug
    for WireOption<T, B>
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.try_into_option() {
            Ok(o) => f.debug_tuple("WireOption").field(&o).finish(),
            Err(e) => f.debug_tuple("WireOption").field(&e).finish(),
        }
    }
}

impl<T, E, BT, BE> PartialEq for WireResult<T, E, BT, BE>
where
    T: TryFromBytes + PartialEq,
    E: TryFromBytes + PartialEq,
    BT: IntoBytes + Immutable + Copy,
    BE: IntoBytes + Immutable + Copy,
{
    fn eq(&self, other: &Self) -> bool {
        self.try_into_result() == other.try_into_result()
    }
}
impl<T, E, BT, BE> Eq for WireResult<T, E, BT, BE>
where
    T: TryFromBytes + Eq,
    E: TryFromBytes + Eq,
    BT: IntoBytes + Immutable + Copy,
    BE: IntoBytes + Immutable + Copy,
{
}
impl<T, E, BT, BE> std::hash::Hash for WireResult<T, E, BT, BE>
where
    T: TryFromBytes + std::hash::Hash,
    E: TryFromBytes + std::hash::Hash,
    BT: IntoBytes + Immutable + Copy,
    BE: IntoBytes + Immutable + Copy,
{
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.try_into_result().hash(state)
    }
}
impl<T, E, BT, BE> std::fmt::Debug for WireResult<T, E, BT, BE>
where
    T: TryFromBytes + std::fmt::Debug,
    E: TryFromBytes + std::fmt::Debug,
    BT: IntoBytes + Immutable + Copy,
    BE: IntoBytes + Immutable + Copy,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.try_into_result() {
            Ok(r) => f.debug_tuple("WireResult").field(&r).finish(),
            Err(e) => f.debug_tuple("WireResult").field(&e).finish(),
        }
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
        type O = WireOption<u64, [u8; 8]>;
        let n = encode(3, 0, &O::from_option(Some(7u64)), &mut buf);
        assert_eq!(n, HEADER_BYTES + 9);
        let v: O = decode_response(3, &buf[..n]).unwrap();
        assert_eq!(v.try_into_option(), Ok(Some(7)));
        assert_eq!(
            decode_response::<O>(4, &buf[..n]),
            Err(WireError::MethodMismatch {
                expected: 4,
                got: 3
            })
        );
        assert!(matches!(
            decode_response::<O>(3, &buf[..n - 1]),
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
            decode_response::<O>(3, &buf[..n]),
            Err(WireError::BadValue { method_id: 3 })
        );
        let n = encode_status(3, Status::UnknownMethod, &mut buf);
        assert_eq!(
            decode_response::<O>(3, &buf[..n]),
            Err(WireError::Rejected {
                status: Some(Status::UnknownMethod),
                code: 1
            })
        );
    }

    #[test]
    fn result_lowering_roundtrip() {
        type R = WireResult<u32, [u8; 3], [u8; 4], [u8; 3]>;
        let ok = R::from_result(Ok(5));
        assert_eq!(size_of_val(&ok), 1 + 4 + 3);
        assert_eq!(ok.try_into_result(), Ok(Ok(5)));
        let err = R::from_result(Err([1, 2, 3]));
        assert_eq!(err.try_into_result(), Ok(Err([1, 2, 3])));
        let mut bytes = err.as_bytes().to_vec();
        assert_eq!(bytes, [1, 0, 0, 0, 0, 1, 2, 3]);
        bytes[0] = 9;
        assert!(R::try_read_from_bytes(&bytes[..]).is_err());
    }

    /// An enum without a zero discriminant: not `FromZeros`.
    #[derive(
        Clone, Copy, Debug, PartialEq, Eq, TryFromBytes, IntoBytes, KnownLayout, Immutable,
    )]
    #[repr(u8)]
    enum Color {
        Red = 1,
        Green = 2,
    }

    #[test]
    fn non_zero_values_validated_only_when_active() {
        type O = WireOption<Color, [u8; 1]>;
        type R = WireResult<Color, Color, [u8; 1], [u8; 1]>;
        assert_eq!(O::from_option(Some(Color::Green)).as_bytes(), [1, 2]);
        assert_eq!(O::from_option(None).as_bytes(), [0, 0]);
        assert_eq!(R::from_result(Ok(Color::Red)).as_bytes(), [0, 1, 0]);
        assert_eq!(R::from_result(Err(Color::Green)).as_bytes(), [1, 0, 2]);
        // Inactive sides are never read: any bytes.
        let none = O::try_read_from_bytes(&[0, 0xFF][..]).unwrap();
        assert_eq!(none.try_into_option(), Ok(None));
        let ok = R::try_read_from_bytes(&[0, 2, 0xFF][..]).unwrap();
        assert_eq!(ok.try_into_result(), Ok(Ok(Color::Green)));
        let err = R::try_read_from_bytes(&[1, 0xFF, 1][..]).unwrap();
        assert_eq!(err.try_into_result(), Ok(Err(Color::Red)));
        // Active sides are validated.
        for bad in [0u8, 3, 7, 0xFF] {
            let some = O::try_read_from_bytes(&[1, bad][..]).unwrap();
            assert_eq!(some.try_into_option(), Err(InvalidValue));
            let ok = R::try_read_from_bytes(&[0, bad, 1][..]).unwrap();
            assert_eq!(ok.try_into_result(), Err(InvalidValue));
            let err = R::try_read_from_bytes(&[1, 1, bad][..]).unwrap();
            assert_eq!(err.try_into_result(), Err(InvalidValue));
        }
        // The tags are still validated by the cast itself.
        assert!(O::try_read_from_bytes(&[2, 1][..]).is_err());
        assert!(R::try_read_from_bytes(&[2, 1, 1][..]).is_err());
        // Equality ignores the inactive side.
        assert_eq!(
            O::try_read_from_bytes(&[0, 0xFF][..]).unwrap(),
            O::from_option(None)
        );
    }
}
