//! Decoding what the ranks of a job exchange through [`Bootstrap::all_gather`] (issue 14 §4).
//!
//! Every byte here comes from another process (an MPI rank, possibly another program that
//! joined the job by mistake, or a rank of another build): the decoders check lengths and
//! values and return [`BootstrapError::BadRecord`] naming the rank and what is wrong; they
//! never panic, index out of bounds or allocate by a length they read.
//!
//! Formats (all integers little-endian):
//! - a socket address, [`SOCKADDR_BYTES`] = 20 bytes: family (4 or 6), 0, port, then the
//!   address (IPv4: 4 bytes and 12 zero bytes; IPv6: 16 bytes);
//! - a length, 8 bytes (`u64`), one per rank, as [`gather_var`] exchanges them first;
//! - a host record, [`HOST_RECORD_BYTES`]: the host name (zero-padded) and a `u32` pid;
//! - fixed-size records in slots ([`decode_slots`]): all zeros for an empty slot.
//!
//! [`Bootstrap::all_gather`]: super::Bootstrap::all_gather

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::{Bootstrap, BootstrapError, HOSTNAME_BYTES};

/// Bytes of an encoded socket address ([`encode_socket_addr`]).
pub const SOCKADDR_BYTES: usize = 20;

fn bad(rank: usize, what: impl Into<String>) -> BootstrapError {
    BootstrapError::BadRecord {
        rank,
        what: what.into(),
    }
}

/// The 20-byte encoding of `a` (module docs). Flow information and scope of an IPv6 address
/// are not carried.
pub fn encode_socket_addr(a: SocketAddr) -> [u8; SOCKADDR_BYTES] {
    let mut b = [0u8; SOCKADDR_BYTES];
    b[2..4].copy_from_slice(&a.port().to_le_bytes());
    match a.ip() {
        IpAddr::V4(ip) => {
            b[0] = 4;
            b[4..8].copy_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            b[0] = 6;
            b[4..20].copy_from_slice(&ip.octets());
        }
    }
    b
}

/// Decodes [`encode_socket_addr`]'s bytes, sent by rank `rank`.
///
/// # Errors
/// [`BootstrapError::BadRecord`] if `b` is not 20 bytes long, the family byte is neither 4 nor
/// 6, the reserved byte or the unused tail of an IPv4 address is not zero, or the port is 0
/// (no one can be reached there).
pub fn decode_socket_addr(rank: usize, b: &[u8]) -> Result<SocketAddr, BootstrapError> {
    let Ok(b) = <&[u8; SOCKADDR_BYTES]>::try_from(b) else {
        return Err(bad(
            rank,
            format!("socket address of {} bytes, not {SOCKADDR_BYTES}", b.len()),
        ));
    };
    let [family, reserved, p0, p1, addr @ ..] = *b;
    if reserved != 0 {
        return Err(bad(
            rank,
            format!("socket address reserved byte {reserved}"),
        ));
    }
    let port = u16::from_le_bytes([p0, p1]);
    let ip = match family {
        4 => {
            let [a, b, c, d, tail @ ..] = addr;
            if tail != [0; 12] {
                return Err(bad(rank, "IPv4 socket address with a non-zero tail"));
            }
            IpAddr::V4(Ipv4Addr::new(a, b, c, d))
        }
        6 => IpAddr::V6(Ipv6Addr::from(addr)),
        f => return Err(bad(rank, format!("socket address family {f} (not 4 or 6)"))),
    };
    if port == 0 {
        return Err(bad(rank, format!("unreachable socket address {ip}:{port}")));
    }
    Ok(SocketAddr::new(ip, port))
}

/// `all`, an all-gather's result, cut into the `ranks` contributions of `per_rank` bytes.
///
/// # Errors
/// [`BootstrapError::BadRecord`] (rank 0) if `all` is not exactly `ranks * per_rank` bytes.
pub fn split_ranks(
    all: &[u8],
    ranks: usize,
    per_rank: usize,
) -> Result<Vec<&[u8]>, BootstrapError> {
    if Some(all.len()) != ranks.checked_mul(per_rank) {
        return Err(bad(
            0,
            format!(
                "all-gather returned {} bytes for {ranks} ranks of {per_rank}",
                all.len()
            ),
        ));
    }
    if per_rank == 0 {
        return Ok(vec![&all[..0]; ranks]);
    }
    Ok(all.chunks_exact(per_rank).collect())
}

