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
//! Receive buffers are exactly `mtu` bytes long, so a larger datagram is truncated by the kernel
//! and flagged with `MSG_TRUNC`; it is dropped and counted in
//! [`TransportStats::rx_oversized`]. Datagrams shorter than an eRPC packet header
//! ([`PKT_HDR_LEN`]) are delivered unchanged (and counted in [`TransportStats::rx_short`]): the
//! protocol core validates headers and counts bad ones itself.

use std::io;
use std::mem;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::{DatagramTransport, PKT_HDR_LEN, TransportStats, TxPkt};

/// Default MTU for IPv4 sockets: a 1500-byte Ethernet frame minus 20 B IPv4 and 8 B UDP headers.
pub const DEFAULT_MTU_V4: usize = 1472;
/// Default MTU for IPv6 sockets: a 1500-byte Ethernet frame minus 40 B IPv6 and 8 B UDP headers.
pub const DEFAULT_MTU_V6: usize = 1452;
/// Largest configurable MTU: the largest UDP payload over IPv4 (65535 − 20 − 8).
pub const MAX_MTU: usize = 65507;
/// Default number of datagrams per `sendmmsg`/`recvmmsg` call and receive-ring size.
pub const DEFAULT_BATCH: usize = 32;
/// Largest configurable batch: the kernel caps `sendmmsg`/`recvmmsg` at `UIO_MAXIOV` messages.
pub const MAX_BATCH: usize = 1024;

/// Alignment in bytes of each receive buffer.
const RX_ALIGN: usize = 64;

/// Configuration of a [`UdpTransport`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdpConfig {
    /// Local address to bind, e.g. `127.0.0.1:0` (port 0 picks a free port) or `[::1]:0`.
    pub bind: SocketAddr,
    /// Largest datagram payload in bytes, sent or received; between [`PKT_HDR_LEN`] and
    /// [`MAX_MTU`]. Both ends of a session must use the same value.
    pub mtu: usize,
    /// Datagrams per system call and receive-ring size; between 1 and [`MAX_BATCH`].
    pub batch: usize,
    /// If set, requests `SO_SNDBUF` and `SO_RCVBUF` of this many bytes (the kernel caps the
    /// value at `net.core.wmem_max` / `net.core.rmem_max` and doubles it for bookkeeping).
    pub socket_buf_bytes: Option<usize>,
}

