//! [`DatagramTransport`] over a nonblocking UDP socket, batched with Linux `sendmmsg(2)` and
//! `recvmmsg(2)`.
//!
//! Everything the system calls need is allocated once in [`UdpTransport::bind`]: `mmsghdr`,
//! `iovec` and socket-address arrays for one batch in each direction, and a receive ring of
//! `batch` buffers of `mtu` bytes (each starting on a 64-byte boundary). A transmit burst points
//! the `iovec`s at the caller's header and data slices (gather, no copy); a receive burst lends
//! out the ring buffers in place. Both directions use `MSG_DONTWAIT`, so nothing blocks.
//!
//! Works for IPv4 and IPv6. On an IPv6 socket, IPv4 destinations are sent as IPv4-mapped
//! addresses, and IPv4-mapped sources are reported as plain IPv4 addresses, so a peer has one
//! address whichever way it is reached.
//!
//! # Segmentation offload (GSO/GRO)
//! With [`UdpConfig::gso`] set (the default), the socket uses Linux UDP segmentation offload
//! (`udp(7)`: `UDP_SEGMENT`, Linux ≥ 4.18, and `UDP_GRO`, Linux ≥ 5.0):
//! - **Transmit**: consecutive packets of a burst to the same destination whose lengths equal
//!   the first one's (the last may be shorter) go out as one message with a `UDP_SEGMENT`
//!   control message carrying that length (at most [`GSO_MAX_SEGMENTS`] packets and
//!   [`MAX_MTU`] bytes per message); the kernel cuts it into the original datagrams, so the
//!   wire carries exactly what plain sends would. Other packets are sent as plain messages in
//!   the same `sendmmsg` array.
//! - **Receive**: the kernel may hand several equal-size datagrams of one sender over as one
//!   coalesced buffer plus a `UDP_GRO` control message giving the segment size (on loopback
//!   this happens for GSO-sent messages, which then cross the stack once). Receive buffers are
//!   therefore [`GRO_BUF_LEN`] bytes each, at most [`GRO_MAX_RX_MSGS`] of them, and each
//!   segment is lent out as its own datagram. Segments that do not fit in the current burst
//!   (`max`, [`rx_batch`](DatagramTransport::rx_batch)) stay in their buffer for the next
//!   [`rx_burst`](DatagramTransport::rx_burst), which then delivers them without a system call.
//!
//! If the kernel refuses either option at [`UdpTransport::bind`], or refuses a GSO message at
//! send time (`EINVAL`, `EIO`, `EMSGSIZE`, e.g. segments above the path MTU or a device without
//! checksum offload), that direction falls back to plain datagrams for the rest of the
//! socket's life, logged once.
//!
//! Without GSO, receive buffers are exactly `mtu` bytes long, so a larger datagram is truncated
//! by the kernel and flagged with `MSG_TRUNC`; it is dropped and counted in
//! [`TransportStats::rx_oversized`]. With GRO, a datagram (segment) above `mtu` is dropped and
//! counted the same way. Datagrams shorter than an eRPC packet header
//! ([`PKT_HDR_LEN`]) are delivered unchanged (and counted in [`TransportStats::rx_short`]): the
//! protocol core validates headers and counts bad ones itself.

use std::io;
use std::mem;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::time::Duration;

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

pub use super::path_mtu::UdpMtu;
use super::path_mtu::auto_mtu;
use super::{DatagramTransport, PKT_HDR_LEN, RxFd, RxWait, TransportStats, TxPkt};

/// Default MTU for IPv4 sockets: a 1500-byte Ethernet frame minus 20 B IPv4 and 8 B UDP headers.
pub const DEFAULT_MTU_V4: usize = 1472;
/// Default MTU for IPv6 sockets: a 1500-byte Ethernet frame minus 40 B IPv6 and 8 B UDP headers.
pub const DEFAULT_MTU_V6: usize = 1452;
/// Largest configurable MTU: the largest UDP payload over IPv4 (65535 − 20 − 8).
pub const MAX_MTU: usize = 65507;
/// What Linux charges a UDP socket's receive buffer for one queued datagram of `mtu` bytes, an
/// upper estimate in bytes: the buffer's `skb->truesize`, i.e. the data allocation (payload,
/// up to 64 B of lower-layer headers and headroom, and the ~320 B `skb_shared_info`, which
/// the slab allocator rounds up to a power of two) plus the `sk_buff` itself and a margin
/// (512 B together). Datagrams of 1472 B are estimated at 2560 B (measured on Linux 6.x
/// loopback: about 2350 B). The kernel drops datagrams once the charges exceed the buffer, so
/// `SO_RCVBUF / udp_rx_charge(mtu)` datagrams fit (checked by the test
/// `rx_ring_entries_datagrams_fit_the_socket_buffer`).
pub fn udp_rx_charge(mtu: usize) -> usize {
    (mtu + 512).next_power_of_two() + 512
}

/// Default [`UdpConfig::socket_buf_bytes`]: 4 MiB. The kernel caps the request at
/// `net.core.rmem_max`/`wmem_max` (208 KiB on a stock kernel) and doubles it; the receive
/// buffer bounds admission control ([`udp_rx_charge`]) and the [`UdpMtu::Auto`] datagram size.
pub const DEFAULT_SOCKET_BUF_BYTES: usize = 4 << 20;

/// Default number of datagrams per `sendmmsg`/`recvmmsg` call and receive-ring size.
pub const DEFAULT_BATCH: usize = 32;
/// Largest configurable batch: the kernel caps `sendmmsg`/`recvmmsg` at `UIO_MAXIOV` messages.
pub const MAX_BATCH: usize = 1024;

/// Most datagrams per GSO message. The kernel's limit (`UDP_MAX_SEGMENTS`) is 64 on older
/// kernels and 128 on newer ones; 64 works everywhere.
pub const GSO_MAX_SEGMENTS: usize = 64;
/// Size in bytes of each receive buffer when GRO is on: room for a coalesced message of up to
/// 64 KiB (the kernel's GRO limit).
pub const GRO_BUF_LEN: usize = 65536;
/// Most receive buffers (messages per `recvmmsg`) when GRO is on, whatever the batch, to bound
/// the receive ring at `GRO_MAX_RX_MSGS * GRO_BUF_LEN` bytes (4 MiB).
pub const GRO_MAX_RX_MSGS: usize = 64;
/// Most packets one `sendmmsg` carries when GSO is on (bounds the preallocated `iovec` array).
const GSO_MAX_TX_PKTS: usize = 4096;

/// Alignment in bytes of each receive buffer.
const RX_ALIGN: usize = 64;

/// `UDP_SEGMENT` socket option / control message (`linux/udp.h`); not exported by `libc` for
/// glibc targets.
const UDP_SEGMENT: libc::c_int = 103;
/// `UDP_GRO` socket option / control message (`linux/udp.h`).
const UDP_GRO: libc::c_int = 104;

/// `CMSG_ALIGN(n)`: `n` rounded up to the control-message alignment (`size_t`).
const fn cmsg_align(n: usize) -> usize {
    (n + mem::size_of::<usize>() - 1) & !(mem::size_of::<usize>() - 1)
}
/// Aligned size in bytes of `struct cmsghdr`: where a control message's data starts.
const CMSG_HDR: usize = cmsg_align(mem::size_of::<libc::cmsghdr>());
/// `CMSG_LEN(data)`: the `cmsg_len` of a control message with `data` bytes of data.
const fn cmsg_len(data: usize) -> usize {
    CMSG_HDR + data
}
/// `CMSG_SPACE(data)`: the buffer space a control message with `data` bytes of data takes.
const fn cmsg_space(data: usize) -> usize {
    CMSG_HDR + cmsg_align(data)
}
/// Size in bytes of each per-message control buffer.
const CMSG_BUF_LEN: usize = 32;
const _: () = assert!(cmsg_space(mem::size_of::<libc::c_int>()) <= CMSG_BUF_LEN);
const _: () = assert!(mem::align_of::<libc::cmsghdr>() <= 8);

/// A per-message control-message buffer, aligned for `struct cmsghdr`.
///
/// Invariant: every byte is initialized (created zeroed, then written whole or by the kernel).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct CmsgBuf([u8; CMSG_BUF_LEN]);

impl CmsgBuf {
    /// Writes one `SOL_UDP`/`UDP_SEGMENT` control message carrying `seg` (bytes per segment)
    /// and returns its `msg_controllen`.
    fn set_segment(&mut self, seg: u16) -> usize {
        // SAFETY: `cmsghdr` is a C struct of integers (plus private padding integers on some
        // libcs), for which all-zero bytes are a valid value.
        let mut hdr: libc::cmsghdr = unsafe { mem::zeroed() };
        hdr.cmsg_len = cmsg_len(mem::size_of::<u16>()) as _;
        hdr.cmsg_level = libc::SOL_UDP;
        hdr.cmsg_type = UDP_SEGMENT;
        // SAFETY: the buffer is 8-byte aligned (≥ `cmsghdr`'s alignment, checked above) and
        // `CMSG_BUF_LEN` ≥ its size, so the write is aligned and in bounds.
        unsafe { self.0.as_mut_ptr().cast::<libc::cmsghdr>().write(hdr) };
        self.0[CMSG_HDR..CMSG_HDR + 2].copy_from_slice(&seg.to_ne_bytes());
        cmsg_space(mem::size_of::<u16>())
    }

