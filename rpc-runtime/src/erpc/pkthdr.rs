//! The 16-byte eRPC packet header (seeds/000 §2.1).
//!
//! Every eRPC packet starts with this header. It is two little-endian `u64` words whose bit
//! fields follow the layout of eRPC's reference implementation (bit 0 is the least
//! significant bit of the word):
//!
//! | word | bits     | field              | width | range                 |
//! |------|----------|--------------------|-------|-----------------------|
//! | 0    | 0..8     | `req_type`         | 8     | 0..=255               |
//! | 0    | 8..32    | `msg_size` (bytes) | 24    | 0..=[`MAX_MSG_SIZE`]  |
//! | 0    | 32..48   | `dest_session_num` | 16    | 0..=65535             |
//! | 0    | 48..50   | `pkt_type`         | 2     | [`PktType`]           |
//! | 0    | 50..64   | `pkt_num`          | 14    | 0..=[`MAX_PKT_NUM`]   |
//! | 1    | 0..44    | `req_num`          | 44    | 0..=[`MAX_REQ_NUM`]   |
//! | 1    | 44..48   | `magic`            | 4     | always [`MAGIC`] (11) |
//! | 1    | 48..64   | `token`            | 16    | 0..=65535             |
//!
//! Word 0 occupies bytes 0..8 and word 1 bytes 8..16, each least significant byte first.
//! `token` occupies the 16 bits eRPC's reference implementation leaves reserved: it is the
//! receiving session's *session token*, a random value the receiver chose when the session
//! was connected (exchanged in the session-management handshake, see `core/sm.rs`). The
//! receiver drops a data or control packet whose token is not its session's, so packets of
//! an ended session cannot reach a later session that reuses its session number (issue 12;
//! seeds/002 §4 invariant I3). Session-management packets carry 0 here and their own 64-bit
//! connect token in the body.
//!
//! # Layout against seeds/000 §2.1
//! The seed's header is the same 16 bytes with the same fields and widths (`req_type` 8,
//! `msg_size` 24, `dest_session_num` 16, `pkt_type` 2 + `pkt_num` 14, `req_num` 44, `magic`
//! 4); the one change is that the 16 bits after `magic`, reserved there, carry `token`
//! (issue 12). No other field can give up bits: the 24-bit `msg_size` and 14-bit `pkt_num`
//! are needed for 8 MiB messages at a 1472-byte UDP MTU, and 44-bit request numbers for
//! sessions that live long. The token therefore stays at 16 bits and no extension word is
//! added to data packets (it would cost 8 bytes of every packet and of every `MsgBuffer`
//! header). Instead (issue 14) request numbers are made unpredictable: a client session's
//! slot `i` starts at `base + i`, where `base` is a random multiple of 8 below 2^43 that the
//! client picks and sends in the connect request (`core/sm.rs`, bytes 48..56 of the body),
//! and the server takes a new request on a slot only with exactly the next number. The
//! 64-bit tokens of session-management packets are in their body (`core/sm.rs`).
//!
//! # What a forger must guess (issue 14)
//! A sender that cannot see the session's packets (off path) and wants a data or control
//! packet accepted must send it with the source address (IP and port, or LID and QPN) of the
//! receiver's peer, which it can spoof, and with:
//! - `dest_session_num`: small, reused numbers; assume known;
//! - `token`: 16 random bits chosen by the receiver at connect (1 in 65 536);
//! - `req_num`: exactly the request number the receiving slot expects: the random base
//!   (2^40 equally likely values) plus 8 times the number of calls the slot has completed;
//!   a packet with another number is dropped (`Stats::drop_out_of_window`);
//! - `pkt_num`: the one packet number the receiver expects next (small, guessable).
//!
//! About 56 unknown bits in all: a forged response that would complete a call, a forged
//! request that would run or block a slot, or a forged credit return or RFR each has a
//! chance of about 2^-56 per datagram, and every miss is counted. A session-management
//! packet must carry the session's 64-bit connect token (2^-64 per datagram). An attacker
//! who can read the session's packets (on path) learns all of these and is not defended
//! against.
//! `msg_size` is the size of the whole message's data (not of this packet), so the format
//! caps messages at 16 MiB - 1; the message buffers of this crate stop at 8 MiB
//! ([`super::msgbuf::MAX_DATA_SIZE`]). `pkt_num` counts packets within one request/response
//! exchange (responses continue after the request packets, seeds/000 §8.2).

