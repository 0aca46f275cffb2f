//! Ring manifests: how a client finds every ring of one server (one process serving several
//! rings, e.g. `kv serve`'s daemons) without trusting names in `/dev/shm`.
//!
//! Probing which of `<base>-0`, `<base>-1`, … exist lets any local user extend the set: a file
//! `<base>-2` created by someone else would be taken for a daemon. Instead the server writes one
//! manifest, `/dev/shm/<base>.rings`, listing its rings, and clients read only the rings the
//! manifest names. The manifest follows the ownership rule of the `shm` module (created
//! `O_EXCL`, mode exactly 0600; opened only after `fstat` shows this user's regular file with
//! no group or other bits), and each ring it names is checked again when it is attached.
//!
//! **Publishing.** [`RingManifest::publish`] writes the complete manifest into a fresh private
//! file under a temporary name (`O_EXCL`, 0600) and then `rename`s it over the final name, so
//! a reader sees either no manifest, the previous one, or the complete new one — never a
//! partial write. A manifest of this user at the name is replaced (a dead server's leftover:
//! publish after creating the rings, whose creation is what excludes a second live server);
//! one of another user is [`RingError::UnsafeFile`] and is left alone. Dropping the
//! [`RingManifest`] unlinks the file if the name still refers to it.
//!
//! **Format** (extension, no seed; integers little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `"DLGRINGS"` |
//! | 8 | 4 | version ([`MANIFEST_VERSION`]) |
//! | 12 | 4 | number of rings `n` (1..=[`MAX_MANIFEST_RINGS`]) |
//! | 16 | 4 | total length of the file, bytes (≤ [`MAX_MANIFEST_BYTES`]) |
//! | 20 | 4 | pid of the writer (diagnostics only) |
//! | 24 | … | `n` × (2-byte name length `l`, `l` bytes of name: a valid ring name) |
//! | end − 8 | 8 | FNV-1a 64 checksum of every byte before it |
//!
//! [`read_manifest`] checks every field and the exact length, and refuses anything else with
//! [`RingError::BadManifest`], never a panic.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::error::RingError;
use super::shm;

/// Magic at offset 0 of a ring manifest.
pub const MANIFEST_MAGIC: [u8; 8] = *b"DLGRINGS";
/// Manifest layout version this build writes and reads.
pub const MANIFEST_VERSION: u32 = 1;
/// Most rings one manifest lists.
pub const MAX_MANIFEST_RINGS: usize = 4096;
/// Largest manifest file accepted, bytes.
pub const MAX_MANIFEST_BYTES: usize = 1 << 20;
/// Suffix appended to the base name: the manifest of `base` is `/dev/shm/<base>.rings`.
pub const MANIFEST_SUFFIX: &str = ".rings";

const HEADER_LEN: usize = 24;
const CHECKSUM_LEN: usize = 8;

/// FNV-1a, 64-bit, over `bytes` (a corruption check, not an authenticator: the ownership check
/// is what keeps other users out).
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The manifest's file name and path for `base` (`"kv"` or `"/kv"` → `kv.rings`,
/// `/dev/shm/kv.rings`).
///
/// # Errors
/// [`RingError::InvalidName`] if `base` (or the name with the suffix) is not a valid ring name.
pub fn manifest_path(base: &str) -> Result<(String, PathBuf), RingError> {
    let (b, _) = shm::shm_path(base)?;
    shm::shm_path(&format!("{b}{MANIFEST_SUFFIX}"))
}

/// Encodes a manifest listing `rings` (already validated names).
fn encode(rings: &[String]) -> Vec<u8> {
    let body: usize = rings.iter().map(|r| 2 + r.len()).sum();
    let total = HEADER_LEN + body + CHECKSUM_LEN;
    let mut b = Vec::with_capacity(total);
    b.extend_from_slice(&MANIFEST_MAGIC);
    b.extend_from_slice(&MANIFEST_VERSION.to_le_bytes());
    b.extend_from_slice(&(rings.len() as u32).to_le_bytes());
    b.extend_from_slice(&(total as u32).to_le_bytes());
    b.extend_from_slice(&std::process::id().to_le_bytes());
    for r in rings {
        b.extend_from_slice(&(r.len() as u16).to_le_bytes());
        b.extend_from_slice(r.as_bytes());
    }
    let sum = fnv1a64(&b);
    b.extend_from_slice(&sum.to_le_bytes());
    debug_assert_eq!(b.len(), total);
    b
}