/// The `u64` at byte `off` of `b` (little-endian), if `b` holds it.
pub fn le_u64(b: &[u8], off: usize) -> Option<u64> {
    let s = b.get(off..off.checked_add(8)?)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Some(u64::from_le_bytes(a))
}

/// The `u32` at byte `off` of `b` (little-endian), if `b` holds it.
pub fn le_u32(b: &[u8], off: usize) -> Option<u32> {
    let s = b.get(off..off.checked_add(4)?)?;
    let mut a = [0u8; 4];
    a.copy_from_slice(s);
    Some(u32::from_le_bytes(a))
}

/// All-gathers a byte string of any length up to `max_len` bytes from every rank: the
/// lengths first (8 bytes each), then every string padded to the longest. Returns the strings
/// by rank.
///
/// # Errors
/// [`BootstrapError::BadRecord`] naming the rank whose length exceeds `max_len` (every rank
/// sees it, before anything is allocated by it), or if an all-gather returns the wrong number
/// of bytes; the errors of [`Bootstrap::all_gather`]. `mine` longer than `max_len` is refused
/// the same way on every rank.
pub fn gather_var<B: Bootstrap + ?Sized>(
    b: &B,
    mine: &[u8],
    max_len: usize,
) -> Result<Vec<Vec<u8>>, BootstrapError> {
    let ranks = b.size();
    let lens = b.all_gather(&(mine.len() as u64).to_le_bytes())?;
    let lens = decode_lengths(&lens, ranks, max_len)?;
    let max = lens.iter().copied().max().unwrap_or(0);
    let mut padded = mine.to_vec();
    padded.resize(max, 0);
    let all = b.all_gather(&padded)?;
    let parts = split_ranks(&all, ranks, max)?;
    Ok(parts
        .iter()
        .zip(&lens)
        .map(|(p, &l)| p[..l].to_vec())
        .collect())
}

/// Decodes the `ranks` lengths of [`gather_var`]'s first all-gather (8 bytes each), each at
/// most `max_len`.
///
/// # Errors
/// [`BootstrapError::BadRecord`] for a wrong total size or a length above `max_len` (naming
/// its rank).
pub fn decode_lengths(
    all: &[u8],
    ranks: usize,
    max_len: usize,
) -> Result<Vec<usize>, BootstrapError> {
    split_ranks(all, ranks, 8)?
        .iter()
        .enumerate()
        .map(|(r, b)| {
            let l = le_u64(b, 0).ok_or_else(|| bad(r, "length record too short"))?;
            usize::try_from(l)
                .ok()
                .filter(|&l| l <= max_len)
                .ok_or_else(|| bad(r, format!("length {l} bytes above the limit {max_len}")))
        })
        .collect()
}

/// Every rank's `per_rank` socket addresses from an all-gather of their encodings
/// ([`encode_socket_addr`], `ranks` contributions of `per_rank * 20` bytes), by rank.
///
/// # Errors
/// [`BootstrapError::BadRecord`] for a wrong total size, or naming the rank of the first
/// address that does not decode ([`decode_socket_addr`]).
pub fn decode_socket_addrs(
    all: &[u8],
    ranks: usize,
    per_rank: usize,
) -> Result<Vec<Vec<SocketAddr>>, BootstrapError> {
    let bytes = per_rank
        .checked_mul(SOCKADDR_BYTES)
        .ok_or_else(|| bad(0, "address count overflows"))?;
    split_ranks(all, ranks, bytes)?
        .iter()
        .enumerate()
        .map(|(r, part)| {
            part.chunks_exact(SOCKADDR_BYTES)
                .map(|a| decode_socket_addr(r, a))
                .collect()
        })
        .collect()
}