use thiserror::Error;

/// Size of an encoded header in bytes.
pub const PKTHDR_SIZE: usize = 16;
/// The 4-bit magic value every valid header carries (a cheap corruption/mis-parse check).
pub const MAGIC: u8 = 11;
/// Largest `msg_size` the 24-bit field holds: 16 MiB - 1 bytes.
pub const MAX_MSG_SIZE: u32 = (1 << 24) - 1;
/// Largest `pkt_num` the 14-bit field holds.
pub const MAX_PKT_NUM: u16 = (1 << 14) - 1;
/// Largest `req_num` the 44-bit field holds.
pub const MAX_REQ_NUM: u64 = (1 << 44) - 1;

/// The 2-bit packet type (seeds/000 §2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PktType {
    /// Request data.
    Req = 0,
    /// Request for response: the client asks for the next response packet.
    Rfr = 1,
    /// Explicit credit return: the server acknowledges a request packet.
    ExplCr = 2,
    /// Response data.
    Resp = 3,
}

impl PktType {
    /// The type for a 2-bit value; only the low two bits of `bits` are looked at, so every
    /// input maps to a type.
    #[inline]
    pub fn from_bits(bits: u8) -> PktType {
        match bits & 0b11 {
            0 => PktType::Req,
            1 => PktType::Rfr,
            2 => PktType::ExplCr,
            _ => PktType::Resp,
        }
    }
}

/// Why a header could not be built or decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum HdrError {
    /// `msg_size` does not fit its 24 bits.
    #[error("msg_size {0} exceeds the 24-bit limit {MAX_MSG_SIZE}")]
    MsgSizeTooLarge(u32),
    /// `pkt_num` does not fit its 14 bits.
    #[error("pkt_num {0} exceeds the 14-bit limit {MAX_PKT_NUM}")]
    PktNumTooLarge(u16),
    /// `req_num` does not fit its 44 bits.
    #[error("req_num {0} exceeds the 44-bit limit {MAX_REQ_NUM}")]
    ReqNumTooLarge(u64),
    /// Fewer than [`PKTHDR_SIZE`] bytes were given to [`PktHdr::decode`].
    #[error("header needs {PKTHDR_SIZE} bytes, got {0}")]
    TooShort(usize),
    /// The magic nibble is not [`MAGIC`].
    #[error("bad header magic {0} (expected {MAGIC})")]
    BadMagic(u8),
}

/// A decoded packet header with every field in range. Build one with [`PktHdr::new`] or
/// [`PktHdr::decode`]; serialize with [`PktHdr::encode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PktHdr {
    req_type: u8,
    msg_size: u32,
    dest_session_num: u16,
    pkt_type: PktType,
    pkt_num: u16,
    req_num: u64,
    token: u16,
}

impl PktHdr {
    /// A header from its fields; `msg_size` is in bytes.
    ///
    /// # Errors
    /// [`HdrError::MsgSizeTooLarge`] above [`MAX_MSG_SIZE`], [`HdrError::PktNumTooLarge`]
    /// above [`MAX_PKT_NUM`], [`HdrError::ReqNumTooLarge`] above [`MAX_REQ_NUM`].
    pub fn new(
        req_type: u8,
        msg_size: u32,
        dest_session_num: u16,
        pkt_type: PktType,
        pkt_num: u16,
        req_num: u64,
    ) -> Result<PktHdr, HdrError> {
        if msg_size > MAX_MSG_SIZE {
            return Err(HdrError::MsgSizeTooLarge(msg_size));
        }
        if pkt_num > MAX_PKT_NUM {
            return Err(HdrError::PktNumTooLarge(pkt_num));
        }
        if req_num > MAX_REQ_NUM {
            return Err(HdrError::ReqNumTooLarge(req_num));
        }
        Ok(PktHdr {
            req_type,
            msg_size,
            dest_session_num,
            pkt_type,
            pkt_num,
            req_num,
            token: 0,
        })
    }

    /// This header with session token `token` (the receiving session's; 0 by default).
    #[inline]
    pub fn with_token(mut self, token: u16) -> PktHdr {
        self.token = token;
        self
    }

