//! Variable-length arguments and results: their wire layout and codec (issue 15).
//!
//! A method whose signature has a `&[u8]`, `&str` or `&[T]` argument, or returns `Vec<u8>`,
//! `String`, `Vec<T>`, `&[u8]`, `&str`, `&[T]` (or an `Option` of one of these), sends a
//! message of variable length. Its layout extends the fixed one of [`crate::wire`]:
//!
//! | offset | size | what |
//! |---|---|---|
//! | 0 | 8 B | [`crate::wire::MsgHeader`]; `len` covers everything after it |
//! | 8 | `size_of::<W>()` | the fixed part `W`: the method's wire argument struct, each variable-length argument replaced by a [`WireSlice`] (8 B); for a response, one [`WireSlice`] |
//! | `8 + size_of::<W>()` | rest | the data area: each slice's elements, in argument order, each starting at the next multiple of `align_of::<T>()` counted from the message start |
//!
//! A [`WireSlice`] holds the byte offset of its data **from the start of the message** and its
//! length **in bytes**. Offsets are explicit (not implied by the order) so that a receiver
//! checks each slice on its own: a slice must lie inside the data area of the message as the
//! header bounds it, its length must be a whole number of elements, its address must be
//! aligned for `T` (transports hand out message buffers aligned to 8 B, see
//! [`MAX_SLICE_ALIGN`]), and its elements must be valid `T`s (`&str`: valid UTF-8). Any
//! failure is a [`WireError`]; a server answers it with [`crate::wire::Status::BadArguments`]
//! and counts it ([`crate::ServerStats::bad_requests`]), a client reports the response as
//! [`crate::RpcError::BadResponse`]. Decoding borrows the slices from the receive buffer: no
//! copy, no allocation.
//!
//! `Option<V>` of a variable-length `V` is a [`WireSlice`] too: [`WireSlice::NONE`] (offset 0,
//! inside the header, so never the offset of data) is `None`.
//!
//! # Size limit
//! Each method's largest message is its fixed part plus the service's `max_var_bytes` (the
//! `#[rpc_service(max_var_bytes = N)]` argument, default [`DEFAULT_MAX_VAR_BYTES`]) of data
//! area, alignment padding included; the service descriptor carries it
//! ([`crate::MethodDescriptor::request_bytes`]), every transport sizes its buffers from the
//! descriptor and checks at connect that it can carry it. A client checks the length before
//! sending anything ([`crate::RpcError::MessageTooLarge`]); a server whose handler returns
//! more than fits answers [`crate::wire::Status::ResponseTooLarge`] instead.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, TryFromBytes};

use crate::wire::{self, HEADER_BYTES, MsgHeader, WireError};

/// Bytes of variable-length data (all slices of one message, alignment padding included) a
/// service allows per request and per response unless `#[rpc_service(max_var_bytes = N)]`
/// says otherwise: 4 KiB, the slot size of seeds/003 §9 (`DEFAULT_SLOT_SIZE`), which keeps
/// every transport's default buffers small (a delegation or ipc client holds 32 response
/// slots, a ScaleRPC server 8448 slots).
pub const DEFAULT_MAX_VAR_BYTES: usize = 4096;

/// Largest `align_of::<T>()` of a `&[T]` element: every transport hands the decoder message
/// buffers whose start is aligned to 8 B (the macro refuses larger alignments at compile time).
pub const MAX_SLICE_ALIGN: usize = 8;

/// Where one variable-length value lies in its message: `off` bytes from the message start,
/// `len` bytes long. 8 bytes, native-endian, any bit pattern valid.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
#[repr(C)]
pub struct WireSlice {
    /// Offset of the first byte from the start of the message (header included), in bytes.
    pub off: u32,
    /// Length in bytes (a multiple of `size_of::<T>()`).
    pub len: u32,
}

impl WireSlice {
    /// `None` of an `Option<V>`: offset 0 is inside the header, so no data starts there.
    pub const NONE: WireSlice = WireSlice { off: 0, len: 0 };
}

/// A heap byte buffer whose start is aligned to [`MAX_SLICE_ALIGN`] (8) bytes: the private
/// copy a shared-memory transport makes of a request, so that `&[T]` arguments borrowed from
/// it are aligned. Derefs to `len` bytes.
#[derive(Debug, Default)]
pub struct AlignedBuf {
    words: Box<[u64]>,
    len: usize,
}

impl AlignedBuf {
    /// `len` zeroed bytes.
    pub fn new(len: usize) -> Self {
        AlignedBuf {
            words: vec![0u64; len.div_ceil(8)].into_boxed_slice(),
            len,
        }
    }
}

impl core::ops::Deref for AlignedBuf {
    type Target = [u8];
    #[inline(always)]
    fn deref(&self) -> &[u8] {
        &self.words.as_bytes()[..self.len]
    }
}

