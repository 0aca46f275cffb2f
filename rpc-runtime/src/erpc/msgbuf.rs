//! DMA-capable message buffers with eRPC's zero-copy layout (seeds/000 §3).
//!
//! A message of `data_size` bytes goes out as `N = max(1, ceil(data_size / data_per_pkt))`
//! packets, each a 16-byte [`pkthdr`](super::pkthdr) plus up to `data_per_pkt` data bytes
//! (`data_per_pkt` = MTU - 16). The buffer keeps the data contiguous so the application sees
//! one slice, and puts the headers around it:
//!
//! ```text
//! offset 0        16                         16 + round8(max_data_size)
//! ┌───────────┬──────────────────────────────┬───────────┬───────────┬─────┐
//! │ pkthdr_0  │ data (max_data_size bytes)   │ pkthdr_1  │ pkthdr_2  │ ... │
//! └───────────┴──────────────────────────────┴───────────┴───────────┴─────┘
//! ```
//!
//! Packet 0's header and data are adjacent, so a single-packet message is one DMA read (one
//! SGE); packet `i >= 1` takes two SGEs, its header from the tail and its data slice from the
//! middle. The tail starts at `max_data_size` rounded up to 8 bytes (as in eRPC's reference
//! implementation) so every header is 8-byte aligned; room is reserved for the headers of a
//! full (`max_data_size`) message, and [`MsgBuffer::resize`] only changes how many are in use.
//!
//! Memory comes from [`mlx5::mem::DmaBuf`]: 2 MiB hugepages for buffers of at least 2 MiB,
//! normal pages below that, so the whole buffer can be registered as one memory region.
//!
//! # Sharing with a transport that sends in place
//! The mapping is held through an [`Arc`]. A transport that posts a send reading straight
//! from the buffer (the mlx5 UD transport's gather path, seeds/000 §3) keeps a clone of that
//! `Arc` until the send has completed, so the memory stays mapped (and registered) for as
//! long as the NIC may read it, whoever drops the `MsgBuffer`. While such a clone exists the
//! buffer is [in flight](MsgBuffer::in_flight): the eRPC core does not write its data area or
//! hand it out for reuse then (it takes another buffer), so a queued packet is never sent with
//! bytes of a later message.

use std::sync::Arc;

use mlx5::mem::DmaBuf;
use thiserror::Error;

use super::pkthdr::{MAX_PKT_NUM, PKTHDR_SIZE};

/// Largest message data size a [`MsgBuffer`] accepts: 8 MiB (issue 5). The wire header's
/// 24-bit `msg_size` could describe up to 16 MiB - 1.
pub const MAX_DATA_SIZE: usize = 8 << 20;

/// Buffers at least this large (in total bytes) use hugepages.
const HUGEPAGE_THRESHOLD: usize = 2 << 20;