    /// The receiving session's session token (module docs).
    #[inline]
    pub fn token(&self) -> u16 {
        self.token
    }

    /// RPC request type (selects the handler).
    #[inline]
    pub fn req_type(&self) -> u8 {
        self.req_type
    }

    /// Size of the whole message's data in bytes.
    #[inline]
    pub fn msg_size(&self) -> u32 {
        self.msg_size
    }

    /// Session number at the receiver.
    #[inline]
    pub fn dest_session_num(&self) -> u16 {
        self.dest_session_num
    }

    /// Packet type.
    #[inline]
    pub fn pkt_type(&self) -> PktType {
        self.pkt_type
    }

    /// Packet number within the request/response exchange.
    #[inline]
    pub fn pkt_num(&self) -> u16 {
        self.pkt_num
    }

    /// Request number (identifies the request for at-most-once execution).
    #[inline]
    pub fn req_num(&self) -> u64 {
        self.req_num
    }

    /// The 16 wire bytes (layout in the [module docs](self)).
    #[inline]
    pub fn encode(&self) -> [u8; PKTHDR_SIZE] {
        encode_fields(
            self.req_type,
            self.msg_size,
            self.dest_session_num,
            self.token,
            self.pkt_type,
            self.pkt_num,
            self.req_num,
        )
    }

    /// Parses the first [`PKTHDR_SIZE`] bytes of `bytes` (a longer slice, e.g. a whole
    /// packet, is fine; the rest is ignored).
    ///
    /// # Errors
    /// [`HdrError::TooShort`] for fewer than 16 bytes, [`HdrError::BadMagic`] when the magic
    /// nibble is not [`MAGIC`]. Every other bit pattern is a valid header.
    #[inline]
    pub fn decode(bytes: &[u8]) -> Result<PktHdr, HdrError> {
        let Some((w0, rest)) = bytes.split_first_chunk::<8>() else {
            return Err(HdrError::TooShort(bytes.len()));
        };
        let Some((w1, _)) = rest.split_first_chunk::<8>() else {
            return Err(HdrError::TooShort(bytes.len()));
        };
        let w0 = u64::from_le_bytes(*w0);
        let w1 = u64::from_le_bytes(*w1);
        let magic = ((w1 >> 44) & 0xf) as u8;
        if magic != MAGIC {
            return Err(HdrError::BadMagic(magic));
        }
        Ok(PktHdr {
            req_type: w0 as u8,
            msg_size: ((w0 >> 8) & 0xff_ffff) as u32,
            dest_session_num: (w0 >> 32) as u16,
            pkt_type: PktType::from_bits((w0 >> 48) as u8),
            pkt_num: (w0 >> 50) as u16,
            req_num: w1 & MAX_REQ_NUM,
            token: (w1 >> 48) as u16,
        })
    }
}

