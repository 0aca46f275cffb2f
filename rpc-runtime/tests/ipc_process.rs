//! Cross-process ipc tests. Each test re-executes this test binary (`current_exe() --exact
//! <test>`) with `IPC_TEST_ROLE` set, and the child plays the role instead of running the
//! test: a client of a server in the parent, a server (serving, or idle), or a client that is
//! killed with requests in flight. Children report readiness with a marker line on stdout.

mod ipc_common;

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use ipc_common::*;
use rpc_runtime::RpcError;
use rpc_runtime::ipc::{Ipc, IpcToken};

const ROLE: &str = "IPC_TEST_ROLE";
const NAME: &str = "IPC_TEST_NAME";
const READY: &str = "IPC-CHILD-READY";

/// Runs the child role if this process is a child; returns whether it was.
fn child() -> bool {
    let (Ok(role), Ok(name)) = (std::env::var(ROLE), std::env::var(NAME)) else {
        return false;
    };
    // Die with the test thread that spawned this child, so a failing test leaves no child
    // looping forever.
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    match role.as_str() {
        "client" => {
            let mut c = Ipc::attach(&name).unwrap();
            for i in 0..500u32 {
                let msg = i.to_ne_bytes();
                let t = send(&mut c, &msg);
                let (rt, resp) = wait_one(&mut c, None);
                assert_eq!((rt, resp), (t, transform(&msg)));
            }
        }
        "server" | "idle_server" => {
            let mut s = server(&name, 4, 4);
            println!("{READY}");
            loop {
                if role == "server" {
                    serve_once(&mut s);
                    thread::yield_now();
                } else {
                    thread::sleep(Duration::from_millis(5));
                }
            }
        }
        "dying_client" => {
            let mut c = Ipc::attach(&name).unwrap();
            for i in 0..3u8 {
                send(&mut c, &[i]);
            }
            println!("{READY}");
            loop {
                thread::sleep(Duration::from_millis(5));
            }
        }
        r => panic!("unknown role {r}"),
    }
    true
}

fn spawn(test: &str, role: &str, name: &str) -> (Child, BufReader<ChildStdout>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(NAME, name)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn child");
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

/// Reads the child's stdout until the ready marker (the harness may print it after "test
/// <name> ... " on the same line; panics on EOF: the child failed).
fn wait_ready(out: &mut BufReader<ChildStdout>) {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "child exited before ready"
        );
        if line.contains(READY) {
            return;
        }
    }
}

fn kill(child: &mut Child, sig: libc::c_int) {
    // SAFETY: signals a child process this test spawned and has not reaped yet.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, sig) }, 0);
}

/// Waits for `child` to exit within `timeout` (kills it and panics otherwise).
fn wait_exit(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child did not exit within {timeout:?}");
        }
        thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn client_in_another_process() {
    if child() {
        return;
    }
    let n = unique_name("pclient");
    let mut s = server(&n, 4, 4);
    let (mut c, _out) = spawn("client_in_another_process", "client", &n);
    let deadline = Instant::now() + Duration::from_secs(60);
    while c.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "child client did not finish");
        serve_once(&mut s);
        thread::yield_now();
    }
    assert!(c.wait().unwrap().success(), "child client failed");
    assert_eq!(s.stats().replied, 500);
}

#[test]
fn server_in_another_process() {
    if child() {
        return;
    }
    let n = unique_name("pserver");
    let (mut child, mut out) = spawn("server_in_another_process", "server", &n);
    wait_ready(&mut out);
    let mut c = Ipc::attach(&n).unwrap();
    for i in 0..500u32 {
        let msg = i.to_ne_bytes();
        let t = send(&mut c, &msg);
        assert_eq!(wait_one(&mut c, None), (t, transform(&msg)));
    }
    kill(&mut child, libc::SIGKILL);
    wait_exit(&mut child, Duration::from_secs(10));
    let _ = std::fs::remove_file(shm_file(&n));
}

