//! Cross-process delegation ring tests. Each test re-executes this test binary
//! (`current_exe() --exact <test> --nocapture`) with `RING_TEST_ROLE` set, and the child runs
//! the role instead of the test: a client against a server in the parent, a server that the
//! parent kills with SIGKILL or asks to exit, or a client that dies between reserving a slot
//! and committing it.

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;
use rpc_runtime::delegation::{
    RingCallError, RingClient, RingConfig, RingError, RingServer, SHM_DIR,
};

const ROLE: &str = "RING_TEST_ROLE";
const NAME: &str = "RING_TEST_NAME";

fn unique_name(tag: &str) -> String {
    format!("rt-{}-{tag}", std::process::id())
}

/// The role this process plays, if it is a child.
fn child_role() -> Option<(String, String)> {
    Some((std::env::var(ROLE).ok()?, std::env::var(NAME).ok()?))
}

fn spawn_child(test: &str, role: &str, name: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(NAME, name)
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn child")
}

/// Waits for `child` to exit (panics after `timeout`, killing it).
fn wait_child(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child did not exit within {timeout:?}");
        }
        thread::sleep(Duration::from_millis(2));
    }
}

fn cfg() -> RingConfig {
    RingConfig {
        max_clients: 8,
        ring_depth: 4,
        resp_depth: 8,
        req_payload_cap: 48,
        resp_payload_cap: 48,
        hole_timeout: Duration::from_millis(50),
        liveness_interval: Duration::from_millis(10),
        ..RingConfig::default()
    }
}

fn transform(req: &[u8]) -> Vec<u8> {
    req.iter()
        .map(|b| b.wrapping_mul(3).wrapping_add(1))
        .collect()
}

/// Polls once and answers everything with `transform`. Returns the requests seen.
fn serve_once(server: &mut RingServer) -> Vec<Vec<u8>> {
    server.poll();
    let mut seen = Vec::new();
    while let Some(e) = server.recv() {
        let token = e.token;
        let req = e.payload.to_vec();
        server.reply(token, &transform(&req)).expect("reply");
        seen.push(req);
    }
    server.advance_tail();
    seen
}

/// `calls` pipelined calls, each response checked. Payload: pid, client id, sequence number.
fn client_calls(c: &mut RingClient, calls: u64) {
    c.set_send_timeout(Duration::from_secs(60));
    let depth = c.info().resp_depth as usize;
    let mut slot_req: Vec<Option<Vec<u8>>> = vec![None; depth];
    let (mut next, mut done) = (0u64, 0u64);
    let backoff = Backoff::new();
    while done < calls {
        while next < calls {
            let mut req = Vec::with_capacity(16);
            req.extend_from_slice(&std::process::id().to_le_bytes());
            req.extend_from_slice(&c.client_id().to_le_bytes());
            req.extend_from_slice(&next.to_le_bytes());
            match c.try_call(&req) {
                Ok(idx) => {
                    assert!(slot_req[idx as usize].replace(req).is_none());
                    next += 1;
                }
                Err(RingCallError::WouldBlock) => break,
                // Stalled past the stall timeout (a loaded machine): not delivered; resend.
                Err(RingCallError::Skipped) => {}
                Err(e) => panic!("try_call: {e}"),
            }
        }
        let n = c
            .poll(|idx, resp| {
                let req = slot_req[idx as usize]
                    .take()
                    .expect("response without call");
                assert_eq!(resp, transform(&req));
                done += 1;
            })
            .expect("poll");
        if n == 0 {
            backoff.snooze();
        } else {
            backoff.reset();
        }
    }
}

/// One call, waiting for its response.
fn call(c: &mut RingClient, req: &[u8]) -> Result<Vec<u8>, RingCallError> {
    let idx = c.try_call(req)?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut got = None;
        c.poll(|i, r| {
            assert_eq!(i, idx);
            got = Some(r.to_vec())
        })?;
        if let Some(r) = got {
            return Ok(r);
        }
        assert!(Instant::now() < deadline, "no response");
        thread::yield_now();
    }
}