impl core::ops::DerefMut for AlignedBuf {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.words.as_mut_bytes()[..self.len]
    }
}

/// `msg` itself if it starts on a [`MAX_SLICE_ALIGN`] boundary, else a copy of it in
/// `scratch` (grown on first use), so that slices aligned from the message start are aligned
/// in memory. Transports whose message buffers are not 8-byte aligned (copyrpc places a
/// payload 12 B after its 32 B-aligned message header, seeds/001) cost one copy for
/// variable-length messages; the others none.
#[inline(always)]
pub fn realign<'a>(msg: &'a [u8], scratch: &'a mut AlignedBuf) -> &'a [u8] {
    if (msg.as_ptr() as usize).is_multiple_of(MAX_SLICE_ALIGN) {
        msg
    } else {
        copy_aligned(msg, scratch)
    }
}

#[cold]
fn copy_aligned<'a>(msg: &[u8], scratch: &'a mut AlignedBuf) -> &'a [u8] {
    if scratch.len() < msg.len() {
        *scratch = AlignedBuf::new(msg.len());
    }
    scratch[..msg.len()].copy_from_slice(msg);
    &scratch[..msg.len()]
}

/// `n` rounded up to a multiple of `align` (a power of two).
#[inline(always)]
const fn align_up(n: usize, align: usize) -> usize {
    (n + align - 1) & !(align - 1)
}

/// The message length after appending `elems` elements of `T` at `end` (aligned for `T`),
/// saturating: the length check that follows refuses a saturated length.
#[inline(always)]
pub fn var_end<T>(end: usize, elems: usize) -> usize {
    align_up(end, align_of::<T>()).saturating_add(elems.saturating_mul(size_of::<T>()))
}

/// [`var_end`] for an `Option` of a slice (`None` adds nothing).
#[inline(always)]
pub fn var_end_opt<T>(end: usize, v: Option<&[T]>) -> usize {
    match v {
        Some(s) => var_end::<T>(end, s.len()),
        None => end,
    }
}

/// Writes a variable-length message into a transport's buffer: the data area first
/// ([`VarWriter::put`]), then the header and fixed part ([`VarWriter::finish`]).
///
/// The caller computed the message's length with [`var_end`] and checked it against the
/// buffer (the client against the method's limit, before sending; the server against its
/// reply buffer), so the writes are in bounds; an out-of-bounds write is a bug in the caller
/// and panics on the slice index, never writes past the buffer.
pub struct VarWriter<'a> {
    out: &'a mut [u8],
    end: usize,
}

impl<'a> VarWriter<'a> {
    /// A writer whose data area starts at `fixed_end` (header + fixed part, in bytes).
    #[inline(always)]
    pub fn new(out: &'a mut [u8], fixed_end: usize) -> Self {
        VarWriter {
            out,
            end: fixed_end,
        }
    }

    /// Copies `data` into the data area, aligned for `T`; returns its [`WireSlice`].
    #[inline(always)]
    pub fn put<T: IntoBytes + Immutable>(&mut self, data: &[T]) -> WireSlice {
        let off = align_up(self.end, align_of::<T>());
        let bytes = data.as_bytes();
        let end = off + bytes.len();
        self.out[off..end].copy_from_slice(bytes);
        self.end = end;
        WireSlice {
            off: off as u32,
            len: bytes.len() as u32,
        }
    }

    /// [`VarWriter::put`] for an `Option` ([`WireSlice::NONE`] for `None`).
    #[inline(always)]
    pub fn put_opt<T: IntoBytes + Immutable>(&mut self, data: Option<&[T]>) -> WireSlice {
        match data {
            Some(d) => self.put(d),
            None => WireSlice::NONE,
        }
    }

    /// Writes the header (`method_id`, `status`, body length) and the fixed part `fixed`;
    /// returns the message length in bytes.
    #[inline(always)]
    pub fn finish<W: IntoBytes + Immutable>(self, method_id: u16, status: u16, fixed: &W) -> usize {
        let hdr = MsgHeader {
            method_id,
            status,
            len: (self.end - HEADER_BYTES) as u32,
        };
        self.out[..HEADER_BYTES].copy_from_slice(hdr.as_bytes());
        let fixed = fixed.as_bytes();
        self.out[HEADER_BYTES..HEADER_BYTES + fixed.len()].copy_from_slice(fixed);
        self.end
    }
}