    /// The segment size in bytes of a `SOL_UDP`/`UDP_GRO` control message among the first
    /// `controllen` bytes written by the kernel, if there is one (and it is positive).
    fn gro_segment(&self, controllen: usize) -> Option<usize> {
        let end = controllen.min(CMSG_BUF_LEN);
        let mut off = 0;
        while off + mem::size_of::<libc::cmsghdr>() <= end {
            // SAFETY: `off + size_of::<cmsghdr>() <= CMSG_BUF_LEN`, so the read is in bounds;
            // every byte is initialized (type invariant) and `cmsghdr` is plain integers,
            // valid for any bit pattern; `read_unaligned` needs no alignment.
            let hdr = unsafe {
                self.0
                    .as_ptr()
                    .add(off)
                    .cast::<libc::cmsghdr>()
                    .read_unaligned()
            };
            // `size_t` on glibc, `socklen_t` on musl.
            #[allow(clippy::unnecessary_cast)]
            let len = hdr.cmsg_len as usize;
            if len < CMSG_HDR || off + len > end {
                return None;
            }
            if hdr.cmsg_level == libc::SOL_UDP
                && hdr.cmsg_type == UDP_GRO
                && len >= cmsg_len(mem::size_of::<libc::c_int>())
            {
                let d = off + CMSG_HDR;
                let mut v = [0u8; 4];
                v.copy_from_slice(&self.0[d..d + 4]);
                return usize::try_from(libc::c_int::from_ne_bytes(v))
                    .ok()
                    .filter(|&s| s > 0);
            }
            off += cmsg_align(len);
        }
        None
    }
}

/// Configuration of a [`UdpTransport`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdpConfig {
    /// Local address to bind, e.g. `127.0.0.1:0` (port 0 picks a free port) or `[::1]:0`.
    pub bind: SocketAddr,
    /// Largest datagram payload in bytes, sent or received: fixed (between [`PKT_HDR_LEN`]
    /// and [`MAX_MTU`]) or derived from the network path at bind ([`UdpMtu::Auto`], the rule
    /// in [`path_mtu`](super::path_mtu)). Both ends of a session must use the same value.
    pub mtu: UdpMtu,
    /// Datagrams per system call and receive-ring size; between 1 and [`MAX_BATCH`].
    pub batch: usize,
    /// If set, requests `SO_SNDBUF` and `SO_RCVBUF` of this many bytes (the kernel caps the
    /// value at `net.core.wmem_max` / `net.core.rmem_max` and doubles it for bookkeeping).
    pub socket_buf_bytes: Option<usize>,
    /// Use UDP segmentation offload: `UDP_SEGMENT` on transmit and `UDP_GRO` on receive (see
    /// the [module docs](self#segmentation-offload-gsogro)). Default `true`; falls back to plain
    /// datagrams where the kernel refuses. With GRO the receive ring takes
    /// `min(batch, GRO_MAX_RX_MSGS) * GRO_BUF_LEN` bytes instead of about `batch * mtu`.
    pub gso: bool,
}

impl UdpConfig {
    /// A configuration binding `bind`, with the MTU derived from the bound address's link
    /// ([`UdpMtu::Auto`]: 8972 B on IPv4 loopback when the receive buffer admits it, 1472 B on
    /// a 1500 B Ethernet link), [`DEFAULT_BATCH`], socket buffers of
    /// [`DEFAULT_SOCKET_BUF_BYTES`] and GSO/GRO on.
    pub fn new(bind: SocketAddr) -> Self {
        UdpConfig {
            bind,
            mtu: UdpMtu::Auto,
            batch: DEFAULT_BATCH,
            socket_buf_bytes: Some(DEFAULT_SOCKET_BUF_BYTES),
            gso: true,
        }
    }
}

impl Default for UdpConfig {
    /// `127.0.0.1:0` with the IPv4 defaults.
    fn default() -> Self {
        UdpConfig::new(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
    }
}

/// A socket address in the form the kernel reads and writes: `sockaddr_in` or `sockaddr_in6`.
///
/// Invariant: every byte is initialized (values are created through [`RawSockAddr::zeroed`]
/// and only ever overwritten with whole `sockaddr_in`/`sockaddr_in6` values or by the kernel).
#[repr(C)]
#[derive(Clone, Copy)]
union RawSockAddr {
    v4: libc::sockaddr_in,
    v6: libc::sockaddr_in6,
}

impl RawSockAddr {
    /// An all-zero address (family `AF_UNSPEC`), initializing every byte of the union.
    fn zeroed() -> Self {
        RawSockAddr {
            v6: libc::sockaddr_in6 {
                sin6_family: 0,
                sin6_port: 0,
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr { s6_addr: [0; 16] },
                sin6_scope_id: 0,
            },
        }
    }

    /// Stores `addr` in the form a socket of the given family expects and returns its length.
    ///
    /// IPv4 addresses become IPv4-mapped IPv6 addresses on an IPv6 socket, and IPv4-mapped
    /// addresses become IPv4 on an IPv4 socket. A genuine IPv6 address on an IPv4 socket is
    /// stored as such; the kernel rejects it (`EAFNOSUPPORT`), which drops that packet.
    fn set(&mut self, addr: SocketAddr, ipv6_socket: bool) -> libc::socklen_t {
        match (addr, ipv6_socket) {
            (SocketAddr::V4(a), false) => self.set_v4(a),
            (SocketAddr::V4(a), true) => {
                self.set_v6(SocketAddrV6::new(a.ip().to_ipv6_mapped(), a.port(), 0, 0))
            }
            (SocketAddr::V6(a), false) => match a.ip().to_ipv4_mapped() {
                Some(ip) => self.set_v4(SocketAddrV4::new(ip, a.port())),
                None => self.set_v6(a),
            },
            (SocketAddr::V6(a), true) => self.set_v6(a),
        }
    }

    /// Stores an IPv4 address and returns its length.
    fn set_v4(&mut self, a: SocketAddrV4) -> libc::socklen_t {
        self.v4 = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: a.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(a.ip().octets()),
            },
            sin_zero: [0; 8],
        };
        mem::size_of::<libc::sockaddr_in>() as libc::socklen_t
    }

    /// Stores an IPv6 address and returns its length.
    fn set_v6(&mut self, a: SocketAddrV6) -> libc::socklen_t {
        self.v6 = libc::sockaddr_in6 {
            sin6_family: libc::AF_INET6 as libc::sa_family_t,
            sin6_port: a.port().to_be(),
            sin6_flowinfo: a.flowinfo().to_be(),
            sin6_addr: libc::in6_addr {
                s6_addr: a.ip().octets(),
            },
            sin6_scope_id: a.scope_id(),
        };
        mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t
    }

    /// Decodes an address of length `len` written by the kernel. IPv4-mapped IPv6 addresses
    /// are returned as IPv4. `None` for any other family or a short length.
    fn get(&self, len: libc::socklen_t) -> Option<SocketAddr> {
        let len = len as usize;
        // SAFETY: every byte of the union is initialized (type invariant), and both variants
        // are plain integers and byte arrays, valid for any bit pattern; `sin_family` and
        // `sin6_family` are the same leading `sa_family_t` field.
        let (family, v4, v6) = unsafe { (self.v4.sin_family, self.v4, self.v6) };
        match family as libc::c_int {
            libc::AF_INET if len >= mem::size_of::<libc::sockaddr_in>() => {
                let ip = Ipv4Addr::from(v4.sin_addr.s_addr.to_ne_bytes());
                Some(SocketAddr::from((ip, u16::from_be(v4.sin_port))))
            }
            libc::AF_INET6 if len >= mem::size_of::<libc::sockaddr_in6>() => {
                let ip = Ipv6Addr::from(v6.sin6_addr.s6_addr);
                let port = u16::from_be(v6.sin6_port);
                Some(match ip.to_ipv4_mapped() {
                    Some(ip4) => SocketAddr::from((IpAddr::V4(ip4), port)),
                    None => SocketAddr::V6(SocketAddrV6::new(
                        ip,
                        port,
                        u32::from_be(v6.sin6_flowinfo),
                        v6.sin6_scope_id,
                    )),
                })
            }
            _ => None,
        }
    }
}

/// How a received message of `len` bytes (already capped at the buffer length) is handed
/// out: `Ok(None)` as one datagram, `Ok(Some(seg))` as GRO segments of `seg` bytes (the last
/// may be shorter; `0 < seg < len`), or `Err(n)`: dropped, `n` oversized datagrams to count.
/// `ctrl` is the message's control buffer when GRO is on, of which the kernel wrote
/// `controllen` bytes; `flags` its `msg_flags`. Every input (any control bytes, any lengths)
/// gives one of these; nothing reads outside `ctrl`.
fn classify_rx(
    ctrl: Option<&CmsgBuf>,
    controllen: usize,
    len: usize,
    flags: libc::c_int,
    mtu: usize,
) -> Result<Option<usize>, u64> {
    let seg = ctrl.and_then(|c| c.gro_segment(controllen).filter(|&s| s < len));
    if flags & libc::MSG_TRUNC != 0 || seg.unwrap_or(len) > mtu {
        // Every datagram of the message is oversized (they share one size but the last,
        // which is not longer).
        return Err(seg.map_or(1, |s| len.div_ceil(s)) as u64);
    }
    Ok(seg)
}

/// One `RX_ALIGN`-byte block of the receive ring; gives the ring its alignment.
#[repr(C, align(64))]
#[derive(Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
struct Block([u8; RX_ALIGN]);

/// A datagram of the current receive burst.
#[derive(Clone, Copy, Debug)]
struct RxMeta {
    /// Source address.
    addr: SocketAddr,
    /// Offset in bytes of its first byte in the receive ring.
    start: u32,
    /// Length in bytes.
    len: u32,
}

/// A received message (one datagram, or several coalesced by GRO) whose datagrams are not all
/// delivered yet.
#[derive(Clone, Copy, Debug)]
struct RxMsg {
    /// Source address.
    addr: SocketAddr,
    /// Offset in bytes in the receive ring of the next undelivered datagram.
    start: u32,
    /// Offset in bytes in the receive ring just past the message.
    end: u32,
    /// Segment size in bytes (every datagram but the last of the message has this length);
    /// 0 for a message that is a single datagram (possibly empty).
    seg: u32,
}

/// A `mmsghdr` with every pointer null and every length zero.
fn zeroed_mmsghdr() -> libc::mmsghdr {
    // SAFETY: `mmsghdr` is a C struct of raw pointers and integers (plus, on some libcs,
    // private padding integers), for all of which all-zero bytes are a valid value.
    unsafe { mem::zeroed() }
}

