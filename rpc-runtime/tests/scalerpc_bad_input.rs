//! ScaleRPC bad input on the device model (issue 6 §5).
//!
//! A *forger* is a raw RC QP driven through the mlx5 driver directly (no ScaleRPC client
//! core; `mlx5::sim::testkit::RawRcPeer`). As a client it connects to a [`ScaleServer`] through `accept` with a
//! [`ClientConnInfo`] it builds itself (its response region is the middle third of a larger
//! registered buffer, so the bytes just below and above the region are valid RDMA targets
//! the server must never write), and RDMA WRITEs whatever it likes into its pool slots.
//! As a server it answers a [`ScaleClient`]'s `connect` with a [`ServerConnInfo`] it builds
//! and writes notices and responses into the client's memory.
//!
//! Every malformed request must be counted in the server's stats, never reach `recv()`, and
//! write nothing outside the region the forger registered; an honest client on the same
//! server keeps working throughout.
//!
//! `arbitrary_slot_bytes_are_served_or_counted` does the same with whole pool slots of
//! arbitrary bytes (issue 14 §4): 64 cases by default, `PROPTEST_CASES=<n>` for more.

use std::time::Duration;

use mlx5::sim::testkit::{RawRcPeer, RegBuf};
use mlx5::sim::{Fabric, SimConfig};
use mlx5::verbs::{Access, RcParams, RcRemote};
use rpc_runtime::scalerpc::protocol::{
    REQUEST_HEADER_SIZE, REQUEST_MAGIC, RESPONSE_HEADER_SIZE, RESPONSE_MAGIC, RequestHeader,
    ResponseHeader, STATUS_OK, STATUS_REJECTED, request_bytes, response_bytes, trailer,
    trailer_offset,
};
use rpc_runtime::scalerpc::{
    ACK_HELLO, CallFailure, ClientConfig, ClientConnInfo, GroupSize, IMM_ACK, IMM_NOTICE,
    ResponseMode, ScaleClient, ScaleError, ScaleServer, ServerConfig, ServerConnInfo,
};

const SLOT: usize = 256;
const K: u32 = 4;
/// The forger's response region: one slot per pool slot of its connection.
const REGION: usize = SLOT * K as usize;
/// Pattern the bytes around the forger's region hold; they must never change.
const GUARD: u8 = 0xa5;

fn rc() -> RcParams {
    RcParams {
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 16,
        access: Access::REMOTE_WRITE | Access::REMOTE_READ,
        ..RcParams::default()
    }
}

/// A raw RC peer (module docs), on [`RawRcPeer`]. Field order is drop order: the buffers
/// are deregistered before the peer's protection domain goes.
struct Forger {
    /// `[guard | response region | guard]`, REMOTE_WRITE: the middle third is advertised.
    big: RegBuf,
    /// Another registered buffer (REMOTE_WRITE) full of guard bytes, for wrong-rkey cases.
    other: RegBuf,
    /// Control word (notices from a server) / ack word (acks from a client), REMOTE_WRITE.
    word: RegBuf,
    /// A fake server's pool (the client's requests land here).
    pool: RegBuf,
    raw: RawRcPeer,
    /// When the forger is a client: the server's answer.
    server: Option<ServerConnInfo>,
    /// When the forger is a server: the client's information.
    client: Option<ClientConnInfo>,
}

impl Forger {
    fn new(fabric: &Fabric) -> Forger {
        let raw = RawRcPeer::new(fabric, 4 * SLOT);
        let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let mut big = raw.reg(3 * REGION, rw);
        big.write(0, &vec![GUARD; 3 * REGION]);
        let mut other = raw.reg(REGION, rw);
        other.write(0, &vec![GUARD; REGION]);
        let word = raw.reg(64, rw);
        let pool = raw.reg(REGION, rw | Access::REMOTE_READ);
        Forger {
            big,
            other,
            word,
            pool,
            raw,
            server: None,
            client: None,
        }
    }

    fn region(&self) -> u64 {
        self.big.addr(REGION)
    }

    /// What the server's `accept` gets: the middle third of `big` as the response region.
    fn client_info(&self) -> ClientConnInfo {
        let port = self.raw.port();
        ClientConnInfo {
            qpn: self.raw.qpn(),
            lid: port.lid,
            gid: port.gid,
            resp_addr: self.region(),
            resp_len: REGION as u64,
            resp_rkey: self.big.mr.rkey,
            ctrl_addr: self.word.addr(0),
            ctrl_rkey: self.word.mr.rkey,
            fingerprint: 0,
        }
    }

