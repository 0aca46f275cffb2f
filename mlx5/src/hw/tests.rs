//! Tests of the hardware provider that run on every machine: missing libraries, missing
//! symbols, no device. Tests that need a device are in `tests/conformance_hw.rs`.

use super::*;

fn no_device_reason(r: Result<Context>) -> Option<String> {
    match r {
        Ok(ctx) => {
            println!("an RDMA device is present: {}", ctx.provider().name());
            None
        }
        Err(Error::NoDevice { reason }) => Some(reason),
        Err(e) => panic!("expected NoDevice, got {e}"),
    }
}

fn rdma_core_installed() -> bool {
    Libs::load(LibraryNames::DEFAULT).is_ok()
}

#[test]
fn open_on_this_machine_is_no_device_with_a_reason() {
    let Some(reason) = no_device_reason(open(None, 1)) else {
        return;
    };
    println!("hw::open: no RDMA device: {reason}");
    assert!(!reason.is_empty());
    if !rdma_core_installed() {
        assert!(reason.contains("could not be loaded"), "{reason}");
    } else if !std::path::Path::new("/sys/class/infiniband_verbs").exists() {
        // No uverbs in the kernel (containers, CI): libibverbs reports ENOSYS.
        assert!(
            reason.starts_with("ibv_get_device_list returned no devices"),
            "{reason}"
        );
    }
    // The error's Display says what it is.
    let e = open(Some("mlx5_3"), 1).unwrap_err();
    assert!(e.to_string().starts_with("no RDMA device: "), "{e}");
}

#[test]
fn missing_libibverbs_is_named() {
    let names = LibraryNames {
        ibverbs: "libibverbs-does-not-exist.so.1",
        mlx5: "libmlx5.so.1",
    };
    // SAFETY: rdma-core's libraries, a library that does not exist, or libc (no verbs symbols).
    let reason =
        no_device_reason(unsafe { open_with_libraries(names, None, 1) }).expect("cannot succeed");
    assert!(
        reason.starts_with("libibverbs-does-not-exist.so.1 could not be loaded: "),
        "{reason}"
    );
    // dlerror's text is included.
    assert!(
        reason.contains("cannot open shared object file"),
        "{reason}"
    );
    // SAFETY: as above.
    let Err(Error::NoDevice { reason }) = (unsafe { list_devices_with_libraries(names) }) else {
        panic!("list_devices must fail the same way");
    };
    assert!(
        reason.contains("libibverbs-does-not-exist.so.1"),
        "{reason}"
    );
}

#[test]
fn missing_libmlx5_is_named() {
    let names = LibraryNames {
        ibverbs: "libibverbs.so.1",
        mlx5: "libmlx5-does-not-exist.so.1",
    };
    // SAFETY: rdma-core's libraries, a library that does not exist, or libc (no verbs symbols).
    let reason =
        no_device_reason(unsafe { open_with_libraries(names, None, 1) }).expect("cannot succeed");
    if rdma_core_installed() {
        assert!(
            reason.starts_with("libmlx5-does-not-exist.so.1 could not be loaded: "),
            "{reason}"
        );
    } else {
        assert!(
            reason.starts_with("libibverbs.so.1 could not be loaded: "),
            "{reason}"
        );
    }
}

#[test]
fn missing_symbol_is_named() {
    // libc is always there and has none of the verbs symbols.
    let names = LibraryNames {
        ibverbs: "libc.so.6",
        mlx5: "libc.so.6",
    };
    // SAFETY: rdma-core's libraries, a library that does not exist, or libc (no verbs symbols).
    let reason =
        no_device_reason(unsafe { open_with_libraries(names, None, 1) }).expect("cannot succeed");
    assert!(
        reason.starts_with("libc.so.6 has no symbol ibv_get_device_list"),
        "{reason}"
    );
}

#[test]
fn list_devices_never_panics() {
    match list_devices() {
        Ok(devs) => println!("RDMA devices: {devs:?}"),
        Err(Error::NoDevice { reason }) => println!("no RDMA device: {reason}"),
        Err(e) => panic!("unexpected error {e}"),
    }
}

#[test]
fn errno_mapping() {
    assert!(rc_result("x", 0).is_ok());
    let Err(Error::Verbs { call, source }) = rc_result("ibv_modify_qp", libc::EINVAL) else {
        panic!()
    };
    assert_eq!(call, "ibv_modify_qp");
    assert_eq!(source.raw_os_error(), Some(libc::EINVAL));
    let Err(Error::Verbs { source, .. }) = rc_result("y", -libc::ENOMEM) else {
        panic!()
    };
    assert_eq!(source.raw_os_error(), Some(libc::ENOMEM));
    assert_eq!(errno_name(libc::ENOSYS), "ENOSYS");
}

#[test]
fn mtu_conversions() {
    assert_eq!(mtu_bytes(IBV_MTU_256), 256);
    assert_eq!(mtu_bytes(IBV_MTU_1024), 1024);
    assert_eq!(mtu_bytes(IBV_MTU_4096), 4096);
    for b in [256, 512, 1024, 2048, 4096] {
        assert_eq!(mtu_bytes(mtu_enum(b).unwrap()), b);
    }
    assert!(mtu_enum(1500).is_err());
}

#[test]
fn address_vector_conversion() {
    // What mlx5_create_ah builds for InfiniBand without GRH: rlid, stat_rate_sl = sl.
    let mut av = [0u8; DGRAM_BYTES];
    av[12] = 0x03; // sl 3
    av[14..16].copy_from_slice(&0x1234u16.to_be_bytes());
    let seg = dgram_from_av(&av, 0x1111_2222, 0xab_cdef).unwrap();
    assert_eq!(
        seg,
        DgramSeg {
            qkey: 0x1111_2222,
            dqpn: 0xab_cdef,
            rlid: 0x1234,
            stat_rate_sl: 3,
            grh: false,
            rgid: [0; 16],
        }
    );
    // Written back, the segment equals the AV with key and dqp_dct filled in.
    let mut out = [0xeeu8; DGRAM_BYTES];
    seg.write(&mut out);
    let mut want = av;
    want[0..4].copy_from_slice(&0x1111_2222u32.to_be_bytes());
    want[8..12].copy_from_slice(&(0x00ab_cdefu32 | 0x8000_0000).to_be_bytes());
    assert_eq!(out, want);
    // GRH with only the "present" bit: representable.
    let mut g = av;
    g[28..32].copy_from_slice(&MLX5_AV_GRH.to_be_bytes());
    g[32..48].copy_from_slice(&[7; 16]);
    let seg = dgram_from_av(&g, 1, 2).unwrap();
    assert!(seg.grh);
    assert_eq!(seg.rgid, [7; 16]);
    // RoCE fields (MAC, hop limit), flow label, source path bits: refused, naming the field.
    for (i, v) in [(20usize, 0x02u8), (27, 64), (31, 1), (13, 1)] {
        let mut r = av;
        r[i] = v;
        let e = dgram_from_av(&r, 1, 2).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    }
}
