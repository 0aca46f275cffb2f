//! The device model across processes ([`Fabric::join`]): two processes on one node, each with
//! its own model, RC QPs connected across them. Every opcode that crosses (WRITE, SEND into a
//! posted receive, FETCH_ADD, READ, WRITE_IMM) and a UD SEND_IMM moves bytes into the other
//! process's registered memory and CQ; then one process crashes (`abort`, no cleanup) and the other's next request
//! to it fails with TRANSPORT_RETRY_EXC instead of hanging.
//!
//! Each role runs in a process of its own (this test binary re-executed with
//! `MLX5_NODE_ROLE`): a process joins one node for its lifetime, and the test harness's own
//! process must stay unjoined. The `#[test]` only relays the handshake lines between them.

mod sim_common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use mlx5::cqe::{CqeOpcode, Syndrome};
use mlx5::sim::{Fabric, SimConfig};
use mlx5::verbs::{QpCaps, QpType, RcParams, RcRemote, UdDest};
use mlx5::wqe::{AtomicSeg, Opcode, RaddrSeg, WqeDesc};
use sim_common::*;

const ROLE: &str = "MLX5_NODE_ROLE";
const NODE: &str = "MLX5_NODE_NAME";
const PEER: &str = "MLX5_NODE_PEER";
const UD_QKEY: u32 = 0x1111_2222;

fn line_in() -> String {
    let mut s = String::new();
    std::io::stdin().read_line(&mut s).unwrap();
    s.trim().to_string()
}

fn say(s: &str) {
    println!("{s}");
    std::io::stdout().flush().unwrap();
}

/// A role's watchdog: a hung role fails the test instead of hanging it.
fn watchdog() {
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(60));
        eprintln!("role timed out");
        std::process::exit(3);
    });
}

/// Polls `cq` until a CQE arrives, making progress steps; `None` after `limit`.
fn poll_for(
    f: &Fabric,
    cq: &mut mlx5::cq::CompletionQueue,
    limit: Duration,
) -> Option<mlx5::cqe::Cqe> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if let Some(c) = try_poll(cq) {
            return Some(c);
        }
        f.progress();
        std::thread::yield_now();
    }
    None
}

/// RC remote: QP `qpn` on the port with LID `lid` (InfiniBand addressing, no GID).
fn peer_qp(qpn: u64, lid: u64) -> RcRemote {
    RcRemote {
        qpn: qpn as u32,
        lid: lid as u16,
        gid: [0; 16],
        psn: 0,
    }
}

fn parse(line: &str) -> Vec<u64> {
    line.split_whitespace()
        .skip(1)
        .map(|w| w.parse().unwrap())
        .collect()
}

/// Role A: the responder; after the peer crashed, its WRITE to the peer must fail.
fn role_a() {
    watchdog();
    let f = Fabric::join(&std::env::var(NODE).unwrap(), SimConfig::deterministic()).unwrap();
    assert!(f.node_slot().is_some());
    let n = Node::new(&f);
    let cq = n.cq(64);
    let mut qp = n.qp(QpType::Rc, &cq, &cq, None, QpCaps::default());
    // A second connection, which B breaks with a bad rkey.
    let cq2 = n.cq(16);
    let mut qp2 = n.qp(QpType::Rc, &cq2, &cq2, None, QpCaps::default());
    let buf = n.buf(4096, all_access());
    assert!(
        buf.mem.segment().is_some(),
        "a joined process's DmaBuf is shared"
    );
    // A UD QP that B sends a datagram to.
    let udcq = n.cq(16);
    let mut ud = n.qp(QpType::Ud, &udcq, &udcq, None, QpCaps::default());
    ud.activate_ud(UD_QKEY).unwrap();
    let udbuf = n.buf(4096, all_access());
    post_recv(&mut ud, &[udbuf.sge(0, 4096)]);
    buf.write(3072, b"readable");
    buf.write(2048, &40u64.to_be_bytes());
    let port = n.ctx.port();
    say(&format!(
        "A {} {} {} {} {} {}",
        qp.qpn(),
        port.lid,
        buf.addr(0),
        buf.mr.rkey,
        qp2.qpn(),
        ud.qpn()
    ));
    let b = parse(&line_in());
    let params = RcParams {
        access: all_access(),
        ..RcParams::default()
    };
    qp.connect_rc(&peer_qp(b[0], b[1]), &params).unwrap();
    qp2.connect_rc(&peer_qp(b[4], b[1]), &params).unwrap();
    post_recv(&mut qp, &[buf.sge(1024, 512)]);
    post_recv(&mut qp, &[]);
    say("READY");

    // The SEND and the WRITE_IMM from B land in our memory and our CQ.
    let mut cq = cq;
    let r = poll_for(&f, &mut cq.cq, Duration::from_secs(20)).expect("SEND completion");
    expect_ok(&r, CqeOpcode::RespSend);
    assert_eq!((r.byte_cnt, r.src_qpn), (100, b[0] as u32));
    let r = poll_for(&f, &mut cq.cq, Duration::from_secs(20)).expect("WRITE_IMM completion");
    expect_ok(&r, CqeOpcode::RespWrImm);
    assert_eq!(r.imm, 0xfeed_f00d);
    assert_eq!(buf.read(0, 64), vec![0xab; 64], "RDMA WRITE payload");
    assert_eq!(
        buf.read(1024, 100),
        (0..100u8).collect::<Vec<_>>(),
        "SEND payload"
    );
    assert_eq!(buf.read(2048, 8), 47u64.to_be_bytes(), "FETCH_ADD result");
    let mut udcq = udcq;
    let r = poll_for(&f, &mut udcq.cq, Duration::from_secs(20)).expect("UD receive");
    expect_ok(&r, CqeOpcode::RespSendImm);
    assert_eq!(
        (r.byte_cnt, r.imm, r.src_qpn),
        (40 + 9, 0x0bad_cafe, b[5] as u32)
    );
    assert_eq!(udbuf.read(40, 9), b"datagram!");
    say("CHECKED");

    // B crashes; once the model sees its liveness lock gone (within about a millisecond),
    // a request to it fails (retry exceeded) instead of hanging.
    assert_eq!(line_in(), "probe");
    let dead_raddr = RaddrSeg {
        raddr: b[2],
        rkey: b[3] as u32,
    };
    let t = Instant::now();
    let c = loop {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "B's death never noticed"
        );
        post(
            &mut qp,
            &WqeDesc {
                remote: Some(dead_raddr),
                inline: b"anyone?",
                ..desc(Opcode::RdmaWrite)
            },
        );
        let c = poll_for(&f, &mut cq.cq, Duration::from_secs(20)).expect("a CQE, not a hang");
        if c.status().is_err() {
            break c;
        }
        qp.sq.retire(c.wqe_counter);
        std::thread::sleep(Duration::from_millis(2));
    };
    expect_err(&c, CqeOpcode::ReqErr, Syndrome::TransportRetryExc);
    assert_eq!(f.qp_state(qp.qpn()), Some(mlx5::sim::SimQpState::Error));
    let st = f.stats();
    assert!(st.peer_deaths >= 1, "{st:?}");
    assert!(st.transport_retries >= 1, "{st:?}");
    say(&format!("DEADOK {}", st.peer_deaths));
}