/// Decodes the fixed part `W` of a variable-length message whose header `hdr` was read from
/// `msg`; returns it with the message cut to its length (`HEADER_BYTES + hdr.len`), which the
/// slice readers check offsets against.
///
/// # Errors
/// [`WireError::BadLength`] if the body is shorter than `W`; [`WireError::BadValue`] if the
/// fixed part is not a valid `W`; [`WireError::Truncated`] if `msg` is shorter than the header
/// says.
#[inline(always)]
pub fn decode_fixed<W: TryFromBytes + KnownLayout + Immutable>(
    hdr: MsgHeader,
    msg: &[u8],
) -> Result<(W, &[u8]), WireError> {
    let len = hdr.len as usize;
    if len < size_of::<W>() {
        return Err(WireError::BadLength {
            method_id: hdr.method_id,
            got: len,
            expected: size_of::<W>(),
        });
    }
    let Some(msg) = msg.get(..HEADER_BYTES + len) else {
        return Err(WireError::Truncated {
            got: msg.len(),
            need: HEADER_BYTES + len,
        });
    };
    match W::try_read_from_bytes(&msg[HEADER_BYTES..HEADER_BYTES + size_of::<W>()]) {
        Ok(w) => Ok((w, msg)),
        Err(_) => Err(WireError::BadValue {
            method_id: hdr.method_id,
        }),
    }
}

/// Borrows the `[T]` that `s` describes from `msg` (a message cut by [`decode_fixed`]), whose
/// data area starts at `data_start` (header + fixed part).
///
/// # Errors
/// [`WireError::BadSlice`] if the slice does not lie inside the data area or its length is
/// not a whole number of `T`; [`WireError::Misaligned`] if its address is not aligned for
/// `T`; [`WireError::BadValue`] if an element is not a valid `T`.
#[inline(always)]
pub fn read_slice<T: TryFromBytes + KnownLayout + Immutable>(
    msg: &[u8],
    data_start: usize,
    s: WireSlice,
    method_id: u16,
) -> Result<&[T], WireError> {
    let (off, len) = (s.off as usize, s.len as usize);
    let end = off as u64 + len as u64;
    if off < data_start || end > msg.len() as u64 || !len.is_multiple_of(size_of::<T>().max(1)) {
        return Err(bad_slice(method_id, s, msg.len()));
    }
    let bytes = &msg[off..off + len];
    if !(bytes.as_ptr() as usize).is_multiple_of(align_of::<T>()) {
        return Err(misaligned::<T>(method_id, bytes.as_ptr()));
    }
    <[T]>::try_ref_from_bytes(bytes).map_err(|_| WireError::BadValue { method_id })
}

/// [`read_slice`] of an `Option`: [`WireSlice::NONE`] is `None`.
///
/// # Errors
/// As [`read_slice`].
#[inline(always)]
pub fn read_opt_slice<T: TryFromBytes + KnownLayout + Immutable>(
    msg: &[u8],
    data_start: usize,
    s: WireSlice,
    method_id: u16,
) -> Result<Option<&[T]>, WireError> {
    if s == WireSlice::NONE {
        return Ok(None);
    }
    read_slice(msg, data_start, s, method_id).map(Some)
}

/// Borrows the `str` that `s` describes from `msg` (see [`read_slice`]).
///
/// # Errors
/// As [`read_slice`], and [`WireError::BadUtf8`] if the bytes are not UTF-8.
#[inline(always)]
pub fn read_str(
    msg: &[u8],
    data_start: usize,
    s: WireSlice,
    method_id: u16,
) -> Result<&str, WireError> {
    let bytes = read_slice::<u8>(msg, data_start, s, method_id)?;
    core::str::from_utf8(bytes).map_err(|e| bad_utf8(method_id, e))
}

/// [`read_str`] of an `Option`: [`WireSlice::NONE`] is `None`.
///
/// # Errors
/// As [`read_str`].
#[inline(always)]
pub fn read_opt_str(
    msg: &[u8],
    data_start: usize,
    s: WireSlice,
    method_id: u16,
) -> Result<Option<&str>, WireError> {
    if s == WireSlice::NONE {
        return Ok(None);
    }
    read_str(msg, data_start, s, method_id).map(Some)
}

/// Reads a variable-length response to a call of `method_id`: checks the header (status,
/// echoed method) and returns the response's [`WireSlice`] with the message cut to its length.
///
/// # Errors
/// [`WireError::Rejected`] for an error status, [`WireError::MethodMismatch`], and those of
/// [`decode_fixed`].
#[inline(always)]
pub fn read_var_response(method_id: u16, msg: &[u8]) -> Result<(WireSlice, &[u8]), WireError> {
    let hdr = wire::read_header(msg)?;
    wire::check_response_header(method_id, hdr)?;
    decode_fixed::<WireSlice>(hdr, msg)
}

/// Start of a variable-length response's data area: header + one [`WireSlice`].
pub const RESPONSE_DATA_START: usize = HEADER_BYTES + size_of::<WireSlice>();

#[cold]
fn bad_slice(method_id: u16, s: WireSlice, msg_len: usize) -> WireError {
    WireError::BadSlice {
        method_id,
        off: s.off,
        len: s.len,
        msg_len,
    }
}