    fn connect_to(&mut self, qpn: u32, lid: u16, gid: [u8; 16]) {
        self.raw.connect(
            &RcRemote {
                qpn,
                lid,
                gid,
                psn: 0,
            },
            &rc(),
        );
    }

    /// Connects as a client of `server` and says hello.
    fn join(server: &mut ScaleServer, fabric: &Fabric) -> Forger {
        let mut f = Forger::new(fabric);
        let s = server.accept(&f.client_info()).unwrap();
        assert!(s.active, "one group: the forger starts active");
        f.connect_to(s.qpn, s.lid, s.gid);
        f.server = Some(s);
        f.send_imm(
            s.ack_addr,
            s.ack_rkey,
            &(ACK_HELLO as u64).to_le_bytes(),
            IMM_ACK,
        );
        f
    }

    /// Posts one signaled WRITE (or WRITE+IMM with `imm`) of `bytes` to `raddr`/`rkey`,
    /// rings, and waits for its completion (the model executes it inside the doorbell).
    fn write(&mut self, raddr: u64, rkey: u32, bytes: &[u8], imm: Option<u32>) {
        self.raw.write(raddr, rkey, bytes, imm);
    }

    fn send_imm(&mut self, raddr: u64, rkey: u32, bytes: &[u8], imm: u32) {
        self.write(raddr, rkey, bytes, Some(imm));
    }

    /// Handles completions (WRITE+IMMs received are recorded, [`RawRcPeer::received`]).
    fn poll(&mut self) {
        self.raw.poll();
    }

    /// Writes `bytes` at the start of the forger's pool slot `j` (client side).
    fn write_slot(&mut self, j: u32, bytes: &[u8]) {
        let s = self.server.unwrap();
        let raddr = s.pool_addr + (s.base + j) as u64 * s.slot_size as u64;
        self.write(raddr, s.pool_rkey, bytes, None);
    }

    /// The forger's response slot `j`.
    fn resp_slot(&self, j: u32) -> u64 {
        self.region() + (j as usize * SLOT) as u64
    }

    /// Every byte of `big` outside the region and all of `other` still hold the guard.
    fn assert_guards_intact(&self) {
        let lo = self.big.read(0, REGION);
        let hi = self.big.read(2 * REGION, REGION);
        let other = self.other.read(0, REGION);
        for (name, b) in [("below", lo), ("above", hi), ("other buffer", other)] {
            if let Some(i) = b.iter().position(|&x| x != GUARD) {
                panic!("the server wrote {name} the forger's region (byte {i})");
            }
        }
    }
}

/// A request: header (whatever it claims), `payload`, trailer after `payload`.
fn request(h: &RequestHeader, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut b = vec![0u8; request_bytes(len)];
    h.write(&mut b[..REQUEST_HEADER_SIZE]);
    b[REQUEST_HEADER_SIZE..REQUEST_HEADER_SIZE + len].copy_from_slice(payload);
    let t = trailer_offset(REQUEST_HEADER_SIZE, len);
    b[t..t + 8].copy_from_slice(&trailer(h.magic, h.req_id).to_le_bytes());
    b
}

fn header(req_id: u64, len: u16, addr: u64, rkey: u32) -> RequestHeader {
    RequestHeader {
        magic: REQUEST_MAGIC,
        req_id,
        rpc_type: 3,
        payload_len: len.into(),
        client_slot_addr: addr,
        client_slot_rkey: rkey,
    }
}

fn server_cfg() -> ServerConfig {
    ServerConfig {
        max_conns: 8,
        group_size: GroupSize::Off,
        slots_per_conn: K,
        slot_size: Some(SLOT as u32),
        ..ServerConfig::default()
    }
}

fn client_cfg() -> ClientConfig {
    ClientConfig {
        max_conns: 8,
        slots_per_conn: K,
        slot_size: Some(SLOT as u32),
        ..ClientConfig::default()
    }
}

/// A server with an honest client (connection 0) and a forger (connection 1).
struct Rig {
    server: ScaleServer,
    honest: ScaleClient<u64>,
    forger: Forger,
    _fabric: Fabric,
}

