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
}

impl FlowMetadata {
    /// Writes the 32 bytes (padding zeroed).
    #[inline(always)]
    pub fn write(&self, b: &mut [u8; FLOW_METADATA_SIZE as usize]) {
        b[0..8].copy_from_slice(&self.ring_credit_return.to_le_bytes());
        b[8..16].copy_from_slice(&self.credit_grant.to_le_bytes());
        b[16..20].copy_from_slice(&self.message_count.to_le_bytes());
        b[20..32].fill(0);
    }

    /// Reads the 32 bytes (padding ignored).
    #[inline(always)]
    pub fn read(b: &[u8; FLOW_METADATA_SIZE as usize]) -> Self {
        FlowMetadata {
            ring_credit_return: u64::from_le_bytes(b[0..8].try_into().unwrap()),
            credit_grant: u64::from_le_bytes(b[8..16].try_into().unwrap()),
            message_count: u32::from_le_bytes(b[16..20].try_into().unwrap()),
        }
    }

    /// Whether this is a wrap marker.
    #[inline(always)]
    pub fn is_wrap(&self) -> bool {
        self.message_count == WRAP_MESSAGE_COUNT
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
        }
        .write(&mut b);
        assert_eq!(&b[0..8], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(&b[8..16], &[0x40, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[16..20], &[3, 0, 0, 0]);
        assert!(b[20..].iter().all(|&x| x == 0));
        assert_eq!(FlowMetadata::read(&b).message_count, 3);

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