/// Every rank's `slots` fixed-size records of `slot_bytes` bytes from an all-gather, by rank
/// and slot: an all-zero record is `None` (nothing in that slot), any other must decode with
/// `decode`.
///
/// # Errors
/// [`BootstrapError::BadRecord`] for a wrong total size, or naming the rank (and slot, with
/// `decode`'s error) of the first record that does not decode.
pub fn decode_slots<T, E: std::fmt::Display>(
    all: &[u8],
    ranks: usize,
    slots: usize,
    slot_bytes: usize,
    decode: impl Fn(&[u8]) -> Result<T, E>,
) -> Result<Vec<Vec<Option<T>>>, BootstrapError> {
    if slot_bytes == 0 {
        return Err(bad(0, "records of 0 bytes"));
    }
    let bytes = slots
        .checked_mul(slot_bytes)
        .ok_or_else(|| bad(0, "record count overflows"))?;
    split_ranks(all, ranks, bytes)?
        .iter()
        .enumerate()
        .map(|(r, part)| {
            part.chunks_exact(slot_bytes)
                .enumerate()
                .map(|(slot, b)| {
                    if b.iter().all(|&x| x == 0) {
                        return Ok(None);
                    }
                    decode(b)
                        .map(Some)
                        .map_err(|e| bad(r, format!("slot {slot}: {e}")))
                })
                .collect()
        })
        .collect()
}

/// Bytes of a host record: the host name ([`HOSTNAME_BYTES`], zero-padded) and a `u32` pid.
pub const HOST_RECORD_BYTES: usize = HOSTNAME_BYTES + 4;

/// The host record of this process: `name` truncated to [`HOSTNAME_BYTES`], and `pid`.
pub fn encode_host(name: &str, pid: u32) -> [u8; HOST_RECORD_BYTES] {
    let mut b = [0u8; HOST_RECORD_BYTES];
    let n = name.len().min(HOSTNAME_BYTES);
    b[..n].copy_from_slice(&name.as_bytes()[..n]);
    b[HOSTNAME_BYTES..].copy_from_slice(&pid.to_le_bytes());
    b
}

/// From every rank's host record ([`encode_host`], by rank): the number of distinct hosts,
/// and the pid of the lowest rank on `rank`'s host.
///
/// # Errors
/// [`BootstrapError::BadRecord`] for a wrong total size or a `rank` outside `ranks`.
pub fn decode_hosts(all: &[u8], ranks: usize, rank: usize) -> Result<(usize, u32), BootstrapError> {
    let recs = split_ranks(all, ranks, HOST_RECORD_BYTES)?;
    let name = |r: &[u8]| r.get(..HOSTNAME_BYTES).unwrap_or(r).to_vec();
    let me = recs
        .get(rank)
        .map(|r| name(r))
        .ok_or_else(|| bad(rank, format!("rank outside the {ranks} ranks gathered")))?;
    // `me` is one of `recs`, so a first record of its host exists.
    let (first, r) = recs
        .iter()
        .enumerate()
        .find(|(_, r)| name(r) == me)
        .map(|(i, r)| (*r, i))
        .ok_or_else(|| bad(rank, "own host record missing"))?;
    let pid = le_u32(first, HOSTNAME_BYTES).ok_or_else(|| bad(r, "short host record"))?;
    let mut hosts: Vec<Vec<u8>> = recs.iter().map(|r| name(r)).collect();
    hosts.sort_unstable();
    hosts.dedup();
    Ok((hosts.len(), pid))
}

#[cfg(test)]
mod tests {
    //! Property tests over arbitrary bytes (issue 14 §4). 256 cases per property by default;
    //! `PROPTEST_CASES=<n>` runs more (proptest reads the variable itself).

    use proptest::prelude::*;

    use super::*;
    use crate::bootstrap::threads::ThreadGroup;

    fn rank_of(e: BootstrapError) -> usize {
        match e {
            BootstrapError::BadRecord { rank, .. } => rank,
            e => panic!("not a BadRecord: {e:?}"),
        }
    }