impl Rig {
    fn new(mode: ResponseMode) -> Rig {
        let fabric = Fabric::new(SimConfig::default());
        let mut server = ScaleServer::new(
            &fabric.open(),
            ServerConfig {
                response_mode: mode,
                ..server_cfg()
            },
        )
        .unwrap();
        let mut honest = ScaleClient::<u64>::new(&fabric.open(), client_cfg()).unwrap();
        let (c, info) = honest.create_conn().unwrap();
        let s = server.accept(&info).unwrap();
        honest.connect(c, &s).unwrap();
        let forger = Forger::join(&mut server, &fabric);
        server.poll(); // the hellos
        Rig {
            server,
            honest,
            forger,
            _fabric: fabric,
        }
    }

    /// An echo round trip on the honest client (its own check of the server's health).
    fn honest_round_trip(&mut self, tag: u64) {
        let payload = tag.to_le_bytes();
        self.honest
            .call(0, 1, 8, tag, |b| {
                b[..8].copy_from_slice(&payload);
                8
            })
            .unwrap();
        self.honest.flush();
        let mut got = None;
        for _ in 0..100 {
            self.server.poll();
            while let Some((tok, req)) = self.server.recv() {
                assert_eq!(tok.conn(), 0, "only the honest client's request is served");
                let r = req.to_vec();
                self.server
                    .reply(tok, r.len(), |b| {
                        b[..r.len()].copy_from_slice(&r);
                        r.len()
                    })
                    .unwrap();
            }
            self.server.flush();
            self.honest
                .poll(|t, r| got = Some((t, r.unwrap().to_vec())));
            if got.is_some() {
                break;
            }
        }
        assert_eq!(got, Some((tag, payload.to_vec())), "honest round trip");
    }

    /// Polls the server a few times and checks that no request is ready.
    fn poll_expect_nothing(&mut self) {
        for _ in 0..3 {
            self.server.poll();
            assert!(self.server.recv().is_none(), "bad input reached recv()");
        }
    }
}

#[test]
fn wrong_magic_is_counted_once_and_never_served() {
    let mut r = Rig::new(ResponseMode::Write);
    r.honest_round_trip(1);
    let (rkey, addr) = (r.forger.big.mr.rkey, r.forger.resp_slot(0));
    let mut h = header(1, 8, addr, rkey);
    h.magic = 0x1234_5678;
    r.forger.write_slot(0, &request(&h, &[7; 8]));
    r.poll_expect_nothing();
    assert_eq!(
        r.server.stats().bad_magic,
        1,
        "counted once: the slot was cleared"
    );
    // A response magic in a pool slot is what the server leaves after answering: ignored.
    h.magic = RESPONSE_MAGIC;
    r.forger.write_slot(1, &request(&h, &[7; 8]));
    r.poll_expect_nothing();
    assert_eq!(r.server.stats().bad_magic, 1);
    assert_eq!(r.server.stats().requests, 1);
    r.forger.assert_guards_intact();
    r.honest_round_trip(2);
}

#[test]
fn oversized_payload_len_is_rejected_with_a_status_when_the_address_validates() {
    let mut r = Rig::new(ResponseMode::Write);
    let (rkey, addr) = (r.forger.big.mr.rkey, r.forger.resp_slot(2));
    // payload_len 1000 in a 256 B slot, valid response address: STATUS_REJECTED comes back.
    r.forger
        .write_slot(2, &request(&header(41, 1000, addr, rkey), &[1; 16])[..48]);
    r.poll_expect_nothing();
    assert_eq!(r.server.stats().bad_length, 1);
    let b = r.forger.big.read(REGION + 2 * SLOT, SLOT);
    let h = ResponseHeader::read(b.first_chunk().unwrap());
    assert_eq!(
        h,
        ResponseHeader {
            magic: RESPONSE_MAGIC,
            req_id: 41,
            status: STATUS_REJECTED,
            payload_len: 0
        },
        "the rejection arrived (its doorbell was rung)"
    );
    let t = trailer_offset(RESPONSE_HEADER_SIZE, 0);
    assert_eq!(
        u64::from_le_bytes(b[t..t + 8].try_into().unwrap()),
        trailer(RESPONSE_MAGIC, 41)
    );
    // The same with an address outside the region: counted, nothing written anywhere.
    let below = r.forger.big.addr(REGION - SLOT);
    r.forger.write_slot(
        3,
        &request(&header(42, 0xffff, below, rkey), &[1; 16])[..48],
    );
    r.poll_expect_nothing();
    assert_eq!(r.server.stats().bad_length, 2);
    assert_eq!(r.server.stats().bad_response_addr, 0);
    r.forger.assert_guards_intact();
    assert_eq!(r.server.stats().requests, 0);
    r.honest_round_trip(3);
    // The connection still works for a well-formed request (the forging itself is sound).
    r.forger
        .write_slot(2, &request(&header(43, 4, addr, rkey), b"abcd"));
    r.server.poll();
    let (tok, req) = r
        .server
        .recv()
        .expect("a well-formed forged request is served");
    assert_eq!((tok.conn(), req), (1, &b"abcd"[..]));
    r.server
        .reply(tok, 4, |b| {
            b[..4].copy_from_slice(b"dcba");
            4
        })
        .unwrap();
    r.server.flush();
    let b = r.forger.big.read(REGION + 2 * SLOT, SLOT);
    let h = ResponseHeader::read(b.first_chunk().unwrap());
    assert_eq!((h.req_id, h.status, h.payload_len), (43, STATUS_OK, 4));
    assert_eq!(&b[RESPONSE_HEADER_SIZE..RESPONSE_HEADER_SIZE + 4], b"dcba");
}

