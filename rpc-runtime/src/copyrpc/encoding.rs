//! copyrpc wire format: the immediate value, the 32 B flow metadata that opens every batch,
//! the 12 B message header and 32 B alignment (seeds/001 "ワイヤフォーマット", seeds/004 §3.3).
//!
//! All integers are little-endian. A batch, as one RDMA WRITE+IMM lands it in the peer's
//! receive ring:
//!
//! ```text
//! +0   flow metadata (32 B): ring_credit_return u64 | credit_grant u64 | message_count u32 | 0 (12 B)
//! +32  message 1: call_id u32 | piggyback u32 | payload_len u32 | payload | zero padding to 32 B
//! ...  message 2 ..
//! ```
//! The immediate is the batch's length in 32 B units. A batch whose `message_count` is
//! [`WRAP_MESSAGE_COUNT`] is a wrap marker: its immediate covers the rest of the ring, and the
//! next batch starts at ring offset 0.
//!
//! # Large messages (rendezvous; issue 15, an extension of seeds/004 §3.9's raw READ)
//! A message too large for the ring travels as a [`Descriptor`] message: `payload_len` is
//! [`RENDEZVOUS_FLAG`]` | 16` and the 16 B payload names `len` bytes in a buffer of the sender
//! registered for remote read. The receiver RDMA-READs them into a buffer of its own and then
//! delivers the message like an inline one. It reports each READ it completed in
//! [`FlowMetadata::reads_done`] of a later batch (bytes 20..24 of the metadata, zero in the
//! seed's format), in the order the descriptors arrived, so that the sender reuses the buffer.
//! A request whose caller accepts a rendezvous response sets [`LARGE_RESPONSE_FLAG`] in its
//! piggyback; the low 31 bits stay the credit in 32 B units.

/// Every message and every ring position is a multiple of this many bytes (seeds/001 定数).
pub const ALIGNMENT: u64 = 32;
/// Bytes of a message header: call_id, piggyback, payload_len (seeds/004 §3.3).
pub const HEADER_SIZE: usize = 12;
/// Bytes of the flow metadata that opens each batch (seeds/004 §3.3).
pub const FLOW_METADATA_SIZE: u64 = 32;
/// Set in `call_id` of a response (seeds/001: MSB of call_id).
pub const RESPONSE_FLAG: u32 = 0x8000_0000;
/// `message_count` of a wrap marker (seeds/001: `u32::MAX` sentinel).
pub const WRAP_MESSAGE_COUNT: u32 = u32::MAX;
/// Largest call id a request may carry (the MSB is the response flag).
pub const MAX_CALL_ID: u32 = RESPONSE_FLAG - 1;
/// Set in `payload_len` of a rendezvous message: the payload is a [`Descriptor`] (module docs).
pub const RENDEZVOUS_FLAG: u32 = 0x8000_0000;
/// Set in a request's `piggyback`: the caller accepts a rendezvous response (module docs).
pub const LARGE_RESPONSE_FLAG: u32 = 0x8000_0000;
/// Bytes of a [`Descriptor`].
pub const DESCRIPTOR_SIZE: usize = 16;
/// A rendezvous message carries more than this many bytes: anything up to it is always sent
/// inline (a descriptor naming fewer is refused as [`super::ProtocolError::BadDescriptor`]).
pub const RENDEZVOUS_MIN: u32 = 256;
/// Largest inline response to a call that accepts a rendezvous response, in bytes: such a
/// call reserves [`internal_allowance`] of this much credit (4 KiB), whatever its response
/// size; longer responses are sent by rendezvous. Lowered to the endpoint's
/// [`super::EndpointCore::max_payload`] on small rings.
pub const LARGE_INLINE_RESPONSE: u32 = 4096 - FLOW_METADATA_SIZE as u32 - HEADER_SIZE as u32;

/// The immediate of a WRITE+IMM covering `delta` bytes (a multiple of [`ALIGNMENT`]):
/// `delta / 32`, so 32 bits cover up to 128 GiB (seeds/001 "Immediate Value").
#[inline(always)]
pub const fn encode_imm(delta: u64) -> u32 {
    (delta / ALIGNMENT) as u32
}

/// Bytes announced by immediate `imm`: `imm * 32`.
#[inline(always)]
pub const fn decode_imm(imm: u32) -> u64 {
    imm as u64 * ALIGNMENT
}