/// Role B: the requester; crashes when told.
fn role_b() {
    watchdog();
    let f = Fabric::join(&std::env::var(NODE).unwrap(), SimConfig::deterministic()).unwrap();
    let a = parse(&std::env::var(PEER).unwrap());
    let n = Node::new(&f);
    let cq = n.cq(64);
    let mut qp = n.qp(QpType::Rc, &cq, &cq, None, QpCaps::default());
    let cq2 = n.cq(16);
    let mut qp2 = n.qp(QpType::Rc, &cq2, &cq2, None, QpCaps::default());
    let udcq = n.cq(16);
    let mut ud = n.qp(QpType::Ud, &udcq, &udcq, None, QpCaps::default());
    ud.activate_ud(UD_QKEY).unwrap();
    let local = n.buf(4096, all_access());
    local.write(0, &[0xab; 64]);
    local.write(512, &(0..100u8).collect::<Vec<_>>());
    let params = RcParams {
        access: all_access(),
        ..RcParams::default()
    };
    qp.connect_rc(&peer_qp(a[0], a[1]), &params).unwrap();
    qp2.connect_rc(&peer_qp(a[4], a[1]), &params).unwrap();
    let port = n.ctx.port();
    assert_ne!(port.lid as u64, a[1], "LIDs are unique on the node");
    say(&format!(
        "B {} {} {} {} {} {}",
        qp.qpn(),
        port.lid,
        local.addr(0),
        local.mr.rkey,
        qp2.qpn(),
        ud.qpn()
    ));
    assert_eq!(line_in(), "go");
    let raddr = |off: u64| RaddrSeg {
        raddr: a[2] + off,
        rkey: a[3] as u32,
    };
    let mut cq = cq;
    let mut done = |what: &str, qp: &mut mlx5::verbs::Qp| {
        let c = poll_for(&f, &mut cq.cq, Duration::from_secs(20)).expect(what);
        expect_ok(&c, CqeOpcode::Req);
        qp.sq.retire(c.wqe_counter);
        c
    };
    let sges = [local.sge(0, 64)];
    post(
        &mut qp,
        &WqeDesc {
            remote: Some(raddr(0)),
            sges: &sges,
            ..desc(Opcode::RdmaWrite)
        },
    );
    done("WRITE", &mut qp);
    let sges = [local.sge(512, 100)];
    post(
        &mut qp,
        &WqeDesc {
            sges: &sges,
            ..desc(Opcode::Send)
        },
    );
    done("SEND", &mut qp);
    let sges = [local.sge(1024, 8)];
    post(
        &mut qp,
        &WqeDesc {
            remote: Some(raddr(2048)),
            atomic: Some(AtomicSeg {
                swap_add: 7,
                compare: 0,
            }),
            sges: &sges,
            ..desc(Opcode::AtomicFa)
        },
    );
    done("FETCH_ADD", &mut qp);
    assert_eq!(
        local.read(1024, 8),
        40u64.to_be_bytes(),
        "FETCH_ADD original"
    );
    let sges = [local.sge(2000, 8)];
    post(
        &mut qp,
        &WqeDesc {
            remote: Some(raddr(3072)),
            sges: &sges,
            ..desc(Opcode::RdmaRead)
        },
    );
    let c = done("READ", &mut qp);
    assert_eq!(c.byte_cnt, 8);
    assert_eq!(local.read(2000, 8), b"readable");
    post(
        &mut qp,
        &WqeDesc {
            imm: 0xfeed_f00d,
            remote: Some(raddr(4000)),
            ..desc(Opcode::RdmaWriteImm)
        },
    );
    done("WRITE_IMM", &mut qp);
    // A datagram to A's UD QP (LID + QPN + Q_Key, no GRH).
    let av = n.ah(&UdDest {
        qpn: a[5] as u32,
        qkey: UD_QKEY,
        lid: a[1] as u16,
        gid: [0; 16],
    });
    post(
        &mut ud,
        &WqeDesc {
            imm: 0x0bad_cafe,
            ud: Some(av),
            inline: b"datagram!",
            ..desc(Opcode::SendImm)
        },
    );
    let mut udcq = udcq;
    let c = poll_for(&f, &mut udcq.cq, Duration::from_secs(20)).expect("UD send completion");
    expect_ok(&c, CqeOpcode::Req);
    assert_eq!(f.stats().ud_no_dest, 0);
    // A wrong rkey is refused by A's MR table, across the process boundary too (on the
    // second connection: the error breaks it).
    let mut cq2 = cq2;
    post(
        &mut qp2,
        &WqeDesc {
            remote: Some(RaddrSeg {
                raddr: a[2],
                rkey: (a[3] as u32) ^ 0x100,
            }),
            inline: b"x",
            ..desc(Opcode::RdmaWrite)
        },
    );
    let c = poll_for(&f, &mut cq2.cq, Duration::from_secs(20)).expect("error CQE");
    expect_err(&c, CqeOpcode::ReqErr, Syndrome::RemoteAccess);
    say("DONE");
    assert_eq!(line_in(), "die");
    // A crash: no destructor runs, the node directory still says "alive".
    std::process::abort();
}

