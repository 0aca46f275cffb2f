//! Trust boundaries of the device model's node (issue 14): the files a joined process creates
//! (the node directory, its registered buffers' and queues' segments) are mode 0600 even under
//! umask 000, and a foreign lock held on the node directory's lock byte makes operations fail
//! with [`Error::LockTimeout`] within the configured bound instead of freezing the process.
//!
//! A process joins one node for its lifetime and the test harness's own process must stay
//! unjoined, so each scenario runs in a child (this test binary re-executed with
//! `MLX5_TRUST_ROLE`); the `#[test]` waits for it with a time limit and checks its exit status.
//! A child that stalls is ended by its watchdog (exit code 3), so a stall fails the test
//! instead of hanging it.

mod sim_common;

use std::os::unix::fs::MetadataExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mlx5::Error;
use mlx5::cqe::CqeOpcode;
use mlx5::sim::{Fabric, SimConfig};
use mlx5::verbs::{Access, QpCaps, RcParams};
use mlx5::wqe::{Opcode, WqeDesc};
use sim_common::*;

const ROLE: &str = "MLX5_TRUST_ROLE";
const NODE: &str = "MLX5_TRUST_NODE";

/// Runs `test` of this binary as a child playing `role` on a fresh node; asserts it succeeds.
fn run_role(test: &str, role: &str) {
    let node = format!("trust-{role}-{}", std::process::id());
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(NODE, &node)
        .stdout(Stdio::inherit())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("role {role} still running after 60 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // Leftovers of a failed child.
    let prefix = format!("mlx5sim.{node}");
    for e in std::fs::read_dir("/dev/shm").unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_file(e.path());
        }
    }
    assert!(status.success(), "role {role} failed: {status}");
}

/// A child's watchdog: a stalled role exits with code 3.
fn watchdog(limit: Duration) {
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        eprintln!("role stalled for {limit:?}");
        std::process::exit(3);
    });
}

fn mode_of(path: &str) -> u32 {
    std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

#[test]
fn files_are_0600_under_umask_000() {
    if std::env::var(ROLE).as_deref() != Ok("umask") {
        return run_role("files_are_0600_under_umask_000", "umask");
    }
    watchdog(Duration::from_secs(30));
    let node = std::env::var(NODE).unwrap();
    // SAFETY: umask has no preconditions; this child process exists only for this check.
    unsafe { libc::umask(0) };
    let f = Fabric::join(&node, SimConfig::deterministic()).unwrap();
    let n = Node::new(&f);
    let buf = n.buf(4096, all_access());
    let cq = n.cq(16);
    let seg = buf
        .mem
        .segment()
        .expect("a joined process's DmaBuf is shared");
    let dir = format!("/dev/shm/mlx5sim.{node}");
    assert_eq!(mode_of(&dir), 0o600, "node directory");
    let seg_path = format!("{dir}.{}.{seg}", std::process::id());
    assert_eq!(mode_of(&seg_path), 0o600, "registered buffer segment");
    // Every file of the node (queue memory too).
    let prefix = format!("mlx5sim.{node}.");
    let mut n_files = 0;
    for e in std::fs::read_dir("/dev/shm").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) {
            n_files += 1;
            assert_eq!(mode_of(&format!("/dev/shm/{name}")), 0o600, "{name}");
        }
    }
    assert!(
        n_files >= 3,
        "buffer, CQ ring and doorbell segments: {n_files}"
    );
    drop((cq, buf, n, f));
}