    proptest! {
        /// Any byte string: an address only from a well-formed 20-byte record (which then
        /// re-encodes to exactly those bytes), else `BadRecord` naming the rank.
        #[test]
        fn decode_socket_addr_over_arbitrary_bytes(
            b in prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..30),
                (any::<bool>(), any::<[u8; 20]>()).prop_map(|(v6, mut b)| {
                    b[0] = if v6 { 6 } else { 4 };
                    b[1] = 0;
                    if !v6 {
                        b[8..].fill(0);
                    }
                    b.to_vec()
                }),
            ],
            rank in 0usize..100,
        ) {
            match decode_socket_addr(rank, &b) {
                Ok(a) => {
                    prop_assert_eq!(&encode_socket_addr(a)[..], &b[..]);
                    prop_assert!(a.port() != 0);
                }
                Err(e) => prop_assert_eq!(rank_of(e), rank),
            }
        }

        /// Round trip of every reachable address.
        #[test]
        fn socket_addr_round_trip(ip in any::<[u8; 16]>(), v6 in any::<bool>(), port in 1u16..) {
            let ip = if v6 {
                IpAddr::V6(Ipv6Addr::from(ip))
            } else {
                IpAddr::V4(Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3]))
            };
            let a = SocketAddr::new(ip, port);
            prop_assert_eq!(decode_socket_addr(0, &encode_socket_addr(a)), Ok(a));
        }

        /// Lengths from arbitrary bytes: decoded only if the total is right and each is
        /// within the limit, else the rank of the first bad one is named.
        #[test]
        fn decode_lengths_over_arbitrary_bytes(
            b in proptest::collection::vec(any::<u8>(), 0..70),
            ranks in 0usize..9,
            max_len in prop_oneof![0usize..300, Just(usize::MAX)],
        ) {
            match decode_lengths(&b, ranks, max_len) {
                Ok(lens) => {
                    prop_assert_eq!(b.len(), ranks * 8);
                    for (r, l) in lens.iter().enumerate() {
                        prop_assert_eq!(*l as u64, le_u64(&b, 8 * r).unwrap());
                        prop_assert!(*l <= max_len);
                    }
                }
                Err(e) => {
                    let r = rank_of(e);
                    if b.len() == ranks * 8 {
                        let l = le_u64(&b, 8 * r).unwrap();
                        prop_assert!(usize::try_from(l).map_or(true, |l| l > max_len));
                        for q in 0..r {
                            prop_assert!(le_u64(&b, 8 * q).unwrap() as usize <= max_len);
                        }
                    } else {
                        prop_assert_eq!(r, 0);
                    }
                }
            }
        }

        /// The little-endian readers never read outside their input.
        #[test]
        fn le_readers_stay_in_bounds(b in proptest::collection::vec(any::<u8>(), 0..20), off in any::<usize>()) {
            prop_assert_eq!(le_u64(&b, off).is_some(), off.checked_add(8).is_some_and(|e| e <= b.len()));
            prop_assert_eq!(le_u32(&b, off).is_some(), off.checked_add(4).is_some_and(|e| e <= b.len()));
        }
    }

    /// `gather_var` over a group of threads: strings of different lengths come back by rank;
    /// one above the limit is refused on every rank, naming it.
    #[test]
    fn gather_var_round_trip_and_limit() {
        let ranks = ThreadGroup::ranks(3);
        let out: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = ranks
                .into_iter()
                .map(|b| {
                    s.spawn(move || {
                        let mine = vec![b.rank() as u8; b.rank() * 5];
                        let ok = gather_var(&b, &mine, 100);
                        let big = gather_var(&b, &mine, 7);
                        (ok, big)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (ok, big) in out {
            assert_eq!(ok.unwrap(), vec![vec![], vec![1; 5], vec![2; 10]]);
            assert_eq!(rank_of(big.unwrap_err()), 2);
        }
    }

    proptest! {
        /// Addresses of every rank from arbitrary gathered bytes: decoded only when the size
        /// is right and every record decodes, else the first bad rank is named.
        #[test]
        fn decode_socket_addrs_over_arbitrary_bytes(
            addrs in proptest::collection::vec((any::<[u8; 4]>(), 1u16.., any::<bool>()), 0..8),
            ranks in 1usize..4,
            corrupt in proptest::option::of((any::<usize>(), any::<u8>())),
            trim in 0usize..2,
        ) {
            let per = addrs.len() / ranks;
            let mut all: Vec<u8> = addrs[..per * ranks]
                .iter()
                .flat_map(|&(ip, port, _)| encode_socket_addr(SocketAddr::from((ip, port))))
                .collect();
            if let Some((at, v)) = corrupt
                && !all.is_empty()
            {
                let at = at % all.len();
                all[at] = v;
            }
            all.truncate(all.len().saturating_sub(trim));
            match decode_socket_addrs(&all, ranks, per) {
                Ok(got) => {
                    prop_assert_eq!(got.len(), ranks);
                    let flat: Vec<u8> = got.iter().flatten().flat_map(|a| encode_socket_addr(*a)).collect();
                    prop_assert_eq!(flat, all);
                }
                Err(e) => {
                    let r = rank_of(e);
                    prop_assert!(r < ranks.max(1));
                }
            }
        }

        /// Slots from arbitrary gathered bytes: an all-zero record is `None`, others must
        /// decode; a wrong size or an undecodable record is an error naming its rank.
        #[test]
        fn decode_slots_over_arbitrary_bytes(
            all in proptest::collection::vec(prop_oneof![3 => Just(0u8), 1 => any::<u8>()], 0..64),
            ranks in 0usize..4,
            slots in 0usize..4,
            slot_bytes in 0usize..6,
        ) {
            // A record decodes iff its first byte is odd.
            let decode = |b: &[u8]| if b[0] % 2 == 1 { Ok(b.to_vec()) } else { Err("even") };
            match decode_slots(&all, ranks, slots, slot_bytes, decode) {
                Ok(got) => {
                    prop_assert_eq!(all.len(), ranks * slots * slot_bytes);
                    prop_assert!(slot_bytes > 0);
                    for (r, part) in got.iter().enumerate() {
                        prop_assert_eq!(part.len(), slots);
                        for (k, v) in part.iter().enumerate() {
                            let at = (r * slots + k) * slot_bytes;
                            let rec = &all[at..at + slot_bytes];
                            match v {
                                None => prop_assert!(rec.iter().all(|&x| x == 0)),
                                Some(v) => prop_assert_eq!(&v[..], rec),
                            }
                        }
                    }
                }
                Err(e) => {
                    let r = rank_of(e);
                    prop_assert!(r == 0 || r < ranks);
                }
            }
        }

        /// Host records from arbitrary gathered bytes: counted and the first pid of the
        /// host found when the size is right and `rank` is in range; an error otherwise.
        #[test]
        fn decode_hosts_over_arbitrary_bytes(
            names in proptest::collection::vec((0u8..3, any::<u32>()), 1..6),
            rank in 0usize..7,
            trim in prop_oneof![4 => Just(0usize), 1 => 1usize..10],
        ) {
            let ranks = names.len();
            let mut all: Vec<u8> = names
                .iter()
                .flat_map(|&(n, pid)| encode_host(&format!("host{n}"), pid))
                .collect();
            all.truncate(all.len() - trim.min(all.len()));
            match decode_hosts(&all, ranks, rank) {
                Ok((hosts, pid)) => {
                    prop_assert!(trim == 0 && rank < ranks);
                    let mut distinct: Vec<u8> = names.iter().map(|n| n.0).collect();
                    distinct.sort_unstable();
                    distinct.dedup();
                    prop_assert_eq!(hosts, distinct.len());
                    let first = names.iter().find(|n| n.0 == names[rank].0).unwrap();
                    prop_assert_eq!(pid, first.1);
                }
                Err(e) => {
                    rank_of(e);
                    prop_assert!(trim > 0 || rank >= ranks);
                }
            }
        }
    }
}