/// How a `sendmmsg` failure is handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TxFailure {
    /// Interrupted: try the same call again.
    Retry,
    /// Send queue full: stop the burst, the caller retries later.
    Full,
    /// The error concerns the first packet only (its destination): drop it and go on.
    DropPacket,
    /// The socket itself failed.
    Fatal,
}

/// Classifies the `errno` of a failed `sendmmsg`, whose first message was the one that failed.
fn classify_tx_error(err: &io::Error) -> TxFailure {
    match err.raw_os_error() {
        Some(libc::EINTR) => TxFailure::Retry,
        Some(libc::EAGAIN | libc::ENOBUFS | libc::ENOMEM) => TxFailure::Full,
        Some(
            libc::ENETUNREACH
            | libc::EHOSTUNREACH
            | libc::ENETDOWN
            | libc::EHOSTDOWN
            | libc::ECONNREFUSED
            | libc::ECONNRESET
            | libc::EACCES
            | libc::EPERM
            | libc::EAFNOSUPPORT
            | libc::EADDRNOTAVAIL
            | libc::EINVAL
            | libc::EMSGSIZE,
        ) => TxFailure::DropPacket,
        _ => TxFailure::Fatal,
    }
}

/// `sendmmsg(fd, hdrs, hdrs.len(), MSG_DONTWAIT)`: returns how many messages were sent.
///
/// # Safety
/// For every header in `hdrs`: `msg_name` points to `msg_namelen` readable bytes, `msg_iov`
/// points to `msg_iovlen` readable `iovec`s, each of which points to `iov_len` readable bytes,
/// and `msg_control` is null with `msg_controllen` zero or points to `msg_controllen` readable
/// bytes of well-formed control messages. All of it stays valid for the call.
unsafe fn sys_sendmmsg(fd: RawFd, hdrs: &mut [libc::mmsghdr]) -> io::Result<usize> {
    debug_assert!(hdrs.len() <= MAX_BATCH);
    // SAFETY: the caller guarantees the pointers inside `hdrs`; `hdrs` itself is a valid,
    // exclusively borrowed array of `hdrs.len()` headers, into which the kernel writes `msg_len`.
    let n = unsafe {
        libc::sendmmsg(
            fd,
            hdrs.as_mut_ptr(),
            hdrs.len() as libc::c_uint,
            libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// `recvmmsg(fd, hdrs, hdrs.len(), MSG_DONTWAIT, NULL)`: returns how many messages arrived.
///
/// # Safety
/// For every header in `hdrs`: `msg_name` points to `msg_namelen` writable bytes, `msg_iov`
/// points to `msg_iovlen` readable `iovec`s, each of which points to `iov_len` writable bytes
/// that nothing else accesses during the call, and `msg_control` is null with `msg_controllen`
/// zero or points to `msg_controllen` writable bytes that nothing else accesses.
unsafe fn sys_recvmmsg(fd: RawFd, hdrs: &mut [libc::mmsghdr]) -> io::Result<usize> {
    debug_assert!(hdrs.len() <= MAX_BATCH);
    // SAFETY: the caller guarantees the pointers inside `hdrs`; `hdrs` itself is a valid,
    // exclusively borrowed array; a null timeout is allowed.
    let n = unsafe {
        libc::recvmmsg(
            fd,
            hdrs.as_mut_ptr(),
            hdrs.len() as libc::c_uint,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Sets an `int`-valued `SOL_SOCKET` option.
fn set_socket_int(fd: BorrowedFd<'_>, opt: libc::c_int, value: libc::c_int) -> io::Result<()> {
    set_sockopt_int(fd, libc::SOL_SOCKET, opt, value)
}

/// Reads an `int`-valued `SOL_SOCKET` option.
fn get_socket_int(fd: BorrowedFd<'_>, opt: libc::c_int) -> io::Result<libc::c_int> {
    get_sockopt_int(fd, libc::SOL_SOCKET, opt)
}

/// Reads an `int`-valued socket option of `level`.
pub(super) fn get_sockopt_int(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    opt: libc::c_int,
) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `fd` is an open socket for the borrow's lifetime; `value` and `len` are locals
    // whose addresses are passed with `len` holding the size of `value`.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (&raw mut value).cast(),
            &raw mut len,
        )
    };
    if rc == 0 {
        Ok(value)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets an `int`-valued socket option of `level`.
fn set_sockopt_int(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    opt: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `fd` is an open socket for the borrow's lifetime; the option value is a local
    // `c_int` whose address and size are passed together.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (&raw const value).cast(),
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Batched UDP [`DatagramTransport`]; see the [module docs](self).
pub struct UdpTransport {
    /// The nonblocking socket.
    socket: UdpSocket,
    /// Bound address, as returned by the socket.
    local: SocketAddr,
    /// Whether the socket is `AF_INET6`.
    ipv6: bool,
    /// Largest datagram in bytes.
    mtu: usize,
    /// Most datagrams per receive burst, and most messages per `sendmmsg`.
    batch: usize,
    /// Whether transmit bursts use `UDP_SEGMENT` (cleared for good if the kernel refuses).
    gso: bool,
    /// Whether `UDP_GRO` is enabled on the socket.
    gro: bool,
    /// Receive buffers, i.e. messages per `recvmmsg`.
    rx_msgs: usize,
    /// Bytes offered to the kernel per receive buffer (`mtu`, or [`GRO_BUF_LEN`] with GRO).
    rx_buf_len: usize,
    /// Distance in bytes between receive buffers (`rx_buf_len` rounded up to `RX_ALIGN`).
    rx_stride: usize,
    /// Transmit headers (`batch`); their pointers are rewritten by every `tx_burst`.
    tx_hdrs: Box<[libc::mmsghdr]>,
    /// Transmit gather lists, two per packet, for as many packets as one `sendmmsg` may carry
    /// (`batch`, or `batch * GSO_MAX_SEGMENTS` up to 4096 with GSO).
    tx_iovs: Box<[libc::iovec]>,
    /// Transmit destinations (`batch`).
    tx_names: Box<[RawSockAddr]>,
    /// Transmit `UDP_SEGMENT` control messages (`batch` with GSO, else empty).
    tx_ctrl: Box<[CmsgBuf]>,
    /// For each message of the current `sendmmsg`: packets it carries and index of its first
    /// entry in `tx_iovs` (`batch`).
    tx_msgs: Box<[(u32, u32)]>,
    /// Receive headers (`rx_msgs`); their pointers are rewritten by every `recvmmsg`.
    rx_hdrs: Box<[libc::mmsghdr]>,
    /// Receive buffer descriptors, one per buffer (`rx_msgs`).
    rx_iovs: Box<[libc::iovec]>,
    /// Receive source addresses (`rx_msgs`).
    rx_names: Box<[RawSockAddr]>,
    /// Receive `UDP_GRO` control messages (`rx_msgs` with GRO, else empty).
    rx_ctrl: Box<[CmsgBuf]>,
    /// The receive ring: `rx_msgs` buffers of `rx_stride` bytes.
    rx_buf: Box<[Block]>,
    /// Messages of the last `recvmmsg` with undelivered datagrams: `rx_pend[rx_head..rx_tail]`.
    rx_pend: Box<[RxMsg]>,
    /// First pending message.
    rx_head: usize,
    /// End of the pending messages.
    rx_tail: usize,
    /// The datagrams of the current burst (first `rx_count` entries valid; `batch` entries).
    rx_meta: Box<[RxMeta]>,
    /// Number of datagrams in the current burst.
    rx_count: usize,
    /// Counters.
    stats: TransportStats,
    /// `SO_RCVBUF` in bytes as the kernel reported it at bind.
    rcvbuf_bytes: usize,
    /// `rcvbuf_bytes / udp_rx_charge(mtu)`.
    rx_ring_entries: usize,
}

// SAFETY: the raw pointers inside the `mmsghdr`/`iovec` arrays are only written and then
// dereferenced (by the kernel) within one `tx_burst`/`rx_burst` call on `&mut self`; between
// calls they are stale values that are never read. They point into this struct's own boxed
// arrays or into slices borrowed for the duration of that call. Every other field is `Send`.
unsafe impl Send for UdpTransport {}

impl std::fmt::Debug for UdpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpTransport")
            .field("local", &self.local)
            .field("mtu", &self.mtu)
            .field("batch", &self.batch)
            .field("gso", &self.gso)
            .field("gro", &self.gro)
            .field("rx_count", &self.rx_count)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl UdpTransport {
    /// Binds a nonblocking UDP socket as `config` says and preallocates all batch state.
    ///
    /// With [`UdpConfig::gso`], probes `UDP_SEGMENT` and enables `UDP_GRO`; a refusal turns
    /// that direction's offload off (logged once, see [`gso`](Self::gso), [`gro`](Self::gro))
    /// and is not an error.
    ///
    /// A derived MTU ([`UdpMtu::Auto`], [`UdpMtu::AutoToward`]) is resolved once the socket
    /// buffers are set, from the receive buffer the kernel granted; [`mtu`](Self::mtu) reports
    /// the result.
    ///
    /// # Errors
    /// [`io::ErrorKind::InvalidInput`] if a fixed `mtu` or `batch` is out of range; otherwise
    /// the errors of `bind(2)`, `fcntl(2)` and `setsockopt(2)` (socket buffer sizes).
    pub fn bind(config: UdpConfig) -> io::Result<Self> {
        if let UdpMtu::Fixed(mtu) = config.mtu
            && !(PKT_HDR_LEN..=MAX_MTU).contains(&mtu)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("UDP transport mtu {mtu} outside {PKT_HDR_LEN}..={MAX_MTU}"),
            ));
        }
        if !(1..=MAX_BATCH).contains(&config.batch) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "UDP transport batch {} outside 1..={MAX_BATCH}",
                    config.batch
                ),
            ));
        }
        let socket = UdpSocket::bind(config.bind)?;
        socket.set_nonblocking(true)?;
        if let Some(bytes) = config.socket_buf_bytes {
            let bytes = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
            set_socket_int(socket.as_fd(), libc::SO_SNDBUF, bytes)?;
            set_socket_int(socket.as_fd(), libc::SO_RCVBUF, bytes)?;
        }
        // Probe with segment size 0 (= no default segmentation for plain sends).
        let gso = config.gso
            && match set_sockopt_int(socket.as_fd(), libc::SOL_UDP, UDP_SEGMENT, 0) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!("UDP transport: kernel refuses UDP_SEGMENT ({e}); GSO off");
                    false
                }
            };
        let gro = config.gso
            && match set_sockopt_int(socket.as_fd(), libc::SOL_UDP, UDP_GRO, 1) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!("UDP transport: kernel refuses UDP_GRO ({e}); GRO off");
                    false
                }
            };
        let local = socket.local_addr()?;
        let rcvbuf_bytes =
            usize::try_from(get_socket_int(socket.as_fd(), libc::SO_RCVBUF)?).unwrap_or(0);
        let mtu = match config.mtu {
            UdpMtu::Fixed(mtu) => mtu,
            UdpMtu::Auto => auto_mtu(config.bind.ip(), rcvbuf_bytes),
            UdpMtu::AutoToward(peer) => auto_mtu(peer, rcvbuf_bytes),
        };
        let batch = config.batch;
        let tx_max_pkts = if gso {
            (batch * GSO_MAX_SEGMENTS).min(GSO_MAX_TX_PKTS).max(batch)
        } else {
            batch
        };
        let (rx_msgs, rx_buf_len) = if gro {
            (batch.min(GRO_MAX_RX_MSGS), GRO_BUF_LEN)
        } else {
            (batch, mtu)
        };
        let rx_stride = rx_buf_len.div_ceil(RX_ALIGN) * RX_ALIGN;
        let empty_iov = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        let placeholder = RxMeta {
            addr: local,
            start: 0,
            len: 0,
        };
        let no_msg = RxMsg {
            addr: local,
            start: 0,
            end: 0,
            seg: 0,
        };
        let zero_ctrl = CmsgBuf([0; CMSG_BUF_LEN]);
        Ok(UdpTransport {
            socket,
            local,
            ipv6: local.is_ipv6(),
            mtu,
            batch,
            gso,
            gro,
            rx_msgs,
            rx_buf_len,
            rx_stride,
            tx_hdrs: (0..batch).map(|_| zeroed_mmsghdr()).collect(),
            tx_iovs: vec![empty_iov; 2 * tx_max_pkts].into_boxed_slice(),
            tx_names: vec![RawSockAddr::zeroed(); batch].into_boxed_slice(),
            tx_ctrl: vec![zero_ctrl; if gso { batch } else { 0 }].into_boxed_slice(),
            tx_msgs: vec![(0, 0); batch].into_boxed_slice(),
            rx_hdrs: (0..rx_msgs).map(|_| zeroed_mmsghdr()).collect(),
            rx_iovs: vec![empty_iov; rx_msgs].into_boxed_slice(),
            rx_names: vec![RawSockAddr::zeroed(); rx_msgs].into_boxed_slice(),
            rx_ctrl: vec![zero_ctrl; if gro { rx_msgs } else { 0 }].into_boxed_slice(),
            rx_buf: vec![Block([0; RX_ALIGN]); rx_msgs * rx_stride / RX_ALIGN].into_boxed_slice(),
            rx_pend: vec![no_msg; rx_msgs].into_boxed_slice(),
            rx_head: 0,
            rx_tail: 0,
            rx_meta: vec![placeholder; batch].into_boxed_slice(),
            rx_count: 0,
            stats: TransportStats::default(),
            rcvbuf_bytes,
            rx_ring_entries: rcvbuf_bytes / udp_rx_charge(mtu),
        })
    }

    /// The underlying socket (e.g. to wait for readability with `poll(2)` when idle).
    pub fn socket(&self) -> &UdpSocket {
        &self.socket
    }

    /// The socket's receive buffer in bytes (`SO_RCVBUF` as the kernel reported it at bind:
    /// twice the requested size, capped at `net.core.rmem_max`, or `net.core.rmem_default`).
    pub fn rcvbuf_bytes(&self) -> usize {
        self.rcvbuf_bytes
    }

    /// Most datagrams per receive burst; most messages per `sendmmsg`/`recvmmsg` call.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Whether transmit bursts currently use GSO (`UDP_SEGMENT`): [`UdpConfig::gso`] was set
    /// and the kernel has not refused it.
    pub fn gso(&self) -> bool {
        self.gso
    }

    /// Whether `UDP_GRO` is enabled on the socket ([`UdpConfig::gso`] was set and the kernel
    /// accepted it), i.e. whether received messages may hold several datagrams.
    pub fn gro(&self) -> bool {
        self.gro
    }

    /// Sets up the `iovec`s of packet `p` at `tx_iovs[iov..]`; returns how many were used.
    fn push_pkt_iovs(&mut self, iov: usize, p: &TxPkt<'_, SocketAddr>, keep_empty: bool) -> usize {
        let mut n = 0;
        for part in [p.hdr, p.data] {
            if part.is_empty() && !(keep_empty && n == 0) {
                continue;
            }
            self.tx_iovs[iov + n] = libc::iovec {
                iov_base: part.as_ptr().cast_mut().cast(),
                iov_len: part.len(),
            };
            n += 1;
        }
        n
    }

    /// Sends one `sendmmsg` of at most `batch` messages from the front of `pkts` (several
    /// packets per message with GSO); returns how many packets were consumed and whether the
    /// burst must stop (queue full).
    fn tx_chunk(&mut self, pkts: &[TxPkt<'_, SocketAddr>]) -> io::Result<(usize, bool)> {
        let mut msgs = 0;
        let mut p = 0;
        let mut iov = 0;
        while msgs < self.batch && p < pkts.len() && iov + 2 <= self.tx_iovs.len() {
            let first = &pkts[p];
            let seg = first.len();
            let mut k = 1;
            if self.gso && seg > 0 {
                let max_k = GSO_MAX_SEGMENTS
                    .min(MAX_MTU / seg)
                    .min((self.tx_iovs.len() - iov) / 2);
                while k < max_k && p + k < pkts.len() {
                    let q = &pkts[p + k];
                    if q.dest != first.dest || q.is_empty() || q.len() > seg {
                        break;
                    }
                    k += 1;
                    if q.len() < seg {
                        break;
                    }
                }
            }
            let iov_start = iov;
            for q in &pkts[p..p + k] {
                iov += self.push_pkt_iovs(iov, q, k == 1);
            }
            let namelen = self.tx_names[msgs].set(first.dest, self.ipv6);
            let controllen = if k > 1 {
                self.tx_ctrl[msgs].set_segment(seg as u16)
            } else {
                0
            };
            let h = &mut self.tx_hdrs[msgs].msg_hdr;
            h.msg_namelen = namelen;
            h.msg_iovlen = (iov - iov_start) as _;
            h.msg_controllen = controllen as _;
            self.tx_msgs[msgs] = (k as u32, iov_start as u32);
            msgs += 1;
            p += k;
        }
        // Pointers are taken after the index writes above so that no later reborrow of these
        // arrays invalidates them before the system call.
        let names = self.tx_names.as_mut_ptr();
        let iovs = self.tx_iovs.as_mut_ptr();
        let ctrl = self.tx_ctrl.as_mut_ptr();
        for (i, h) in self.tx_hdrs[..msgs].iter_mut().enumerate() {
            h.msg_hdr.msg_name = names.wrapping_add(i).cast();
            h.msg_hdr.msg_iov = iovs.wrapping_add(self.tx_msgs[i].1 as usize);
            h.msg_hdr.msg_control = if h.msg_hdr.msg_controllen == 0 {
                std::ptr::null_mut()
            } else {
                ctrl.wrapping_add(i).cast()
            };
            h.msg_len = 0;
        }
        loop {
            self.stats.tx_calls += 1;
            // SAFETY: for each of the first `msgs` headers, `msg_name` points to entry `i` of
            // `tx_names`, initialized by `set` with `msg_namelen` bytes; `msg_iov` points to
            // `msg_iovlen` consecutive initialized entries of `tx_iovs` (all in bounds: `iov`
            // never exceeds its length), which point into the `hdr`/`data` slices of `pkts`,
            // borrowed for this whole call; `msg_control` is null with `msg_controllen` 0, or
            // points to entry `i` of `tx_ctrl`, holding one well-formed `UDP_SEGMENT` control
            // message of `msg_controllen` bytes.
            match unsafe { sys_sendmmsg(self.socket.as_raw_fd(), &mut self.tx_hdrs[..msgs]) } {
                Ok(n) => {
                    let sent: usize = self.tx_msgs[..n].iter().map(|&(k, _)| k as usize).sum();
                    self.stats.tx_pkts += sent as u64;
                    self.stats.tx_bytes += pkts[..sent].iter().map(|p| p.len() as u64).sum::<u64>();
                    return Ok((sent, false));
                }
                Err(e) => {
                    let first_pkts = self.tx_msgs[0].0 as usize;
                    if first_pkts > 1
                        && matches!(
                            e.raw_os_error(),
                            Some(libc::EINVAL | libc::EIO | libc::EMSGSIZE)
                        )
                    {
                        // The kernel refuses this GSO message: plain datagrams from now on;
                        // nothing was sent, the caller's loop resends these packets.
                        tracing::warn!("UDP transport: kernel refuses a GSO send ({e}); GSO off");
                        self.gso = false;
                        return Ok((0, false));
                    }
                    match classify_tx_error(&e) {
                        TxFailure::Retry => continue,
                        TxFailure::Full => {
                            self.stats.tx_would_block += 1;
                            return Ok((0, true));
                        }
                        TxFailure::DropPacket => {
                            self.stats.tx_errors += first_pkts as u64;
                            return Ok((first_pkts, false));
                        }
                        TxFailure::Fatal => return Err(e),
                    }
                }
            }
        }
    }

    /// One `recvmmsg` into all receive buffers (at most `n` messages); queues the messages in
    /// `rx_pend`. Requires no pending message (their buffers are reused).
    fn rx_fill(&mut self, n: usize) {
        debug_assert_eq!(self.rx_head, self.rx_tail);
        self.rx_head = 0;
        self.rx_tail = 0;
        let n = n.min(self.rx_msgs);
        let buf = self.rx_buf.as_mut_ptr().cast::<u8>();
        for (i, iov) in self.rx_iovs[..n].iter_mut().enumerate() {
            *iov = libc::iovec {
                iov_base: buf.wrapping_add(i * self.rx_stride).cast(),
                iov_len: self.rx_buf_len,
            };
        }
        let names = self.rx_names.as_mut_ptr();
        let iovs = self.rx_iovs.as_mut_ptr();
        let ctrl = self.rx_ctrl.as_mut_ptr();
        let gro = self.gro;
        for (i, h) in self.rx_hdrs[..n].iter_mut().enumerate() {
            h.msg_hdr.msg_name = names.wrapping_add(i).cast();
            h.msg_hdr.msg_namelen = mem::size_of::<RawSockAddr>() as libc::socklen_t;
            h.msg_hdr.msg_iov = iovs.wrapping_add(i);
            h.msg_hdr.msg_iovlen = 1;
            if gro {
                h.msg_hdr.msg_control = ctrl.wrapping_add(i).cast();
                h.msg_hdr.msg_controllen = CMSG_BUF_LEN as _;
            }
            h.msg_hdr.msg_flags = 0;
            h.msg_len = 0;
        }
        let got = loop {
            // SAFETY: for each of the first `n` headers, `msg_name` points to entry `i` of
            // `rx_names` (`msg_namelen` = its size, writable); `msg_iov` points to entry `i` of
            // `rx_iovs`, which points to `rx_buf_len` bytes of buffer `i` (`i * rx_stride +
            // rx_buf_len <= rx_buf` length as `i < rx_msgs`), not otherwise borrowed during
            // the call (`&mut self`); `msg_control` is null with `msg_controllen` 0 (zeroed at
            // construction, never changed without GRO) or, with GRO, points to entry `i` of
            // `rx_ctrl` (`CMSG_BUF_LEN` writable bytes).
            match unsafe { sys_recvmmsg(self.socket.as_raw_fd(), &mut self.rx_hdrs[..n]) } {
                Ok(got) => break got,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    self.stats.rx_errors += 1;
                    return;
                }
            }
        };
        self.stats.rx_calls += 1;
        for i in 0..got {
            let h = &self.rx_hdrs[i];
            let len = (h.msg_len as usize).min(self.rx_buf_len);
            // `size_t` on glibc, `socklen_t` on musl.
            #[allow(clippy::unnecessary_cast)]
            let controllen = h.msg_hdr.msg_controllen as usize;
            let ctrl = gro.then(|| &self.rx_ctrl[i]);
            let seg = match classify_rx(ctrl, controllen, len, h.msg_hdr.msg_flags, self.mtu) {
                Ok(seg) => seg,
                Err(oversized) => {
                    self.stats.rx_oversized += oversized;
                    continue;
                }
            };
            let Some(addr) = self.rx_names[i].get(h.msg_hdr.msg_namelen) else {
                self.stats.rx_errors += 1;
                continue;
            };
            let start = i * self.rx_stride;
            self.rx_pend[self.rx_tail] = RxMsg {
                addr,
                start: start as u32,
                end: (start + len) as u32,
                seg: seg.unwrap_or(0) as u32,
            };
            self.rx_tail += 1;
        }
    }
}