#[test]
fn dead_server_ends_the_call_with_disconnected() {
    if child() {
        return;
    }
    let n = unique_name("deadserver");
    let (mut child, mut out) = spawn(
        "dead_server_ends_the_call_with_disconnected",
        "idle_server",
        &n,
    );
    wait_ready(&mut out);
    let mut c = Ipc::attach(&n).unwrap();
    send(&mut c, b"never answered");
    // Alive but silent: polls report nothing, not a disconnect (3 liveness intervals).
    let until = Instant::now() + Duration::from_millis(30);
    while Instant::now() < until {
        assert_eq!(c.poll_up_to(1, |_, _| ()).unwrap(), 0);
    }
    kill(&mut child, libc::SIGKILL);
    wait_exit(&mut child, Duration::from_secs(10));
    let t0 = Instant::now();
    let e = loop {
        match c.poll_up_to(1, |_, _| ()) {
            Ok(0) => assert!(t0.elapsed() < Duration::from_secs(5), "death not detected"),
            Ok(_) => panic!("a response from a dead server"),
            Err(e) => break e,
        }
    };
    assert!(matches!(e, RpcError::ServerDisconnected), "{e}");
    assert!(matches!(
        c.try_send(|_| 0),
        Err(RpcError::ServerDisconnected)
    ));
    let _ = std::fs::remove_file(shm_file(&n));
}

#[test]
fn stopped_server_is_not_dead_and_never_blocks() {
    if child() {
        return;
    }
    let n = unique_name("stopped");
    let (mut child, mut out) = spawn("stopped_server_is_not_dead_and_never_blocks", "server", &n);
    wait_ready(&mut out);
    let mut c = Ipc::attach(&n).unwrap();
    let t = send(&mut c, b"a");
    assert_eq!(wait_one(&mut c, None), (t, transform(b"a")));
    kill(&mut child, libc::SIGSTOP);
    // Wait until it is stopped (signal delivery is asynchronous).
    let mut status = 0;
    // SAFETY: waits for a state change of our own unreaped child; WUNTRACED reports the stop
    // without reaping it.
    let r = unsafe { libc::waitpid(child.id() as libc::pid_t, &mut status, libc::WUNTRACED) };
    assert!(r > 0 && libc::WIFSTOPPED(status), "child not stopped");
    let t = send(&mut c, b"b");
    for _ in 1..4 {
        send(&mut c, b"c");
    }
    // Every operation returns at once while the server is stopped: no response, no false
    // disconnect (10 liveness intervals), back-pressure at depth.
    let until = Instant::now() + Duration::from_millis(100);
    while Instant::now() < until {
        let t0 = Instant::now();
        assert_eq!(c.poll_up_to(1, |_, _| ()).unwrap(), 0);
        assert!(matches!(c.try_send(|_| 0), Err(RpcError::WouldBlock)));
        assert!(t0.elapsed() < Duration::from_millis(50));
    }
    kill(&mut child, libc::SIGCONT);
    assert_eq!(wait_one(&mut c, None), (t, transform(b"b")));
    kill(&mut child, libc::SIGKILL);
    wait_exit(&mut child, Duration::from_secs(10));
    let _ = std::fs::remove_file(shm_file(&n));
}

#[test]
fn dead_client_block_is_reclaimed_and_its_requests_dropped() {
    if child() {
        return;
    }
    let n = unique_name("deadclient");
    let mut s = server(&n, 1, 4);
    let (mut child, mut out) = spawn(
        "dead_client_block_is_reclaimed_and_its_requests_dropped",
        "dying_client",
        &n,
    );
    wait_ready(&mut out);
    // Take one of its three requests (awaiting a reply), leave two queued.
    let deadline = Instant::now() + Duration::from_secs(10);
    let token: IpcToken = loop {
        s.poll();
        if let Some((t, _)) = s.recv() {
            break t;
        }
        assert!(Instant::now() < deadline, "no request from the child");
    };
    // Alive: its block is not reclaimed.
    s.scan_clients();
    assert_eq!(s.stats().clients_reclaimed, 0);
    kill(&mut child, libc::SIGKILL);
    wait_exit(&mut child, Duration::from_secs(10));
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.stats().clients_reclaimed == 0 {
        assert!(Instant::now() < deadline, "dead client not reclaimed");
        s.poll();
    }
    assert_eq!(s.stats().requests_dropped, 3);
    assert!(s.reply_with(token, |_| 0).is_err());
    assert_eq!(s.stats().stale_replies, 1);
    // The only block is free again and works for a new client.
    let mut c = Ipc::attach(&n).unwrap();
    let t = send(&mut c, b"new");
    assert_eq!(wait_one(&mut c, Some(&mut s)), (t, transform(b"new")));
}