#[test]
fn response_addresses_outside_the_region_write_nothing() {
    let mut r = Rig::new(ResponseMode::Write);
    let f = &r.forger;
    let (rkey, orkey) = (f.big.mr.rkey, f.other.mr.rkey);
    let region = f.region();
    let end = region + REGION as u64;
    let cases: [(&str, u64, u32); 7] = [
        ("just below", region - 8, rkey),
        ("a slot below", region - SLOT as u64, rkey),
        ("at the end", end, rkey),
        ("above", f.big.addr(2 * REGION + 64), rkey),
        ("straddling the end", end - 16, rkey),
        ("wrong rkey, other buffer", f.other.addr(0), orkey),
        ("wrong rkey, inside the region", region, orkey),
    ];
    for (i, (what, addr, key)) in cases.into_iter().enumerate() {
        let j = i as u32 % K;
        r.forger
            .write_slot(j, &request(&header(100 + i as u64, 8, addr, key), &[9; 8]));
        r.poll_expect_nothing();
        assert_eq!(
            r.server.stats().bad_response_addr,
            i as u64 + 1,
            "{what}: counted"
        );
        r.forger.assert_guards_intact();
        // The region itself got nothing either.
        assert_ne!(
            ResponseHeader::read(
                r.forger
                    .big
                    .read(REGION + j as usize * SLOT, 20)
                    .first_chunk()
                    .unwrap()
            )
            .magic,
            RESPONSE_MAGIC,
            "{what}"
        );
        r.honest_round_trip(i as u64);
    }
    let st = r.server.stats();
    assert_eq!((st.requests, st.responses), (7, 7), "only the honest calls");
    assert_eq!(st.bad_magic + st.bad_length, 0);
}

#[test]
fn stale_and_double_replies_are_refused() {
    let mut r = Rig::new(ResponseMode::Write);
    r.honest
        .call(0, 1, 1, 5, |b| {
            b[0] = 5;
            1
        })
        .unwrap();
    r.honest.flush();
    r.server.poll();
    let (t1, _) = r.server.recv().unwrap();
    r.server.reply(t1, 0, |_| 0).unwrap();
    assert!(matches!(
        r.server.reply(t1, 0, |_| 0),
        Err(ScaleError::StaleToken)
    ));
    r.server.flush();
    let mut got = Vec::new();
    r.honest.poll(|t, res| got.push((t, res.unwrap().len())));
    assert_eq!(got, vec![(5, 0)]);
    // The next call reuses the same slot: the old token must not answer it.
    r.honest
        .call(0, 1, 1, 6, |b| {
            b[0] = 6;
            1
        })
        .unwrap();
    r.honest.flush();
    r.server.poll();
    let (t2, req) = r.server.recv().unwrap();
    assert_eq!(req, &[6]);
    assert!(matches!(
        r.server.reply(t1, 0, |_| 0),
        Err(ScaleError::StaleToken)
    ));
    r.server
        .reply(t2, 1, |b| {
            b[0] = 66;
            1
        })
        .unwrap();
    r.server.flush();
    r.honest
        .poll(|t, res| got.push((t, res.unwrap()[0] as usize)));
    assert_eq!(got, vec![(5, 0), (6, 66)]);
    assert_eq!(r.server.stats().stale_replies, 2);
}