/// `x` rounded up to a multiple of [`ALIGNMENT`].
#[inline(always)]
pub const fn align_up(x: u64) -> u64 {
    (x + ALIGNMENT - 1) & !(ALIGNMENT - 1)
}

/// Ring bytes a message with `payload_len` payload bytes occupies:
/// `ceil((12 + payload_len) / 32) * 32` (0 → 32, 20 → 32, 21 → 64, 52 → 64; seeds/001 "パディング").
#[inline(always)]
pub const fn padded_message_size(payload_len: u64) -> u64 {
    align_up(HEADER_SIZE as u64 + payload_len)
}

/// Credit a caller reserves for a response of up to `response_allowance` payload bytes: the
/// padded response plus one flow metadata, for the batch (or wrap marker) the responder may
/// have to open for it (seeds/004 §3.4 "call() 時のクレジット消費").
#[inline(always)]
pub const fn internal_allowance(response_allowance: u64) -> u64 {
    align_up(padded_message_size(response_allowance) + FLOW_METADATA_SIZE)
}

/// Whether `call_id` is a response's.
#[inline(always)]
pub const fn is_response(call_id: u32) -> bool {
    call_id & RESPONSE_FLAG != 0
}

/// The response id of request `call_id`.
#[inline(always)]
pub const fn to_response_id(call_id: u32) -> u32 {
    call_id | RESPONSE_FLAG
}

/// The request id a response id answers.
#[inline(always)]
pub const fn from_response_id(call_id: u32) -> u32 {
    call_id & !RESPONSE_FLAG
}

/// The 32 B flow metadata at the start of each batch (seeds/004 §3.3 "フロー制御メタデータ").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowMetadata {
    /// Bytes of the sender's receive ring consumed since the sender last reported; the peer
    /// adds it to its view of that ring's consumer position.
    pub ring_credit_return: u64,
    /// Response credit, in bytes, newly granted to the peer (a multiple of 32).
    pub credit_grant: u64,
    /// Messages in the batch; [`WRAP_MESSAGE_COUNT`] marks a wrap.
    pub message_count: u32,
    /// Rendezvous messages of the peer whose bytes the sender finished reading since it last
    /// reported (bytes 20..24; module docs).
    pub reads_done: u32,
}

impl FlowMetadata {
    /// Writes the 32 bytes (padding zeroed).
    #[inline(always)]
    pub fn write(&self, b: &mut [u8; FLOW_METADATA_SIZE as usize]) {
        b[0..8].copy_from_slice(&self.ring_credit_return.to_le_bytes());
        b[8..16].copy_from_slice(&self.credit_grant.to_le_bytes());
        b[16..20].copy_from_slice(&self.message_count.to_le_bytes());
        b[20..24].copy_from_slice(&self.reads_done.to_le_bytes());
        b[24..32].fill(0);
    }

    /// Reads the 32 bytes (padding ignored).
    #[inline(always)]
    pub fn read(b: &[u8; FLOW_METADATA_SIZE as usize]) -> Self {
        FlowMetadata {
            ring_credit_return: u64::from_le_bytes(b[0..8].try_into().unwrap()),
            credit_grant: u64::from_le_bytes(b[8..16].try_into().unwrap()),
            message_count: u32::from_le_bytes(b[16..20].try_into().unwrap()),
            reads_done: u32::from_le_bytes(b[20..24].try_into().unwrap()),
        }
    }

    /// Whether this is a wrap marker.
    #[inline(always)]
    pub fn is_wrap(&self) -> bool {
        self.message_count == WRAP_MESSAGE_COUNT
    }
}

/// The payload of a rendezvous message: where the receiver RDMA-READs the message
/// (little-endian `addr u64 | rkey u32 | len u32`; module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Descriptor {
    /// Address of the bytes in the sender's registered buffer.
    pub addr: u64,
    /// rkey of that buffer.
    pub rkey: u32,
    /// Message length in bytes.
    pub len: u32,
}

impl Descriptor {
    /// Writes the 16 bytes.
    #[inline]
    pub fn write(&self, b: &mut [u8]) {
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_le_bytes());
        b[12..16].copy_from_slice(&self.len.to_le_bytes());
    }

    /// Reads the 16 bytes.
    #[inline]
    pub fn read(b: &[u8; DESCRIPTOR_SIZE]) -> Self {
        Descriptor {
            addr: u64::from_le_bytes(b[0..8].try_into().unwrap()),
            rkey: u32::from_le_bytes(b[8..12].try_into().unwrap()),
            len: u32::from_le_bytes(b[12..16].try_into().unwrap()),
        }
    }
}