/// Why a [`MsgBuffer`] could not be created or resized.
#[derive(Debug, Error)]
pub enum MsgBufError {
    /// The data size exceeds [`MAX_DATA_SIZE`] (on creation) or the buffer's
    /// `max_data_size` (on resize).
    #[error("data size {size} exceeds the limit {max}")]
    TooLarge {
        /// Requested data size in bytes.
        size: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// `data_per_pkt` is zero.
    #[error("data_per_pkt must be positive")]
    ZeroPacketCapacity,
    /// A full message would need more packets than the 14-bit `pkt_num` can number.
    #[error("{0} packets exceed the 14-bit packet number space")]
    TooManyPackets(usize),
    /// Mapping the memory failed.
    #[error("allocating the message buffer: {0}")]
    Alloc(#[from] mlx5::Error),
    /// [`MsgBuffer::write_pkt`]: the packet index is not below [`MsgBuffer::num_pkts`].
    #[error("packet {pkt} past the message's {num_pkts} packets")]
    PktOutOfRange {
        /// The packet index.
        pkt: usize,
        /// Packets of the message.
        num_pkts: usize,
    },
    /// [`MsgBuffer::write_pkt`]: the bytes are not exactly the packet's data length.
    #[error("packet {pkt} carries {len} bytes, the message layout wants {want}")]
    PktLength {
        /// The packet index.
        pkt: usize,
        /// Bytes offered.
        len: usize,
        /// The packet's data length ([`MsgBuffer::pkt_data_len`]).
        want: usize,
    },
}

/// A message buffer: contiguous data plus one header slot per packet (layout in the
/// [module docs](self)).
///
/// The slice accessors assume the NIC is not writing into the buffer while a slice is
/// alive; whoever posts receives into it (the protocol core) must not hand out slices until
/// the receive completed.
pub struct MsgBuffer {
    /// The mapping; clones are held only by transports with sends from it outstanding.
    buf: Arc<DmaBuf>,
    /// `buf`'s start and length, copied out so that slicing does not go through the `Arc`
    /// (valid while `buf` lives, i.e. as long as `self`).
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    max_data_size: usize,
    data_per_pkt: usize,
    data_size: usize,
    num_pkts: usize,
    /// Offset of pkthdr_1 (start of the header tail).
    tail_offset: usize,
}

// SAFETY: `ptr` points into the mapping that `buf` (an `Arc<DmaBuf>`, which is Send and
// Sync) keeps alive; through `MsgBuffer`'s API the bytes are read via `&self` and written via
// `&mut self` only, as with a `Vec<u8>`, so moving or sharing a `MsgBuffer` between threads
// is as sound as for the `DmaBuf` it wraps.
unsafe impl Send for MsgBuffer {}
// SAFETY: as for `Send`.
unsafe impl Sync for MsgBuffer {}

/// Packets needed for `size` data bytes: at least one (a zero-byte message still sends a
/// header). A message that fits one packet (the common case) costs a compare, not a
/// division.
#[inline]
fn pkts_for(size: usize, data_per_pkt: usize) -> usize {
    if size <= data_per_pkt {
        1
    } else {
        size.div_ceil(data_per_pkt)
    }
}

impl MsgBuffer {
    /// A buffer for messages of up to `max_data_size` bytes sent in packets of up to
    /// `data_per_pkt` data bytes each (MTU - [`PKTHDR_SIZE`]). The data size starts at
    /// `max_data_size`; the memory is zeroed.
    ///
    /// # Errors
    /// [`MsgBufError::TooLarge`] above [`MAX_DATA_SIZE`], [`MsgBufError::ZeroPacketCapacity`]
    /// for `data_per_pkt == 0`, [`MsgBufError::TooManyPackets`] when a full message needs
    /// more than 2^14 packets, [`MsgBufError::Alloc`] when mapping fails.
    pub fn new(max_data_size: usize, data_per_pkt: usize) -> Result<MsgBuffer, MsgBufError> {
        if max_data_size > MAX_DATA_SIZE {
            return Err(MsgBufError::TooLarge {
                size: max_data_size,
                max: MAX_DATA_SIZE,
            });
        }
        if data_per_pkt == 0 {
            return Err(MsgBufError::ZeroPacketCapacity);
        }
        let max_pkts = pkts_for(max_data_size, data_per_pkt);
        if max_pkts > usize::from(MAX_PKT_NUM) + 1 {
            return Err(MsgBufError::TooManyPackets(max_pkts));
        }
        let tail_offset = PKTHDR_SIZE + max_data_size.next_multiple_of(8);
        let total = tail_offset + (max_pkts - 1) * PKTHDR_SIZE;
        let buf = if total >= HUGEPAGE_THRESHOLD {
            DmaBuf::new(total)?
        } else {
            DmaBuf::with_normal_pages(total)?
        };
        let (ptr, len) = (buf.as_non_null(), buf.len());
        Ok(MsgBuffer {
            buf: Arc::new(buf),
            ptr,
            len,
            max_data_size,
            data_per_pkt,
            data_size: max_data_size,
            num_pkts: max_pkts,
            tail_offset,
        })
    }

    /// A buffer holding a copy of `bytes` (data size and capacity `bytes.len()`), sent in
    /// packets of `data_per_pkt` data bytes.
    ///
    /// # Errors
    /// As [`MsgBuffer::new`].
    pub fn from_bytes(bytes: &[u8], data_per_pkt: usize) -> Result<MsgBuffer, MsgBufError> {
        let mut m = MsgBuffer::new(bytes.len(), data_per_pkt)?;
        m.data_mut().copy_from_slice(bytes);
        Ok(m)
    }

    /// Largest data size in bytes.
    #[inline]
    pub fn max_data_size(&self) -> usize {
        self.max_data_size
    }

    /// Data bytes per packet.
    #[inline]
    pub fn data_per_pkt(&self) -> usize {
        self.data_per_pkt
    }

    /// Current data size in bytes.
    #[inline]
    pub fn data_size(&self) -> usize {
        self.data_size
    }

    /// Packets for the current data size (at least 1).
    #[inline]
    pub fn num_pkts(&self) -> usize {
        self.num_pkts
    }

    /// Sets the current data size and recomputes [`num_pkts`](Self::num_pkts). Data bytes
    /// are kept as they are.
    ///
    /// # Errors
    /// [`MsgBufError::TooLarge`] when `data_size > max_data_size`.
    pub fn resize(&mut self, data_size: usize) -> Result<(), MsgBufError> {
        if data_size > self.max_data_size {
            return Err(MsgBufError::TooLarge {
                size: data_size,
                max: self.max_data_size,
            });
        }
        self.data_size = data_size;
        self.num_pkts = pkts_for(data_size, self.data_per_pkt);
        Ok(())
    }

    /// The current data (`data_size` bytes).
    #[inline]
    pub fn data(&self) -> &[u8] {
        &self.bytes()[PKTHDR_SIZE..PKTHDR_SIZE + self.data_size]
    }

    /// The current data, writable.
    #[inline]
    pub fn data_mut(&mut self) -> &mut [u8] {
        debug_assert!(
            !self.in_flight(),
            "data of a message buffer in flight rewritten"
        );
        let end = PKTHDR_SIZE + self.data_size;
        &mut self.bytes_mut()[PKTHDR_SIZE..end]
    }

    /// The whole data area (`max_data_size` bytes, whatever the current data size), writable:
    /// fill a message of unknown length in place, then [`resize`](Self::resize) to what was
    /// written.
    #[inline]
    pub fn capacity_mut(&mut self) -> &mut [u8] {
        debug_assert!(
            !self.in_flight(),
            "data of a message buffer in flight rewritten"
        );
        let end = PKTHDR_SIZE + self.max_data_size;
        &mut self.bytes_mut()[PKTHDR_SIZE..end]
    }

    /// Copies `bytes`, the data of packet `i` of the current message, to its place in the
    /// data area (reassembly of a received multi-packet message; seeds/000 §3, §8.2).
    ///
    /// # Errors
    /// [`MsgBufError::PktOutOfRange`] if `i >= num_pkts()`, [`MsgBufError::PktLength`] if
    /// `bytes.len() != pkt_data_len(i)`; nothing is written then.
    pub fn write_pkt(&mut self, i: usize, bytes: &[u8]) -> Result<(), MsgBufError> {
        debug_assert!(
            !self.in_flight(),
            "data of a message buffer in flight rewritten"
        );
        if i >= self.num_pkts {
            return Err(MsgBufError::PktOutOfRange {
                pkt: i,
                num_pkts: self.num_pkts,
            });
        }
        let want = self.pkt_data_len(i);
        if bytes.len() != want {
            return Err(MsgBufError::PktLength {
                pkt: i,
                len: bytes.len(),
                want,
            });
        }
        let off = self.pkt_data_offset(i);
        self.bytes_mut()[off..off + want].copy_from_slice(bytes);
        Ok(())
    }

    /// Packet `i`'s header and data, the two parts of its gather list (header from
    /// `pkthdr_i`, data in place in the data area), or `None` if `i >= num_pkts()`.
    #[inline]
    pub fn pkt_parts(&self, i: usize) -> Option<(&[u8], &[u8])> {
        if i >= self.num_pkts {
            return None;
        }
        let h = self.pkthdr_offset(i);
        let d = self.pkt_data_offset(i);
        let len = self.pkt_data_len(i);
        let b = self.bytes();
        Some((&b[h..h + PKTHDR_SIZE], &b[d..d + len]))
    }

    /// Byte offset of packet `i`'s header from [`as_ptr`](Self::as_ptr): 0 for packet 0,
    /// the tail for the others.
    ///
    /// # Panics
    /// If `i >= num_pkts()`.
    #[inline]
    pub fn pkthdr_offset(&self, i: usize) -> usize {
        assert!(i < self.num_pkts, "packet {i} of {}", self.num_pkts);
        if i == 0 {
            0
        } else {
            self.tail_offset + (i - 1) * PKTHDR_SIZE
        }
    }

    /// Packet `i`'s header bytes.
    ///
    /// # Panics
    /// If `i >= num_pkts()`.
    #[inline]
    pub fn pkthdr(&self, i: usize) -> &[u8; PKTHDR_SIZE] {
        let off = self.pkthdr_offset(i);
        self.bytes()[off..off + PKTHDR_SIZE].try_into().unwrap()
    }

    /// Packet `i`'s header bytes, writable (fill with [`super::pkthdr::PktHdr::encode`]).
    ///
    /// # Panics
    /// If `i >= num_pkts()`.
    #[inline]
    pub fn pkthdr_mut(&mut self, i: usize) -> &mut [u8; PKTHDR_SIZE] {
        let off = self.pkthdr_offset(i);
        (&mut self.bytes_mut()[off..off + PKTHDR_SIZE])
            .try_into()
            .unwrap()
    }

    /// Byte offset of packet `i`'s data from [`as_ptr`](Self::as_ptr).
    ///
    /// # Panics
    /// If `i >= num_pkts()`.
    #[inline]
    pub fn pkt_data_offset(&self, i: usize) -> usize {
        assert!(i < self.num_pkts, "packet {i} of {}", self.num_pkts);
        PKTHDR_SIZE + i * self.data_per_pkt
    }

    /// Data bytes packet `i` carries: `data_per_pkt` except for the last packet (which may
    /// carry fewer, or 0 for an empty message).
    ///
    /// # Panics
    /// If `i >= num_pkts()`.
    #[inline]
    pub fn pkt_data_len(&self, i: usize) -> usize {
        assert!(i < self.num_pkts, "packet {i} of {}", self.num_pkts);
        let start = i * self.data_per_pkt;
        (self.data_size - start).min(self.data_per_pkt)
    }

    /// The data slice packet `i` carries.
    ///
    /// # Panics
    /// If `i >= num_pkts()`.
    #[inline]
    pub fn pkt_data(&self, i: usize) -> &[u8] {
        let off = self.pkt_data_offset(i);
        &self.bytes()[off..off + self.pkt_data_len(i)]
    }

    /// Start of the buffer (for SGE addresses: add the offsets above).
    #[inline]
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Address of packet `i`'s header.
    ///
    /// # Panics
    /// If `i >= num_pkts()`.
    #[inline]
    pub fn pkthdr_addr(&self, i: usize) -> u64 {
        self.as_ptr() as u64 + self.pkthdr_offset(i) as u64
    }

    /// Address of packet `i`'s data.
    ///
    /// # Panics
    /// If `i >= num_pkts()`.
    #[inline]
    pub fn pkt_data_addr(&self, i: usize) -> u64 {
        self.as_ptr() as u64 + self.pkt_data_offset(i) as u64
    }

    /// Total bytes of the buffer (header 0, data area, all tail headers), the length to
    /// register.
    #[inline]
    pub fn buf_len(&self) -> usize {
        self.len
    }

    /// The backing memory, e.g. to register it with the NIC.
    #[inline]
    pub fn dma_buf(&self) -> &DmaBuf {
        &self.buf
    }

    /// The shared handle of the backing memory, for a transport that sends from the buffer
    /// in place ([`TxPkt::mem`](super::datagram::TxPkt::mem)): it clones the handle while a
    /// posted send reads the buffer (see the [module docs](self)).
    #[inline]
    pub fn dma_handle(&self) -> &Arc<DmaBuf> {
        &self.buf
    }

    /// Whether a transport still holds the memory for a send it posted from it (another
    /// clone of [`dma_handle`](Self::dma_handle) exists). The eRPC core does not rewrite the
    /// data of, or reuse, a buffer in flight (module docs).
    #[inline]
    pub fn in_flight(&self) -> bool {
        Arc::strong_count(&self.buf) > 1
    }

    #[inline]
    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr`/`len` describe the mapping `self.buf` keeps alive; per the type docs
        // no device writes it while a slice derived from `&self` is alive (a transport sending
        // in place only reads it).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    #[inline]
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` excludes other slices (the `Arc` clones that
        // transports hold are never turned into slices: they keep the mapping alive and give
        // its address to the NIC). The NIC may still read bytes of packets posted in place;
        // the eRPC core writes only bytes no posted send reads (the data only while the
        // buffer is not in flight, a header slot only for a packet not sent yet or with the
        // bytes it already holds; module docs).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// The current data ([`MsgBuffer::data`]), so a received message reads like a byte slice.
impl std::ops::Deref for MsgBuffer {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        self.data()
    }
}

/// Compares the current data only (not capacity or headers).
impl PartialEq for MsgBuffer {
    fn eq(&self, other: &Self) -> bool {
        self.data() == other.data()
    }
}

impl Eq for MsgBuffer {}

impl PartialEq<[u8]> for MsgBuffer {
    fn eq(&self, other: &[u8]) -> bool {
        self.data() == other
    }
}

impl PartialEq<Vec<u8>> for MsgBuffer {
    fn eq(&self, other: &Vec<u8>) -> bool {
        self.data() == other.as_slice()
    }
}

impl<const N: usize> PartialEq<[u8; N]> for MsgBuffer {
    fn eq(&self, other: &[u8; N]) -> bool {
        self.data() == other
    }
}

impl<const N: usize> PartialEq<&[u8; N]> for MsgBuffer {
    fn eq(&self, other: &&[u8; N]) -> bool {
        self.data() == *other
    }
}

impl std::fmt::Debug for MsgBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MsgBuffer")
            .field("max_data_size", &self.max_data_size)
            .field("data_per_pkt", &self.data_per_pkt)
            .field("data_size", &self.data_size)
            .field("num_pkts", &self.num_pkts)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DPP: usize = 4080; // 4096 MTU - 16 B header

    #[test]
    fn layout_zero_size() {
        let mut m = MsgBuffer::new(0, DPP).unwrap();
        assert_eq!(m.num_pkts(), 1);
        assert_eq!(m.data(), &[] as &[u8]);
        assert_eq!(m.pkthdr_offset(0), 0);
        assert_eq!(m.pkt_data_offset(0), 16);
        assert_eq!(m.pkt_data_len(0), 0);
        assert_eq!(m.buf_len(), 16);
        m.pkthdr_mut(0)[0] = 7;
        assert_eq!(m.pkthdr(0)[0], 7);
    }

    #[test]
    fn layout_one_byte() {
        let mut m = MsgBuffer::new(1, DPP).unwrap();
        assert_eq!(m.num_pkts(), 1);
        m.data_mut()[0] = 0xab;
        assert_eq!(m.pkt_data(0), &[0xab]);
        assert_eq!(m.pkt_data_offset(0), 16);
        // Tail starts at 16 + round8(1) = 24; one packet needs no tail header.
        assert_eq!(m.buf_len(), 24);
    }

    #[test]
    fn layout_exactly_full_packet() {
        let m = MsgBuffer::new(DPP, DPP).unwrap();
        assert_eq!(m.num_pkts(), 1);
        assert_eq!(m.pkt_data_len(0), DPP);
        assert_eq!(m.buf_len(), 16 + DPP);
    }

    #[test]
    fn layout_multi_packet() {
        let size = 2 * DPP + 100;
        let mut m = MsgBuffer::new(size, DPP).unwrap();
        assert_eq!(m.num_pkts(), 3);
        let tail = 16 + size.next_multiple_of(8);
        assert_eq!(m.pkthdr_offset(0), 0);
        assert_eq!(m.pkthdr_offset(1), tail);
        assert_eq!(m.pkthdr_offset(2), tail + 16);
        assert_eq!(m.buf_len(), tail + 32);
        assert_eq!(m.pkthdr_offset(2) % 8, 0);
        for i in 0..3 {
            assert_eq!(m.pkt_data_offset(i), 16 + i * DPP);
        }
        assert_eq!(
            [m.pkt_data_len(0), m.pkt_data_len(1), m.pkt_data_len(2)],
            [DPP, DPP, 100]
        );
        for (i, b) in m.data_mut().iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        for i in 0..3 {
            m.pkthdr_mut(i).fill(0xee);
        }
        // Headers never overlap the data.
        assert!(
            m.data()
                .iter()
                .enumerate()
                .all(|(i, &b)| b == (i % 251) as u8)
        );
        let joined: Vec<u8> = (0..3).flat_map(|i| m.pkt_data(i).to_vec()).collect();
        assert_eq!(joined, m.data());
        assert_eq!(m.pkt_data_addr(1), m.as_ptr() as u64 + (16 + DPP) as u64);
        assert_eq!(m.pkthdr_addr(2), m.as_ptr() as u64 + (tail + 16) as u64);
        assert_eq!(m.as_ptr(), m.dma_buf().as_ptr());
    }

    #[test]
    fn resize_recomputes_packets() {
        let mut m = MsgBuffer::new(3 * DPP, DPP).unwrap();
        assert_eq!(m.num_pkts(), 3);
        m.resize(DPP + 1).unwrap();
        assert_eq!((m.data_size(), m.num_pkts()), (DPP + 1, 2));
        assert_eq!(m.pkt_data_len(1), 1);
        // Tail headers stay where a full message puts them.
        assert_eq!(m.pkthdr_offset(1), 16 + 3 * DPP);
        m.resize(0).unwrap();
        assert_eq!(m.num_pkts(), 1);
        m.resize(3 * DPP).unwrap();
        assert_eq!(m.num_pkts(), 3);
        assert!(matches!(
            m.resize(3 * DPP + 1),
            Err(MsgBufError::TooLarge { size, max }) if size == 3 * DPP + 1 && max == 3 * DPP
        ));
        assert_eq!(m.data_size(), 3 * DPP);
    }

    #[test]
    #[should_panic(expected = "packet 1 of 1")]
    fn pkthdr_beyond_num_pkts_panics() {
        let mut m = MsgBuffer::new(2 * DPP, DPP).unwrap();
        m.resize(10).unwrap();
        let _ = m.pkthdr(1);
    }

    #[test]
    fn write_pkt_checks_index_and_length() {
        let mut m = MsgBuffer::new(2 * DPP + 5, DPP).unwrap();
        m.write_pkt(2, &[9; 5]).unwrap();
        m.write_pkt(0, &[1; DPP]).unwrap();
        assert_eq!(m.pkt_data(2), &[9; 5]);
        assert!(matches!(
            m.write_pkt(3, &[0; 5]),
            Err(MsgBufError::PktOutOfRange {
                pkt: 3,
                num_pkts: 3
            })
        ));
        assert!(matches!(
            m.write_pkt(2, &[0; 6]),
            Err(MsgBufError::PktLength {
                pkt: 2,
                len: 6,
                want: 5
            })
        ));
        assert!(matches!(
            m.write_pkt(1, &[0; 5]),
            Err(MsgBufError::PktLength {
                pkt: 1,
                len: 5,
                want: DPP
            })
        ));
        // Nothing was written by the refused calls.
        assert_eq!(m.pkt_data(2), &[9; 5]);
        assert!(m.pkt_data(1).iter().all(|&b| b == 0));
        // A resize below packet 2 makes it out of range.
        m.resize(DPP).unwrap();
        assert!(m.write_pkt(1, &[]).is_err());
        assert!(m.pkt_parts(1).is_none());
        let (h, d) = m.pkt_parts(0).unwrap();
        assert_eq!((h.len(), d.len()), (16, DPP));
    }

    #[test]
    fn capacity_mut_then_resize() {
        let mut m = MsgBuffer::new(100, DPP).unwrap();
        m.resize(0).unwrap();
        assert_eq!(m.capacity_mut().len(), 100);
        m.capacity_mut()[..3].copy_from_slice(b"abc");
        m.resize(3).unwrap();
        assert_eq!(m, *b"abc");
        assert_eq!(&m[..], b"abc");
    }

    #[test]
    fn eight_mib_buffer() {
        let mut m = MsgBuffer::new(MAX_DATA_SIZE, DPP).unwrap();
        let n = MAX_DATA_SIZE.div_ceil(DPP);
        assert_eq!(m.num_pkts(), n);
        assert_eq!(m.buf_len(), 16 + MAX_DATA_SIZE + (n - 1) * 16);
        let last = n - 1;
        assert_eq!(m.pkt_data_len(last), MAX_DATA_SIZE - last * DPP);
        m.data_mut()[MAX_DATA_SIZE - 1] = 1;
        m.pkthdr_mut(last)[15] = 2;
        assert_eq!(m.pkt_data(last).last(), Some(&1));
        assert_eq!(m.pkthdr(last)[15], 2);
    }

    #[test]
    fn rejects_bad_parameters() {
        assert!(matches!(
            MsgBuffer::new(MAX_DATA_SIZE + 1, DPP),
            Err(MsgBufError::TooLarge { .. })
        ));
        assert!(matches!(
            MsgBuffer::new(10, 0),
            Err(MsgBufError::ZeroPacketCapacity)
        ));
        // 8 MiB in 256-byte packets is 32768 packets > 2^14.
        assert!(matches!(
            MsgBuffer::new(MAX_DATA_SIZE, 256),
            Err(MsgBufError::TooManyPackets(32768))
        ));
    }
}
