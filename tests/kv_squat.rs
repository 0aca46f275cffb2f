//! Ring squatting (issue 14): another user who runs a ring server at the next ring name of a
//! `kv serve` (`<shm>-1` next to its one daemon's `<shm>-0`) must not become a daemon of
//! `kv client`. The client attaches only to the rings `kv serve` listed in its ring manifest.
//! Run as root, the squatter's file is chowned to uid 65534 (another user, no account needed);
//! otherwise it is this user's file with mode 0666, which the manifest keeps out just the same.
//! And `kv client` refuses a missing, corrupt or group/other-readable manifest with a clear
//! error (exit code 2), never a panic.

mod kv_common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use kv_common::{Serve, client, finish_within};
use rpc::delegation::{RingConfig, RingServer};

#[test]
fn a_squatted_next_ring_name_is_not_used_by_kv_client() {
    let serve = Serve::start("squat", 1, &[]);
    // The squatter: a live, well-formed ring server at `<shm>-1` that never answers.
    let squat = format!("{}-1", serve.shm);
    let squatter = RingServer::create(&squat, &RingConfig::default()).expect("squatter ring");
    let path = format!("/dev/shm/{squat}");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    // Another user's file when run as root (elsewhere chown fails with EPERM and the file
    // stays this user's, mode 0666).
    let _ = std::os::unix::fs::chown(&path, Some(65534), Some(65534));
    let run = client(
        &serve.shm,
        &[
            "--clients",
            "2",
            "--duration",
            "1",
            "--deadline-ms",
            "300",
            "--quiet",
        ],
    )
    .spawn()
    .expect("kv client");
    let (code, v, stderr) = finish_within(run, Duration::from_secs(60), "kv client");
    let v = v.unwrap_or_else(|| panic!("no summary; stderr: {stderr}"));
    assert_eq!(code, Some(0), "{v}\nstderr: {stderr}");
    assert_eq!(v["check_passed"], true, "{v}");
    assert_eq!(v["errors"], 0, "{v}");
    assert_eq!(v["daemons"], 1, "only the manifest's ring is used: {v}");
    drop(squatter);
    let _ = std::fs::remove_file(&path);
}

/// `kv client` refuses a manifest that is not `kv serve`'s: missing, corrupt, or readable by
/// others. Exit code 2, and stderr names the file and what is wrong; no panic.
#[test]
fn kv_client_refuses_missing_corrupt_or_exposed_manifests() {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let base = format!("kv-badmanifest-{}", std::process::id());
    let path = format!("/dev/shm/{base}.rings");
    let run = || {
        let out = client(&base, &["--duration", "1", "--quiet"])
            .output()
            .expect("kv client");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stderr) = run();
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("no ring manifest"), "{stderr}");
    assert!(stderr.contains(&path), "{stderr}");

    let write = |bytes: &[u8], mode: u32| {
        let _ = std::fs::remove_file(&path);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .unwrap();
        f.write_all(bytes).unwrap();
        f.set_permissions(std::fs::Permissions::from_mode(mode))
            .unwrap();
    };
    // Truncated (the first 20 bytes of a plausible header).
    write(
        b"DLGRINGS\x01\x00\x00\x00\x01\x00\x00\x00\x40\x00\x00\x00\x00\x00\x00\x00",
        0o600,
    );
    let (code, stderr) = run();
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("invalid"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // Garbage.
    write(&[0xa5; 64], 0o600);
    let (code, stderr) = run();
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("magic"), "{stderr}");
    // Readable by others: refused before it is read.
    write(&[0xa5; 64], 0o644);
    let (code, stderr) = run();
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("mode 0644"), "{stderr}");
    let _ = std::fs::remove_file(&path);
}
