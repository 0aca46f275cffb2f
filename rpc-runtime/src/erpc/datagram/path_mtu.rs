//! The default UDP datagram size: taken from the network path instead of assumed.
//!
//! eRPC cuts messages into packets of the fabric's MTU (seeds/000 §2.2: `MTU = 4096`, the
//! InfiniBand MTU) and its credits count packets (§2.2 `SESSION_CREDITS = 8`, §5), so the
//! bytes a session can have in flight are `session_credits × (mtu − 16)`. With the 8 credits
//! and the Ethernet-safe 1472 B datagram, that window is 11.6 KB, which bounds one session to
//! about 5 Gbit/s on a 20 µs round trip (UDP loopback on a VM) whatever congestion control
//! does. A datagram sized to the path restores what the seed assumes, a packet as large as
//! the link carries.
//!
//! # The rule ([`UdpMtu::Auto`], [`UdpMtu::AutoToward`])
//! 1. **Link MTU** ([`link_mtu`]) of the address the rule is applied to:
//!    - an address assigned to a local interface (loopback included): that interface's MTU
//!      (`/sys/class/net/<name>/mtu`);
//!    - the unspecified address (`0.0.0.0`, `::`): the smallest MTU of the interfaces that are
//!      up and not loopback (only loopback if nothing else is up), since such a socket may be
//!      reached through any of them;
//!    - any other address (a remote peer): the kernel's path MTU toward it (`IP_MTU` /
//!      `IPV6_MTU` of a UDP socket connected to it, `ip(7)`, `ipv6(7)`).
//! 2. **Datagram** = `min(link MTU, `[`JUMBO_FRAME_BYTES`]`)` minus the IP and UDP headers
//!    (28 B for IPv4, 48 B for IPv6), at least the protocol minimum (IPv4 576 B, IPv6 1280 B,
//!    minus the same headers). Loopback (MTU 65536) gives 8972 B over IPv4; a 1500 B Ethernet
//!    link gives the old default, 1472 B; a 1450 B overlay link gives 1422 B, where the old
//!    default would have been fragmented.
//! 3. **Admission** ([`AUTO_MTU_MIN_RX_DATAGRAMS`]): a datagram above the Ethernet default is
//!    kept only if the socket's receive buffer holds at least that many of them (estimated by
//!    [`udp_rx_charge`]); otherwise the Ethernet default is used. Admission control sizes
//!    the receive ring from the buffer (sessions × credits ≤ ring entries, as eRPC), so
//!    on a kernel that caps `SO_RCVBUF` low (`net.core.rmem_max` of 208 KiB) a jumbo datagram
//!    would admit one to three sessions; there the old default, and its admission, stay.
//!
//! Both ends of a session must use the same size (the connect handshake checks it,
//! `ConfigMismatch` naming `mtu`). A server applies the rule to its bound address; a client
//! applies it to the server's address as it was given ([`UdpMtu::AutoToward`]), so a client
//! and a server on one host, or on a cluster whose links share an MTU and whose kernels share
//! `rmem_max`, arrive at the same value. Where they do not, the typed client
//! (`Erpc::connect_with`) reconnects once with the size the server's refusal names; a size
//! set explicitly ([`UdpMtu::Fixed`]) is never replaced.
//!
//! A lookup that fails (no such interface, no `/sys`, no route) falls back to the Ethernet
//! default and is logged at `debug`.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;

use nix::ifaddrs::getifaddrs;
use nix::net::if_::InterfaceFlags;

use super::udp::{DEFAULT_MTU_V4, DEFAULT_MTU_V6, get_sockopt_int, udp_rx_charge};

/// Largest link MTU the rule uses, in bytes: an Ethernet jumbo frame. Loopback (65536 B) is
/// capped here, so a session's 8-packet window is about 72 KB, and the receive buffer still
/// holds hundreds of datagrams.
pub const JUMBO_FRAME_BYTES: usize = 9000;

/// Datagrams the receive buffer must hold for the rule to keep a datagram above the Ethernet
/// default: 32 sessions of the seed's 8 credits.
pub const AUTO_MTU_MIN_RX_DATAGRAMS: usize = 256;

/// How a [`UdpTransport`](super::UdpTransport) sizes its datagrams
/// ([`UdpConfig::mtu`](super::UdpConfig::mtu)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UdpMtu {
    /// Exactly this many bytes per datagram (eRPC header included), between
    /// [`PKT_HDR_LEN`](super::PKT_HDR_LEN) and [`MAX_MTU`](super::udp::MAX_MTU).
    Fixed(usize),
    /// The [module rule](self#the-rule-udpmtuauto-udpmtuautotoward) applied to the bound
    /// address (a server's choice).
    Auto,
    /// The module rule applied to this address: the peer's address as it was given, e.g. a
    /// server bound to `0.0.0.0` is given as `0.0.0.0` (a client's choice).
    AutoToward(IpAddr),
}

/// IP and UDP header bytes in front of a datagram's payload: 28 (IPv4) or 48 (IPv6).
fn ip_udp_overhead(v6: bool) -> usize {
    if v6 { 40 + 8 } else { 20 + 8 }
}