#[cold]
fn misaligned<T>(method_id: u16, p: *const u8) -> WireError {
    WireError::Misaligned {
        method_id,
        align: align_of::<T>(),
        addr: p as usize,
    }
}

#[cold]
fn bad_utf8(method_id: u16, e: core::str::Utf8Error) -> WireError {
    WireError::BadUtf8 {
        method_id,
        valid_up_to: e.valid_up_to(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An 8-byte-aligned message buffer, as transports provide.
    #[repr(C, align(8))]
    struct Buf([u8; 256]);

    fn message(key: &str, words: &[u64]) -> (Buf, usize) {
        let mut buf = Buf([0; 256]);
        let fixed_end = HEADER_BYTES + size_of::<[WireSlice; 2]>();
        let mut w = VarWriter::new(&mut buf.0, fixed_end);
        let k = w.put(key.as_bytes());
        let v = w.put(words);
        let n = w.finish(3, 0, &[k, v]);
        assert_eq!(
            n,
            var_end::<u64>(var_end::<u8>(fixed_end, key.len()), words.len())
        );
        (buf, n)
    }

    #[test]
    fn round_trip_borrows_aligned_slices() {
        let (buf, n) = message("héllo", &[1, 2, 3]);
        let hdr = wire::read_request_header(&buf.0[..n]).unwrap();
        let ([k, v], msg) = decode_fixed::<[WireSlice; 2]>(hdr, &buf.0[..n]).unwrap();
        let start = HEADER_BYTES + 16;
        assert_eq!(read_str(msg, start, k, 3).unwrap(), "héllo");
        assert_eq!(read_slice::<u64>(msg, start, v, 3).unwrap(), &[1, 2, 3]);
        assert_eq!(v.off % 8, 0, "u64 data is aligned from the message start");
    }

    #[test]
    fn empty_values_and_none() {
        let (buf, n) = message("", &[]);
        let hdr = wire::read_header(&buf.0[..n]).unwrap();
        let ([k, v], msg) = decode_fixed::<[WireSlice; 2]>(hdr, &buf.0[..n]).unwrap();
        assert_eq!(read_str(msg, 24, k, 3).unwrap(), "");
        assert!(read_slice::<u64>(msg, 24, v, 3).unwrap().is_empty());
        assert_eq!(read_opt_str(msg, 24, WireSlice::NONE, 3).unwrap(), None);
        assert_eq!(read_opt_slice::<u8>(msg, 24, k, 3).unwrap(), Some(&[][..]));
    }

    #[test]
    fn lying_descriptors_are_errors() {
        let (buf, n) = message("abc", &[7]);
        let msg = &buf.0[..n];
        let start = HEADER_BYTES + 16;
        // Past the end, overflowing, inside the fixed part, not whole elements, misaligned.
        for (s, want) in [
            (
                WireSlice {
                    off: n as u32 - 2,
                    len: 3,
                },
                "slice",
            ),
            (
                WireSlice {
                    off: u32::MAX,
                    len: u32::MAX,
                },
                "slice",
            ),
            (WireSlice { off: 4, len: 4 }, "slice"),
            (WireSlice { off: 32, len: 12 }, "slice"),
            (WireSlice { off: 28, len: 8 }, "align"),
        ] {
            let e = read_slice::<u64>(msg, start, s, 3).unwrap_err();
            match (want, e) {
                ("slice", WireError::BadSlice { .. }) | ("align", WireError::Misaligned { .. }) => {
                }
                _ => panic!("{s:?}: {e:?}"),
            }
        }
        let bad = WireSlice { off: 24, len: 2 };
        let mut raw = buf.0;
        raw[24] = 0xc3; // a lone lead byte
        raw[25] = b'(';
        assert!(matches!(
            read_str(&raw[..n], start, bad, 3),
            Err(WireError::BadUtf8 {
                method_id: 3,
                valid_up_to: 0
            })
        ));
        // A `bool` slice with a byte that is no bool.
        raw[24] = 2;
        assert!(matches!(
            read_slice::<bool>(&raw[..n], start, bad, 3),
            Err(WireError::BadValue { method_id: 3 })
        ));
    }

    #[test]
    fn fixed_part_must_fit_the_body() {
        let (buf, _) = message("abc", &[7]);
        let hdr = MsgHeader {
            method_id: 3,
            status: 0,
            len: 8,
        };
        assert!(matches!(
            decode_fixed::<[WireSlice; 2]>(hdr, &buf.0),
            Err(WireError::BadLength { expected: 16, .. })
        ));
        let hdr = MsgHeader { len: 1000, ..hdr };
        assert!(matches!(
            decode_fixed::<[WireSlice; 2]>(hdr, &buf.0),
            Err(WireError::Truncated { need: 1008, .. })
        ));
    }
}