/// A token answered on connection 0 must not answer connection 2's request that later
/// occupies the same pool slot with the same request id (after the bank changed hands).
#[test]
fn stale_token_does_not_answer_another_connections_request_in_the_same_slot() {
    let fabric = Fabric::new(SimConfig::default());
    let mut server = ScaleServer::new(
        &fabric.open(),
        ServerConfig {
            max_conns: 3,
            group_size: GroupSize::Fixed(1),
            slots_per_conn: 1,
            slot_size: Some(SLOT as u32),
            slice: Duration::from_micros(300),
            warmup: Duration::from_micros(100),
            ..ServerConfig::default()
        },
    )
    .unwrap();
    let mut client = ScaleClient::<u64>::new(&fabric.open(), client_cfg()).unwrap();
    for _ in 0..3 {
        let (c, info) = client.create_conn().unwrap();
        let s = server.accept(&info).unwrap();
        client.connect(c, &s).unwrap();
    }
    assert!(client.is_active(0));
    client.call(0, 1, 0, 0, |_| 0).unwrap();
    client.flush();
    server.poll();
    let (t0, _) = server.recv().unwrap();
    assert_eq!(t0.conn(), 0);
    server.reply(t0, 0, |_| 0).unwrap();
    server.flush();
    let mut got = Vec::new();
    // Rotate until connection 2 (group 2, bank 0 again: the same pool slot) is active.
    let mut spins = 0u64;
    while !client.is_active(2) {
        server.poll();
        client.poll(|t, r| got.push((t, r.map(<[u8]>::to_vec))));
        spins += 1;
        assert!(spins < 10_000_000, "connection 2 never activated");
    }
    assert_eq!(got, vec![(0, Ok(vec![]))]);
    client.call(2, 1, 0, 2, |_| 0).unwrap();
    client.flush();
    let t2 = loop {
        server.poll();
        if let Some((t, _)) = server.recv() {
            break t;
        }
    };
    assert_eq!(t2.conn(), 2);
    assert!(
        matches!(server.reply(t0, 0, |_| 0), Err(ScaleError::StaleToken)),
        "connection 0's old token answered connection 2's request"
    );
    server
        .reply(t2, 2, |b| {
            b[..2].copy_from_slice(b"ok");
            2
        })
        .unwrap();
    server.flush();
    let mut spins = 0u64;
    while got.len() < 2 {
        server.poll();
        client.poll(|t, r| got.push((t, r.map(<[u8]>::to_vec))));
        spins += 1;
        assert!(spins < 10_000_000, "connection 2's response never arrived");
    }
    assert_eq!(got[1], (2, Ok(b"ok".to_vec())));
}

#[test]
fn replies_are_truncated_to_max_response_and_oversized_ones_refused() {
    let mut r = Rig::new(ResponseMode::Write);
    let max = r.server.max_response();
    assert_eq!(max, SLOT - RESPONSE_HEADER_SIZE - 8 - 4);
    assert!(response_bytes(max) <= SLOT);
    // Asking for more than fits: the encoder sees max_response() bytes, and that is sent.
    r.honest.call(0, 1, 0, 1, |_| 0).unwrap();
    r.honest.flush();
    r.server.poll();
    let (tok, _) = r.server.recv().unwrap();
    r.server
        .reply(tok, 1 << 20, |b| {
            assert_eq!(b.len(), max);
            for (i, x) in b.iter_mut().enumerate() {
                *x = i as u8;
            }
            b.len()
        })
        .unwrap();
    // An encoder claiming more than its buffer is clamped to max_len.
    r.honest.call(0, 1, 0, 2, |_| 0).unwrap();
    r.honest.flush();
    r.server.poll();
    let (tok, _) = r.server.recv().unwrap();
    r.server
        .reply(tok, 8, |b| {
            assert_eq!(b.len(), 8);
            b.fill(0xee);
            1000
        })
        .unwrap();
    r.server.flush();
    let mut got = Vec::new();
    r.honest.poll(|t, res| got.push((t, res.unwrap().to_vec())));
    got.sort();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].1, (0..max).map(|i| i as u8).collect::<Vec<_>>());
    assert_eq!(got[1].1, vec![0xee; 8]);
    // A response address valid for a header-only response but too close to the region's end
    // for a longer one: the long reply is refused (TooLarge), nothing written.
    let (rkey, addr) = (
        r.forger.big.mr.rkey,
        r.forger.region() + (REGION - response_bytes(0)) as u64,
    );
    r.forger
        .write_slot(0, &request(&header(7, 0, addr, rkey), &[]));
    r.server.poll();
    let (tok, _) = r.server.recv().expect("the address validates for a header");
    assert!(matches!(
        r.server.reply(tok, 64, |b| {
            b.fill(1);
            64
        }),
        Err(ScaleError::TooLarge)
    ));
    assert_eq!(r.server.stats().oversized_replies, 1);
    r.server.flush();
    r.forger.assert_guards_intact();
    // A header-only response at the same place fits exactly.
    r.forger
        .write_slot(0, &request(&header(8, 0, addr, rkey), &[]));
    r.server.poll();
    let (tok, _) = r.server.recv().unwrap();
    r.server.reply(tok, 0, |_| 0).unwrap();
    r.server.flush();
    let h = ResponseHeader::read(
        r.forger
            .big
            .read(2 * REGION - response_bytes(0), 20)
            .first_chunk()
            .unwrap(),
    );
    assert_eq!((h.magic, h.req_id, h.payload_len), (RESPONSE_MAGIC, 8, 0));
    r.forger.assert_guards_intact();
    r.honest_round_trip(9);
}

