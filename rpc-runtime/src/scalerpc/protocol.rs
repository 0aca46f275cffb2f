//! ScaleRPC message formats (seeds/003 §5.1): the 32 B request header the client writes at
//! the start of a server pool slot, the 20 B response header the server writes at the start
//! of the client's response slot, and this implementation's 8 B trailer after each payload.
//!
//! All integers little-endian.
//!
//! **Request length (this implementation).** The seed's `payload_len` is a `u16`, which caps a
//! request at 65535 B whatever the slot size; the response's length is a `u32`. Requests
//! carry the high 16 bits of their length in the first two bytes of the seed's padding
//! (`payload_len_hi`), so a request is as large as its slot allows, like a response. A
//! request below 64 KiB has the seed's exact bytes (the padding stays zero).
//!
//! ```text
//! request  (pool slot):      magic 0xDEADBEEF u32 | req_id u64 | rpc_type u16 | payload_len u16
//!                            | client_slot_addr u64 | client_slot_rkey u32
//!                            | payload_len_hi u16 | 0 u16 (pad to 32)
//!                            | payload | trailer
//! response (client slot):    magic 0xBEEFDEAD u32 | req_id u64 | status u32 | payload_len u32
//!                            | payload | trailer
//! trailer (8 B, at 8-aligned offset after the payload): magic u32 | req_id low 32 bits
//! ```
//! **Trailer (this implementation).** The seed detects arrival by polling the header's magic.
//! Neither PCIe nor the verbs specification guarantees that a NIC places an RDMA WRITE's
//! bytes in increasing address order, so a reader polling the head could see a header before
//! its payload. The reader therefore polls the header, computes where the trailer is, and
//! accepts the message only once the trailer carries the same magic and request id; the
//! writer's last 8 bytes are the trailer (the device model stores a WRITE's last 8 bytes
//! with Release after the rest, as this requires).

/// Request magic (seeds/003 §5.1).
pub const REQUEST_MAGIC: u32 = 0xDEAD_BEEF;
/// Response magic (seeds/003 §5.1).
pub const RESPONSE_MAGIC: u32 = 0xBEEF_DEAD;
/// Bytes of the request header (seeds/003 §5.1 `REQUEST_HEADER_SIZE`).
pub const REQUEST_HEADER_SIZE: usize = 32;
/// Bytes of the response header (seeds/003 §5.1 `RESPONSE_HEADER_SIZE`).
pub const RESPONSE_HEADER_SIZE: usize = 20;
/// Bytes of the trailer that marks a complete message.
pub const TRAILER_SIZE: usize = 8;
/// Response status: success.
pub const STATUS_OK: u32 = 0;
/// Response status: the server refused the request (bad header for its slot).
pub const STATUS_REJECTED: u32 = 1;

/// Offset of the trailer of a message whose payload starts at `header` bytes and is `len`
/// bytes long: the payload end rounded up to 8.
#[inline(always)]
pub const fn trailer_offset(header: usize, len: usize) -> usize {
    (header + len + 7) & !7
}

/// Bytes a request with `len` payload bytes occupies in a slot (header, payload, trailer).
#[inline(always)]
pub const fn request_bytes(len: usize) -> usize {
    trailer_offset(REQUEST_HEADER_SIZE, len) + TRAILER_SIZE
}

/// Bytes a response with `len` payload bytes occupies in a slot.
#[inline(always)]
pub const fn response_bytes(len: usize) -> usize {
    trailer_offset(RESPONSE_HEADER_SIZE, len) + TRAILER_SIZE
}

/// The request header (seeds/003 §5.1 `RequestHeader`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestHeader {
    /// [`REQUEST_MAGIC`].
    pub magic: u32,
    /// Request id (per connection, increasing).
    pub req_id: u64,
    /// Caller-defined type.
    pub rpc_type: u16,
    /// Payload bytes: the low half at the seed's `payload_len`, the high half in
    /// `payload_len_hi` (module docs).
    pub payload_len: u32,
    /// Where the server writes the response (inside the client's registered response region).
    pub client_slot_addr: u64,
    /// The response region's rkey.
    pub client_slot_rkey: u32,
}