impl UdpConfig {
    /// A configuration binding `bind`, with the Ethernet-safe default MTU of its address family
    /// ([`DEFAULT_MTU_V4`] or [`DEFAULT_MTU_V6`]), [`DEFAULT_BATCH`] and the kernel's default
    /// socket buffer sizes.
    pub fn new(bind: SocketAddr) -> Self {
        UdpConfig {
            bind,
            mtu: if bind.is_ipv4() {
                DEFAULT_MTU_V4
            } else {
                DEFAULT_MTU_V6
            },
            batch: DEFAULT_BATCH,
            socket_buf_bytes: None,
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

/// One `RX_ALIGN`-byte block of the receive ring; gives the ring its alignment.
#[repr(C, align(64))]
#[derive(Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
struct Block([u8; RX_ALIGN]);

/// A datagram of the current receive burst.
#[derive(Clone, Copy, Debug)]
struct RxMeta {
    /// Source address.
    addr: SocketAddr,
    /// Index of its buffer in the receive ring.
    slot: u32,
    /// Length in bytes.
    len: u32,
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
/// and `msg_control` is null with `msg_controllen` zero. All of it stays valid for the call.
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
/// zero.
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
    // SAFETY: `fd` is an open socket for the borrow's lifetime; the option value is a local
    // `c_int` whose address and size are passed together.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
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
    /// Messages per system call, and receive-ring size.
    batch: usize,
    /// Distance in bytes between receive buffers (`mtu` rounded up to `RX_ALIGN`).
    rx_stride: usize,
    /// Transmit headers (`batch`); their pointers are rewritten by every `tx_burst`.
    tx_hdrs: Box<[libc::mmsghdr]>,
    /// Transmit gather lists, two per message (`2 * batch`).
    tx_iovs: Box<[libc::iovec]>,
    /// Transmit destinations (`batch`).
    tx_names: Box<[RawSockAddr]>,
    /// Receive headers (`batch`); their pointers are rewritten by every `rx_burst`.
    rx_hdrs: Box<[libc::mmsghdr]>,
    /// Receive buffer descriptors, one per ring slot (`batch`).
    rx_iovs: Box<[libc::iovec]>,
    /// Receive source addresses (`batch`).
    rx_names: Box<[RawSockAddr]>,
    /// The receive ring: `batch` buffers of `rx_stride` bytes.
    rx_buf: Box<[Block]>,
    /// The datagrams of the current burst (first `rx_count` entries valid).
    rx_meta: Box<[RxMeta]>,
    /// Number of datagrams in the current burst.
    rx_count: usize,
    /// Counters.
    stats: TransportStats,
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
            .field("rx_count", &self.rx_count)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl UdpTransport {
    /// Binds a nonblocking UDP socket as `config` says and preallocates all batch state.
    ///
    /// # Errors
    /// [`io::ErrorKind::InvalidInput`] if `mtu` or `batch` is out of range; otherwise the
    /// errors of `bind(2)`, `fcntl(2)` and `setsockopt(2)`.
    pub fn bind(config: UdpConfig) -> io::Result<Self> {
        if !(PKT_HDR_LEN..=MAX_MTU).contains(&config.mtu) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "UDP transport mtu {} outside {PKT_HDR_LEN}..={MAX_MTU}",
                    config.mtu
                ),
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
        let local = socket.local_addr()?;
        let batch = config.batch;
        let rx_stride = config.mtu.div_ceil(RX_ALIGN) * RX_ALIGN;
        let empty_iov = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        let placeholder = RxMeta {
            addr: local,
            slot: 0,
            len: 0,
        };
        Ok(UdpTransport {
            socket,
            local,
            ipv6: local.is_ipv6(),
            mtu: config.mtu,
            batch,
            rx_stride,
            tx_hdrs: (0..batch).map(|_| zeroed_mmsghdr()).collect(),
            tx_iovs: vec![empty_iov; 2 * batch].into_boxed_slice(),
            tx_names: vec![RawSockAddr::zeroed(); batch].into_boxed_slice(),
            rx_hdrs: (0..batch).map(|_| zeroed_mmsghdr()).collect(),
            rx_iovs: vec![empty_iov; batch].into_boxed_slice(),
            rx_names: vec![RawSockAddr::zeroed(); batch].into_boxed_slice(),
            rx_buf: vec![Block([0; RX_ALIGN]); batch * rx_stride / RX_ALIGN].into_boxed_slice(),
            rx_meta: vec![placeholder; batch].into_boxed_slice(),
            rx_count: 0,
            stats: TransportStats::default(),
        })
    }

    /// The underlying socket (e.g. to wait for readability with `poll(2)` when idle).
    pub fn socket(&self) -> &UdpSocket {
        &self.socket
    }

    /// Datagrams per `sendmmsg`/`recvmmsg` call.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Sends one chunk of at most `batch` packets; returns how many were consumed and whether
    /// the burst must stop (queue full).
    fn tx_chunk(&mut self, chunk: &[TxPkt<'_, SocketAddr>]) -> io::Result<(usize, bool)> {
        debug_assert!(chunk.len() <= self.batch);
        for (i, p) in chunk.iter().enumerate() {
            let namelen = self.tx_names[i].set(p.dest, self.ipv6);
            self.tx_iovs[2 * i] = libc::iovec {
                iov_base: p.hdr.as_ptr().cast_mut().cast(),
                iov_len: p.hdr.len(),
            };
            self.tx_iovs[2 * i + 1] = libc::iovec {
                iov_base: p.data.as_ptr().cast_mut().cast(),
                iov_len: p.data.len(),
            };
            let h = &mut self.tx_hdrs[i].msg_hdr;
            h.msg_namelen = namelen;
            h.msg_iovlen = if p.data.is_empty() { 1 } else { 2 };
        }
        // Pointers are taken after the index writes above so that no later reborrow of these
        // arrays invalidates them before the system call.
        let names = self.tx_names.as_mut_ptr();
        let iovs = self.tx_iovs.as_mut_ptr();
        for (i, h) in self.tx_hdrs[..chunk.len()].iter_mut().enumerate() {
            h.msg_hdr.msg_name = names.wrapping_add(i).cast();
            h.msg_hdr.msg_iov = iovs.wrapping_add(2 * i);
            h.msg_len = 0;
        }
        loop {
            self.stats.tx_calls += 1;
            // SAFETY: for each of the first `chunk.len()` headers, `msg_name` points to entry
            // `i` of `tx_names`, initialized by `set` with `msg_namelen` bytes; `msg_iov` points
            // to entries `2i`, `2i + 1` of `tx_iovs` (`msg_iovlen` ≤ 2 of them used), which
            // point into `p.hdr` / `p.data`, borrowed for this whole call; `msg_control` is null
            // (zeroed at construction, never changed).
            match unsafe { sys_sendmmsg(self.socket.as_raw_fd(), &mut self.tx_hdrs[..chunk.len()]) }
            {
                Ok(n) => {
                    self.stats.tx_pkts += n as u64;
                    self.stats.tx_bytes += chunk[..n].iter().map(|p| p.len() as u64).sum::<u64>();
                    return Ok((n, false));
                }
                Err(e) => match classify_tx_error(&e) {
                    TxFailure::Retry => continue,
                    TxFailure::Full => {
                        self.stats.tx_would_block += 1;
                        return Ok((0, true));
                    }
                    TxFailure::DropPacket => {
                        self.stats.tx_errors += 1;
                        return Ok((1, false));
                    }
                    TxFailure::Fatal => return Err(e),
                },
            }
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
            let end = pkts.len().min(done + self.batch);
            match self.tx_chunk(&pkts[done..end]) {
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
        let buf = self.rx_buf.as_mut_ptr().cast::<u8>();
        for (i, iov) in self.rx_iovs[..n].iter_mut().enumerate() {
            *iov = libc::iovec {
                iov_base: buf.wrapping_add(i * self.rx_stride).cast(),
                iov_len: self.mtu,
            };
        }
        let names = self.rx_names.as_mut_ptr();
        let iovs = self.rx_iovs.as_mut_ptr();
        for (i, h) in self.rx_hdrs[..n].iter_mut().enumerate() {
            h.msg_hdr.msg_name = names.wrapping_add(i).cast();
            h.msg_hdr.msg_namelen = mem::size_of::<RawSockAddr>() as libc::socklen_t;
            h.msg_hdr.msg_iov = iovs.wrapping_add(i);
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_flags = 0;
            h.msg_len = 0;
        }
        let got = loop {
            // SAFETY: for each of the first `n` headers, `msg_name` points to entry `i` of
            // `rx_names` (`msg_namelen` = its size, writable); `msg_iov` points to entry `i` of
            // `rx_iovs`, which points to `mtu` bytes of ring slot `i` (`i * rx_stride +
            // mtu <= rx_buf` length), not otherwise borrowed during the call (`&mut self`);
            // `msg_control` is null (zeroed at construction, never changed).
            match unsafe { sys_recvmmsg(self.socket.as_raw_fd(), &mut self.rx_hdrs[..n]) } {
                Ok(got) => break got,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return 0,
                Err(_) => {
                    self.stats.rx_errors += 1;
                    return 0;
                }
            }
        };
        self.stats.rx_calls += 1;
        let mut count = 0;
        for i in 0..got {
            let h = &self.rx_hdrs[i];
            if h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 || h.msg_len as usize > self.mtu {
                self.stats.rx_oversized += 1;
                continue;
            }
            let Some(addr) = self.rx_names[i].get(h.msg_hdr.msg_namelen) else {
                self.stats.rx_errors += 1;
                continue;
            };
            let len = h.msg_len as usize;
            if len < PKT_HDR_LEN {
                self.stats.rx_short += 1;
            }
            self.stats.rx_pkts += 1;
            self.stats.rx_bytes += len as u64;
            self.rx_meta[count] = RxMeta {
                addr,
                slot: i as u32,
                len: len as u32,
            };
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
        let start = m.slot as usize * self.rx_stride;
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
            mtu: 8,
            ..UdpConfig::default()
        };
        assert_eq!(
            UdpTransport::bind(c).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        c.mtu = MAX_MTU + 1;
        assert!(UdpTransport::bind(c).is_err());
        c.mtu = 1000;
        c.batch = 0;
        assert!(UdpTransport::bind(c).is_err());
        c.batch = MAX_BATCH + 1;
        assert!(UdpTransport::bind(c).is_err());
        c.batch = 3;
        let t = UdpTransport::bind(c).unwrap();
        assert_eq!((t.mtu(), t.rx_batch(), t.rx_stride), (1000, 3, 1024));
    }
}
