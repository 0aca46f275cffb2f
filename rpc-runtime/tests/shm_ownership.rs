//! Ownership of the delegation ring's shared-memory files (issue 14, part 1): ring files and
//! ring manifests are created mode 0600 whatever the umask; attaching refuses a file with
//! group or other permission bits, a symbolic link, or (run as root, which can `chown` a file to
//! uid 65534 without a second account) another user's file, before mapping it; a server never
//! unlinks or reuses another user's file at its name but replaces its own user's stale ring;
//! a corrupt or truncated manifest is refused with a clear error, never a panic.
//!
//! Tests in this binary run in parallel with one that changes the process umask: every file a
//! test makes itself gets its mode set explicitly (`write_file`).

mod ring_common;

use std::fs::{OpenOptions, Permissions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::time::Duration;

use proptest::prelude::*;
use rpc_runtime::delegation::manifest::{self, MANIFEST_VERSION};
use rpc_runtime::delegation::{
    RingClient, RingConfig, RingError, RingManifest, RingServer, SHM_DIR, read_manifest,
    unsafe_files_refused,
};

use ring_common::{Cleanup, shm_file, unique_name};

/// The uid the root-only tests give files ("nobody").
const FOREIGN_UID: u32 = 65534;

fn cfg() -> RingConfig {
    RingConfig {
        max_clients: 4,
        ring_depth: 8,
        resp_depth: 4,
        req_payload_cap: 32,
        resp_payload_cap: 32,
        liveness_interval: Duration::from_millis(5),
        ..RingConfig::default()
    }
}

fn mode_of(path: &std::path::Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn chown(path: &std::path::Path, uid: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
}

/// Writes `bytes` into a new file `path` with exactly `mode`.
fn write_file(path: &std::path::Path, bytes: &[u8], mode: u32) {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    f.write_all(bytes).unwrap();
    f.set_permissions(Permissions::from_mode(mode)).unwrap();
}

#[test]
fn attach_refuses_a_ring_file_with_group_or_other_bits() {
    let name = unique_name("mode");
    let _server = RingServer::create(&name, &cfg()).unwrap();
    let path = shm_file(&name);
    for bad in [0o644, 0o640, 0o604, 0o620, 0o602, 0o660, 0o666] {
        std::fs::set_permissions(&path, Permissions::from_mode(bad)).unwrap();
        let before = unsafe_files_refused();
        let e = RingClient::attach(&name).unwrap_err();
        match &e {
            RingError::UnsafeFile {
                path: p,
                owner,
                mode,
                ..
            } => {
                assert_eq!(p, &path);
                // SAFETY: geteuid has no preconditions and cannot fail.
                assert_eq!(*owner, unsafe { libc::geteuid() });
                assert_eq!(*mode, bad);
            }
            other => panic!("mode {bad:o}: expected UnsafeFile, got {other}"),
        }
        let msg = e.to_string();
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(msg.contains(&format!("mode {bad:04o}")), "{msg}");
        assert!(msg.contains("owner uid"), "{msg}");
        assert!(unsafe_files_refused() > before, "counted");
    }
    // Back to 0600: accepted.
    std::fs::set_permissions(&path, Permissions::from_mode(0o600)).unwrap();
    RingClient::attach(&name).expect("0600 is accepted");
}

#[test]
fn attach_refuses_a_symbolic_link_to_a_ring() {
    let target = unique_name("link-target");
    let _server = RingServer::create(&target, &cfg()).unwrap();
    let name = unique_name("link");
    let _cleanup = Cleanup(shm_file(&name));
    std::os::unix::fs::symlink(shm_file(&target), shm_file(&name)).unwrap();
    let e = RingClient::attach(&name).unwrap_err();
    assert!(
        matches!(&e, RingError::UnsafeFile { reason, .. } if reason.contains("symbolic link")),
        "{e}"
    );
    // A server does not replace (or follow) it either.
    let e = RingServer::create(&name, &cfg()).unwrap_err();
    assert!(matches!(e, RingError::UnsafeFile { .. }), "{e}");
    assert!(
        std::fs::symlink_metadata(shm_file(&name))
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

#[test]
fn files_are_0600_whatever_the_umask() {
    for umask in [0o000, 0o377, 0o022] {
        // SAFETY: umask has no preconditions; restored below.
        let old = unsafe { libc::umask(umask) };
        let name = unique_name(&format!("umask{umask:o}"));
        let server = RingServer::create(&name, &cfg());
        let manifest = RingManifest::publish(&name, &[&name]);
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        let (server, manifest) = (server.unwrap(), manifest.unwrap());
        assert_eq!(mode_of(&shm_file(&name)), 0o600, "ring, umask {umask:o}");
        assert_eq!(mode_of(manifest.path()), 0o600, "manifest, umask {umask:o}");
        RingClient::attach(&name).expect("attach");
        assert_eq!(read_manifest(&name).unwrap(), vec![name.clone()]);
        drop((server, manifest));
    }
}

#[test]
fn a_stale_ring_of_this_user_is_replaced() {
    // A ring file of this user that no server holds (its server died), even with a mode an
    // older build might have left: replaced by a fresh 0600 ring.
    let src = unique_name("stale-src");
    let bytes = {
        let _s = RingServer::create(&src, &cfg()).unwrap();
        std::fs::read(shm_file(&src)).unwrap()
    };
    let name = unique_name("stale");
    write_file(&shm_file(&name), &bytes, 0o644);
    let server = RingServer::create(&name, &cfg()).expect("stale ring replaced");
    assert_eq!(mode_of(&shm_file(&name)), 0o600);
    let mut client = RingClient::attach(&name).unwrap();
    assert_eq!(client.client_id(), 0, "a fresh ring");
    client.try_call(b"x").unwrap();
    drop(client);
    drop(server);
    assert!(!shm_file(&name).exists(), "removed at shutdown");
}

#[test]
fn another_users_ring_is_refused_and_never_replaced() {
    if !is_root() {
        eprintln!(
            "skipped: needs root (chowns a file to uid {FOREIGN_UID} to stand for another user)"
        );
        return;
    }
    // A live ring whose file another user owns (a squatter's file at a daemon's name).
    let name = unique_name("foreign");
    let server = RingServer::create(&name, &cfg()).unwrap();
    chown(&shm_file(&name), FOREIGN_UID);
    let e = RingClient::attach(&name).unwrap_err();
    match &e {
        RingError::UnsafeFile { owner, mode, .. } => {
            assert_eq!((*owner, *mode), (FOREIGN_UID, 0o600))
        }
        other => panic!("expected UnsafeFile, got {other}"),
    }
    assert!(e.to_string().contains("owner uid 65534"), "{e}");
    drop(server);

    // A stale-looking file of another user at the name: a server refuses it and leaves it.
    let name = unique_name("foreign-stale");
    let path = shm_file(&name);
    let _cleanup = Cleanup(path.clone());
    write_file(&path, &[0u8; 4096], 0o666);
    chown(&path, FOREIGN_UID);
    let e = RingServer::create(&name, &cfg()).unwrap_err();
    assert!(
        matches!(&e, RingError::UnsafeFile { owner, mode, .. } if *owner == FOREIGN_UID && *mode == 0o666),
        "{e}"
    );
    let md = std::fs::metadata(&path).expect("never unlinked");
    assert_eq!((md.uid(), md.len()), (FOREIGN_UID, 4096), "never reused");

    // Another user's manifest: refused by readers, and a publisher does not replace it.
    let base = unique_name("foreign-manifest");
    let (_, mpath) = manifest::manifest_path(&base).unwrap();
    let _cleanup2 = Cleanup(mpath.clone());
    let good = {
        let m = RingManifest::publish(&base, &["a-0"]).unwrap();
        let b = std::fs::read(m.path()).unwrap();
        drop(m);
        b
    };
    write_file(&mpath, &good, 0o600);
    chown(&mpath, FOREIGN_UID);
    let e = read_manifest(&base).unwrap_err();
    assert!(
        matches!(&e, RingError::UnsafeFile { owner, .. } if *owner == FOREIGN_UID),
        "{e}"
    );
    let e = RingManifest::publish(&base, &["b-0"]).unwrap_err();
    assert!(matches!(e, RingError::UnsafeFile { .. }), "{e}");
    assert_eq!(std::fs::metadata(&mpath).unwrap().uid(), FOREIGN_UID);
    assert_eq!(std::fs::read(&mpath).unwrap(), good, "left alone");
}

#[test]
fn manifest_round_trip_replacement_and_cleanup() {
    let base = unique_name("manifest");
    let names = ["kv-x-0", "/kv-x-1", "kv-x-2"];
    let m = RingManifest::publish(&base, &names).unwrap();
    assert_eq!(m.path(), shm_file(&format!("{base}.rings")));
    assert_eq!(
        read_manifest(&base).unwrap(),
        vec!["kv-x-0", "kv-x-1", "kv-x-2"]
    );
    assert_eq!(read_manifest(&format!("/{base}")).unwrap().len(), 3);
    // A dead publisher's manifest (forgotten: no Drop) is replaced by the next one.
    std::mem::forget(m);
    let m2 = RingManifest::publish(&base, &["kv-y-0"]).unwrap();
    assert_eq!(read_manifest(&base).unwrap(), vec!["kv-y-0"]);
    // No temporary files left behind.
    let tmp_prefix = format!(".{base}.rings.tmp.");
    assert!(
        std::fs::read_dir(SHM_DIR)
            .unwrap()
            .flatten()
            .all(|e| !e.file_name().to_string_lossy().starts_with(&tmp_prefix))
    );
    drop(m2);
    assert!(matches!(
        read_manifest(&base),
        Err(RingError::NotFound { .. })
    ));
    // Bad arguments.
    assert!(matches!(
        RingManifest::publish(&base, &[]),
        Err(RingError::InvalidConfig { .. })
    ));
    assert!(matches!(
        RingManifest::publish(&base, &["a/b"]),
        Err(RingError::InvalidName { .. })
    ));
    assert!(matches!(
        read_manifest("a/b"),
        Err(RingError::InvalidName { .. })
    ));
}

/// The bytes of a valid manifest listing `rings`.
fn manifest_bytes(tag: &str, rings: &[&str]) -> Vec<u8> {
    let m = RingManifest::publish(&unique_name(tag), rings).unwrap();
    std::fs::read(m.path()).unwrap()
}

/// Writes `bytes` as the manifest of a fresh base (mode `mode`) and reads it.
fn read_written(tag: &str, bytes: &[u8], mode: u32) -> Result<Vec<String>, RingError> {
    let base = unique_name(tag);
    let (_, path) = manifest::manifest_path(&base).unwrap();
    let _cleanup = Cleanup(path.clone());
    write_file(&path, bytes, mode);
    read_manifest(&base)
}

fn bad_manifest(r: Result<Vec<String>, RingError>) -> String {
    match r {
        Err(RingError::BadManifest { path, reason }) => {
            assert!(path.to_string_lossy().ends_with(".rings"));
            reason
        }
        other => panic!("expected BadManifest, got {other:?}"),
    }
}

#[test]
fn corrupt_or_truncated_manifests_are_refused() {
    let good = manifest_bytes("good", &["ring-a", "ring-b"]);
    assert_eq!(
        read_written("good-copy", &good, 0o600).unwrap(),
        vec!["ring-a", "ring-b"]
    );
    // Mode with group/other bits: refused before reading.
    let e = read_written("mode", &good, 0o644).unwrap_err();
    assert!(
        matches!(e, RingError::UnsafeFile { mode: 0o644, .. }),
        "{e}"
    );
    // Every truncation.
    for len in 0..good.len() {
        let reason = bad_manifest(read_written("trunc", &good[..len], 0o600));
        assert!(!reason.is_empty());
    }
    // Extended by a byte.
    let mut long = good.clone();
    long.push(0);
    assert!(bad_manifest(read_written("long", &long, 0o600)).contains("length"));
    // Every single-byte corruption is caught (magic, version, count, length, names, checksum).
    for i in 0..good.len() {
        let mut b = good.clone();
        b[i] ^= 0x5a;
        bad_manifest(read_written("flip", &b, 0o600));
    }
    // Named checks.
    let mut b = good.clone();
    b[0] = b'X';
    assert!(bad_manifest(read_written("magic", &b, 0o600)).contains("magic"));
    let mut b = good.clone();
    b[8..12].copy_from_slice(&(MANIFEST_VERSION + 1).to_le_bytes());
    assert!(bad_manifest(read_written("version", &b, 0o600)).contains("version"));
    // An invalid ring name with a consistent checksum: still refused.
    let b = reencode(&[b"ok", b"../etc"]);
    assert!(bad_manifest(read_written("name", &b, 0o600)).contains("ring 1"));
    let b = reencode(&[]);
    assert!(bad_manifest(read_written("empty", &b, 0o600)).contains("count"));
    // Too large to be a manifest.
    let big = vec![0u8; manifest::MAX_MANIFEST_BYTES + 10];
    assert!(bad_manifest(read_written("big", &big, 0o600)).contains("more than"));
}

/// A manifest with these raw names and a correct length and checksum (the module's format).
fn reencode(names: &[&[u8]]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&manifest::MANIFEST_MAGIC);
    b.extend_from_slice(&MANIFEST_VERSION.to_le_bytes());
    b.extend_from_slice(&(names.len() as u32).to_le_bytes());
    let total = 24 + names.iter().map(|n| 2 + n.len()).sum::<usize>() + 8;
    b.extend_from_slice(&(total as u32).to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    for n in names {
        b.extend_from_slice(&(n.len() as u16).to_le_bytes());
        b.extend_from_slice(n);
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in &b {
        h ^= u64::from(x);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    b.extend_from_slice(&h.to_le_bytes());
    b
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    /// Arbitrary bytes never panic the decoder; whatever it accepts re-encodes to itself.
    #[test]
    fn manifest_decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let path = std::path::Path::new("/dev/shm/prop.rings");
        if let Ok(names) = manifest::decode(&bytes, path) {
            let refs: Vec<&[u8]> = names.iter().map(|n| n.as_bytes()).collect();
            let again = reencode(&refs);
            prop_assert_eq!(manifest::decode(&again, path).unwrap(), names);
        }
    }

    /// A valid manifest with arbitrary bytes spliced in is refused or decodes to valid names.
    #[test]
    fn manifest_mutations_are_refused_or_valid(
        at in 0usize..64, junk in proptest::collection::vec(any::<u8>(), 1..8)
    ) {
        let good = reencode(&[b"ring-a", b"ring-b"]);
        let mut b = good.clone();
        let at = at.min(b.len());
        b.splice(at..at, junk);
        let path = std::path::Path::new("/dev/shm/prop.rings");
        prop_assert!(manifest::decode(&b, path).is_err());
    }
}