impl RequestHeader {
    /// Writes the 32 bytes.
    #[inline(always)]
    pub fn write(&self, b: &mut [u8]) {
        b[0..4].copy_from_slice(&self.magic.to_le_bytes());
        b[4..12].copy_from_slice(&self.req_id.to_le_bytes());
        b[12..14].copy_from_slice(&self.rpc_type.to_le_bytes());
        b[14..16].copy_from_slice(&(self.payload_len as u16).to_le_bytes());
        b[16..24].copy_from_slice(&self.client_slot_addr.to_le_bytes());
        b[24..28].copy_from_slice(&self.client_slot_rkey.to_le_bytes());
        b[28..30].copy_from_slice(&((self.payload_len >> 16) as u16).to_le_bytes());
        b[30..32].fill(0);
    }

    /// Reads the 32 bytes. Total: every bit pattern is a header (the reader checks the
    /// magic, the length against its slot, the trailer and the response address); the
    /// array type rules out a short input (issue 14).
    #[inline(always)]
    pub fn read(b: &[u8; REQUEST_HEADER_SIZE]) -> Self {
        RequestHeader {
            magic: u32::from_le_bytes(b[0..4].try_into().unwrap()),
            req_id: u64::from_le_bytes(b[4..12].try_into().unwrap()),
            rpc_type: u16::from_le_bytes(b[12..14].try_into().unwrap()),
            payload_len: u32::from(u16::from_le_bytes(b[14..16].try_into().unwrap()))
                | (u32::from(u16::from_le_bytes(b[28..30].try_into().unwrap())) << 16),
            client_slot_addr: u64::from_le_bytes(b[16..24].try_into().unwrap()),
            client_slot_rkey: u32::from_le_bytes(b[24..28].try_into().unwrap()),
        }
    }
}

/// The response header (seeds/003 §5.1 `ResponseHeader`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResponseHeader {
    /// [`RESPONSE_MAGIC`].
    pub magic: u32,
    /// The request's id.
    pub req_id: u64,
    /// [`STATUS_OK`] or an error code.
    pub status: u32,
    /// Payload bytes.
    pub payload_len: u32,
}

impl ResponseHeader {
    /// Writes the 20 bytes.
    #[inline(always)]
    pub fn write(&self, b: &mut [u8]) {
        b[0..4].copy_from_slice(&self.magic.to_le_bytes());
        b[4..12].copy_from_slice(&self.req_id.to_le_bytes());
        b[12..16].copy_from_slice(&self.status.to_le_bytes());
        b[16..20].copy_from_slice(&self.payload_len.to_le_bytes());
    }

    /// Reads the 20 bytes. Total: every bit pattern is a header (the reader checks the
    /// magic, request id, length and trailer); the array type rules out a short input
    /// (issue 14).
    #[inline(always)]
    pub fn read(b: &[u8; RESPONSE_HEADER_SIZE]) -> Self {
        ResponseHeader {
            magic: u32::from_le_bytes(b[0..4].try_into().unwrap()),
            req_id: u64::from_le_bytes(b[4..12].try_into().unwrap()),
            status: u32::from_le_bytes(b[12..16].try_into().unwrap()),
            payload_len: u32::from_le_bytes(b[16..20].try_into().unwrap()),
        }
    }
}