impl AsFd for UdpTransport {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

impl AsRawFd for UdpTransport {
    fn as_raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

impl DatagramTransport for UdpTransport {
    type Addr = SocketAddr;

    fn mtu(&self) -> usize {
        self.mtu
    }

    fn local_addr(&self) -> SocketAddr {
        self.local
    }

    fn rx_batch(&self) -> usize {
        self.batch
    }

    /// The socket's receive buffer (`SO_RCVBUF` as the kernel reports it, read at bind)
    /// divided by [`udp_rx_charge`] of the MTU: how many full-size datagrams it holds.
    fn rx_ring_entries(&self) -> usize {
        self.rx_ring_entries
    }

    fn tx_burst(&mut self, pkts: &[TxPkt<'_, SocketAddr>]) -> io::Result<usize> {
        if let Some((i, p)) = pkts.iter().enumerate().find(|(_, p)| p.len() > self.mtu) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "packet {i} is {} bytes, above the UDP transport mtu {}",
                    p.len(),
                    self.mtu
                ),
            ));
        }
        let mut done = 0;
        while done < pkts.len() {
            match self.tx_chunk(&pkts[done..]) {
                Ok((n, stop)) => {
                    done += n;
                    if stop {
                        break;
                    }
                }
                Err(_) if done > 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    fn rx_burst(&mut self, max: usize) -> usize {
        self.rx_count = 0;
        let n = max.min(self.batch);
        if n == 0 {
            return 0;
        }
        if self.rx_head == self.rx_tail {
            self.rx_fill(n);
        }
        let mut count = 0;
        while count < n && self.rx_head < self.rx_tail {
            let m = &mut self.rx_pend[self.rx_head];
            let rest = m.end - m.start;
            let len = if m.seg == 0 { rest } else { rest.min(m.seg) };
            self.rx_meta[count] = RxMeta {
                addr: m.addr,
                start: m.start,
                len,
            };
            m.start += len;
            if m.start >= m.end {
                self.rx_head += 1;
            }
            if (len as usize) < PKT_HDR_LEN {
                self.stats.rx_short += 1;
            }
            self.stats.rx_pkts += 1;
            self.stats.rx_bytes += u64::from(len);
            count += 1;
        }
        self.rx_count = count;
        count
    }

    fn rx_pkt(&self, i: usize) -> (SocketAddr, &[u8]) {
        assert!(
            i < self.rx_count,
            "rx_pkt({i}) outside the current burst of {}",
            self.rx_count
        );
        let m = self.rx_meta[i];
        let start = m.start as usize;
        (
            m.addr,
            &self.rx_buf.as_bytes()[start..start + m.len as usize],
        )
    }

    fn rx_release(&mut self) {
        self.rx_count = 0;
    }

    fn stats(&self) -> TransportStats {
        self.stats
    }

    /// `ppoll(2)` for `POLLIN` on the socket, at most `timeout` (rounded to whole µs, at least
    /// 1 µs; the kernel's timer slack, 50 µs by default, may add to it). Datagrams already
    /// received by the last `recvmmsg` and not yet handed out (segments of a coalesced one)
    /// make it return [`RxWait::Ready`] at once. An interrupted or failed `ppoll` is `Ready`
    /// (the caller polls; a failure is counted in `rx_errors`).
    fn rx_wait_fd(&self) -> RxFd {
        if self.rx_head < self.rx_tail {
            RxFd::Ready
        } else {
            RxFd::Fd(self.socket.as_raw_fd())
        }
    }

    fn rx_wait(&mut self, timeout: Duration) -> RxWait {
        if self.rx_head < self.rx_tail {
            return RxWait::Ready;
        }
        match poll_readable(self.socket.as_raw_fd(), timeout) {
            Ok(true) => RxWait::Ready,
            Ok(false) => RxWait::TimedOut,
            Err(e) => {
                if e.kind() != io::ErrorKind::Interrupted {
                    self.stats.rx_errors += 1;
                }
                RxWait::Ready
            }
        }
    }
}

/// Waits up to `timeout` for `fd` to become readable (`ppoll(2)`, `POLLIN`); `Ok(true)` if it
/// is (or reports an error condition, which the next receive returns).
fn poll_readable(fd: RawFd, timeout: Duration) -> io::Result<bool> {
    let mut pfd = [libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }];
    ppoll_readable(&mut pfd, timeout)
}

/// Waits up to `timeout` (at least 1 µs) for one of `fds` to become readable (`ppoll(2)`,
/// `POLLIN` each); `Ok(true)` if one is (or reports an error condition, which its next
/// receive returns), `Ok(false)` at the timeout.
pub(crate) fn ppoll_readable(fds: &mut [libc::pollfd], timeout: Duration) -> io::Result<bool> {
    let ns = timeout.as_nanos().clamp(1_000, 999_999_999_999) as i64;
    let ts = libc::timespec {
        tv_sec: ns / 1_000_000_000,
        tv_nsec: ns % 1_000_000_000,
    };
    // SAFETY: `fds` is a valid slice of pollfds and `ts` a valid timespec, both live across
    // the call; the signal mask argument is null (unchanged).
    let rc = unsafe {
        libc::ppoll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(addr: SocketAddr, ipv6_socket: bool) -> Option<SocketAddr> {
        let mut raw = RawSockAddr::zeroed();
        let len = raw.set(addr, ipv6_socket);
        raw.get(len)
    }

    #[test]
    fn sockaddr_roundtrip_v4_and_v6() {
        let v4: SocketAddr = "10.1.2.3:4567".parse().unwrap();
        assert_eq!(roundtrip(v4, false), Some(v4));
        // On an IPv6 socket a v4 address travels IPv4-mapped and decodes back to v4.
        assert_eq!(roundtrip(v4, true), Some(v4));
        let v6: SocketAddr = "[fe80::1:2%7]:9".parse().unwrap();
        assert_eq!(roundtrip(v6, true), Some(v6));
        let v6 = SocketAddr::V6(SocketAddrV6::new("2001:db8::5".parse().unwrap(), 80, 3, 0));
        assert_eq!(roundtrip(v6, true), Some(v6));
        // IPv4-mapped destination on an IPv4 socket is sent as plain IPv4.
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:77".parse().unwrap();
        let mut raw = RawSockAddr::zeroed();
        assert_eq!(
            raw.set(mapped, false) as usize,
            mem::size_of::<libc::sockaddr_in>()
        );
        assert_eq!(raw.get(16), Some("127.0.0.1:77".parse().unwrap()));
    }

    #[test]
    fn sockaddr_rejects_unknown_family_and_short_length() {
        let raw = RawSockAddr::zeroed();
        assert_eq!(raw.get(28), None);
        let mut raw = RawSockAddr::zeroed();
        raw.set("1.2.3.4:5".parse().unwrap(), false);
        assert_eq!(raw.get(8), None);
    }

    #[test]
    fn tx_error_classification() {
        let e = |n| io::Error::from_raw_os_error(n);
        assert_eq!(classify_tx_error(&e(libc::EAGAIN)), TxFailure::Full);
        assert_eq!(classify_tx_error(&e(libc::EINTR)), TxFailure::Retry);
        assert_eq!(
            classify_tx_error(&e(libc::EAFNOSUPPORT)),
            TxFailure::DropPacket
        );
        assert_eq!(classify_tx_error(&e(libc::EBADF)), TxFailure::Fatal);
    }

    #[test]
    fn config_validation() {
        let mut c = UdpConfig {
            mtu: UdpMtu::Fixed(8),
            gso: false,
            ..UdpConfig::default()
        };
        assert_eq!(
            UdpTransport::bind(c).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        c.mtu = UdpMtu::Fixed(MAX_MTU + 1);
        assert!(UdpTransport::bind(c).is_err());
        c.mtu = UdpMtu::Fixed(1000);
        c.batch = 0;
        assert!(UdpTransport::bind(c).is_err());
        c.batch = MAX_BATCH + 1;
        assert!(UdpTransport::bind(c).is_err());
        c.batch = 3;
        let t = UdpTransport::bind(c).unwrap();
        assert_eq!((t.mtu(), t.rx_batch(), t.rx_stride), (1000, 3, 1024));
    }

    /// Binds `bind` with a derived MTU and the default 4 MiB socket buffers.
    fn bind_auto(bind: &str, mtu: UdpMtu) -> UdpTransport {
        UdpTransport::bind(UdpConfig {
            mtu,
            ..UdpConfig::new(bind.parse().unwrap())
        })
        .unwrap()
    }

    #[test]
    fn derived_mtu_is_the_same_for_a_server_and_a_client_of_it() {
        let expected = |ip: &str, t: &UdpTransport| {
            crate::erpc::datagram::path_mtu::auto_mtu(ip.parse().unwrap(), t.rcvbuf_bytes())
        };
        // Loopback server, loopback client.
        let server = bind_auto("127.0.0.1:0", UdpMtu::Auto);
        let client = bind_auto(
            "127.0.0.1:0",
            UdpMtu::AutoToward("127.0.0.1".parse().unwrap()),
        );
        assert_eq!(server.mtu(), client.mtu());
        assert_eq!(server.mtu(), expected("127.0.0.1", &server));
        // A server on the unspecified address, reached on loopback by a client that applies
        // the rule to the address it was given.
        let server = bind_auto("0.0.0.0:0", UdpMtu::Auto);
        let client = bind_auto(
            "127.0.0.1:0",
            UdpMtu::AutoToward("0.0.0.0".parse().unwrap()),
        );
        assert_eq!(server.mtu(), client.mtu());
        assert_eq!(server.mtu(), expected("0.0.0.0", &server));
        // With loopback's 65536 B MTU and a receive buffer that holds 256 jumbo datagrams,
        // the datagram is a jumbo frame's payload.
        let lo = bind_auto("127.0.0.1:0", UdpMtu::Auto);
        let jumbo_fits = lo.rcvbuf_bytes() / udp_rx_charge(8972)
            >= crate::erpc::datagram::path_mtu::AUTO_MTU_MIN_RX_DATAGRAMS;
        let lo_mtu = std::fs::read_to_string("/sys/class/net/lo/mtu").ok();
        if jumbo_fits && lo_mtu.as_deref().map(str::trim) == Some("65536") {
            assert_eq!(lo.mtu(), 8972);
            assert_eq!(
                lo.rx_ring_entries(),
                lo.rcvbuf_bytes() / udp_rx_charge(8972)
            );
        } else {
            eprintln!(
                "jumbo case skipped: rcvbuf {} B, lo mtu {lo_mtu:?}",
                lo.rcvbuf_bytes()
            );
            assert_eq!(lo.mtu(), expected("127.0.0.1", &lo));
        }
        // A fixed size is used as given.
        assert_eq!(bind_auto("127.0.0.1:0", UdpMtu::Fixed(1000)).mtu(), 1000);
    }

    #[test]
    fn a_small_receive_buffer_keeps_the_ethernet_datagram() {
        // 64 KiB requested: the kernel grants at most 128 KiB, which holds fewer than 256
        // jumbo datagrams, so loopback falls back to the Ethernet default.
        let t = UdpTransport::bind(UdpConfig {
            socket_buf_bytes: Some(64 << 10),
            ..UdpConfig::new("127.0.0.1:0".parse().unwrap())
        })
        .unwrap();
        assert!(t.rcvbuf_bytes() <= 128 << 10);
        assert_eq!(t.mtu(), DEFAULT_MTU_V4);
    }

    fn bind_udp(gso: bool, mtu: usize, batch: usize) -> UdpTransport {
        UdpTransport::bind(UdpConfig {
            mtu: UdpMtu::Fixed(mtu),
            batch,
            socket_buf_bytes: Some(4 << 20),
            gso,
            ..UdpConfig::default()
        })
        .unwrap()
    }

    /// `rx_wait_fd` and `ppoll_readable`, the wait of a caller with several transports: the
    /// socket's descriptor (or `Ready` with segments buffered), a timeout with nothing to
    /// receive on any, and a return for a datagram in any one of them.
    #[test]
    fn a_wait_over_several_sockets_ends_for_a_datagram_in_any() {
        use std::time::Instant;
        let mut a = bind_udp(false, DEFAULT_MTU_V4, 8);
        let b = bind_udp(false, DEFAULT_MTU_V4, 8);
        let mut c = bind_udp(false, DEFAULT_MTU_V4, 8);
        let fd = |t: &UdpTransport| match t.rx_wait_fd() {
            RxFd::Fd(fd) => libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            },
            other => panic!("{other:?}"),
        };
        let mut fds = [fd(&b), fd(&c)];
        assert!(!ppoll_readable(&mut fds, Duration::from_millis(2)).unwrap());
        let p = pattern(2, 64);
        assert_eq!(a.tx_burst(&[TxPkt::single(c.local_addr(), &p)]).unwrap(), 1);
        // Loopback queues the datagram in `c`'s socket within `sendmmsg`: a lost wake would
        // take the whole 60 s.
        let t = Instant::now();
        assert!(ppoll_readable(&mut fds, Duration::from_secs(60)).unwrap());
        assert!(t.elapsed() < Duration::from_secs(5));
        assert_eq!(c.rx_burst(8), 1);
        c.rx_release();
        c.rx_head = 0;
        c.rx_tail = 1;
        assert_eq!(c.rx_wait_fd(), RxFd::Ready, "segments still buffered");
    }

    /// `rx_wait`: a timeout with nothing to receive, at once for a waiting datagram or for
    /// segments of a coalesced one not yet handed out, and a wake for a datagram sent while
    /// the thread is blocked.
    #[test]
    fn rx_wait_ends_at_its_timeout_or_for_a_datagram() {
        use std::time::Instant;
        let mut a = bind_udp(false, DEFAULT_MTU_V4, 8);
        let mut b = bind_udp(false, DEFAULT_MTU_V4, 8);
        let t = Instant::now();
        assert_eq!(b.rx_wait(Duration::from_millis(2)), RxWait::TimedOut);
        assert!(
            t.elapsed() >= Duration::from_millis(2),
            "ppoll waits its timeout"
        );

        let to = b.local_addr();
        let p = pattern(1, 100);
        assert_eq!(a.tx_burst(&[TxPkt::single(to, &p)]).unwrap(), 1);
        // Loopback queues the datagram in `b`'s socket within `sendmmsg`.
        assert_eq!(b.rx_wait(Duration::from_secs(60)), RxWait::Ready);
        assert_eq!(b.rx_burst(8), 1);
        assert_eq!(b.rx_pkt(0).1, &p[..]);
        b.rx_release();

        // A coalesced datagram cut into segments, some still pending in the ring: ready
        // without asking the kernel (whose queue is empty).
        b.rx_pend[0] = RxMsg {
            addr: to,
            start: 0,
            end: 64,
            seg: 32,
        };
        b.rx_head = 0;
        b.rx_tail = 1;
        assert_eq!(b.rx_wait(Duration::from_secs(60)), RxWait::Ready);
        assert_eq!(b.rx_burst(1), 1);
        assert_eq!(
            b.rx_wait(Duration::from_secs(60)),
            RxWait::Ready,
            "one segment left"
        );
        assert_eq!(b.rx_burst(1), 1);
        b.rx_release();
        assert_eq!(b.rx_wait(Duration::from_millis(1)), RxWait::TimedOut);

        // A datagram sent while `b` sleeps wakes it (the 60 s bound is not what ends it).
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!(a.tx_burst(&[TxPkt::single(to, &p)]).unwrap(), 1);
        });
        let t = Instant::now();
        assert_eq!(b.rx_wait(Duration::from_secs(60)), RxWait::Ready);
        assert!(t.elapsed() < Duration::from_secs(30));
        sender.join().unwrap();
        assert_eq!(b.rx_burst(8), 1);
        assert_eq!(b.stats().rx_errors, 0);
    }