#[test]
fn malformed_control_messages_are_counted() {
    let mut r = Rig::new(ResponseMode::Write);
    let s = r.forger.server.unwrap();
    let before = r.server.stats().bad_control;
    // Wrong immediate.
    r.forger
        .send_imm(s.ack_addr, s.ack_rkey, &[0; 8], 0x0bad_0bad);
    r.server.poll();
    assert_eq!(r.server.stats().bad_control, before + 1);
    // An acknowledgement nobody asked for (not stopping, wrong epoch).
    r.forger
        .send_imm(s.ack_addr, s.ack_rkey, &77u64.to_le_bytes(), IMM_ACK);
    r.server.poll();
    assert_eq!(r.server.stats().bad_control, before + 2);
    assert_eq!(r.server.scheduler().stats().bad_acks, 1);
    assert!(
        !r.server.conn_failed(1),
        "bad control input does not fail the connection"
    );
    r.honest_round_trip(1);
}

/// The forger plays the server toward a real client: malformed notices and responses.
#[test]
fn client_ignores_malformed_notices_and_responses() {
    let fabric = Fabric::new(SimConfig::default());
    let mut client = ScaleClient::<u64>::new(&fabric.open(), client_cfg()).unwrap();
    let mut f = Forger::new(&fabric);
    let (c, info) = client.create_conn().unwrap();
    f.connect_to(info.qpn, info.lid, info.gid);
    f.client = Some(info);
    let port = f.raw.port();
    let s = ServerConnInfo {
        qpn: f.raw.qpn(),
        lid: port.lid,
        gid: port.gid,
        conn_id: 0,
        pool_addr: f.pool.addr(0),
        pool_rkey: f.pool.mr.rkey,
        slot_size: SLOT as u32,
        slots_per_conn: K,
        ack_addr: f.word.addr(0),
        ack_rkey: f.word.mr.rkey,
        active: true,
        base: 0,
        epoch: 0,
        response_mode: ResponseMode::Write,
        fingerprint: 0,
    };
    client.connect(c, &s).unwrap();
    f.poll();
    assert_eq!(f.raw.received(), [IMM_ACK], "the client's hello");
    let mut got = Vec::new();
    // A notice with a wrong immediate.
    f.send_imm(info.ctrl_addr, info.ctrl_rkey, &[0; 8], 0x0bad);
    client.poll(|t, r| got.push((t, r.map(<[u8]>::to_vec))));
    assert_eq!(client.stats().bad_input, 1);
    // An activation whose base overflows.
    let word = 1u64 | ((u32::MAX as u64 - 2) << 32);
    f.send_imm(
        info.ctrl_addr,
        info.ctrl_rkey,
        &word.to_le_bytes(),
        IMM_NOTICE,
    );
    client.poll(|t, r| got.push((t, r.map(<[u8]>::to_vec))));
    assert_eq!(client.stats().bad_input, 2);
    assert!(client.is_active(c), "still active on its old mapping");
    // A call: the request lands in the forger's pool slot 0.
    client
        .call(c, 9, 4, 77, |b| {
            b[..4].copy_from_slice(b"req!");
            4
        })
        .unwrap();
    client.flush();
    let h = RequestHeader::read(f.pool.read(0, REQUEST_HEADER_SIZE).first_chunk().unwrap());
    assert_eq!((h.magic, h.rpc_type, h.payload_len), (REQUEST_MAGIC, 9, 4));
    let respond = |f: &mut Forger, req_id: u64, status: u32, len: u32, trailer_ok: bool| {
        let mut b = vec![0u8; response_bytes(4)];
        ResponseHeader {
            magic: RESPONSE_MAGIC,
            req_id,
            status,
            payload_len: len,
        }
        .write(&mut b);
        b[RESPONSE_HEADER_SIZE..RESPONSE_HEADER_SIZE + 4].copy_from_slice(b"resp");
        let t = trailer_offset(RESPONSE_HEADER_SIZE, 4);
        let tr = if trailer_ok {
            trailer(RESPONSE_MAGIC, req_id)
        } else {
            0
        };
        b[t..t + 8].copy_from_slice(&tr.to_le_bytes());
        f.write(h.client_slot_addr, h.client_slot_rkey, &b, None);
    };
    // Wrong request id, an impossible length, a missing trailer: none is delivered.
    respond(&mut f, h.req_id + 1, STATUS_OK, 4, true);
    client.poll(|t, r| got.push((t, r.map(<[u8]>::to_vec))));
    respond(&mut f, h.req_id, STATUS_OK, 1 << 30, true);
    client.poll(|t, r| got.push((t, r.map(<[u8]>::to_vec))));
    respond(&mut f, h.req_id, STATUS_OK, 4, false);
    client.poll(|t, r| got.push((t, r.map(<[u8]>::to_vec))));
    assert!(got.is_empty(), "{got:?}");
    assert_eq!(client.outstanding(c), 1);
    // A rejection status is a failed call; then a good response on the next call.
    respond(&mut f, h.req_id, STATUS_REJECTED, 0, true);
    client.poll(|t, r| got.push((t, r.map(<[u8]>::to_vec))));
    assert_eq!(got, vec![(77, Err(CallFailure::Rejected(STATUS_REJECTED)))]);
    got.clear();
    client.call(c, 9, 0, 78, |_| 0).unwrap();
    client.flush();
    let h = RequestHeader::read(f.pool.read(0, REQUEST_HEADER_SIZE).first_chunk().unwrap());
    respond(&mut f, h.req_id, STATUS_OK, 4, true);
    client.poll(|t, r| got.push((t, r.map(<[u8]>::to_vec))));
    assert_eq!(got, vec![(78, Ok(b"resp".to_vec()))]);
}