/// The datagram size in bytes the rule picks for a link of `link_mtu` bytes (`None`: unknown),
/// an IPv6 (`v6`) or IPv4 socket, and a receive buffer of `rcvbuf_bytes` (steps 2 and 3 of
/// the [module rule](self#the-rule-udpmtuauto-udpmtuautotoward)).
pub fn auto_datagram_size(link_mtu: Option<usize>, v6: bool, rcvbuf_bytes: usize) -> usize {
    let ethernet = if v6 { DEFAULT_MTU_V6 } else { DEFAULT_MTU_V4 };
    let Some(link) = link_mtu else {
        return ethernet;
    };
    let floor = if v6 { 1280 } else { 576 };
    let size = link.clamp(floor, JUMBO_FRAME_BYTES) - ip_udp_overhead(v6);
    if size > ethernet && rcvbuf_bytes / udp_rx_charge(size) < AUTO_MTU_MIN_RX_DATAGRAMS {
        ethernet
    } else {
        size
    }
}

/// The link MTU in bytes for `ip` (step 1 of the
/// [module rule](self#the-rule-udpmtuauto-udpmtuautotoward)). IPv4-mapped IPv6 addresses
/// count as IPv4.
///
/// # Errors
/// Those of `getifaddrs(3)`, of reading `/sys/class/net/<name>/mtu`, and of the path-MTU
/// probe (`socket`, `connect`, `getsockopt`); [`io::ErrorKind::NotFound`] if no interface
/// qualifies.
pub fn link_mtu(ip: IpAddr) -> io::Result<usize> {
    let ip = ip.to_canonical();
    if ip.is_unspecified() {
        return unspecified_link_mtu(ip.is_ipv6());
    }
    match local_interface(ip)? {
        Some(name) => interface_mtu(&name),
        None => probe_path_mtu(ip),
    }
}

/// The name of the interface `ip` is assigned to, if any.
fn local_interface(ip: IpAddr) -> io::Result<Option<String>> {
    for ifa in getifaddrs()? {
        let Some(addr) = ifa.address else { continue };
        let found = match ip {
            IpAddr::V4(v4) => addr.as_sockaddr_in().is_some_and(|a| a.ip() == v4),
            IpAddr::V6(v6) => addr.as_sockaddr_in6().is_some_and(|a| a.ip() == v6),
        };
        if found {
            return Ok(Some(ifa.interface_name));
        }
    }
    Ok(None)
}

/// The smallest MTU of the up, non-loopback interfaces with an address of the family (`v6`),
/// or of the up loopback interfaces if there is none.
fn unspecified_link_mtu(v6: bool) -> io::Result<usize> {
    let mut outside: Option<usize> = None;
    let mut loopback: Option<usize> = None;
    for ifa in getifaddrs()? {
        let Some(addr) = ifa.address else { continue };
        let family_ok = if v6 {
            addr.as_sockaddr_in6().is_some()
        } else {
            addr.as_sockaddr_in().is_some()
        };
        if !family_ok || !ifa.flags.contains(InterfaceFlags::IFF_UP) {
            continue;
        }
        let mtu = interface_mtu(&ifa.interface_name)?;
        let slot = if ifa.flags.contains(InterfaceFlags::IFF_LOOPBACK) {
            &mut loopback
        } else {
            &mut outside
        };
        *slot = Some(slot.map_or(mtu, |m| m.min(mtu)));
    }
    outside.or(loopback).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "no interface that is up has an address of this family",
        )
    })
}

/// The MTU of interface `name`, from `/sys/class/net/<name>/mtu`.
fn interface_mtu(name: &str) -> io::Result<usize> {
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("interface name {name:?}"),
        ));
    }
    let text = std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))?;
    text.trim().parse().map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/sys/class/net/{name}/mtu: {e}"),
        )
    })
}

/// The kernel's path MTU toward `ip`: `IP_MTU` / `IPV6_MTU` of a UDP socket connected to it.
/// Nothing is sent.
fn probe_path_mtu(ip: IpAddr) -> io::Result<usize> {
    let (bind, level, opt) = match ip {
        IpAddr::V4(_) => (
            IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            libc::IPPROTO_IP,
            libc::IP_MTU,
        ),
        IpAddr::V6(_) => (
            IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU,
        ),
    };
    let probe = UdpSocket::bind(SocketAddr::new(bind, 0))?;
    // The port only has to be nonzero; connecting a UDP socket sends nothing.
    probe.connect(SocketAddr::new(ip, 9))?;
    let mtu = get_sockopt_int(probe.as_fd(), level, opt)?;
    usize::try_from(mtu).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("path MTU {mtu} toward {ip}"),
        )
    })
}

