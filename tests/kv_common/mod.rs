//! Helpers shared by the `kv` tests (`tests/kv_*.rs`): running a job in this process through
//! the `kvbench` library with a small workload and turning its summaries into JSON, the
//! checks every passing single-rank run must meet, and, for the tests that need separate
//! processes (`kv serve` / `kv client`), finding the example binary and driving it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// `target/<profile>/examples/kv`, which `cargo test` builds alongside the test binaries.
pub(crate) fn kv_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir");
    let kv = profile_dir.join("examples").join("kv");
    assert!(
        kv.exists(),
        "{} not found: build it with `cargo test` (which builds examples) or `cargo build --example kv`",
        kv.display()
    );
    kv
}

/// Runs `kv --duration 1 --json --quiet` with a small workload plus `args` in this process
/// ([`kvbench::run::run_all`]); returns the exit code the binary would have, the JSON of the
/// first summary (if any) and the errors as the binary prints them on stderr.
pub(crate) fn run_kv(args: &[&str]) -> (Option<i32>, Option<serde_json::Value>, String) {
    let small = [
        "--duration",
        "1",
        "--warmup",
        "0.2",
        "--json",
        "--quiet",
        "--keys",
        "65536",
        "--pattern-len",
        "8192",
        "--check-samples",
        "1000",
    ];
    let all: Vec<&str> = small.iter().chain(args).copied().collect();
    let (code, summaries, stderr) = run_in_process(&all, Duration::from_secs(120));
    (code, summaries.into_iter().next(), stderr)
}

/// Runs `kv <args>` (no subcommand) in this process through [`kvbench::run::run_all`], failing
/// the test if it takes longer than `limit`: the exit code the binary would have
/// ([`kvbench::run::exit_code`]), every summary as JSON (the ones completed before an error
/// included), and the errors, one `kv: <message>` line each, as the binary prints them.
pub(crate) fn run_in_process(
    args: &[&str],
    limit: Duration,
) -> (Option<i32>, Vec<serde_json::Value>, String) {
    use clap::Parser;
    // Warnings (a failed connection and why, `RUST_LOG` honoured) go to the test's captured
    // output, so a failing run explains itself. (Once per test binary: later calls fail.)
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
    // These runs check answers, not latency: unless a test sets its own, calls get 10 s
    // instead of kv's 1 s default. On a 2-core machine running other test binaries, a call
    // that crosses several spinning threads (client, Flux, daemon, copyrpc peer) can wait a
    // scheduling round at each hop; a stress run at load 10 saw 8 of about 3000 remote calls
    // pass 1 s (`kv_multirank`), answered late and dropped as the deadline requires.
    let deadline: &[&str] = if args.contains(&"--deadline-ms") {
        &[]
    } else {
        &["--deadline-ms", "10000"]
    };
    let cli = kvbench::config::Cli::try_parse_from(
        std::iter::once("kv")
            .chain(deadline.iter().copied())
            .chain(args.iter().copied()),
    )
    .unwrap_or_else(|e| panic!("kv {args:?}: {e}"));
    let kvbench::config::Cmd::Run(a) = cli.into_command() else {
        panic!("kv {args:?}: not a run");
    };
    let t0 = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(kvbench::run::run_all(&a));
    });
    let r = rx
        .recv_timeout(limit)
        .unwrap_or_else(|_| panic!("kv {args:?}: still running after {limit:?}"));
    assert!(t0.elapsed() < limit, "kv {args:?} too slow");
    let code = kvbench::run::exit_code(&r);
    let json = |s: &kvbench::report::Summary| serde_json::to_value(s).expect("a JSON summary");
    match r {
        Ok(v) => (Some(code), v.iter().map(json).collect(), String::new()),
        Err(e) => (
            Some(code),
            e.completed.iter().map(json).collect(),
            e.messages.iter().map(|m| format!("kv: {m}\n")).collect(),
        ),
    }
}

