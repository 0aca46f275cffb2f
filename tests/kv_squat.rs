//! Ring squatting (issue 14): another user who runs a ring server at the next ring name of a
//! `kv serve` (`<shm>-1` next to its one daemon's `<shm>-0`) must not become a daemon of
//! `kv client`. The client attaches only to the rings `kv serve` listed in its ring manifest.
//! Run as root, the squatter's file is chowned to uid 65534 (another user, no account needed);
//! otherwise it is this user's file with mode 0666, which the manifest keeps out just the same.

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