/// Decodes and validates the bytes of a manifest (read from `path`, named in errors): returns
/// the ring names, each normalized (no leading `/`).
///
/// # Errors
/// [`RingError::BadManifest`] naming the first check that fails: length bounds, magic,
/// version, ring count, the recorded total length against the actual one, each name's length
/// and validity, trailing bytes, the checksum.
pub fn decode(bytes: &[u8], path: &Path) -> Result<Vec<String>, RingError> {
    let bad = |reason: String| RingError::BadManifest {
        path: path.to_path_buf(),
        reason,
    };
    if bytes.len() < HEADER_LEN + CHECKSUM_LEN {
        return Err(bad(format!(
            "{} bytes, shorter than the {} bytes of an empty manifest",
            bytes.len(),
            HEADER_LEN + CHECKSUM_LEN
        )));
    }
    if bytes.len() > MAX_MANIFEST_BYTES {
        return Err(bad(format!(
            "{} bytes, more than the {MAX_MANIFEST_BYTES} accepted",
            bytes.len()
        )));
    }
    let u32_at = |off: usize| {
        let mut w = [0u8; 4];
        w.copy_from_slice(&bytes[off..off + 4]);
        u32::from_le_bytes(w)
    };
    if bytes[..8] != MANIFEST_MAGIC {
        return Err(bad(format!(
            "magic {:02x?}, expected {:02x?} (\"DLGRINGS\")",
            &bytes[..8],
            MANIFEST_MAGIC
        )));
    }
    let version = u32_at(8);
    if version != MANIFEST_VERSION {
        return Err(bad(format!(
            "version {version}, this build reads {MANIFEST_VERSION}"
        )));
    }
    let count = u32_at(12) as usize;
    if count == 0 || count > MAX_MANIFEST_RINGS {
        return Err(bad(format!(
            "ring count {count}, expected 1..={MAX_MANIFEST_RINGS}"
        )));
    }
    let total = u32_at(16) as usize;
    if total != bytes.len() {
        return Err(bad(format!(
            "records a length of {total} bytes but has {} (truncated or extended)",
            bytes.len()
        )));
    }
    let body_end = bytes.len() - CHECKSUM_LEN;
    let mut sum = [0u8; 8];
    sum.copy_from_slice(&bytes[body_end..]);
    let (found, computed) = (u64::from_le_bytes(sum), fnv1a64(&bytes[..body_end]));
    if found != computed {
        return Err(bad(format!(
            "checksum {found:#018x}, computed {computed:#018x}"
        )));
    }
    let mut rings = Vec::with_capacity(count);
    let mut off = HEADER_LEN;
    for i in 0..count {
        if body_end - off < 2 {
            return Err(bad(format!("ring {i}: name length past the end")));
        }
        let len = usize::from(u16::from_le_bytes([bytes[off], bytes[off + 1]]));
        off += 2;
        if body_end - off < len {
            return Err(bad(format!(
                "ring {i}: name of {len} bytes runs past the end"
            )));
        }
        let name = std::str::from_utf8(&bytes[off..off + len])
            .map_err(|_| bad(format!("ring {i}: name is not UTF-8")))?;
        if name.starts_with('/') {
            return Err(bad(format!("ring {i}: name {name:?} starts with '/'")));
        }
        let (name, _) = shm::shm_path(name).map_err(|e| bad(format!("ring {i}: {e}")))?;
        rings.push(name);
        off += len;
    }
    if off != body_end {
        return Err(bad(format!(
            "{} bytes after the last ring name",
            body_end - off
        )));
    }
    Ok(rings)
}