/// A passing run's summary.
pub(crate) fn passing(args: &[&str]) -> serde_json::Value {
    let (code, v, stderr) = run_kv(args);
    let v = v.unwrap_or_else(|| panic!("kv {args:?}: no summary; stderr: {stderr}"));
    assert_eq!(code, Some(0), "kv {args:?}: {v}\nstderr: {stderr}");
    assert_eq!(v["check_passed"], true, "{v}");
    assert_eq!(v["errors"], 0, "{v}");
    assert_eq!(v["bad_requests"], 0, "{v}");
    assert_eq!(v["check_mismatches"], 0, "{v}");
    assert!(v["check_samples"].as_u64().unwrap() > 0, "{v}");
    assert!(v["ops"].as_u64().unwrap() > 0, "{v}");
    v
}

/// A `kv serve` process for the two-process tests: started with `--shm <unique name>`, its
/// `ready` line read; on drop it is killed (SIGKILL) and its rings and ring manifest are
/// removed.
pub(crate) struct Serve {
    child: std::process::Child,
    /// The rings' base name in /dev/shm.
    pub shm: String,
    daemons: usize,
}

impl Serve {
    /// Starts `kv serve --shm kv-<tag>-<pid> --daemons <daemons> --duration 300` plus `args`
    /// and waits for its `ready` line.
    pub(crate) fn start(tag: &str, daemons: usize, args: &[&str]) -> Serve {
        use std::io::{BufRead, BufReader};
        let shm = format!("kv-{tag}-{}", std::process::id());
        let mut child = Command::new(kv_binary())
            .args(["serve", "--shm", &shm, "--daemons", &daemons.to_string()])
            .args(["--duration", "300"])
            .args(args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn kv serve");
        let out = child.stdout.take().expect("serve stdout");
        let mut lines = BufReader::new(out).lines();
        let ready = lines
            .next()
            .expect("kv serve exited early")
            .expect("a line");
        assert!(ready.starts_with("ready"), "unexpected first line: {ready}");
        // Keep reading (the daemons' final lines) so that serve never blocks on a full pipe.
        std::thread::spawn(move || lines.map_while(Result::ok).for_each(drop));
        Serve {
            child,
            shm,
            daemons,
        }
    }

    /// Kills the daemons' process (SIGKILL: no clean shutdown, the rings stay behind).
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stops the process (SIGSTOP): it holds its rings but answers nothing.
    pub(crate) fn pause(&self) {
        signal(self.child.id(), "STOP");
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        // A paused process must run to die; it may be gone already (no check).
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .stderr(std::process::Stdio::null())
            .status();
        self.kill();
        for d in 0..self.daemons {
            let _ = std::fs::remove_file(format!("/dev/shm/{}-{d}", self.shm));
        }
        let _ = std::fs::remove_file(format!("/dev/shm/{}.rings", self.shm));
    }
}

/// Sends `SIG<sig>` through the `kill` command (no unsafe libc call needed in a test).
pub(crate) fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .expect("kill");
    assert!(st.success(), "kill -{sig} {pid}");
}

/// `kv client --shm <shm>` with a small workload (`--keys 4096 --pattern-len 4096
/// --check-samples 500 --json`) plus `args`; stdout and stderr piped.
pub(crate) fn client(shm: &str, args: &[&str]) -> Command {
    let mut c = Command::new(kv_binary());
    c.args(["client", "--shm", shm])
        .args([
            "--keys",
            "4096",
            "--pattern-len",
            "4096",
            "--check-samples",
            "500",
        ])
        .arg("--json")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    c
}

/// Waits up to `limit` for `child` to exit; kills it and fails the test if it does not.
/// Returns the exit code, the JSON summary (the first stdout line, if any) and stderr.
pub(crate) fn finish_within(
    mut child: std::process::Child,
    limit: Duration,
    what: &str,
) -> (Option<i32>, Option<serde_json::Value>, String) {
    use std::io::Read;
    let t0 = Instant::now();
    // Read the pipes while waiting, so that the child never blocks on a full one.
    let mut out = child.stdout.take().expect("stdout piped");
    let err = child.stderr.take();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    // (Stderr already taken by the caller: reported empty.)
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut err) = err {
            let _ = err.read_to_string(&mut s);
        }
        s
    });
    let status = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break st;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what}: still running after {limit:?}; stderr: {}",
                err.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = out.join().expect("stdout reader");
    let json = stdout
        .lines()
        .next()
        .map(|l| serde_json::from_str(l).expect("a JSON summary"));
    (status.code(), json, err.join().expect("stderr reader"))
}
