//! Raw RDMA READ/WRITE on copyrpc endpoints (seeds/004 §3.9): data moves between registered
//! buffers of two contexts, completions are counted (`raw_rdma_pending`), RPCs keep working
//! alongside, and a raw operation with a bad rkey fails only its endpoint.

mod copyrpc_common;

use copyrpc_common::connect;
use mlx5::mem::DmaBuf;
use mlx5::sim::{Fabric, SimConfig};
use mlx5::verbs::{Access, Mr};
use mlx5::wqe::{RaddrSeg, Sge};
use rpc_runtime::copyrpc::{Context, ContextConfig, EndpointConfig, EndpointState};

/// A registered buffer (`mr` first: deregistered before the memory is unmapped).
struct Buf {
    mr: Mr,
    mem: DmaBuf,
}

impl Buf {
    fn new<U>(ctx: &Context<U>, len: usize, access: Access) -> Buf {
        let mem = DmaBuf::with_normal_pages(len).unwrap();
        // SAFETY: `mem` outlives `mr` (field order).
        let mr = unsafe { ctx.reg_mr(mem.as_mut_ptr(), len, access) }.unwrap();
        Buf { mr, mem }
    }
    fn bytes(&self, len: usize) -> Vec<u8> {
        // SAFETY: inside the mapping; read after the completion that published the bytes.
        unsafe { std::slice::from_raw_parts(self.mem.as_ptr(), len) }.to_vec()
    }
    fn write(&self, data: &[u8]) {
        // SAFETY: inside the mapping; no device access in flight on it.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.mem.as_mut_ptr(), data.len()) }
    }
    fn sge(&self, len: u32) -> Sge {
        Sge {
            addr: self.mr.addr,
            len,
            lkey: self.mr.lkey,
        }
    }
    fn raddr(&self) -> RaddrSeg {
        RaddrSeg {
            raddr: self.mr.addr,
            rkey: self.mr.rkey,
        }
    }
}

fn wait_raw(a: &mut Context<u64>, b: &mut Context<()>) {
    for _ in 0..10_000 {
        a.poll(|_, _| {});
        b.poll(|_, _| {});
        if a.raw_rdma_pending() == 0 {
            return;
        }
    }
    panic!("raw RDMA operation never completed");
}

#[test]
fn raw_write_and_read_move_data_beside_rpcs() {
    let fabric = Fabric::new(SimConfig::default());
    let mut a = Context::<u64>::new(&fabric.open(), ContextConfig::default()).unwrap();
    let mut b = Context::<()>::new(&fabric.open(), ContextConfig::default()).unwrap();
    let cfg = EndpointConfig {
        ring_size: 1 << 14,
        ..EndpointConfig::default()
    };
    let (ea, _eb) = connect(&mut a, &mut b, &cfg);
    let local = Buf::new(&a, 4096, Access::LOCAL_WRITE);
    let remote = Buf::new(
        &b,
        4096,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
    );
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 3) as u8).collect();
    local.write(&data);
    a.post_rdma_write(ea, local.sge(3000), remote.raddr())
        .unwrap();
    assert_eq!(a.raw_rdma_pending(), 1);
    wait_raw(&mut a, &mut b);
    assert_eq!(remote.bytes(3000), data);

    // Read it back into a cleared local buffer, with an RPC in flight at the same time.
    local.write(&[0u8; 4096]);
    a.call(ea, b"beside", 9, 16).unwrap();
    // SAFETY: `local` outlives the endpoints and is read (by copy) only after the READ.
    unsafe { a.post_rdma_read(ea, local.sge(3000), remote.raddr()) }.unwrap();
    wait_raw(&mut a, &mut b);
    assert_eq!(local.bytes(3000), data);
    let (h, req) = b.recv().expect("the RPC arrived");
    assert_eq!(req, b"beside");
    b.reply(h, b"ok").unwrap();
    b.poll(|_, _| {});
    let mut got = None;
    a.poll(|u, r| got = Some((u, r.unwrap().to_vec())));
    assert_eq!(got, Some((9, b"ok".to_vec())));
    assert_eq!(a.stats().raw_posted, 2);
    assert_eq!(a.stats().raw_done, 2);
    assert_eq!(a.stats().error_cqes, 0);
}

#[test]
fn raw_write_with_a_bad_rkey_fails_only_its_endpoint() {
    let fabric = Fabric::new(SimConfig::default());
    let mut a = Context::<u64>::new(&fabric.open(), ContextConfig::default()).unwrap();
    let mut b = Context::<()>::new(&fabric.open(), ContextConfig::default()).unwrap();
    let cfg = EndpointConfig {
        ring_size: 1 << 14,
        ..EndpointConfig::default()
    };
    let (bad, _) = connect(&mut a, &mut b, &cfg);
    let (good, _) = connect(&mut a, &mut b, &cfg);
    let local = Buf::new(&a, 64, Access::LOCAL_WRITE);
    let remote = Buf::new(&b, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    a.call(bad, b"pending", 1, 16).unwrap();
    let wrong = RaddrSeg {
        raddr: remote.mr.addr,
        rkey: remote.mr.rkey ^ 0x55,
    };
    a.post_rdma_write(bad, local.sge(64), wrong).unwrap();
    let mut failed = Vec::new();
    for _ in 0..100 {
        a.poll(|u, r| failed.push((u, r.is_err())));
        b.poll(|_, _| {});
    }
    assert_eq!(
        a.raw_rdma_pending(),
        0,
        "the failed operation is counted as done"
    );
    assert!(matches!(
        a.endpoint_state(bad),
        Some(EndpointState::Failed(_))
    ));
    assert_eq!(
        failed,
        vec![(1, true)],
        "the pending call failed with an error"
    );
    assert!(
        a.post_rdma_write(bad, local.sge(64), remote.raddr())
            .is_err()
    );
    // The other endpoint is unaffected.
    a.post_rdma_write(good, local.sge(64), remote.raddr())
        .unwrap();
    wait_raw(&mut a, &mut b);
    assert_eq!(a.endpoint_state(good), Some(EndpointState::Connected));
}