fn attach_retry(name: &str) -> RingClient {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match RingClient::attach(name) {
            Ok(c) => return c,
            Err(RingError::NotFound { .. } | RingError::ServerNotRunning { .. })
                if Instant::now() < deadline =>
            {
                thread::sleep(Duration::from_millis(5))
            }
            Err(e) => panic!("attach: {e}"),
        }
    }
}

/// Child role "server": creates the ring and serves it. After answering `STALL` it stops
/// serving (until killed); after answering `EXIT` it drops the server and returns.
fn child_server(name: &str) {
    let mut server = RingServer::create(name, &cfg()).expect("child create");
    let backoff = Backoff::new();
    loop {
        let seen = serve_once(&mut server);
        if seen.iter().any(|r| r == b"STALL") {
            loop {
                thread::sleep(Duration::from_secs(1));
            }
        }
        if seen.iter().any(|r| r == b"EXIT") {
            return;
        }
        if seen.is_empty() {
            backoff.snooze();
        } else {
            backoff.reset();
        }
    }
}

const CHILD_CALLS: u64 = 20_000;

#[test]
fn ring_cross_process_clients() {
    if let Some((role, name)) = child_role() {
        assert_eq!(role, "client");
        let mut c = RingClient::attach(&name).expect("child attach");
        client_calls(&mut c, CHILD_CALLS);
        return;
    }
    let name = unique_name("xproc-clients");
    let mut server = RingServer::create(&name, &cfg()).unwrap();
    let mut children: Vec<Child> = (0..3)
        .map(|_| spawn_child("ring_cross_process_clients", "client", &name))
        .collect();
    // A client in this process too.
    let local = {
        let name = name.clone();
        thread::spawn(move || client_calls(&mut RingClient::attach(&name).unwrap(), 5_000))
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    let backoff = Backoff::new();
    let mut statuses = Vec::new();
    while !children.is_empty() || !local.is_finished() {
        assert!(Instant::now() < deadline, "timeout; {:?}", server.stats());
        if serve_once(&mut server).is_empty() {
            backoff.snooze();
        } else {
            backoff.reset();
        }
        children.retain_mut(|c| match c.try_wait().unwrap() {
            Some(status) => {
                statuses.push(status);
                false
            }
            None => true,
        });
    }
    local.join().unwrap();
    assert!(statuses.iter().all(|s| s.success()), "{statuses:?}");
    let s = server.stats();
    assert_eq!(s.received, 3 * CHILD_CALLS + 5_000, "{s:?}");
    assert_eq!(s.replied, s.received);
    assert_eq!((s.invalid_entries(), s.holes_skipped), (0, 0));
}

#[test]
fn ring_server_killed_clients_disconnect() {
    if let Some((_, name)) = child_role() {
        child_server(&name);
        return;
    }
    let name = unique_name("xproc-kill");
    let path = std::path::Path::new(SHM_DIR).join(&name);
    let mut child = spawn_child("ring_server_killed_clients_disconnect", "server", &name);
    let mut a = attach_retry(&name);
    let mut b = attach_retry(&name);
    client_calls(&mut a, 500);
    client_calls(&mut b, 500);
    assert_eq!(call(&mut a, b"STALL").unwrap(), transform(b"STALL"));

    // b: one call outstanding, polling. a: fills the ring (depth 4) and blocks in try_call.
    b.try_call(b"pending").unwrap();
    let ready = Arc::new(Barrier::new(3));
    let poller = {
        let ready = ready.clone();
        thread::spawn(move || {
            ready.wait();
            loop {
                match b.poll(|_, _| panic!("stalled server answered")) {
                    Ok(_) => thread::yield_now(),
                    Err(e) => return (e, Instant::now()),
                }
            }
        })
    };
    let caller = {
        let ready = ready.clone();
        thread::spawn(move || {
            ready.wait();
            let mut sent = 0;
            loop {
                match a.try_call(b"fill") {
                    Ok(_) => sent += 1,
                    Err(e) => return (e, Instant::now(), sent),
                }
            }
        })
    };
    ready.wait();
    thread::sleep(Duration::from_millis(300));
    assert!(!poller.is_finished() && !caller.is_finished());
    let killed_at = Instant::now();
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let (e, at) = poller.join().unwrap();
    assert_eq!(e, RingCallError::ServerDisconnected);
    let (e2, at2, sent) = caller.join().unwrap();
    assert_eq!(e2, RingCallError::ServerDisconnected);
    assert_eq!(sent, 3, "ring of 4 with one pending call: 3 more fit");
    let (d1, d2) = (
        at.saturating_duration_since(killed_at),
        at2.saturating_duration_since(killed_at),
    );
    eprintln!("disconnect noticed {d1:?} (poll) / {d2:?} (blocked call) after SIGKILL");
    assert!(d1 < Duration::from_secs(5) && d2 < Duration::from_secs(5));
    // The crashed server left its file behind; a new server replaces it.
    assert!(path.exists());
    assert!(matches!(
        RingClient::attach(&name),
        Err(RingError::ServerNotRunning { .. })
    ));
    let server = RingServer::create(&name, &cfg()).unwrap();
    drop(server);
    assert!(!path.exists());
}

#[test]
fn ring_server_clean_exit_cross_process() {
    if let Some((_, name)) = child_role() {
        child_server(&name);
        return;
    }
    let name = unique_name("xproc-exit");
    let mut child = spawn_child("ring_server_clean_exit_cross_process", "server", &name);
    let mut c = attach_retry(&name);
    client_calls(&mut c, 200);
    assert_eq!(call(&mut c, b"EXIT").unwrap(), transform(b"EXIT"));
    assert!(wait_child(&mut child, Duration::from_secs(30)).success());
    assert_eq!(c.try_call(b"late"), Err(RingCallError::ServerDisconnected));
    assert_eq!(c.check_server(), Err(RingCallError::ServerDisconnected));
    assert!(!std::path::Path::new(SHM_DIR).join(&name).exists());
}

#[test]
fn ring_client_process_dies_mid_call() {
    if let Some((_, name)) = child_role() {
        let mut c = RingClient::attach(&name).expect("child attach");
        assert_eq!(c.client_id(), 1);
        let pos = c.__reserve_without_commit().expect("reserve");
        assert_eq!(pos, 1);
        // Die between fetch_add and commit, without unwinding or running destructors.
        // SAFETY: terminates the process immediately.
        unsafe { libc::_exit(0) };
    }
    let name = unique_name("xproc-hole");
    let cfg = RingConfig {
        max_clients: 2,
        ..cfg()
    };
    let mut server = RingServer::create(&name, &cfg).unwrap();
    let mut a = RingClient::attach(&name).unwrap();
    assert_eq!(a.client_id(), 0);
    a.try_call(b"first").unwrap();
    let mut child = spawn_child(
        "ring_client_process_dies_mid_call",
        "reserve-and-die",
        &name,
    );
    assert!(wait_child(&mut child, Duration::from_secs(30)).success());
    assert!(matches!(
        RingClient::attach(&name),
        Err(RingError::NoFreeClientId { .. })
    ));

    // The server serves "first", then stops at the dead client's hole at position 1, skips
    // it after hole_timeout, and serves the call behind it.
    let idx = a.try_call(b"behind the hole").unwrap();
    let start = Instant::now();
    let mut got = Vec::new();
    while got.len() < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            server.stats()
        );
        serve_once(&mut server);
        a.poll(|i, r| got.push((i, r.to_vec()))).unwrap();
        thread::yield_now();
    }
    assert_eq!(got[1], (idx, transform(b"behind the hole")));
    assert_eq!(server.stats().holes_skipped, 1);

    // Its id is reclaimed and reusable.
    while server.stats().clients_reclaimed == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            server.stats()
        );
        serve_once(&mut server);
        thread::yield_now();
    }
    let mut b = RingClient::attach(&name).unwrap();
    assert_eq!((b.client_id(), b.generation()), (1, 1));
    let h = thread::spawn(move || {
        client_calls(&mut b, 1000);
        client_calls(&mut a, 1000);
    });
    while !h.is_finished() {
        assert!(start.elapsed() < Duration::from_secs(60));
        serve_once(&mut server);
        thread::yield_now();
    }
    h.join().unwrap();
    assert_eq!(server.stats().holes_skipped, 1);
}