/// The 16 wire bytes of a header with these fields (layout in the [module docs](self)),
/// for a sender whose fields are in range by construction: the core's packet renderer
/// (`Rpc::hdr`), whose message sizes, packet numbers and request numbers were checked when
/// the message was accepted. A field wider than its bits is cut to them (never spilling into
/// its neighbour; a debug build asserts instead), so the header stays well-formed; the
/// checked constructor is [`PktHdr::new`]. Costs no branch (issue 16, `CG_STEPS=1
/// scripts/callgrind-erpc.sh 20000 32 off`: 17–18 instructions per packet, against 24–28 for
/// `new` + `encode` + the error fallback on the send path).
#[inline(always)]
pub(crate) fn encode_fields(
    req_type: u8,
    msg_size: u32,
    dest_session_num: u16,
    token: u16,
    pkt_type: PktType,
    pkt_num: u16,
    req_num: u64,
) -> [u8; PKTHDR_SIZE] {
    debug_assert!(msg_size <= MAX_MSG_SIZE, "msg_size {msg_size}");
    debug_assert!(pkt_num <= MAX_PKT_NUM, "pkt_num {pkt_num}");
    debug_assert!(req_num <= MAX_REQ_NUM, "req_num {req_num}");
    let w0 = u64::from(req_type)
        | u64::from(msg_size & MAX_MSG_SIZE) << 8
        | u64::from(dest_session_num) << 32
        | u64::from(pkt_type as u8) << 48
        | u64::from(pkt_num & MAX_PKT_NUM) << 50;
    let w1 = (req_num & MAX_REQ_NUM) | u64::from(MAGIC) << 44 | u64::from(token) << 48;
    let mut out = [0u8; PKTHDR_SIZE];
    out[..8].copy_from_slice(&w0.to_le_bytes());
    out[8..].copy_from_slice(&w1.to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    //! Vectors and property tests; the decoder's properties run 256 cases by default and
    //! `PROPTEST_CASES=<n>` runs more (proptest reads the variable itself; issue 14 §4).
    use super::*;
    use proptest::prelude::*;

    fn check_vector(hdr: PktHdr, bytes: [u8; 16]) {
        assert_eq!(hdr.encode(), bytes, "encode of {hdr:?}");
        assert_eq!(PktHdr::decode(&bytes), Ok(hdr));
    }

    #[test]
    fn vector_all_zero_but_magic() {
        // word1 = 11 << 44: byte 13 (= 8 + 5) holds bits 40..48 of word 1, magic is its upper
        // nibble.
        let hdr = PktHdr::new(0, 0, 0, PktType::Req, 0, 0).unwrap();
        check_vector(
            hdr,
            [
                0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // word 0
                0x00, 0x00, 0x00, 0x00, 0x00, 0xb0, 0x00, 0x00, // word 1
            ],
        );
    }

    #[test]
    fn vector_max_fields() {
        // word0 all ones; word1 = (2^44 - 1) | 11 << 44 = 0x0000_BFFF_FFFF_FFFF.
        let hdr = PktHdr::new(
            0xff,
            MAX_MSG_SIZE,
            0xffff,
            PktType::Resp,
            MAX_PKT_NUM,
            MAX_REQ_NUM,
        )
        .unwrap();
        check_vector(
            hdr,
            [
                0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // word 0
                0xff, 0xff, 0xff, 0xff, 0xff, 0xbf, 0x00, 0x00, // word 1
            ],
        );
    }

    #[test]
    fn vector_typical_resp() {
        // req_type 3, msg_size 100 = 0x64, session 5, RESP (3) pkt 1 -> bits 48..64 = 3 | 1 << 2
        // = 0x0007, req_num 0x123.
        let hdr = PktHdr::new(3, 100, 5, PktType::Resp, 1, 0x123).unwrap();
        check_vector(
            hdr,
            [
                0x03, 0x64, 0x00, 0x00, 0x05, 0x00, 0x07, 0x00, // word 0
                0x23, 0x01, 0x00, 0x00, 0x00, 0xb0, 0x00, 0x00, // word 1
            ],
        );
    }

    #[test]
    fn vector_mixed_rfr() {
        // req_type 0x2a, msg_size 0x123456, session 0xabcd, RFR (1) pkt 0x1234 -> bits 48..64
        // = 1 | 0x1234 << 2 = 0x48d1; req_num 0xedc_ba98_7654 -> byte 13 = 0x0e | 0xb0.
        let hdr = PktHdr::new(
            0x2a,
            0x12_3456,
            0xabcd,
            PktType::Rfr,
            0x1234,
            0xedc_ba98_7654,
        )
        .unwrap();
        check_vector(
            hdr,
            [
                0x2a, 0x56, 0x34, 0x12, 0xcd, 0xab, 0xd1, 0x48, // word 0
                0x54, 0x76, 0x98, 0xba, 0xdc, 0xbe, 0x00, 0x00, // word 1
            ],
        );
    }

    #[test]
    fn vector_expl_cr() {
        // EXPL_CR (2) pkt 0 -> bits 48..64 = 0x0002; req_num 1 << 43 -> byte 13 = 0x08 | 0xb0.
        let hdr = PktHdr::new(0, 0, 0x0100, PktType::ExplCr, 0, 1 << 43).unwrap();
        check_vector(
            hdr,
            [
                0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, 0x00, // word 0
                0x00, 0x00, 0x00, 0x00, 0x00, 0xb8, 0x00, 0x00, // word 1
            ],
        );
    }

    #[test]
    fn vector_with_token() {
        // Token 0xbeef in bits 48..64 of word 1: bytes 14 (0xef) and 15 (0xbe).
        let hdr = PktHdr::new(3, 100, 5, PktType::Resp, 1, 0x123)
            .unwrap()
            .with_token(0xbeef);
        check_vector(
            hdr,
            [
                0x03, 0x64, 0x00, 0x00, 0x05, 0x00, 0x07, 0x00, // word 0
                0x23, 0x01, 0x00, 0x00, 0x00, 0xb0, 0xef, 0xbe, // word 1
            ],
        );
    }

    #[test]
    fn new_rejects_out_of_range() {
        assert_eq!(
            PktHdr::new(0, MAX_MSG_SIZE + 1, 0, PktType::Req, 0, 0),
            Err(HdrError::MsgSizeTooLarge(MAX_MSG_SIZE + 1))
        );
        assert_eq!(
            PktHdr::new(0, 0, 0, PktType::Req, MAX_PKT_NUM + 1, 0),
            Err(HdrError::PktNumTooLarge(MAX_PKT_NUM + 1))
        );
        assert_eq!(
            PktHdr::new(0, 0, 0, PktType::Req, 0, MAX_REQ_NUM + 1),
            Err(HdrError::ReqNumTooLarge(MAX_REQ_NUM + 1))
        );
    }

    #[test]
    fn decode_rejects_bad_input() {
        let good = PktHdr::new(1, 2, 3, PktType::Req, 4, 5).unwrap().encode();
        assert_eq!(PktHdr::decode(&good[..15]), Err(HdrError::TooShort(15)));
        assert_eq!(PktHdr::decode(&[]), Err(HdrError::TooShort(0)));
        let mut bad = good;
        bad[13] = 0xa0;
        assert_eq!(PktHdr::decode(&bad), Err(HdrError::BadMagic(10)));
        // The top 16 bits of word 1 are the session token.
        let mut tok = good;
        tok[14] = 0x34;
        tok[15] = 0x80;
        assert_eq!(
            PktHdr::decode(&tok).map(|h| h.token()),
            Ok(0x8034),
            "token bits"
        );
        // Longer input: only the first 16 bytes count.
        let mut long = good.to_vec();
        long.extend_from_slice(&[0xff; 8]);
        assert_eq!(PktHdr::decode(&long), PktHdr::decode(&good));
    }

    fn arb_hdr() -> impl Strategy<Value = PktHdr> {
        (
            any::<u8>(),
            0..=MAX_MSG_SIZE,
            any::<u16>(),
            0u8..4,
            0..=MAX_PKT_NUM,
            0..=MAX_REQ_NUM,
            any::<u16>(),
        )
            .prop_map(|(rt, ms, ds, pt, pn, rn, tok)| {
                PktHdr::new(rt, ms, ds, PktType::from_bits(pt), pn, rn)
                    .unwrap()
                    .with_token(tok)
            })
    }

    proptest! {
        #[test]
        fn prop_round_trip(hdr in arb_hdr()) {
            prop_assert_eq!(PktHdr::decode(&hdr.encode()), Ok(hdr));
        }

        /// Any byte string (issue 14 §4): `TooShort` with its length below 16 bytes,
        /// `BadMagic` with the nibble found, otherwise the header of the first 16 bytes.
        #[test]
        fn prop_decode_any_length(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            match PktHdr::decode(&bytes) {
                Err(HdrError::TooShort(n)) => prop_assert!(n == bytes.len() && n < PKTHDR_SIZE),
                Err(HdrError::BadMagic(m)) => {
                    prop_assert!(bytes.len() >= PKTHDR_SIZE);
                    prop_assert_eq!(m, bytes[13] >> 4);
                    prop_assert_ne!(m, MAGIC);
                }
                Err(e) => prop_assert!(false, "decode never returns {:?}", e),
                Ok(h) => prop_assert_eq!(&h.encode()[..], &bytes[..PKTHDR_SIZE]),
            }
        }

        #[test]
        fn prop_decode_never_panics(bytes in any::<[u8; 16]>()) {
            // Whatever decodes re-encodes to the same bytes (no information is dropped).
            if let Ok(hdr) = PktHdr::decode(&bytes) {
                prop_assert_eq!(hdr.encode(), bytes);
            }
        }
    }
}