/// Takes a read lock on byte 0 of `path` through a new open file description (read-only, as
/// any user who can open the file could).
fn foreign_read_lock(path: &str) -> std::fs::File {
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: `flock` is plain data; zeroed is valid (l_pid must be 0 for OFD locks).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_RDLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = 0;
    fl.l_len = 1;
    // SAFETY: a valid descriptor and `flock`.
    let r = unsafe {
        libc::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            libc::F_OFD_SETLK,
            &mut fl,
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    f
}

/// Asserts `r` is the node lock's timeout, reached after at least `bound` and well before a
/// stall would end.
#[track_caller]
fn timed_out<T>(r: mlx5::Result<T>, t0: Instant, bound: Duration) {
    let waited = t0.elapsed();
    match r {
        Err(Error::LockTimeout {
            lock,
            path,
            waited: w,
            bound: b,
        }) => {
            assert!(lock.contains("node lock"), "{lock}");
            assert!(path.starts_with("/dev/shm/mlx5sim."), "{path}");
            assert_eq!(b, bound);
            assert!(w >= bound, "{w:?}");
        }
        Err(e) => panic!("expected LockTimeout, got {e}"),
        Ok(_) => panic!("expected LockTimeout, got Ok"),
    }
    assert!(
        waited >= bound && waited < bound + Duration::from_secs(2),
        "{waited:?}"
    );
}

#[test]
fn a_foreign_lock_makes_operations_fail_within_the_bound() {
    if std::env::var(ROLE).as_deref() != Ok("held") {
        return run_role(
            "a_foreign_lock_makes_operations_fail_within_the_bound",
            "held",
        );
    }
    watchdog(Duration::from_secs(20));
    let node = std::env::var(NODE).unwrap();
    let bound = Duration::from_millis(100);
    let f = Fabric::join(
        &node,
        SimConfig {
            node_lock_timeout: bound,
            ..SimConfig::deterministic()
        },
    )
    .unwrap();
    let mut p = RcPair::new(&f, QpCaps::default(), &RcParams::default());
    let src = p.a.buf(4096, Access::LOCAL_WRITE);
    let dst = p.b.buf(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    src.write(0, b"first");
    src.write(64, b"second");

    let held = foreign_read_lock(&format!("/dev/shm/mlx5sim.{node}"));
    assert_eq!(f.stats().node_lock_timeouts, 0);
    // Object creation: the error, within the bound.
    let t0 = Instant::now();
    timed_out(p.a.ctx.alloc_pd(), t0, bound);
    let t0 = Instant::now();
    timed_out(p.a.ctx.create_cq(16), t0, bound);
    // A progress step: skipped with the error.
    let t0 = Instant::now();
    timed_out(f.try_progress(), t0, bound);
    // A doorbell cannot fail: it returns within the bound, the WQE stays posted.
    let sges = [src.sge(0, 5)];
    let t0 = Instant::now();
    post(
        &mut p.qa,
        &WqeDesc {
            remote: Some(dst.raddr(0)),
            sges: &sges,
            ..desc(Opcode::RdmaWrite)
        },
    );
    let waited = t0.elapsed();
    assert!(
        waited >= bound && waited < bound + Duration::from_secs(2),
        "{waited:?}"
    );
    assert!(try_poll(&mut p.cqa.cq).is_none(), "not executed");
    assert_eq!(dst.read(0, 5), [0; 5]);
    let stats = f.stats();
    assert_eq!(stats.node_lock_timeouts, 4, "{stats:?}");
    // Reading this process's own counters and states never needs the node lock.
    assert!(f.qp_state(p.qa.qpn()).is_some());

    // The lock is released: the next doorbell executes both WQEs.
    drop(held);
    let sges = [src.sge(64, 6)];
    post(
        &mut p.qa,
        &WqeDesc {
            remote: Some(dst.raddr(64)),
            sges: &sges,
            ..desc(Opcode::RdmaWrite)
        },
    );
    expect_ok(&poll(&f, &mut p.cqa.cq), CqeOpcode::Req);
    expect_ok(&poll(&f, &mut p.cqa.cq), CqeOpcode::Req);
    assert_eq!(dst.read(0, 5), b"first");
    assert_eq!(dst.read(64, 6), b"second");
    assert!(p.a.ctx.alloc_pd().is_ok());
    assert_eq!(f.stats().node_lock_timeouts, 4);
}
