//! Endpoint information exchanged out of band before connecting (seeds/004 §3.8
//! `LocalEndpointInfo`, plus what RC addressing and the READ fallback need and the service's
//! schema fingerprint), with a fixed-size byte encoding for bootstrap channels (MPI, files).

use super::error::SetupError;

/// Bytes of [`EndpointInfo::to_bytes`].
pub const INFO_BYTES: usize = 96;
/// First 8 bytes of the encoding.
pub const INFO_MAGIC: [u8; 8] = *b"CPYRPC01";

/// What a peer needs to connect to one endpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EndpointInfo {
    /// RC QP number.
    pub qpn: u32,
    /// Port LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Port GID (RoCE).
    pub gid: [u8; 16],
    /// Initial packet sequence number of the QP's sends.
    pub psn: u32,
    /// Receive ring address.
    pub recv_ring_addr: u64,
    /// Receive ring rkey.
    pub recv_ring_rkey: u32,
    /// Receive ring size in bytes (power of two).
    pub recv_ring_size: u64,
    /// Address of the 8 B consumer position (for the peer's RDMA READ).
    pub consumer_addr: u64,
    /// Its rkey.
    pub consumer_rkey: u32,
    /// Response credit granted up front, in bytes.
    pub initial_credit: u64,
    /// Schema fingerprint of the service (0: untyped).
    pub fingerprint: u64,
    /// Largest message this endpoint sends or receives by rendezvous, in bytes (issue 15;
    /// 0: none, as a peer predating large messages announces).
    pub max_large_message: u32,
}

impl EndpointInfo {
    /// Little-endian encoding: magic (8) | qpn (4) | psn (4) | lid (2) | 0 (6) | gid (16) |
    /// ring addr (8) | ring size (8) | ring rkey (4) | consumer rkey (4) | consumer addr (8) |
    /// initial credit (8) | fingerprint (8) | max large message (4) | 0 (4).
    pub fn to_bytes(&self) -> [u8; INFO_BYTES] {
        let mut b = [0u8; INFO_BYTES];
        b[0..8].copy_from_slice(&INFO_MAGIC);
        b[8..12].copy_from_slice(&self.qpn.to_le_bytes());
        b[12..16].copy_from_slice(&self.psn.to_le_bytes());
        b[16..18].copy_from_slice(&self.lid.to_le_bytes());
        b[24..40].copy_from_slice(&self.gid);
        b[40..48].copy_from_slice(&self.recv_ring_addr.to_le_bytes());
        b[48..56].copy_from_slice(&self.recv_ring_size.to_le_bytes());
        b[56..60].copy_from_slice(&self.recv_ring_rkey.to_le_bytes());
        b[60..64].copy_from_slice(&self.consumer_rkey.to_le_bytes());
        b[64..72].copy_from_slice(&self.consumer_addr.to_le_bytes());
        b[72..80].copy_from_slice(&self.initial_credit.to_le_bytes());
        b[80..88].copy_from_slice(&self.fingerprint.to_le_bytes());
        b[88..92].copy_from_slice(&self.max_large_message.to_le_bytes());
        b
    }

    /// Decodes [`EndpointInfo::to_bytes`].
    ///
    /// # Errors
    /// [`SetupError::BadInfo`] for a wrong length or magic.
    pub fn from_bytes(b: &[u8]) -> Result<Self, SetupError> {
        if b.len() != INFO_BYTES {
            return Err(SetupError::BadInfo("length is not 96 bytes"));
        }
        if b[0..8] != INFO_MAGIC {
            return Err(SetupError::BadInfo("wrong magic"));
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        Ok(EndpointInfo {
            qpn: u32_at(8),
            psn: u32_at(12),
            lid: u16::from_le_bytes([b[16], b[17]]),
            gid: b[24..40].try_into().unwrap(),
            recv_ring_addr: u64_at(40),
            recv_ring_size: u64_at(48),
            recv_ring_rkey: u32_at(56),
            consumer_rkey: u32_at(60),
            consumer_addr: u64_at(64),
            initial_credit: u64_at(72),
            fingerprint: u64_at(80),
            max_large_message: u32_at(88),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejects() {
        let i = EndpointInfo {
            qpn: 0x123456,
            lid: 7,
            gid: [9; 16],
            psn: 3,
            recv_ring_addr: 0xdead_beef_0000,
            recv_ring_rkey: 0x42,
            recv_ring_size: 1 << 20,
            consumer_addr: 0x1000,
            consumer_rkey: 0x43,
            initial_credit: 1 << 18,
            fingerprint: 0xfeed,
            max_large_message: 8 << 20,
        };
        let b = i.to_bytes();
        assert_eq!(EndpointInfo::from_bytes(&b).unwrap(), i);
        assert!(EndpointInfo::from_bytes(&b[..95]).is_err());
        let mut bad = b;
        bad[0] ^= 1;
        assert!(EndpointInfo::from_bytes(&bad).is_err());
    }

    /// Property test over arbitrary bytes (issue 14 §4): endpoint information arrives from
    /// other ranks (MPI, files). 256 cases by default; `PROPTEST_CASES=<n>` runs more
    /// (proptest reads the variable itself).
    mod props {
        use proptest::prelude::*;

        use super::*;

        proptest! {
            /// Any byte string: `BadInfo` unless it is 96 bytes starting with the magic;
            /// otherwise every field is taken from its offset, so re-encoding gives back the
            /// input with only the reserved bytes (18..24, 92..96) zeroed.
            #[test]
            fn from_bytes_over_arbitrary_bytes(
                b in prop_oneof![
                    proptest::collection::vec(any::<u8>(), 0..200),
                    proptest::collection::vec(any::<u8>(), INFO_BYTES..=INFO_BYTES).prop_map(|mut b| {
                        b[..8].copy_from_slice(&INFO_MAGIC);
                        b
                    }),
                ],
            ) {
                match EndpointInfo::from_bytes(&b) {
                    Err(SetupError::BadInfo(_)) => {
                        prop_assert!(b.len() != INFO_BYTES || b[..8] != INFO_MAGIC)
                    }
                    Err(e) => prop_assert!(false, "unexpected error {:?}", e),
                    Ok(info) => {
                        prop_assert!(b.len() == INFO_BYTES && b[..8] == INFO_MAGIC);
                        let mut want = b.clone();
                        want[18..24].fill(0);
                        want[92..96].fill(0);
                        prop_assert_eq!(&info.to_bytes()[..], &want[..]);
                    }
                }
            }
        }
    }
}