    /// Distinct contents for packet `i` of length `len`.
    fn pattern(i: usize, len: usize) -> Vec<u8> {
        (0..len).map(|j| (i * 31 + j * 7) as u8).collect()
    }

    /// Receives until `want` datagrams arrived (10 s timeout), `max` per burst; returns them
    /// and the size of every non-empty burst.
    fn recv_n(
        t: &mut UdpTransport,
        want: usize,
        max: usize,
    ) -> (Vec<(SocketAddr, Vec<u8>)>, Vec<usize>) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let (mut got, mut bursts) = (Vec::new(), Vec::new());
        while got.len() < want {
            assert!(
                std::time::Instant::now() < deadline,
                "only {} of {want}",
                got.len()
            );
            let n = t.rx_burst(max);
            if n == 0 {
                std::thread::yield_now();
                continue;
            }
            bursts.push(n);
            for i in 0..n {
                let (a, b) = t.rx_pkt(i);
                got.push((a, b.to_vec()));
            }
            t.rx_release();
        }
        (got, bursts)
    }

    #[test]
    fn gso_equal_packets_and_short_tail_arrive_as_separate_datagrams() {
        for rx_gso in [true, false] {
            let mut tx = bind_udp(true, DEFAULT_MTU_V4, 32);
            let mut rx = bind_udp(rx_gso, DEFAULT_MTU_V4, 32);
            let dest = rx.local_addr();
            let mut bufs: Vec<Vec<u8>> = (0..10).map(|i| pattern(i, 1000)).collect();
            bufs.push(pattern(10, 300));
            // Split header/data to exercise the gather list.
            let pkts: Vec<_> = bufs
                .iter()
                .map(|b| TxPkt::new(dest, &b[..16], &b[16..]))
                .collect();
            assert_eq!(tx.tx_burst(&pkts).unwrap(), 11);
            let st = tx.stats();
            assert_eq!((st.tx_pkts, st.tx_calls), (11, 1));
            assert_eq!(st.tx_bytes, 10 * 1000 + 300);
            let (got, _) = recv_n(&mut rx, 11, 64);
            assert_eq!(got.len(), 11);
            for (i, (a, b)) in got.iter().enumerate() {
                assert_eq!(*a, tx.local_addr());
                assert_eq!(b, &bufs[i], "datagram {i} (rx gso {rx_gso})");
            }
            let rs = rx.stats();
            assert_eq!((rs.rx_pkts, rs.rx_bytes), (11, 10_300));
            assert_eq!((rs.rx_oversized, rs.rx_short, rs.rx_errors), (0, 0, 0));
            if tx.gso() && rx.gro() {
                // On loopback the GSO message reaches the GRO socket whole.
                assert_eq!(rs.rx_calls, 1);
            }
        }
    }

    #[test]
    fn gso_mixed_destinations_and_lengths_in_one_burst() {
        let mut tx = bind_udp(true, DEFAULT_MTU_V4, 32);
        let mut ra = bind_udp(true, DEFAULT_MTU_V4, 32);
        let mut rb = bind_udp(false, DEFAULT_MTU_V4, 32);
        let (a, b) = (ra.local_addr(), rb.local_addr());
        // (destination, length): runs of equal lengths, a longer packet after a run, a short
        // tail followed by more of the same length, an empty datagram, and 70 equal packets
        // (more than one GSO message holds).
        let mut plan: Vec<(SocketAddr, usize)> = vec![
            (a, 100),
            (a, 100),
            (a, 100),
            (b, 100),
            (b, 100),
            (a, 60),
            (a, 100),
            (a, 200),
            (a, 200),
            (b, 0),
            (b, 17),
            (a, 1472),
            (b, 5),
        ];
        plan.extend(std::iter::repeat_n((b, 64), 70));
        let bufs: Vec<Vec<u8>> = plan
            .iter()
            .enumerate()
            .map(|(i, &(_, l))| pattern(i, l))
            .collect();
        let pkts: Vec<_> = plan
            .iter()
            .zip(&bufs)
            .map(|(&(d, _), buf)| TxPkt::single(d, buf))
            .collect();
        let mut sent = 0;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while sent < pkts.len() {
            assert!(std::time::Instant::now() < deadline);
            sent += tx.tx_burst(&pkts[sent..]).unwrap();
        }
        assert_eq!(tx.stats().tx_pkts, pkts.len() as u64);
        assert_eq!(tx.stats().tx_errors, 0);
        if tx.gso() {
            assert_eq!(tx.stats().tx_calls, 1, "one sendmmsg for the whole burst");
        }
        for (r, addr) in [(&mut ra, a), (&mut rb, b)] {
            let want: Vec<&Vec<u8>> = plan
                .iter()
                .zip(&bufs)
                .filter(|((d, _), _)| *d == addr)
                .map(|(_, buf)| buf)
                .collect();
            let (got, _) = recv_n(r, want.len(), 64);
            assert_eq!(got.len(), want.len());
            for (i, (src, bytes)) in got.iter().enumerate() {
                assert_eq!(*src, tx.local_addr());
                assert_eq!(bytes, want[i], "datagram {i} to {addr}");
            }
            assert_eq!(r.rx_burst(64), 0, "nothing extra");
        }
        // The empty and the 5-byte datagrams are shorter than a packet header (16 B).
        assert_eq!(rb.stats().rx_short, 2);
    }

    #[test]
    fn gro_burst_respects_max_and_rx_batch_across_a_coalesced_message() {
        let mut tx = bind_udp(true, DEFAULT_MTU_V4, 32);
        let mut rx = bind_udp(true, DEFAULT_MTU_V4, 4);
        let dest = rx.local_addr();
        let bufs: Vec<Vec<u8>> = (0..10).map(|i| pattern(i, 500)).collect();
        let pkts: Vec<_> = bufs.iter().map(|b| TxPkt::single(dest, b)).collect();
        assert_eq!(tx.tx_burst(&pkts).unwrap(), 10);
        // First burst asks for 3, then 100 (capped at rx_batch 4), then the rest.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut got = Vec::new();
        let mut bursts = Vec::new();
        let mut max = 3;
        while got.len() < 10 {
            assert!(std::time::Instant::now() < deadline);
            let n = rx.rx_burst(max);
            assert!(n <= max.min(rx.rx_batch()), "burst of {n} above max {max}");
            if n == 0 {
                std::thread::yield_now();
                continue;
            }
            bursts.push(n);
            got.extend((0..n).map(|i| rx.rx_pkt(i).1.to_vec()));
            max = 100;
        }
        assert_eq!(got, bufs);
        if tx.gso() && rx.gro() {
            // One coalesced message, handed out over three bursts without re-receiving.
            assert_eq!(bursts, [3, 4, 3]);
            assert_eq!(rx.stats().rx_calls, 1);
        }
        assert_eq!(rx.stats().rx_pkts, 10);
        assert_eq!(rx.rx_burst(0), 0);
        assert_eq!(rx.rx_burst(100), 0);
    }

    #[test]
    fn gro_oversized_segments_are_counted_per_datagram() {
        let mut tx = bind_udp(true, 2000, 32);
        let mut rx = bind_udp(true, 1000, 32);
        let dest = rx.local_addr();
        let big: Vec<u8> = pattern(0, 1500);
        let small = pattern(1, 200);
        let pkts = [
            TxPkt::single(dest, &big),
            TxPkt::single(dest, &big),
            TxPkt::single(dest, &big),
            TxPkt::single(dest, &small),
        ];
        let mut sent = 0;
        while sent < pkts.len() {
            sent += tx.tx_burst(&pkts[sent..]).unwrap();
        }
        // The 200-byte tail rides in the same GSO message as the 1500-byte ones: the whole
        // message is dropped; every datagram of it is counted.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while rx.stats().rx_oversized + rx.stats().rx_pkts < 4 {
            assert!(std::time::Instant::now() < deadline);
            let n = rx.rx_burst(32);
            for i in 0..n {
                assert_eq!(rx.rx_pkt(i).1, &small[..]);
            }
        }
        let st = rx.stats();
        assert!(st.rx_oversized >= 3, "{st:?}");
        assert_eq!(st.rx_oversized + st.rx_pkts, 4, "{st:?}");
    }

    #[test]
    fn gso_off_keeps_plain_datagrams() {
        let mut tx = bind_udp(false, 1000, 8);
        let mut rx = bind_udp(false, 1000, 8);
        assert!(!tx.gso() && !tx.gro() && !rx.gro());
        assert_eq!(rx.rx_stride, 1024);
        let dest = rx.local_addr();
        let bufs: Vec<Vec<u8>> = (0..12).map(|i| pattern(i, 100)).collect();
        let pkts: Vec<_> = bufs.iter().map(|b| TxPkt::single(dest, b)).collect();
        assert_eq!(tx.tx_burst(&pkts).unwrap(), 12);
        // 8 messages per sendmmsg without GSO.
        assert_eq!(tx.stats().tx_calls, 2);
        let (got, bursts) = recv_n(&mut rx, 12, 5);
        assert!(bursts.iter().all(|&n| n <= 5));
        let got: Vec<Vec<u8>> = got.into_iter().map(|(_, b)| b).collect();
        assert_eq!(got, bufs);
        // A datagram above the MTU is truncated by the kernel, dropped and counted.
        let plain = UdpSocket::bind("127.0.0.1:0").unwrap();
        plain.send_to(&[7u8; 1001], dest).unwrap();
        plain.send_to(&[8u8; 1000], dest).unwrap();
        let (got, _) = recv_n(&mut rx, 1, 8);
        assert_eq!(got[0].1, vec![8u8; 1000]);
        assert_eq!(rx.stats().rx_oversized, 1);
    }

    #[test]
    fn segment_cmsg_roundtrip() {
        let mut c = CmsgBuf([0; CMSG_BUF_LEN]);
        let len = c.set_segment(1234);
        assert_eq!(len, cmsg_space(2));
        // Not a UDP_GRO message.
        assert_eq!(c.gro_segment(len), None);
        // Turn it into a UDP_GRO message with an int payload.
        c.0[CMSG_HDR..CMSG_HDR + 4].copy_from_slice(&1234i32.to_ne_bytes());
        // SAFETY: as in `set_segment`: aligned, in bounds, plain integers.
        let mut hdr: libc::cmsghdr = unsafe { mem::zeroed() };
        hdr.cmsg_len = cmsg_len(4) as _;
        hdr.cmsg_level = libc::SOL_UDP;
        hdr.cmsg_type = UDP_GRO;
        // SAFETY: see above.
        unsafe { c.0.as_mut_ptr().cast::<libc::cmsghdr>().write(hdr) };
        assert_eq!(c.gro_segment(cmsg_space(4)), Some(1234));
        // Truncated control data is ignored.
        assert_eq!(c.gro_segment(cmsg_len(4) - 1), None);
        assert_eq!(c.gro_segment(0), None);
    }

    /// Property tests of what the receive path decodes from the kernel and the wire (issue 14
    /// §4): `UDP_GRO` control messages, source addresses, and the cutting of a coalesced
    /// message into datagrams. 256 cases per property by default; `PROPTEST_CASES=<n>` runs
    /// more (proptest reads the variable itself).
    mod props {
        use proptest::prelude::*;

        use super::*;

        /// The control-message walk of `cmsg(3)`, written out independently on the bytes:
        /// the segment size of the first `SOL_UDP`/`UDP_GRO` message with room for an `int`.
        fn gro_oracle(b: &[u8; CMSG_BUF_LEN], controllen: usize) -> Option<usize> {
            assert_eq!(mem::size_of::<libc::cmsghdr>(), 16, "64-bit glibc layout");
            let end = controllen.min(CMSG_BUF_LEN);
            let mut off = 0;
            while off + 16 <= end {
                let len = u64::from_ne_bytes(b[off..off + 8].try_into().unwrap()) as usize;
                let level = i32::from_ne_bytes(b[off + 8..off + 12].try_into().unwrap());
                let ty = i32::from_ne_bytes(b[off + 12..off + 16].try_into().unwrap());
                if len < 16 || off + len > end {
                    return None;
                }
                if level == libc::SOL_UDP && ty == UDP_GRO && len >= 20 {
                    let v = i32::from_ne_bytes(b[off + 16..off + 20].try_into().unwrap());
                    return (v > 0).then_some(v as usize);
                }
                off += len.div_ceil(8) * 8;
            }
            None
        }

        /// Control bytes that are often a well-formed `UDP_GRO` message (possibly after
        /// another message), else arbitrary.
        fn ctrl_bytes() -> impl Strategy<Value = [u8; CMSG_BUF_LEN]> {
            (
                any::<[u8; CMSG_BUF_LEN]>(),
                0u8..4,
                any::<i32>(),
                0usize..40,
            )
                .prop_map(|(mut b, shape, seg, clen)| {
                    let mut put = |off: usize, len: usize, level: i32, ty: i32| {
                        if off + 16 <= CMSG_BUF_LEN {
                            b[off..off + 8].copy_from_slice(&(len as u64).to_ne_bytes());
                            b[off + 8..off + 12].copy_from_slice(&level.to_ne_bytes());
                            b[off + 12..off + 16].copy_from_slice(&ty.to_ne_bytes());
                        }
                    };
                    match shape {
                        0 => {}
                        1 => put(0, clen, libc::SOL_UDP, UDP_GRO),
                        2 => put(0, 20, libc::SOL_UDP, UDP_GRO),
                        _ => put(0, 16, libc::SOL_SOCKET, 1),
                    }
                    if shape == 2 {
                        b[16..20].copy_from_slice(&seg.to_ne_bytes());
                    }
                    b
                })
        }

        proptest! {
            /// `gro_segment` over arbitrary control bytes and any `controllen` (a kernel
            /// may report more than the buffer): never reads outside the buffer, and finds
            /// exactly what the written-out walk finds.
            #[test]
            fn gro_segment_over_arbitrary_control_bytes(
                b in ctrl_bytes(),
                controllen in prop_oneof![0usize..=CMSG_BUF_LEN, any::<usize>()],
            ) {
                let c = CmsgBuf(b);
                prop_assert_eq!(c.gro_segment(controllen), gro_oracle(&b, controllen));
            }

            /// Every received message is either handed out (whole, or as segments of a size
            /// below its length and at most the MTU) or dropped with a count of at least one
            /// oversized datagram: one per datagram the message holds.
            #[test]
            fn classify_rx_over_arbitrary_messages(
                b in ctrl_bytes(),
                controllen in 0usize..64,
                gro in any::<bool>(),
                len in prop_oneof![0usize..2000, 0usize..=GRO_BUF_LEN],
                trunc in any::<bool>(),
                mtu in PKT_HDR_LEN..=MAX_MTU,
            ) {
                let c = CmsgBuf(b);
                let flags = if trunc { libc::MSG_TRUNC } else { 0 };
                let seg = if gro { gro_oracle(&b, controllen).filter(|&s| s < len) } else { None };
                match classify_rx(gro.then_some(&c), controllen, len, flags, mtu) {
                    Ok(None) => prop_assert!(!trunc && len <= mtu && seg.is_none()),
                    Ok(Some(s)) => {
                        prop_assert!(!trunc && s > 0 && s < len && s <= mtu);
                        prop_assert_eq!(Some(s), seg);
                    }
                    Err(n) => {
                        prop_assert!(trunc || seg.unwrap_or(len) > mtu);
                        prop_assert_eq!(n, seg.map_or(1, |s| len.div_ceil(s)) as u64);
                    }
                }
            }

            /// A source address as the kernel (or anything) left it: decoded only for
            /// `AF_INET` / `AF_INET6` with a long enough length, and then to the address the
            /// bytes hold (IPv4-mapped IPv6 as IPv4).
            #[test]
            fn sockaddr_get_over_arbitrary_bytes(
                bytes in any::<[u8; 28]>(),
                family in prop_oneof![Just(libc::AF_INET), Just(libc::AF_INET6), any::<i32>()],
                len in prop_oneof![0u32..40, any::<u32>()],
            ) {
                assert_eq!(mem::size_of::<RawSockAddr>(), 28);
                let mut b = bytes;
                b[0..2].copy_from_slice(&(family as u16).to_ne_bytes());
                let mut raw = RawSockAddr::zeroed();
                // SAFETY: `RawSockAddr` is 28 bytes of plain integers, valid for any pattern.
                unsafe {
                    std::ptr::copy_nonoverlapping(b.as_ptr(), (&raw mut raw).cast::<u8>(), 28)
                };
                let fam = i32::from(u16::from_ne_bytes([b[0], b[1]]));
                let port = u16::from_be_bytes([b[2], b[3]]);
                let got = raw.get(len);
                match fam {
                    libc::AF_INET if len as usize >= 16 => prop_assert_eq!(
                        got,
                        Some(SocketAddr::from((Ipv4Addr::new(b[4], b[5], b[6], b[7]), port)))
                    ),
                    libc::AF_INET6 if len as usize >= 28 => {
                        let ip = Ipv6Addr::from(<[u8; 16]>::try_from(&b[8..24]).unwrap());
                        let want = match ip.to_ipv4_mapped() {
                            Some(v4) => SocketAddr::from((v4, port)),
                            None => SocketAddr::V6(SocketAddrV6::new(
                                ip,
                                port,
                                u32::from_be_bytes(b[4..8].try_into().unwrap()),
                                u32::from_ne_bytes(b[24..28].try_into().unwrap()),
                            )),
                        };
                        prop_assert_eq!(got, Some(want));
                    }
                    _ => prop_assert_eq!(got, None),
                }
            }

            /// Pending messages with any segment size are handed out as datagrams that lie
            /// inside their message, cover it exactly and in order, are at most the segment
            /// size, come at most `max` (and `batch`) per burst, and are counted (`rx_pkts`,
            /// `rx_bytes`, and `rx_short` below a header).
            #[test]
            fn rx_burst_cuts_messages_within_their_bounds(
                msgs in proptest::collection::vec((0usize..=1472, any::<u16>(), any::<bool>()), 1..=8),
                maxes in proptest::collection::vec(1usize..12, 1..40),
            ) {
                let mut t = bind_udp(false, DEFAULT_MTU_V4, 8);
                let from: SocketAddr = "10.0.0.1:9".parse().unwrap();
                let mut want: Vec<Vec<Vec<u8>>> = Vec::new();
                for (i, &(len, seg, coalesced)) in msgs.iter().enumerate() {
                    let start = i * t.rx_stride;
                    let seg = if coalesced && len > 1 { 1 + seg as usize % (len - 1) } else { 0 };
                    let bytes = pattern(i, len);
                    t.rx_buf.as_mut_bytes()[start..start + len].copy_from_slice(&bytes);
                    t.rx_pend[i] = RxMsg {
                        addr: from,
                        start: start as u32,
                        end: (start + len) as u32,
                        seg: seg as u32,
                    };
                    want.push(if seg == 0 {
                        vec![bytes]
                    } else {
                        bytes.chunks(seg).map(<[u8]>::to_vec).collect()
                    });
                }
                t.rx_head = 0;
                t.rx_tail = msgs.len();
                let want: Vec<Vec<u8>> = want.into_iter().flatten().collect();
                let mut got = Vec::new();
                for &max in &maxes {
                    if t.rx_head == t.rx_tail {
                        break;
                    }
                    let n = t.rx_burst(max);
                    prop_assert!(n <= max.min(8) && n >= 1);
                    for i in 0..n {
                        let (a, b) = t.rx_pkt(i);
                        prop_assert_eq!(a, from);
                        got.push(b.to_vec());
                    }
                    t.rx_release();
                }
                if t.rx_head == t.rx_tail {
                    prop_assert_eq!(&got, &want);
                } else {
                    prop_assert_eq!(&got[..], &want[..got.len()]);
                }
                let st = t.stats();
                prop_assert_eq!(st.rx_pkts, got.len() as u64);
                prop_assert_eq!(st.rx_bytes, got.iter().map(|g| g.len() as u64).sum::<u64>());
                prop_assert_eq!(
                    st.rx_short,
                    got.iter().filter(|g| g.len() < PKT_HDR_LEN).count() as u64
                );
            }
        }
    }
}