/// One forged pool slot: a header whose every field is arbitrary (magic mostly one of the
/// meaningful values, response address mostly inside or next to the forger's region), the
/// rest of the slot arbitrary, and the trailer the header calls for written or not.
#[derive(Clone, Debug)]
struct Forged {
    slot: u32,
    magic: u32,
    req_id: u64,
    rpc_type: u16,
    /// Low half at the seed's `payload_len`, high half in `payload_len_hi` (the padding).
    payload_len: u32,
    /// Offset of the response address from the region start (may be outside it).
    addr_off: i64,
    right_rkey: bool,
    trailer: bool,
    fill: Vec<u8>,
}

fn forged() -> impl proptest::strategy::Strategy<Value = Forged> {
    use proptest::prelude::*;
    (
        (
            0..K,
            prop_oneof![
                4 => Just(REQUEST_MAGIC),
                1 => Just(RESPONSE_MAGIC),
                1 => Just(0u32),
                1 => any::<u32>(),
            ],
            any::<u64>(),
            any::<u16>(),
            // Mostly a length that fits; also any 16-bit one, and ones with the high half
            // (the padding the seed leaves zero) set.
            prop_oneof![
                4 => 0u32..(SLOT as u32),
                1 => any::<u16>().prop_map(u32::from),
                1 => any::<u32>(),
            ],
        ),
        (
            prop_oneof![
                4 => 0i64..REGION as i64,
                1 => -(SLOT as i64)..(REGION + SLOT) as i64,
                1 => any::<i64>(),
            ],
            prop_oneof![4 => Just(true), 1 => Just(false)],
            prop_oneof![4 => Just(true), 1 => Just(false)],
            proptest::collection::vec(any::<u8>(), SLOT..=SLOT),
        ),
    )
        .prop_map(
            |(
                (slot, magic, req_id, rpc_type, payload_len),
                (addr_off, right_rkey, trailer, fill),
            )| Forged {
                slot,
                magic,
                req_id,
                rpc_type,
                payload_len,
                addr_off,
                right_rkey,
                trailer,
                fill,
            },
        )
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config {
        // Each case builds a fabric, a server and two clients: 64 by default, more with
        // PROPTEST_CASES (this override applies only when the variable is unset).
        cases: if std::env::var_os("PROPTEST_CASES").is_none() {
            64
        } else {
            proptest::test_runner::Config::default().cases
        },
        ..proptest::test_runner::Config::default()
    })]

    /// Arbitrary pool-slot contents (issue 14 §4), a whole slot each: a slot is served by
    /// `recv()` exactly when it is a complete request (request magic, a length that fits the
    /// slot, the trailer) with a response address inside the forger's region and its rkey,
    /// with the forged payload; otherwise it is counted in exactly the matching counter
    /// (`bad_magic`, `bad_length`, `bad_response_addr`), or, for a zero or response magic or
    /// a missing trailer, ignored as not (yet) a request. Nothing is ever written outside the
    /// forger's region, and the honest client keeps being served.
    #[test]
    fn arbitrary_slot_bytes_are_served_or_counted(slots in proptest::collection::vec(forged(), 1..6)) {
        use proptest::prelude::*;
        let mut r = Rig::new(ResponseMode::Write);
        let (rkey, region) = (r.forger.big.mr.rkey, r.forger.region());
        for f in &slots {
            let addr = region.wrapping_add_signed(f.addr_off);
            let h = RequestHeader {
                magic: f.magic,
                req_id: f.req_id,
                rpc_type: f.rpc_type,
                payload_len: f.payload_len,
                client_slot_addr: addr,
                client_slot_rkey: if f.right_rkey { rkey } else { rkey ^ 0x100 },
            };
            let mut b = f.fill.clone();
            h.write(&mut b[..REQUEST_HEADER_SIZE]);
            let len = f.payload_len as usize;
            let t = trailer_offset(REQUEST_HEADER_SIZE, len);
            if f.trailer && t + 8 <= SLOT {
                b[t..t + 8].copy_from_slice(&trailer(f.magic, f.req_id).to_le_bytes());
            }
            let before = *r.server.stats();
            r.forger.write_slot(f.slot, &b);
            // The oracle.
            let fits = request_bytes(len) <= SLOT;
            let complete = fits
                && u64::from_le_bytes(b[t..t + 8].try_into().unwrap())
                    == trailer(REQUEST_MAGIC, f.req_id);
            let addr_ok = f.right_rkey
                && addr >= region
                && addr.saturating_add(response_bytes(0) as u64) <= region + REGION as u64;
            let served = f.magic == REQUEST_MAGIC && complete && addr_ok;
            let mut got = Vec::new();
            for _ in 0..3 {
                r.server.poll();
                while let Some((tok, req)) = r.server.recv() {
                    got.push((tok.conn(), req.to_vec()));
                    r.server.reply(tok, 2, |o| { o[..2].copy_from_slice(b"ok"); 2 }).unwrap();
                }
                r.server.flush();
            }
            let after = *r.server.stats();
            let d = |a: u64, b: u64| a - b;
            let counted = (
                d(after.bad_magic, before.bad_magic),
                d(after.bad_length, before.bad_length),
                d(after.bad_response_addr, before.bad_response_addr),
            );
            if served {
                prop_assert_eq!(got, vec![(1, b[REQUEST_HEADER_SIZE..REQUEST_HEADER_SIZE + len].to_vec())]);
                prop_assert_eq!(counted, (0, 0, 0));
            } else {
                prop_assert!(got.is_empty(), "served {:?}", got);
                let want = match f.magic {
                    0 | RESPONSE_MAGIC => (0, 0, 0),
                    REQUEST_MAGIC if !fits => (0, 1, 0),
                    REQUEST_MAGIC if !complete => (0, 0, 0),
                    REQUEST_MAGIC => (0, 0, 1),
                    _ => (1, 0, 0),
                };
                prop_assert_eq!(counted, want, "{:?}", f);
            }
            r.forger.assert_guards_intact();
            // Clear the slot so that a leftover (incomplete) request does not meet the next
            // forged bytes' trailer.
            r.forger.write_slot(f.slot, &[0u8; SLOT]);
        }
        r.honest_round_trip(7);
    }
}