/// The trailer value of a message: `magic | (req_id as u32) << 32`.
#[inline(always)]
pub const fn trailer(magic: u32, req_id: u64) -> u64 {
    magic as u64 | ((req_id as u32 as u64) << 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_offsets() {
        assert_eq!(request_bytes(0), 40);
        assert_eq!(request_bytes(1), 48);
        assert_eq!(request_bytes(8), 48);
        assert_eq!(response_bytes(0), 32);
        assert_eq!(response_bytes(4), 32);
        assert_eq!(response_bytes(5), 40);
    }

    #[test]
    fn headers_round_trip_at_the_seed_offsets() {
        let h = RequestHeader {
            magic: REQUEST_MAGIC,
            req_id: 0x0102_0304_0506_0708,
            rpc_type: 7,
            payload_len: 300,
            client_slot_addr: 0xdead_0000,
            client_slot_rkey: 0x42,
        };
        let mut b = [0xffu8; 32];
        h.write(&mut b);
        assert_eq!(&b[0..4], &[0xef, 0xbe, 0xad, 0xde]);
        assert_eq!(b[4], 8);
        assert_eq!(&b[14..16], &[0x2c, 1]);
        assert_eq!(&b[28..32], &[0, 0, 0, 0]);
        assert_eq!(RequestHeader::read(&b), h);
        // A request of 64 KiB or more carries its high half in the seed's padding.
        let big = RequestHeader {
            payload_len: 0x0001_0008,
            ..h
        };
        big.write(&mut b);
        assert_eq!(&b[14..16], &[8, 0]);
        assert_eq!(&b[28..32], &[1, 0, 0, 0]);
        assert_eq!(RequestHeader::read(&b), big);
        let r = ResponseHeader {
            magic: RESPONSE_MAGIC,
            req_id: 9,
            status: STATUS_OK,
            payload_len: 12,
        };
        let mut b = [0u8; RESPONSE_HEADER_SIZE];
        r.write(&mut b);
        assert_eq!(ResponseHeader::read(&b), r);
        assert_eq!(trailer(REQUEST_MAGIC, 0x1_0000_0005), 0x0000_0005_dead_beef);
    }

    /// Property tests over arbitrary bytes (issue 14 §4): a pool slot is written by the
    /// client, a response slot by the server, each over RDMA. 256 cases by default;
    /// `PROPTEST_CASES=<n>` runs more (proptest reads the variable itself).
    mod props {
        use proptest::prelude::*;

        use super::*;

        proptest! {
            /// Any 32 bytes read as a request header keep every field: writing it back gives
            /// the input with only the pad (30..32) zeroed.
            #[test]
            fn request_header_over_arbitrary_bytes(b in any::<[u8; REQUEST_HEADER_SIZE]>()) {
                let h = RequestHeader::read(&b);
                let mut out = [0xffu8; REQUEST_HEADER_SIZE];
                h.write(&mut out);
                let mut want = b;
                want[30..].fill(0);
                prop_assert_eq!(out, want);
            }

            /// Any 20 bytes read as a response header round-trip exactly.
            #[test]
            fn response_header_over_arbitrary_bytes(b in any::<[u8; RESPONSE_HEADER_SIZE]>()) {
                let h = ResponseHeader::read(&b);
                let mut out = [0u8; RESPONSE_HEADER_SIZE];
                h.write(&mut out);
                prop_assert_eq!(out, b);
            }

            /// The sizes computed from a length the peer wrote (any `u32` request length,
            /// any `u32` response length) never overflow, put the trailer 8-aligned right
            /// after the payload, and grow with the length.
            #[test]
            fn sizes_from_arbitrary_lengths(req in any::<u32>(), resp in any::<u32>()) {
                let (req, resp) = (req as usize, resp as usize);
                let t = trailer_offset(REQUEST_HEADER_SIZE, req);
                prop_assert!(t.is_multiple_of(8) && t >= REQUEST_HEADER_SIZE + req && t < REQUEST_HEADER_SIZE + req + 8);
                prop_assert_eq!(request_bytes(req), t + TRAILER_SIZE);
                let t = trailer_offset(RESPONSE_HEADER_SIZE, resp);
                prop_assert!(t.is_multiple_of(8) && t >= RESPONSE_HEADER_SIZE + resp && t < RESPONSE_HEADER_SIZE + resp + 8);
                prop_assert_eq!(response_bytes(resp), t + TRAILER_SIZE);
                prop_assert!(request_bytes(req) <= request_bytes(req + 1));
            }
        }
    }
}