/// The datagram size for the rule applied to `ip` with a receive buffer of `rcvbuf_bytes`:
/// [`link_mtu`] then [`auto_datagram_size`]; a failed lookup gives the Ethernet default
/// (logged at `debug`).
pub fn auto_mtu(ip: IpAddr, rcvbuf_bytes: usize) -> usize {
    let v6 = ip.to_canonical().is_ipv6();
    let link = match link_mtu(ip) {
        Ok(m) => Some(m),
        Err(e) => {
            tracing::debug!("UDP transport: no link MTU for {ip} ({e}); Ethernet default");
            None
        }
    };
    auto_datagram_size(link, v6, rcvbuf_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BIG_BUF: usize = 8 << 20;

    #[test]
    fn datagram_size_follows_the_link_up_to_a_jumbo_frame() {
        assert_eq!(auto_datagram_size(Some(65536), false, BIG_BUF), 8972);
        assert_eq!(auto_datagram_size(Some(65536), true, BIG_BUF), 8952);
        assert_eq!(auto_datagram_size(Some(9000), false, BIG_BUF), 8972);
        assert_eq!(auto_datagram_size(Some(4200), false, BIG_BUF), 4172);
        assert_eq!(
            auto_datagram_size(Some(1500), false, BIG_BUF),
            DEFAULT_MTU_V4
        );
        assert_eq!(
            auto_datagram_size(Some(1500), true, BIG_BUF),
            DEFAULT_MTU_V6
        );
        // An overlay link below Ethernet: smaller than the old default, never fragmented.
        assert_eq!(auto_datagram_size(Some(1450), false, BIG_BUF), 1422);
        // A lying or tiny link MTU is raised to the protocol minimum.
        assert_eq!(auto_datagram_size(Some(0), false, BIG_BUF), 548);
        assert_eq!(auto_datagram_size(Some(100), true, BIG_BUF), 1232);
        assert_eq!(auto_datagram_size(None, false, BIG_BUF), DEFAULT_MTU_V4);
        assert_eq!(auto_datagram_size(None, true, BIG_BUF), DEFAULT_MTU_V6);
    }

    #[test]
    fn a_small_receive_buffer_keeps_the_ethernet_default() {
        // Linux's stock rmem_max (212992 B, doubled by the kernel) holds 25 jumbo datagrams.
        assert_eq!(
            auto_datagram_size(Some(65536), false, 2 * 212992),
            DEFAULT_MTU_V4
        );
        // Exactly the threshold keeps the jumbo datagram, one byte less does not.
        let need = AUTO_MTU_MIN_RX_DATAGRAMS * udp_rx_charge(8972);
        assert_eq!(auto_datagram_size(Some(9000), false, need), 8972);
        assert_eq!(auto_datagram_size(Some(9000), false, need - 1), 1472);
        // Sizes at or below the default never depend on the buffer.
        assert_eq!(auto_datagram_size(Some(1450), false, 0), 1422);
    }

    #[test]
    fn loopback_link_mtu_is_the_loopback_interface() {
        let lo = match interface_mtu("lo") {
            Ok(m) => m,
            Err(e) => {
                eprintln!("skipped: no /sys/class/net/lo/mtu ({e})");
                return;
            }
        };
        assert_eq!(link_mtu(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap(), lo);
        // An IPv4-mapped loopback address is the same interface.
        let mapped = IpAddr::V6(Ipv4Addr::LOCALHOST.to_ipv6_mapped());
        assert_eq!(link_mtu(mapped).unwrap(), lo);
        // A non-local address in 127/8 routes over loopback too (path-MTU probe; the kernel
        // reports the local route's MTU, 65535 where the device says 65536), so it gets the
        // same datagram size.
        let other = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
        let probed = link_mtu(other).unwrap();
        assert!(probed >= lo.min(JUMBO_FRAME_BYTES), "{probed} vs {lo}");
        assert_eq!(
            auto_mtu(other, BIG_BUF),
            auto_mtu(IpAddr::V4(Ipv4Addr::LOCALHOST), BIG_BUF)
        );
    }

    #[test]
    fn unspecified_address_takes_the_smallest_outside_interface() {
        let Ok(addrs) = getifaddrs() else {
            eprintln!("skipped: getifaddrs failed");
            return;
        };
        let mut expect: Option<usize> = None;
        let mut lo: Option<usize> = None;
        for ifa in addrs {
            let Some(a) = ifa.address else { continue };
            if a.as_sockaddr_in().is_none() || !ifa.flags.contains(InterfaceFlags::IFF_UP) {
                continue;
            }
            let m = interface_mtu(&ifa.interface_name).unwrap();
            if ifa.flags.contains(InterfaceFlags::IFF_LOOPBACK) {
                lo = Some(m);
            } else {
                expect = Some(expect.map_or(m, |e| e.min(m)));
            }
        }
        let Some(expect) = expect.or(lo) else {
            eprintln!("skipped: no IPv4 interface is up");
            return;
        };
        assert_eq!(link_mtu(IpAddr::V4(Ipv4Addr::UNSPECIFIED)).unwrap(), expect);
    }

    #[test]
    fn bad_interface_names_are_refused_not_read() {
        for name in ["", "../lo", ".", "a/b"] {
            assert_eq!(
                interface_mtu(name).unwrap_err().kind(),
                io::ErrorKind::InvalidInput,
                "{name:?}"
            );
        }
        assert!(interface_mtu("no-such-if0").is_err());
    }
}