/// Reads the manifest of `base` (`/dev/shm/<base>.rings`): opens it with the ownership check
/// (this user's regular file, mode 0600, checked with `fstat` before reading) and validates it.
/// Returns the ring names in the order the server listed them.
///
/// # Errors
/// [`RingError::InvalidName`] for a bad `base`; [`RingError::NotFound`] if there is no
/// manifest (no server published one); [`RingError::UnsafeFile`] for another user's file, a
/// file with group or other bits, a symbolic link or a non-regular file;
/// [`RingError::BadManifest`] for contents that do not validate ([`decode`]);
/// [`RingError::Io`] if reading fails.
pub fn read_manifest(base: &str) -> Result<Vec<String>, RingError> {
    let (_, path) = manifest_path(base)?;
    let Some(file) = shm::open_private(&path)? else {
        return Err(RingError::NotFound { path });
    };
    let io = |op| {
        let path = path.clone();
        move |source| RingError::Io { path, op, source }
    };
    // Read at most one byte more than accepted, so an oversized file is seen as such without
    // reading it all.
    let mut bytes = Vec::new();
    file.take(MAX_MANIFEST_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(io("read"))?;
    decode(&bytes, &path)
}

/// A published ring manifest; dropping it unlinks the file (if the name still refers to it).
#[derive(Debug)]
pub struct RingManifest {
    path: PathBuf,
    file: File,
    rings: Vec<String>,
}

impl RingManifest {
    /// Publishes the manifest of `base` (`/dev/shm/<base>.rings`) listing `rings` (ring names
    /// as given to [`RingServer::create`](super::RingServer::create)), as described in the
    /// module docs: written completely into a new private file (`O_EXCL`, mode exactly 0600),
    /// then renamed over the final name. Call it after creating the rings.
    ///
    /// # Errors
    /// [`RingError::InvalidName`] for an invalid `base` or ring name; [`RingError::InvalidConfig`]
    /// for no rings or more than [`MAX_MANIFEST_RINGS`]; [`RingError::UnsafeFile`] if another
    /// user's file (or a symbolic link, or a non-regular file) is at the manifest's name;
    /// [`RingError::Io`] if creating, writing or renaming fails.
    pub fn publish(base: &str, rings: &[&str]) -> Result<Self, RingError> {
        let (name, path) = manifest_path(base)?;
        if rings.is_empty() || rings.len() > MAX_MANIFEST_RINGS {
            return Err(RingError::InvalidConfig {
                reason: format!(
                    "a ring manifest lists 1..={MAX_MANIFEST_RINGS} rings, not {}",
                    rings.len()
                ),
            });
        }
        let rings = rings
            .iter()
            .map(|r| shm::shm_path(r).map(|(n, _)| n))
            .collect::<Result<Vec<_>, _>>()?;
        let bytes = encode(&rings);

        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let pid = std::process::id();
        let mut attempt = 0;
        let (tmp, mut file) = loop {
            let tmp = path.with_file_name(format!(
                ".{name}.tmp.{pid}.{}",
                COUNTER.fetch_add(1, Relaxed)
            ));
            match shm::create_exclusive(&tmp) {
                Ok(f) => break (tmp, f),
                // Someone else's file (or a leftover of a recycled pid): another name.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 8 => {
                    attempt += 1
                }
                Err(source) => {
                    return Err(RingError::Io {
                        path: tmp,
                        op: "create",
                        source,
                    });
                }
            }
        };
        let io = |p: &Path, op| {
            let path = p.to_path_buf();
            move |source| RingError::Io { path, op, source }
        };
        let done = (|| {
            file.write_all(&bytes).map_err(io(&tmp, "write"))?;
            // Whatever is at the name now must be this user's (a stale manifest) to be
            // replaced; another user's file is left alone.
            // (The sticky `/dev/shm` already stops a non-root user from renaming over another
            // user's file; this check covers root too.)
            drop(shm::open_owned(&path)?);
            std::fs::rename(&tmp, &path).map_err(io(&path, "rename"))
        })();
        if let Err(e) = done {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        tracing::debug!(path = %path.display(), rings = rings.len(), "ring manifest published");
        Ok(Self { path, file, rings })
    }

    /// The manifest file (`/dev/shm/<base>.rings`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The ring names it lists (normalized: no leading `/`).
    pub fn rings(&self) -> &[String] {
        &self.rings
    }
}

impl Drop for RingManifest {
    /// Unlinks the manifest if its name still refers to the file this manifest wrote.
    fn drop(&mut self) {
        if shm::same_file(&self.file, &self.path) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