struct Proc {
    child: Child,
    out: BufReader<ChildStdout>,
    inp: ChildStdin,
}

impl Proc {
    fn spawn(role: &str, node: &str, peer: Option<&str>) -> Proc {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", "processes", "--nocapture", "--test-threads=1"])
            .env(ROLE, role)
            .env(NODE, node)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        if let Some(p) = peer {
            cmd.env(PEER, p);
        }
        let mut child = cmd.spawn().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let inp = child.stdin.take().unwrap();
        Proc { child, out, inp }
    }

    /// The next protocol line (the harness's own lines are skipped).
    fn expect(&mut self, tag: &str) -> String {
        loop {
            let mut s = String::new();
            assert!(
                self.out.read_line(&mut s).unwrap() > 0,
                "role exited before {tag}"
            );
            // The harness may print "test processes ... " before our first line.
            if let Some(i) = s.find(tag) {
                return s[i..].trim().to_string();
            }
        }
    }

    fn send(&mut self, s: &str) {
        writeln!(self.inp, "{s}").unwrap();
        self.inp.flush().unwrap();
    }
}

#[test]
fn processes() {
    match std::env::var(ROLE).as_deref() {
        Ok("a") => return role_a(),
        Ok("b") => return role_b(),
        _ => {}
    }
    let node = format!("test-{}", std::process::id());
    let mut a = Proc::spawn("a", &node, None);
    let la = a.expect("A ");
    let mut b = Proc::spawn("b", &node, Some(&la));
    let lb = b.expect("B ");
    a.send(&lb);
    a.expect("READY");
    b.send("go");
    b.expect("DONE");
    a.expect("CHECKED");
    b.send("die");
    let st = b.child.wait().unwrap();
    assert!(!st.success(), "B was to crash");
    a.send("probe");
    let deaths = a.expect("DEADOK");
    eprintln!("sim_node: B's crash noticed by A ({deaths})");
    assert!(a.child.wait().unwrap().success());
    // The directory goes with its last process; B's segment files stay (it crashed) until
    // the next join of this node name wipes them, so remove them here.
    assert!(
        !std::path::Path::new(&format!("/dev/shm/mlx5sim.{node}")).exists(),
        "the last process to leave removes the directory"
    );
    for e in std::fs::read_dir("/dev/shm").unwrap().flatten() {
        if e.file_name()
            .to_string_lossy()
            .starts_with(&format!("mlx5sim.{node}."))
        {
            let _ = std::fs::remove_file(e.path());
        }
    }
}