/// Kills (SIGCONT, then SIGKILL) a child process on drop, so a failing test leaves no stopped
/// process behind.
struct KillOnDrop(Option<Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            // SAFETY: plain kill(2) on our own child's pid.
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGCONT) };
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Sends `sig` to `pid` and waits until /proc shows the process stopped (`T`) or not.
fn signal_and_wait(pid: u32, sig: libc::c_int, stopped: bool) {
    // SAFETY: plain kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, sig) }, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        // The state follows the parenthesized command name.
        let state = stat.rsplit(')').next().unwrap().trim_start().chars().next();
        if (state == Some('T')) == stopped {
            return;
        }
        assert!(Instant::now() < deadline, "pid {pid} state {state:?}");
        thread::sleep(Duration::from_millis(1));
    }
}

/// A server process that is stopped (SIGSTOP), not dead: it still holds its lock, so the
/// liveness check cannot help. A call on the ring it no longer drains returns
/// `RingCallError::Timeout` at its deadline; after SIGCONT the outstanding calls are answered, the
/// abandoned position is skipped, and the ring works again.
#[test]
fn ring_server_sigstop_call_times_out_then_recovers() {
    if let Some((_, name)) = child_role() {
        child_server(&name);
        return;
    }
    let name = unique_name("xproc-stop");
    let child = spawn_child(
        "ring_server_sigstop_call_times_out_then_recovers",
        "server",
        &name,
    );
    let pid = child.id();
    let mut guard = KillOnDrop(Some(child));
    let mut c = attach_retry(&name);
    client_calls(&mut c, 200);

    signal_and_wait(pid, libc::SIGSTOP, true);
    // The ring (depth 4) takes 4 more requests; the 5th finds no room.
    let wait = Duration::from_millis(200);
    let mut sent = Vec::new();
    let (err, took) = loop {
        let t = Instant::now();
        let req = [sent.len() as u8; 5];
        match c.try_call_with_deadline(t + wait, |b| {
            b[..5].copy_from_slice(&req);
            5
        }) {
            Ok(idx) => sent.push((idx, req)),
            Err(e) => break (e, t.elapsed()),
        }
        assert!(sent.len() <= 4, "a stopped server cannot make room");
    };
    assert_eq!(err, RingCallError::Timeout);
    assert_eq!(sent.len(), 4);
    assert!(
        took >= wait && took < wait + Duration::from_secs(2),
        "{took:?}"
    );
    // Polling does not fail (the server is alive, only stopped): the caller's deadline
    // bounds the wait for responses.
    assert_eq!(c.poll(|_, _| panic!("stopped server answered")), Ok(0));
    let t = Instant::now();
    assert_eq!(
        c.try_call_with_deadline(t + wait, |_| 0),
        Err(RingCallError::Timeout)
    );
    let took2 = t.elapsed();
    eprintln!(
        "SIGSTOPped server: reservation with a {wait:?} deadline returned Timeout after {took:?} (first) / {took2:?} (second)"
    );

    signal_and_wait(pid, libc::SIGCONT, false);
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < sent.len() {
        assert!(Instant::now() < deadline, "no responses after SIGCONT");
        c.poll(|i, r| got.push((i, r.to_vec()))).unwrap();
        thread::yield_now();
    }
    got.sort();
    let mut want: Vec<_> = sent.iter().map(|(i, r)| (*i, transform(r))).collect();
    want.sort();
    assert_eq!(got, want);
    let resumed = Instant::now();
    client_calls(&mut c, 200);
    eprintln!("after SIGCONT: 200 calls in {:?}", resumed.elapsed());
    assert_eq!(call(&mut c, b"EXIT").unwrap(), transform(b"EXIT"));
    let mut child = guard.0.take().unwrap();
    assert!(wait_child(&mut child, Duration::from_secs(30)).success());
}