/// The 12 B header of each message (seeds/004 §3.3 "メッセージヘッダ").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsgHeader {
    /// Request: the caller's pending-call key (`< 2^31`); response: that key `| RESPONSE_FLAG`.
    pub call_id: u32,
    /// Request: the credit reserved for its response, in 32 B units
    /// ([`internal_allowance`]` / 32`); response: 0.
    pub piggyback: u32,
    /// Payload bytes that follow the header.
    pub payload_len: u32,
}

impl MsgHeader {
    /// Writes the 12 bytes.
    #[inline(always)]
    pub fn write(&self, b: &mut [u8; HEADER_SIZE]) {
        b[0..4].copy_from_slice(&self.call_id.to_le_bytes());
        b[4..8].copy_from_slice(&self.piggyback.to_le_bytes());
        b[8..12].copy_from_slice(&self.payload_len.to_le_bytes());
    }

    /// Reads the 12 bytes.
    #[inline(always)]
    pub fn read(b: &[u8; HEADER_SIZE]) -> Self {
        MsgHeader {
            call_id: u32::from_le_bytes(b[0..4].try_into().unwrap()),
            piggyback: u32::from_le_bytes(b[4..8].try_into().unwrap()),
            payload_len: u32::from_le_bytes(b[8..12].try_into().unwrap()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_matches_the_seed_examples() {
        assert_eq!(padded_message_size(0), 32);
        assert_eq!(padded_message_size(20), 32);
        assert_eq!(padded_message_size(21), 64);
        assert_eq!(padded_message_size(52), 64);
        assert_eq!(padded_message_size(53), 96);
    }

    #[test]
    fn imm_round_trips_and_covers_128_gib() {
        assert_eq!(encode_imm(96), 3);
        assert_eq!(decode_imm(3), 96);
        assert_eq!(decode_imm(u32::MAX), (u32::MAX as u64) * 32);
        for d in [0u64, 32, 64, 1 << 20, (1 << 36) - 32] {
            assert_eq!(decode_imm(encode_imm(d)), d);
        }
    }

    #[test]
    fn allowance_includes_one_metadata() {
        assert_eq!(internal_allowance(0), 64);
        assert_eq!(internal_allowance(20), 64);
        assert_eq!(internal_allowance(21), 96);
    }

    #[test]
    fn response_ids() {
        assert!(!is_response(5));
        assert!(is_response(to_response_id(5)));
        assert_eq!(from_response_id(to_response_id(MAX_CALL_ID)), MAX_CALL_ID);
    }

    #[test]
    fn layouts_are_little_endian_at_the_seed_offsets() {
        let mut b = [0xffu8; 32];
        FlowMetadata {
            ring_credit_return: 0x0102_0304_0506_0708,
            credit_grant: 0x40,
            message_count: 3,
            reads_done: 0x0201,
        }
        .write(&mut b);
        assert_eq!(&b[0..8], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(&b[8..16], &[0x40, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[16..20], &[3, 0, 0, 0]);
        assert_eq!(&b[20..24], &[1, 2, 0, 0]);
        assert!(b[24..].iter().all(|&x| x == 0));
        assert_eq!(FlowMetadata::read(&b).message_count, 3);
        assert_eq!(FlowMetadata::read(&b).reads_done, 0x0201);

        let mut d = [0u8; 16];
        Descriptor {
            addr: 0x1122_3344_5566_7788,
            rkey: 0xaabb_ccdd,
            len: 0x0010_0000,
        }
        .write(&mut d);
        assert_eq!(
            d,
            [
                0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0xdd, 0xcc, 0xbb, 0xaa, 0, 0, 0x10,
                0
            ]
        );
        assert_eq!(Descriptor::read(&d).len, 1 << 20);

        let mut h = [0u8; 12];
        MsgHeader {
            call_id: to_response_id(7),
            piggyback: 2,
            payload_len: 300,
        }
        .write(&mut h);
        assert_eq!(h, [7, 0, 0, 0x80, 2, 0, 0, 0, 0x2c, 1, 0, 0]);
        assert_eq!(MsgHeader::read(&h).payload_len, 300);
    }
}
