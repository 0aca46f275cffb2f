//! Conformance with rdma-core (v44): every segment this crate writes, every CQE field it reads,
//! every constant it hard-codes and every `ibv_*`/`mlx5dv_*` struct it declares for its FFI are
//! compared with what rdma-core's own headers say.
//!
//! The test compiles `tests/c/conformance.c` (with `cc` from `PATH`) against
//! `<infiniband/verbs.h>` and `<infiniband/mlx5dv.h>`. The harness prints `offsetof`/`sizeof`
//! of the structs, the enum values, and — for test vectors generated here and sent on its
//! stdin — the bytes produced by `mlx5dv_set_ctrl_seg`, `mlx5dv_set_data_seg`,
//! `mlx5dv_set_dgram_seg` (and rdma-core's raddr/atomic/inline fills) and what
//! `mlx5dv_get_cqe_owner/se/format/opcode` and `be*toh` of each `mlx5_cqe64` field return for
//! crafted CQEs. The Rust side produces the same with [`mlx5::wqe`], [`mlx5::cqe`] and
//! [`mlx5::hw::ffi`] and every value is compared field by field.
//!
//! Without the headers (`apt-get install libibverbs-dev`) each test prints
//! "skipped: rdma-core headers not installed (...)" and returns; `.ci/run` installs them, so
//! CI always runs these tests.

use std::collections::BTreeMap;
use std::io::Write;
use std::mem::{align_of, offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use mlx5::cqe::{self, Cqe, CqeOpcode, Syndrome};
use mlx5::hw::{self, ffi};
use mlx5::verbs::Access;
use mlx5::wqe::{self, AtomicSeg, CtrlSeg, DataSeg, DgramSeg, Opcode, RaddrSeg, Sge, WqeDesc};

// ---------------------------------------------------------------------------------------------
// the harness

const SKIP: &str = "skipped: rdma-core headers not installed (apt-get install libibverbs-dev)";

/// Compiles the harness once per test binary; `Err(message)` when it cannot run here.
fn harness_binary() -> Result<PathBuf, String> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/conformance.c");
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("mlx5-conformance");
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        // Probe for the headers first so that "not installed" is told apart from a real
        // compile error in the harness (which fails the test).
        let probe = dir.join("probe.c");
        std::fs::write(
            &probe,
            "#include <infiniband/verbs.h>\n#include <infiniband/mlx5dv.h>\n",
        )
        .map_err(|e| e.to_string())?;
        let out = match Command::new("cc").arg("-fsyntax-only").arg(&probe).output() {
            Ok(o) => o,
            Err(e) => return Err(format!("skipped: no C compiler `cc` in PATH ({e})")),
        };
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            if stderr.contains("No such file") || stderr.contains("not found") {
                return Err(SKIP.to_string());
            }
            panic!("probing the rdma-core headers failed:\n{stderr}");
        }
        let bin = dir.join("conformance");
        let out = Command::new("cc")
            .args(["-std=gnu11", "-O1", "-Wall", "-Wextra", "-Werror", "-o"])
            .arg(&bin)
            .arg(&src)
            .output()
            .expect("running cc");
        assert!(
            out.status.success(),
            "compiling {} failed:\n{}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(bin)
    })
    .clone()
}

/// What the harness printed: static facts (`sizeof:`, `offsetof:`, `const:`, `mask:` keys) and
/// one answer line per command.
struct C {
    facts: BTreeMap<String, u64>,
    answers: Vec<String>,
}

impl C {
    /// A static fact; panics naming it when the harness did not print it.
    fn fact(&self, key: &str) -> u64 {
        *self
            .facts
            .get(key)
            .unwrap_or_else(|| panic!("the C harness printed no `{key}`"))
    }
}

/// Runs the harness with `commands` on stdin; `None` (after printing why) when it cannot run.
fn run(commands: &[String]) -> Option<C> {
    let bin = match harness_binary() {
        Ok(b) => b,
        Err(msg) => {
            println!("{msg}");
            return None;
        }
    };
    let mut child = Command::new(&bin)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running the harness");
    let input = commands.join("\n") + "\n";
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().expect("harness output");
    writer.join().unwrap().expect("writing commands");
    assert!(
        out.status.success(),
        "harness failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    let mut facts = BTreeMap::new();
    for line in lines.by_ref() {
        let (k, v) = line.split_once(' ').unwrap();
        if k == "end:static" {
            break;
        }
        facts.insert(
            k.to_string(),
            v.parse().unwrap_or_else(|_| panic!("bad line {line}")),
        );
    }
    let answers: Vec<String> = lines.map(str::to_string).collect();
    assert_eq!(answers.len(), commands.len(), "one answer per command");
    Some(C { facts, answers })
}

/// The hex payload of an answer `tag <hex>`.
fn answer_bytes(answer: &str, tag: &str) -> Vec<u8> {
    let (t, h) = answer.split_once(' ').unwrap();
    assert_eq!(t, tag);
    (0..h.len() / 2)
        .map(|i| u8::from_str_radix(&h[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Asserts byte equality; on mismatch names the first differing byte and the field there.
fn assert_bytes(what: &str, rust: &[u8], c: &[u8], fields: &[(usize, &str)]) {
    assert_eq!(rust.len(), c.len(), "{what}: length");
    if let Some(i) = (0..rust.len()).find(|&i| rust[i] != c[i]) {
        let field = fields
            .iter()
            .rev()
            .find(|(off, _)| *off <= i)
            .map_or("?", |(_, f)| *f);
        panic!(
            "{what}: byte {i} (field `{field}`) differs: crate wrote {:#04x}, rdma-core {:#04x}\n  crate:    {}\n  rdma-core {}",
            rust[i],
            c[i],
            hex(rust),
            hex(c)
        );
    }
}

/// Deterministic test vectors (splitmix64).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn u32(&mut self) -> u32 {
        self.next() as u32
    }
    fn u16(&mut self) -> u16 {
        self.next() as u16
    }
    fn u8(&mut self) -> u8 {
        self.next() as u8
    }
    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[(self.next() % v.len() as u64) as usize]
    }
}

// ---------------------------------------------------------------------------------------------
// layouts

macro_rules! off {
    ($t:ident, $($f:tt)+) => {
        (
            format!("offsetof:{}.{}", stringify!($t), stringify!($($f)+).replace(' ', "").replace("r#", "")),
            offset_of!(ffi::$t, $($f)+),
        )
    };
}

macro_rules! size {
    ($t:ident) => {
        [
            (format!("sizeof:{}", stringify!($t)), size_of::<ffi::$t>()),
            (format!("alignof:{}", stringify!($t)), align_of::<ffi::$t>()),
        ]
    };
}

#[test]
fn ffi_struct_layouts_match_verbs_h_and_mlx5dv_h() {
    let Some(c) = run(&[]) else { return };
    let mut checks: Vec<(String, usize)> = Vec::new();
    // Complete structs: size, alignment and every field.
    for s in [
        size!(ibv_gid),
        size!(ibv_mr),
        size!(ibv_port_attr),
        size!(ibv_device_attr),
        size!(ibv_qp_cap),
        size!(ibv_qp_init_attr),
        size!(ibv_global_route),
        size!(ibv_ah_attr),
        size!(ibv_qp_attr),
        size!(ibv_srq_attr),
        size!(ibv_srq_init_attr),
        size!(mlx5dv_qp),
        size!(mlx5dv_cq),
        size!(mlx5dv_srq),
        size!(mlx5dv_ah),
        size!(mlx5dv_obj),
        size!(mlx5_wqe_av),
    ] {
        checks.extend(s);
    }
    checks.extend([
        off!(ibv_gid, raw),
        off!(ibv_mr, context),
        off!(ibv_mr, pd),
        off!(ibv_mr, addr),
        off!(ibv_mr, length),
        off!(ibv_mr, handle),
        off!(ibv_mr, lkey),
        off!(ibv_mr, rkey),
        off!(ibv_qp, context),
        off!(ibv_qp, qp_context),
        off!(ibv_qp, pd),
        off!(ibv_qp, send_cq),
        off!(ibv_qp, recv_cq),
        off!(ibv_qp, srq),
        off!(ibv_qp, handle),
        off!(ibv_qp, qp_num),
        off!(ibv_qp, state),
        off!(ibv_qp, qp_type),
        off!(ibv_port_attr, state),
        off!(ibv_port_attr, max_mtu),
        off!(ibv_port_attr, active_mtu),
        off!(ibv_port_attr, gid_tbl_len),
        off!(ibv_port_attr, port_cap_flags),
        off!(ibv_port_attr, max_msg_sz),
        off!(ibv_port_attr, bad_pkey_cntr),
        off!(ibv_port_attr, qkey_viol_cntr),
        off!(ibv_port_attr, pkey_tbl_len),
        off!(ibv_port_attr, lid),
        off!(ibv_port_attr, sm_lid),
        off!(ibv_port_attr, lmc),
        off!(ibv_port_attr, max_vl_num),
        off!(ibv_port_attr, sm_sl),
        off!(ibv_port_attr, subnet_timeout),
        off!(ibv_port_attr, init_type_reply),
        off!(ibv_port_attr, active_width),
        off!(ibv_port_attr, active_speed),
        off!(ibv_port_attr, phys_state),
        off!(ibv_port_attr, link_layer),
        off!(ibv_port_attr, flags),
        off!(ibv_port_attr, port_cap_flags2),
        off!(ibv_device_attr, fw_ver),
        off!(ibv_device_attr, node_guid),
        off!(ibv_device_attr, sys_image_guid),
        off!(ibv_device_attr, max_mr_size),
        off!(ibv_device_attr, page_size_cap),
        off!(ibv_device_attr, vendor_id),
        off!(ibv_device_attr, vendor_part_id),
        off!(ibv_device_attr, hw_ver),
        off!(ibv_device_attr, max_qp),
        off!(ibv_device_attr, max_qp_wr),
        off!(ibv_device_attr, device_cap_flags),
        off!(ibv_device_attr, max_sge),
        off!(ibv_device_attr, max_sge_rd),
        off!(ibv_device_attr, max_cq),
        off!(ibv_device_attr, max_cqe),
        off!(ibv_device_attr, max_mr),
        off!(ibv_device_attr, max_pd),
        off!(ibv_device_attr, max_qp_rd_atom),
        off!(ibv_device_attr, max_ee_rd_atom),
        off!(ibv_device_attr, max_res_rd_atom),
        off!(ibv_device_attr, max_qp_init_rd_atom),
        off!(ibv_device_attr, max_ee_init_rd_atom),
        off!(ibv_device_attr, atomic_cap),
        off!(ibv_device_attr, max_ee),
        off!(ibv_device_attr, max_rdd),
        off!(ibv_device_attr, max_mw),
        off!(ibv_device_attr, max_raw_ipv6_qp),
        off!(ibv_device_attr, max_raw_ethy_qp),
        off!(ibv_device_attr, max_mcast_grp),
        off!(ibv_device_attr, max_mcast_qp_attach),
        off!(ibv_device_attr, max_total_mcast_qp_attach),
        off!(ibv_device_attr, max_ah),
        off!(ibv_device_attr, max_fmr),
        off!(ibv_device_attr, max_map_per_fmr),
        off!(ibv_device_attr, max_srq),
        off!(ibv_device_attr, max_srq_wr),
        off!(ibv_device_attr, max_srq_sge),
        off!(ibv_device_attr, max_pkeys),
        off!(ibv_device_attr, local_ca_ack_delay),
        off!(ibv_device_attr, phys_port_cnt),
        off!(ibv_qp_cap, max_send_wr),
        off!(ibv_qp_cap, max_recv_wr),
        off!(ibv_qp_cap, max_send_sge),
        off!(ibv_qp_cap, max_recv_sge),
        off!(ibv_qp_cap, max_inline_data),
        off!(ibv_qp_init_attr, qp_context),
        off!(ibv_qp_init_attr, send_cq),
        off!(ibv_qp_init_attr, recv_cq),
        off!(ibv_qp_init_attr, srq),
        off!(ibv_qp_init_attr, cap),
        off!(ibv_qp_init_attr, qp_type),
        off!(ibv_qp_init_attr, sq_sig_all),
        off!(ibv_global_route, dgid),
        off!(ibv_global_route, flow_label),
        off!(ibv_global_route, sgid_index),
        off!(ibv_global_route, hop_limit),
        off!(ibv_global_route, traffic_class),
        off!(ibv_ah_attr, grh),
        off!(ibv_ah_attr, dlid),
        off!(ibv_ah_attr, sl),
        off!(ibv_ah_attr, src_path_bits),
        off!(ibv_ah_attr, static_rate),
        off!(ibv_ah_attr, is_global),
        off!(ibv_ah_attr, port_num),
        off!(ibv_qp_attr, qp_state),
        off!(ibv_qp_attr, cur_qp_state),
        off!(ibv_qp_attr, path_mtu),
        off!(ibv_qp_attr, path_mig_state),
        off!(ibv_qp_attr, qkey),
        off!(ibv_qp_attr, rq_psn),
        off!(ibv_qp_attr, sq_psn),
        off!(ibv_qp_attr, dest_qp_num),
        off!(ibv_qp_attr, qp_access_flags),
        off!(ibv_qp_attr, cap),
        off!(ibv_qp_attr, ah_attr),
        off!(ibv_qp_attr, alt_ah_attr),
        off!(ibv_qp_attr, pkey_index),
        off!(ibv_qp_attr, alt_pkey_index),
        off!(ibv_qp_attr, en_sqd_async_notify),
        off!(ibv_qp_attr, sq_draining),
        off!(ibv_qp_attr, max_rd_atomic),
        off!(ibv_qp_attr, max_dest_rd_atomic),
        off!(ibv_qp_attr, min_rnr_timer),
        off!(ibv_qp_attr, port_num),
        off!(ibv_qp_attr, timeout),
        off!(ibv_qp_attr, retry_cnt),
        off!(ibv_qp_attr, rnr_retry),
        off!(ibv_qp_attr, alt_port_num),
        off!(ibv_qp_attr, alt_timeout),
        off!(ibv_qp_attr, rate_limit),
        off!(ibv_srq_attr, max_wr),
        off!(ibv_srq_attr, max_sge),
        off!(ibv_srq_attr, srq_limit),
        off!(ibv_srq_init_attr, srq_context),
        off!(ibv_srq_init_attr, attr),
        off!(mlx5dv_qp, dbrec),
        off!(mlx5dv_qp, sq.buf),
        off!(mlx5dv_qp, sq.wqe_cnt),
        off!(mlx5dv_qp, sq.stride),
        off!(mlx5dv_qp, rq.buf),
        off!(mlx5dv_qp, rq.wqe_cnt),
        off!(mlx5dv_qp, rq.stride),
        off!(mlx5dv_qp, bf.reg),
        off!(mlx5dv_qp, bf.size),
        off!(mlx5dv_qp, comp_mask),
        off!(mlx5dv_qp, uar_mmap_offset),
        off!(mlx5dv_qp, tirn),
        off!(mlx5dv_qp, tisn),
        off!(mlx5dv_qp, rqn),
        off!(mlx5dv_qp, sqn),
        off!(mlx5dv_qp, tir_icm_addr),
        off!(mlx5dv_cq, buf),
        off!(mlx5dv_cq, dbrec),
        off!(mlx5dv_cq, cqe_cnt),
        off!(mlx5dv_cq, cqe_size),
        off!(mlx5dv_cq, cq_uar),
        off!(mlx5dv_cq, cqn),
        off!(mlx5dv_cq, comp_mask),
        off!(mlx5dv_srq, buf),
        off!(mlx5dv_srq, dbrec),
        off!(mlx5dv_srq, stride),
        off!(mlx5dv_srq, head),
        off!(mlx5dv_srq, tail),
        off!(mlx5dv_srq, comp_mask),
        off!(mlx5dv_srq, srqn),
        off!(mlx5dv_ah, av),
        off!(mlx5dv_ah, comp_mask),
        off!(mlx5dv_obj, qp.r#in),
        off!(mlx5dv_obj, qp.out),
        off!(mlx5dv_obj, cq.r#in),
        off!(mlx5dv_obj, cq.out),
        off!(mlx5dv_obj, srq.r#in),
        off!(mlx5dv_obj, srq.out),
        off!(mlx5dv_obj, rwq.r#in),
        off!(mlx5dv_obj, rwq.out),
        off!(mlx5dv_obj, dm.r#in),
        off!(mlx5dv_obj, dm.out),
        off!(mlx5dv_obj, ah.r#in),
        off!(mlx5dv_obj, ah.out),
        off!(mlx5dv_obj, pd.r#in),
        off!(mlx5dv_obj, pd.out),
        off!(mlx5_wqe_av, key),
        off!(mlx5_wqe_av, dqp_dct),
        off!(mlx5_wqe_av, stat_rate_sl),
        off!(mlx5_wqe_av, fl_mlid),
        off!(mlx5_wqe_av, rlid),
        off!(mlx5_wqe_av, reserved0),
        off!(mlx5_wqe_av, rmac),
        off!(mlx5_wqe_av, tclass),
        off!(mlx5_wqe_av, hop_limit),
        off!(mlx5_wqe_av, grh_gid_fl),
        off!(mlx5_wqe_av, rgid),
    ]);
    let mut bad = Vec::new();
    for (key, rust) in &checks {
        let cv = c.fact(key);
        if cv != *rust as u64 {
            bad.push(format!("{key}: hw::ffi says {rust}, rdma-core says {cv}"));
        }
    }
    assert!(bad.is_empty(), "FFI layout mismatches:\n{}", bad.join("\n"));
    // ibv_qp is declared as its documented prefix: it must end where the undeclared part begins.
    assert!(size_of::<ffi::ibv_qp>() as u64 <= c.fact("offsetof:ibv_qp.mutex"));
    // The exported ibv_query_port fills `_compat_ibv_port_attr`: ibv_port_attr up to `flags`.
    assert_eq!(
        ffi::COMPAT_PORT_ATTR_BYTES as u64,
        c.fact("offsetof:ibv_port_attr.port_cap_flags2"),
        "COMPAT_PORT_ATTR_BYTES"
    );
    // The PRM's struct sizes (mlx5-prm.md "Struct sizes").
    for (k, v) in [
        ("sizeof:ibv_qp_init_attr", 64),
        ("sizeof:ibv_ah_attr", 32),
        ("sizeof:ibv_port_attr", 52),
        ("sizeof:ibv_qp_attr", 144),
        ("offsetof:ibv_qp_attr.qkey", 16),
        ("offsetof:ibv_qp_attr.rq_psn", 20),
        ("offsetof:ibv_qp_attr.sq_psn", 24),
        ("offsetof:ibv_qp_attr.dest_qp_num", 28),
        ("offsetof:ibv_qp_attr.ah_attr", 56),
        ("offsetof:ibv_qp_attr.pkey_index", 120),
        ("offsetof:ibv_qp_attr.port_num", 129),
        ("sizeof:mlx5dv_qp", 96),
        ("offsetof:mlx5dv_qp.bf.reg", 40),
        ("offsetof:mlx5dv_qp.bf.size", 48),
        ("sizeof:mlx5dv_cq", 48),
        ("offsetof:mlx5dv_cq.cqn", 32),
    ] {
        assert_eq!(c.fact(k), v, "mlx5-prm.md says {k} = {v}");
    }
    println!("{} FFI layout facts verified", checks.len() + 2);
}

#[test]
fn wqe_segment_sizes_and_cqe_offsets_match_mlx5dv_h() {
    let Some(c) = run(&[]) else { return };
    let sizes = [
        ("sizeof:mlx5_wqe_ctrl_seg", wqe::CTRL_BYTES),
        ("sizeof:mlx5_wqe_data_seg", wqe::DATA_BYTES),
        ("sizeof:mlx5_wqe_raddr_seg", wqe::RADDR_BYTES),
        ("sizeof:mlx5_wqe_atomic_seg", wqe::ATOMIC_BYTES),
        ("sizeof:mlx5_wqe_datagram_seg", wqe::DGRAM_BYTES),
        ("sizeof:mlx5_wqe_av", wqe::DGRAM_BYTES),
        ("sizeof:mlx5_cqe64", cqe::CQE_BYTES),
        ("sizeof:mlx5_err_cqe", cqe::CQE_BYTES),
        ("const:MLX5_SEND_WQE_BB", wqe::WQEBB),
        ("offsetof:mlx5_wqe_inl_data_seg.byte_count", 0),
        // The inline header is 4 bytes; the data follows it directly (wqe::write_inline).
        ("sizeof:mlx5_wqe_inl_data_seg", 4),
        // mlx5-prm.md: SRQ next segment is 16 B with next_wqe_index at 2.
        ("sizeof:mlx5_wqe_srq_next_seg", 16),
        ("offsetof:mlx5_wqe_srq_next_seg.next_wqe_index", 2),
        // ds units are 16 bytes: every segment is a multiple.
        ("sizeof:mlx5_wqe_ctrl_seg", wqe::DS_BYTES),
    ];
    for (k, v) in sizes {
        assert_eq!(c.fact(k), v as u64, "{k}: mlx5dv.h vs mlx5::wqe/cqe");
    }
    assert_eq!(
        1u64 << c.fact("const:MLX5_SEND_WQE_SHIFT"),
        wqe::WQEBB as u64
    );
    let offsets = [
        ("offsetof:mlx5_cqe64.flags_rqpn", cqe::off::FLAGS_RQPN),
        ("offsetof:mlx5_cqe64.srqn_uidx", cqe::off::SRQN_UIDX),
        ("offsetof:mlx5_cqe64.imm_inval_pkey", cqe::off::IMM),
        ("offsetof:mlx5_cqe64.byte_cnt", cqe::off::BYTE_CNT),
        ("offsetof:mlx5_cqe64.timestamp", cqe::off::TIMESTAMP),
        ("offsetof:mlx5_cqe64.sop_drop_qpn", cqe::off::SOP_DROP_QPN),
        ("offsetof:mlx5_cqe64.wqe_counter", cqe::off::WQE_COUNTER),
        ("offsetof:mlx5_cqe64.signature", cqe::off::SIGNATURE),
        ("offsetof:mlx5_cqe64.op_own", cqe::off::OP_OWN),
        ("offsetof:mlx5_err_cqe.srqn", cqe::off::SRQN_UIDX),
        (
            "offsetof:mlx5_err_cqe.vendor_err_synd",
            cqe::off::VENDOR_SYNDROME,
        ),
        ("offsetof:mlx5_err_cqe.syndrome", cqe::off::SYNDROME),
        (
            "offsetof:mlx5_err_cqe.s_wqe_opcode_qpn",
            cqe::off::SOP_DROP_QPN,
        ),
        ("offsetof:mlx5_err_cqe.wqe_counter", cqe::off::WQE_COUNTER),
        ("offsetof:mlx5_err_cqe.signature", cqe::off::SIGNATURE),
        ("offsetof:mlx5_err_cqe.op_own", cqe::off::OP_OWN),
        // Segment field offsets the writers use (the byte comparisons below check values).
        ("offsetof:mlx5_wqe_ctrl_seg.fm_ce_se", 11),
        ("offsetof:mlx5_wqe_ctrl_seg.signature", 8),
        ("offsetof:mlx5_wqe_ctrl_seg.imm", 12),
        ("offsetof:mlx5_wqe_av.dqp_dct", 8),
        ("offsetof:mlx5_wqe_av.rlid", 14),
        ("offsetof:mlx5_wqe_av.grh_gid_fl", 28),
        ("offsetof:mlx5_wqe_av.rgid", 32),
    ];
    for (k, v) in offsets {
        assert_eq!(
            c.fact(k),
            v as u64,
            "{k}: mlx5dv.h vs mlx5::cqe::off / mlx5::wqe"
        );
    }
}

#[test]
fn constants_match_header_enums() {
    let Some(c) = run(&[]) else { return };
    let checks: Vec<(&str, u64)> = vec![
        ("const:MLX5_OPCODE_NOP", Opcode::Nop as u64),
        ("const:MLX5_OPCODE_RDMA_WRITE", Opcode::RdmaWrite as u64),
        (
            "const:MLX5_OPCODE_RDMA_WRITE_IMM",
            Opcode::RdmaWriteImm as u64,
        ),
        ("const:MLX5_OPCODE_SEND", Opcode::Send as u64),
        ("const:MLX5_OPCODE_SEND_IMM", Opcode::SendImm as u64),
        ("const:MLX5_OPCODE_RDMA_READ", Opcode::RdmaRead as u64),
        ("const:MLX5_OPCODE_ATOMIC_CS", Opcode::AtomicCs as u64),
        ("const:MLX5_OPCODE_ATOMIC_FA", Opcode::AtomicFa as u64),
        ("const:MLX5_WQE_CTRL_CQ_UPDATE", wqe::CQ_UPDATE as u64),
        ("const:MLX5_WQE_CTRL_SOLICITED", wqe::SOLICITED as u64),
        ("const:MLX5_WQE_CTRL_FENCE", wqe::FENCE as u64),
        (
            "const:MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE",
            wqe::SMALL_FENCE as u64,
        ),
        ("const:MLX5_INLINE_SEG", wqe::INLINE_SEG as u64),
        ("const:MLX5_INVALID_LKEY", wqe::INVALID_LKEY as u64),
        ("const:MLX5_EXTENDED_UD_AV", wqe::EXTENDED_AV as u64),
        // Doorbell record words (mlx5-prm.md: receive head in word 0, SQ producer in word 1).
        ("const:MLX5_RCV_DBR", 0),
        ("const:MLX5_SND_DBR", 1),
        ("const:MLX5_CQE_OWNER_MASK", 1),
        ("const:MLX5_CQE_REQ", CqeOpcode::Req as u64),
        ("const:MLX5_CQE_RESP_WR_IMM", CqeOpcode::RespWrImm as u64),
        ("const:MLX5_CQE_RESP_SEND", CqeOpcode::RespSend as u64),
        (
            "const:MLX5_CQE_RESP_SEND_IMM",
            CqeOpcode::RespSendImm as u64,
        ),
        ("const:MLX5_CQE_REQ_ERR", CqeOpcode::ReqErr as u64),
        ("const:MLX5_CQE_RESP_ERR", CqeOpcode::RespErr as u64),
        ("const:MLX5_CQE_INVALID", CqeOpcode::Invalid as u64),
        (
            "const:MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR",
            Syndrome::LocalLength as u64,
        ),
        (
            "const:MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR",
            Syndrome::LocalQpOp as u64,
        ),
        (
            "const:MLX5_CQE_SYNDROME_LOCAL_PROT_ERR",
            Syndrome::LocalProt as u64,
        ),
        (
            "const:MLX5_CQE_SYNDROME_WR_FLUSH_ERR",
            Syndrome::WrFlush as u64,
        ),
        (
            "const:MLX5_CQE_SYNDROME_BAD_RESP_ERR",
            Syndrome::BadResp as u64,
        ),
        (
            "const:MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR",
            Syndrome::LocalAccess as u64,
        ),
        (
            "const:MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR",
            Syndrome::RemoteInvalReq as u64,
        ),
        (
            "const:MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR",
            Syndrome::RemoteAccess as u64,
        ),
        (
            "const:MLX5_CQE_SYNDROME_REMOTE_OP_ERR",
            Syndrome::RemoteOp as u64,
        ),
        (
            "const:MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR",
            Syndrome::TransportRetryExc as u64,
        ),
        (
            "const:MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR",
            Syndrome::RnrRetryExc as u64,
        ),
        (
            "const:MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR",
            Syndrome::RemoteAborted as u64,
        ),
        ("const:MLX5DV_OBJ_QP", ffi::MLX5DV_OBJ_QP),
        ("const:MLX5DV_OBJ_CQ", ffi::MLX5DV_OBJ_CQ),
        ("const:MLX5DV_OBJ_SRQ", ffi::MLX5DV_OBJ_SRQ),
        ("const:MLX5DV_OBJ_AH", ffi::MLX5DV_OBJ_AH),
        ("const:MLX5DV_SRQ_MASK_SRQN", ffi::MLX5DV_SRQ_MASK_SRQN),
        ("const:IBV_QPS_RESET", ffi::IBV_QPS_RESET as u64),
        ("const:IBV_QPS_INIT", ffi::IBV_QPS_INIT as u64),
        ("const:IBV_QPS_RTR", ffi::IBV_QPS_RTR as u64),
        ("const:IBV_QPS_RTS", ffi::IBV_QPS_RTS as u64),
        ("const:IBV_QPT_RC", ffi::IBV_QPT_RC as u64),
        ("const:IBV_QPT_UD", ffi::IBV_QPT_UD as u64),
        ("const:IBV_MTU_256", ffi::IBV_MTU_256 as u64),
        ("const:IBV_MTU_512", ffi::IBV_MTU_512 as u64),
        ("const:IBV_MTU_1024", ffi::IBV_MTU_1024 as u64),
        ("const:IBV_MTU_2048", ffi::IBV_MTU_2048 as u64),
        ("const:IBV_MTU_4096", ffi::IBV_MTU_4096 as u64),
        ("const:IBV_PORT_ACTIVE", ffi::IBV_PORT_ACTIVE as u64),
        (
            "const:IBV_LINK_LAYER_UNSPECIFIED",
            ffi::IBV_LINK_LAYER_UNSPECIFIED as u64,
        ),
        (
            "const:IBV_LINK_LAYER_INFINIBAND",
            ffi::IBV_LINK_LAYER_INFINIBAND as u64,
        ),
        (
            "const:IBV_LINK_LAYER_ETHERNET",
            ffi::IBV_LINK_LAYER_ETHERNET as u64,
        ),
        (
            "const:IBV_ACCESS_LOCAL_WRITE",
            ffi::IBV_ACCESS_LOCAL_WRITE as u64,
        ),
        (
            "const:IBV_ACCESS_REMOTE_WRITE",
            ffi::IBV_ACCESS_REMOTE_WRITE as u64,
        ),
        (
            "const:IBV_ACCESS_REMOTE_READ",
            ffi::IBV_ACCESS_REMOTE_READ as u64,
        ),
        (
            "const:IBV_ACCESS_REMOTE_ATOMIC",
            ffi::IBV_ACCESS_REMOTE_ATOMIC as u64,
        ),
        // verbs::Access is passed to ibv_reg_mr as is.
        (
            "const:IBV_ACCESS_LOCAL_WRITE",
            Access::LOCAL_WRITE.bits() as u64,
        ),
        (
            "const:IBV_ACCESS_REMOTE_WRITE",
            Access::REMOTE_WRITE.bits() as u64,
        ),
        (
            "const:IBV_ACCESS_REMOTE_READ",
            Access::REMOTE_READ.bits() as u64,
        ),
        (
            "const:IBV_ACCESS_REMOTE_ATOMIC",
            Access::REMOTE_ATOMIC.bits() as u64,
        ),
        ("const:IBV_QP_STATE", ffi::IBV_QP_STATE as u64),
        ("const:IBV_QP_ACCESS_FLAGS", ffi::IBV_QP_ACCESS_FLAGS as u64),
        ("const:IBV_QP_PKEY_INDEX", ffi::IBV_QP_PKEY_INDEX as u64),
        ("const:IBV_QP_PORT", ffi::IBV_QP_PORT as u64),
        ("const:IBV_QP_QKEY", ffi::IBV_QP_QKEY as u64),
        ("const:IBV_QP_AV", ffi::IBV_QP_AV as u64),
        ("const:IBV_QP_PATH_MTU", ffi::IBV_QP_PATH_MTU as u64),
        ("const:IBV_QP_TIMEOUT", ffi::IBV_QP_TIMEOUT as u64),
        ("const:IBV_QP_RETRY_CNT", ffi::IBV_QP_RETRY_CNT as u64),
        ("const:IBV_QP_RNR_RETRY", ffi::IBV_QP_RNR_RETRY as u64),
        ("const:IBV_QP_RQ_PSN", ffi::IBV_QP_RQ_PSN as u64),
        (
            "const:IBV_QP_MAX_QP_RD_ATOMIC",
            ffi::IBV_QP_MAX_QP_RD_ATOMIC as u64,
        ),
        (
            "const:IBV_QP_MIN_RNR_TIMER",
            ffi::IBV_QP_MIN_RNR_TIMER as u64,
        ),
        ("const:IBV_QP_SQ_PSN", ffi::IBV_QP_SQ_PSN as u64),
        (
            "const:IBV_QP_MAX_DEST_RD_ATOMIC",
            ffi::IBV_QP_MAX_DEST_RD_ATOMIC as u64,
        ),
        ("const:IBV_QP_DEST_QPN", ffi::IBV_QP_DEST_QPN as u64),
        // The transition masks the provider uses are the PRM table.
        ("mask:RC_RESET_INIT", hw::qp_masks::RC_RESET_INIT as u64),
        ("mask:RC_INIT_RTR", hw::qp_masks::RC_INIT_RTR as u64),
        ("mask:RC_RTR_RTS", hw::qp_masks::RC_RTR_RTS as u64),
        ("mask:UD_RESET_INIT", hw::qp_masks::UD_RESET_INIT as u64),
        ("mask:UD_INIT_RTR", hw::qp_masks::UD_INIT_RTR as u64),
        ("mask:UD_RTR_RTS", hw::qp_masks::UD_RTR_RTS as u64),
    ];
    let bad: Vec<String> = checks
        .iter()
        .filter(|(k, v)| c.fact(k) != *v)
        .map(|(k, v)| format!("{k}: crate has {v:#x}, header has {:#x}", c.fact(k)))
        .collect();
    assert!(bad.is_empty(), "constant mismatches:\n{}", bad.join("\n"));
    // No access flag of the crate is in IBV_ACCESS_OPTIONAL_RANGE, so the exported
    // ibv_reg_mr is what the header's ibv_reg_mr macro would call.
    assert_eq!(
        Access::all().bits() as u64 & c.fact("const:IBV_ACCESS_OPTIONAL_RANGE"),
        0
    );
    println!("{} constants verified", checks.len() + 1);
}

// ---------------------------------------------------------------------------------------------
// segments

const CTRL_FIELDS: &[(usize, &str)] = &[
    (0, "opmod_idx_opcode"),
    (4, "qpn_ds"),
    (8, "signature"),
    (9, "dci_stream_channel_id"),
    (11, "fm_ce_se"),
    (12, "imm"),
];
const DATA_FIELDS: &[(usize, &str)] = &[(0, "byte_count"), (4, "lkey"), (8, "addr")];
const AV_FIELDS: &[(usize, &str)] = &[
    (0, "key.qkey.qkey"),
    (4, "key.qkey.reserved"),
    (8, "dqp_dct"),
    (12, "stat_rate_sl"),
    (13, "fl_mlid"),
    (14, "rlid"),
    (16, "reserved0"),
    (20, "rmac"),
    (26, "tclass"),
    (27, "hop_limit"),
    (28, "grh_gid_fl"),
    (32, "rgid"),
];
const RADDR_FIELDS: &[(usize, &str)] = &[(0, "raddr"), (8, "rkey"), (12, "reserved")];
const ATOMIC_FIELDS: &[(usize, &str)] = &[(0, "swap_add"), (8, "compare")];

fn ctrl_vectors() -> Vec<CtrlSeg> {
    let mut r = Rng(1);
    let opcodes = [0x00u8, 0x08, 0x09, 0x0a, 0x0b, 0x10, 0x11, 0x12];
    let flags = [
        0u8,
        wqe::CQ_UPDATE,
        wqe::SOLICITED,
        wqe::FENCE,
        wqe::SMALL_FENCE,
        wqe::CQ_UPDATE | wqe::SOLICITED | wqe::FENCE,
    ];
    let mut v = vec![
        CtrlSeg {
            opmod: 0,
            wqe_index: 0,
            opcode: 0,
            qpn: 0,
            ds: 0,
            signature: 0,
            fm_ce_se: 0,
            imm: 0,
        },
        CtrlSeg {
            opmod: 0xff,
            wqe_index: 0xffff,
            opcode: 0xff,
            qpn: 0xff_ffff,
            ds: 63,
            signature: 0xff,
            fm_ce_se: 0xff,
            imm: 0xffff_ffff,
        },
        // PRM examples: RC SEND signaled ds 2, RC WRITE ds 3, UD SEND ds 5.
        CtrlSeg {
            opmod: 0,
            wqe_index: 0x1234,
            opcode: Opcode::SendImm as u8,
            qpn: 0xab_cdef,
            ds: 2,
            signature: 0,
            fm_ce_se: wqe::CQ_UPDATE,
            imm: 0xdead_beef,
        },
    ];
    for _ in 0..200 {
        v.push(CtrlSeg {
            opmod: if r.u8() < 200 { 0 } else { r.u8() },
            wqe_index: r.u16(),
            opcode: r.pick(&opcodes),
            qpn: r.u32() & 0xff_ffff,
            ds: (r.u8() % 63) + 1,
            signature: if r.u8() < 200 { 0 } else { r.u8() },
            fm_ce_se: r.pick(&flags),
            imm: r.u32(),
        });
    }
    v
}

fn ctrl_command(s: &CtrlSeg) -> String {
    format!(
        "ctrl {} {} {} {} {} {} {} {}",
        s.wqe_index, s.opcode, s.opmod, s.qpn, s.fm_ce_se, s.ds, s.signature, s.imm
    )
}

#[test]
fn ctrl_segments_match_mlx5dv_set_ctrl_seg() {
    let v = ctrl_vectors();
    let cmds: Vec<String> = v.iter().map(ctrl_command).collect();
    let Some(c) = run(&cmds) else { return };
    for (s, ans) in v.iter().zip(&c.answers) {
        let want = answer_bytes(ans, "ctrl");
        let mut got = [0xeeu8; wqe::CTRL_BYTES];
        s.write(&mut got);
        assert_bytes(
            &format!("CtrlSeg::write({s:?}) vs mlx5dv_set_ctrl_seg(.., htobe32(imm))"),
            &got,
            &want,
            CTRL_FIELDS,
        );
        // The device model's parser reads rdma-core's bytes back to the same fields.
        assert_eq!(
            CtrlSeg::read(&want),
            *s,
            "CtrlSeg::read of mlx5dv_set_ctrl_seg bytes"
        );
    }
    println!("{} control segments verified", v.len());
}

#[test]
fn data_segments_match_mlx5dv_set_data_seg() {
    let mut r = Rng(2);
    let mut v = vec![
        Sge {
            addr: 0,
            len: 0,
            lkey: 0,
        },
        Sge {
            addr: u64::MAX,
            len: u32::MAX,
            lkey: u32::MAX,
        },
        // The receive terminator.
        Sge {
            addr: 0,
            len: 0,
            lkey: wqe::INVALID_LKEY,
        },
    ];
    for _ in 0..200 {
        v.push(Sge {
            addr: r.next(),
            len: r.u32(),
            lkey: r.u32(),
        });
    }
    let cmds: Vec<String> = v
        .iter()
        .map(|s| format!("data {} {} {}", s.len, s.lkey, s.addr))
        .collect();
    let Some(c) = run(&cmds) else { return };
    for (s, ans) in v.iter().zip(&c.answers) {
        let want = answer_bytes(ans, "data");
        let mut got = [0xaau8; wqe::DATA_BYTES];
        DataSeg(*s).write(&mut got);
        assert_bytes(
            &format!("DataSeg::write({s:?}) vs mlx5dv_set_data_seg"),
            &got,
            &want,
            DATA_FIELDS,
        );
        assert_eq!(DataSeg::read(&want).0, *s, "DataSeg::read");
    }
    assert!(DataSeg(v[2]).is_terminator());
    println!("{} data segments verified", v.len());
}

#[test]
fn dgram_segments_match_mlx5dv_set_dgram_seg() {
    let mut r = Rng(3);
    let mut v = vec![
        DgramSeg {
            qkey: 0x1111_2222,
            dqpn: 0x12_3456,
            rlid: 9,
            stat_rate_sl: 0,
            grh: false,
            rgid: [0; 16],
        },
        DgramSeg {
            qkey: u32::MAX,
            dqpn: 0xff_ffff,
            rlid: u16::MAX,
            stat_rate_sl: 0xff,
            grh: true,
            rgid: [0xff; 16],
        },
    ];
    for _ in 0..100 {
        let mut rgid = [0u8; 16];
        rgid.iter_mut().for_each(|b| *b = r.u8());
        let grh = r.u8() & 1 == 1;
        v.push(DgramSeg {
            qkey: r.u32(),
            dqpn: r.u32() & 0xff_ffff,
            rlid: r.u16(),
            stat_rate_sl: r.u8(),
            grh,
            rgid: if grh { rgid } else { [0; 16] },
        });
    }
    let cmds: Vec<String> = v
        .iter()
        .map(|d| {
            format!(
                "dgram {} {} {} {} {} {}",
                d.qkey,
                d.dqpn,
                d.stat_rate_sl,
                d.rlid,
                u8::from(d.grh),
                hex(&d.rgid)
            )
        })
        .collect();
    let Some(c) = run(&cmds) else { return };
    for (d, ans) in v.iter().zip(&c.answers) {
        let want = answer_bytes(ans, "dgram");
        let mut got = [0xaau8; wqe::DGRAM_BYTES];
        d.write(&mut got);
        assert_bytes(
            &format!(
                "DgramSeg::write({d:?}) vs mlx5dv_set_dgram_seg((u64)qkey << 32, dqpn, ext 1, ...)"
            ),
            &got,
            &want,
            AV_FIELDS,
        );
        assert_eq!(DgramSeg::read(&want), *d, "DgramSeg::read");
        // The hardware provider's AV conversion accepts what rdma-core builds for IB.
        let mut av = [0u8; wqe::DGRAM_BYTES];
        av.copy_from_slice(&want);
        assert_eq!(hw::dgram_from_av(&av, d.qkey, d.dqpn).unwrap(), *d);
    }
    println!("{} datagram segments verified", v.len());
}

#[test]
fn raddr_atomic_inline_match_rdma_core() {
    let mut r = Rng(4);
    let raddrs: Vec<RaddrSeg> = (0..50)
        .map(|_| RaddrSeg {
            raddr: r.next(),
            rkey: r.u32(),
        })
        .collect();
    let atomics: Vec<AtomicSeg> = (0..50)
        .map(|_| AtomicSeg {
            swap_add: r.next(),
            compare: r.next(),
        })
        .collect();
    let inlines: Vec<usize> = vec![0, 1, 12, 13, 60, 220, 1000, 0x7fff_ffff];
    let mut cmds: Vec<String> = raddrs
        .iter()
        .map(|s| format!("raddr {} {}", s.raddr, s.rkey))
        .collect();
    cmds.extend(
        atomics
            .iter()
            .map(|s| format!("atomic {} {}", s.swap_add, s.compare)),
    );
    cmds.extend(inlines.iter().map(|l| format!("inline {l}")));
    let Some(c) = run(&cmds) else { return };
    let mut answers = c.answers.iter();
    for s in &raddrs {
        let want = answer_bytes(answers.next().unwrap(), "raddr");
        let mut got = [0xaau8; wqe::RADDR_BYTES];
        s.write(&mut got);
        assert_bytes(
            &format!("RaddrSeg::write({s:?})"),
            &got,
            &want,
            RADDR_FIELDS,
        );
        assert_eq!(RaddrSeg::read(&want), *s);
    }
    for s in &atomics {
        let want = answer_bytes(answers.next().unwrap(), "atomic");
        let mut got = [0xaau8; wqe::ATOMIC_BYTES];
        s.write(&mut got);
        assert_bytes(
            &format!("AtomicSeg::write({s:?})"),
            &got,
            &want,
            ATOMIC_FIELDS,
        );
        assert_eq!(AtomicSeg::read(&want), *s);
    }
    for &len in &inlines {
        let want = answer_bytes(answers.next().unwrap(), "inline");
        if len <= 1000 {
            let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut got = vec![0xaau8; wqe::inline_seg_bytes(len)];
            wqe::write_inline(&mut got, &data);
            assert_bytes(
                &format!("write_inline header, len {len}"),
                &got[..4],
                &want,
                &[(0, "byte_count")],
            );
            assert!(wqe::is_inline(&want));
            assert_eq!(wqe::inline_len(&want), len);
            assert_eq!(&got[4..4 + len], &data[..]);
            assert!(
                got[4 + len..].iter().all(|&b| b == 0),
                "inline padding is zero"
            );
        } else {
            assert!(wqe::is_inline(&want));
            assert_eq!(wqe::inline_len(&want), len);
        }
    }
}

/// Whole WQEs: `WqeDesc::write` equals the concatenation of what rdma-core's helpers write for
/// each segment, in the PRM's order.
#[test]
fn whole_wqes_match_concatenated_rdma_core_segments() {
    let sges = [
        Sge {
            addr: 0x7f00_1234_5678,
            len: 4096,
            lkey: 0x1234,
        },
        Sge {
            addr: 0x10,
            len: 8,
            lkey: 0x99,
        },
    ];
    let ud = DgramSeg {
        qkey: 0x1111_1111,
        dqpn: 0x00_0042,
        rlid: 7,
        stat_rate_sl: 0,
        grh: false,
        rgid: [0; 16],
    };
    let remote = RaddrSeg {
        raddr: 0xdead_0000,
        rkey: 0x77,
    };
    let descs = [
        WqeDesc {
            opcode: Opcode::Send,
            flags: wqe::CQ_UPDATE,
            imm: 0,
            ud: None,
            remote: None,
            atomic: None,
            inline: &[],
            sges: &sges[..1],
        },
        WqeDesc {
            opcode: Opcode::RdmaWriteImm,
            flags: wqe::CQ_UPDATE | wqe::SOLICITED,
            imm: 0xcafe_f00d,
            ud: None,
            remote: Some(remote),
            atomic: None,
            inline: b"seventeen bytes!!",
            sges: &sges,
        },
        WqeDesc {
            opcode: Opcode::AtomicFa,
            flags: wqe::CQ_UPDATE | wqe::FENCE,
            imm: 0,
            ud: None,
            remote: Some(remote),
            atomic: Some(AtomicSeg {
                swap_add: 1,
                compare: 0,
            }),
            inline: &[],
            sges: &sges[1..],
        },
        WqeDesc {
            opcode: Opcode::Send,
            flags: 0,
            imm: 0,
            ud: Some(ud),
            remote: None,
            atomic: None,
            inline: &[],
            sges: &sges[..1],
        },
    ];
    let (pi, qpn) = (0x0102u16, 0x00ab_cdefu32);
    let mut cmds = Vec::new();
    for d in &descs {
        let imm = if d.opcode.has_imm() { d.imm } else { 0 };
        cmds.push(format!(
            "ctrl {pi} {} 0 {qpn} {} {} 0 {imm}",
            d.opcode as u8,
            d.flags,
            d.ds()
        ));
        if let Some(u) = &d.ud {
            cmds.push(format!(
                "dgram {} {} {} {} {} {}",
                u.qkey,
                u.dqpn,
                u.stat_rate_sl,
                u.rlid,
                u8::from(u.grh),
                hex(&u.rgid)
            ));
        }
        if let Some(r) = &d.remote {
            cmds.push(format!("raddr {} {}", r.raddr, r.rkey));
        }
        if let Some(a) = &d.atomic {
            cmds.push(format!("atomic {} {}", a.swap_add, a.compare));
        }
        if !d.inline.is_empty() {
            cmds.push(format!("inline {}", d.inline.len()));
        }
        for s in d.sges {
            cmds.push(format!("data {} {} {}", s.len, s.lkey, s.addr));
        }
    }
    let Some(c) = run(&cmds) else { return };
    let mut answers = c.answers.iter();
    for d in &descs {
        let mut want = Vec::new();
        let mut fields: Vec<(usize, String)> = Vec::new();
        let mut take = |tag: &str, want: &mut Vec<u8>| {
            fields.push((want.len(), tag.to_string()));
            want.extend(answer_bytes(answers.next().unwrap(), tag));
        };
        take("ctrl", &mut want);
        if d.ud.is_some() {
            take("dgram", &mut want);
        }
        if d.remote.is_some() {
            take("raddr", &mut want);
        }
        if d.atomic.is_some() {
            take("atomic", &mut want);
        }
        if !d.inline.is_empty() {
            take("inline", &mut want);
            want.extend_from_slice(d.inline);
            let pad = wqe::inline_seg_bytes(d.inline.len()) - 4 - d.inline.len();
            want.extend(std::iter::repeat_n(0u8, pad));
        }
        for _ in d.sges {
            take("data", &mut want);
        }
        let mut got = vec![0xaau8; d.ds() as usize * wqe::DS_BYTES];
        assert_eq!(d.write(&mut got, pi, qpn), d.ds());
        let f: Vec<(usize, &str)> = fields.iter().map(|(o, n)| (*o, n.as_str())).collect();
        assert_bytes(&format!("WqeDesc::write({:?})", d.opcode), &got, &want, &f);
        // And the device model's parser gets the description back from rdma-core's bytes.
        let p = wqe::parse(&want, d.ud.is_some()).expect("parse");
        assert_eq!(p.ud, d.ud);
        assert_eq!(p.remote, d.remote);
        assert_eq!(p.atomic, d.atomic);
        assert_eq!(p.inline, d.inline);
        assert_eq!(p.sges, d.sges);
    }
    // The PRM's typical ds values.
    assert_eq!(descs[0].ds(), 2, "RC SEND 1 SGE");
    assert_eq!(descs[2].ds(), 4, "atomic");
    assert_eq!(descs[3].ds(), 5, "UD SEND 1 SGE");
}

// ---------------------------------------------------------------------------------------------
// CQEs

/// Parses `cqe k=v k=v ...`.
fn cqe_answer(a: &str) -> BTreeMap<String, u64> {
    let rest = a.strip_prefix("cqe ").expect("cqe answer");
    rest.split(' ')
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

fn check_cqe(b: &[u8; cqe::CQE_BYTES], n: u32, log2: u32, c: &BTreeMap<String, u64>) {
    let d = Cqe::decode(b);
    let op_own = b[cqe::off::OP_OWN];
    let be32 = |o: usize| u32::from_be_bytes(b[o..o + 4].try_into().unwrap());
    let ctx = || format!("CQE {} (n {n}, log2 {log2})", hex(b));
    let checks: [(&str, u64); 20] = [
        ("opcode", d.opcode.into()),
        ("op_own", op_own.into()),
        ("owner", (op_own & 1).into()),
        ("se", ((op_own >> 1) & 1).into()),
        ("format", ((op_own >> 2) & 3).into()),
        ("sw_owned", cqe::sw_owned(op_own, n, log2).into()),
        ("byte_cnt", d.byte_cnt.into()),
        ("imm_inval_pkey", d.imm.into()),
        ("wqe_counter", d.wqe_counter.into()),
        ("syndrome", d.syndrome.into()),
        ("vendor_err_synd", d.vendor_syndrome.into()),
        (
            "timestamp",
            u64::from_be_bytes(
                b[cqe::off::TIMESTAMP..cqe::off::TIMESTAMP + 8]
                    .try_into()
                    .unwrap(),
            ),
        ),
        ("signature", b[cqe::off::SIGNATURE].into()),
        // Raw BE32 words at the crate's offsets = be32toh of the header's fields.
        ("flags_rqpn", be32(cqe::off::FLAGS_RQPN).into()),
        ("srqn_uidx", be32(cqe::off::SRQN_UIDX).into()),
        ("sop_drop_qpn", be32(cqe::off::SOP_DROP_QPN).into()),
        ("s_wqe_opcode_qpn", be32(cqe::off::SOP_DROP_QPN).into()),
        ("err_srqn", be32(cqe::off::SRQN_UIDX).into()),
        ("byte_cnt", be32(cqe::off::BYTE_CNT).into()),
        ("imm_inval_pkey", be32(cqe::off::IMM).into()),
    ];
    for (k, v) in checks {
        assert_eq!(
            v,
            c[k],
            "{}: `{k}` crate {v:#x} vs rdma-core {:#x}",
            ctx(),
            c[k]
        );
    }
    // Decoded sub-fields = the header's fields with the PRM's masks.
    let field = |k: &str| c[k] as u32;
    assert_eq!(d.qpn, field("sop_drop_qpn") & 0xff_ffff, "{}: qpn", ctx());
    assert_eq!(
        u32::from(d.wqe_opcode),
        field("sop_drop_qpn") >> 24,
        "{}: wqe_opcode",
        ctx()
    );
    assert_eq!(
        d.src_qpn,
        field("flags_rqpn") & 0xff_ffff,
        "{}: src_qpn",
        ctx()
    );
    assert_eq!(
        u32::from(d.grh),
        (field("flags_rqpn") >> 28) & 3,
        "{}: grh",
        ctx()
    );
    assert_eq!(d.srqn, field("srqn_uidx") & 0xff_ffff, "{}: srqn", ctx());
    assert_eq!(
        d.qpn,
        field("s_wqe_opcode_qpn") & 0xff_ffff,
        "{}: error CQE qpn",
        ctx()
    );
}

#[test]
fn cqe_fields_match_mlx5dv_get_cqe_and_be_to_h() {
    let mut r = Rng(5);
    let mut cases: Vec<([u8; 64], u32, u32)> = Vec::new();
    // Random bytes, every opcode nibble, owner/se/format bits, various ring sizes and counters.
    for i in 0..300 {
        let mut b = [0u8; 64];
        b.iter_mut().for_each(|x| *x = r.u8());
        if i % 3 == 0 {
            b[cqe::off::OP_OWN] = cqe::OP_OWN_INVALID | (r.u8() & 1);
        }
        let log2 = (r.u32() % 17).max(1);
        let n = if i % 2 == 0 {
            r.u32()
        } else {
            r.u32() % (4 << log2)
        };
        cases.push((b, n, log2));
    }
    // CQEs the device model encodes (Cqe::encode + op_own) for every opcode, read back by rdma-core.
    let opcodes = [
        CqeOpcode::Req,
        CqeOpcode::RespWrImm,
        CqeOpcode::RespSend,
        CqeOpcode::RespSendImm,
        CqeOpcode::ReqErr,
        CqeOpcode::RespErr,
    ];
    let mut encoded = Vec::new();
    for i in 0..120 {
        let op = opcodes[i % opcodes.len()];
        let err = matches!(op, CqeOpcode::ReqErr | CqeOpcode::RespErr);
        let e = Cqe {
            opcode: op as u8,
            qpn: r.u32() & 0xff_ffff,
            wqe_opcode: r.pick(&[0x08u8, 0x09, 0x0a, 0x0b, 0x10, 0x11, 0x12]),
            wqe_counter: r.u16(),
            byte_cnt: r.u32(),
            imm: r.u32(),
            src_qpn: r.u32() & 0xff_ffff,
            grh: r.u8() & 3,
            srqn: r.u32() & 0xff_ffff,
            syndrome: if err {
                r.pick(&[0x01u8, 0x04, 0x05, 0x13, 0x15, 0x16, 0x22])
            } else {
                0
            },
            vendor_syndrome: if err { r.u8() } else { 0 },
        };
        let log2 = (i as u32 % 12) + 1;
        let pi = r.u32() % (8 << log2);
        let mut b = [0xa5u8; 64];
        e.encode(&mut b);
        b[cqe::off::OP_OWN] = cqe::op_own(op, pi, log2);
        encoded.push((e, pi));
        // The consumer at the same counter owns it; the one a lap earlier does not.
        cases.push((b, pi, log2));
        cases.push((b, pi.wrapping_add(1 << log2), log2));
    }
    let cmds: Vec<String> = cases
        .iter()
        .map(|(b, n, l)| format!("cqe {} {n} {l}", hex(b)))
        .collect();
    let Some(c) = run(&cmds) else { return };
    for ((b, n, log2), ans) in cases.iter().zip(&c.answers) {
        check_cqe(b, *n, *log2, &cqe_answer(ans));
    }
    // The encoded ones: rdma-core sees exactly the fields the model meant.
    let enc_answers = &c.answers[300..];
    for (i, (e, _pi)) in encoded.iter().enumerate() {
        let own = cqe_answer(&enc_answers[2 * i]);
        let lap = cqe_answer(&enc_answers[2 * i + 1]);
        assert_eq!(
            own["sw_owned"], 1,
            "rdma-core must see CQE {e:?} as software-owned at its producer counter"
        );
        assert_eq!(lap["sw_owned"], 0, "… and not one lap later");
        assert_eq!(own["opcode"], u64::from(e.opcode));
        assert_eq!(own["format"], 0);
        assert_eq!(own["imm_inval_pkey"] as u32, e.imm);
        assert_eq!(own["byte_cnt"] as u32, e.byte_cnt);
        assert_eq!(own["wqe_counter"] as u16, e.wqe_counter);
        assert_eq!(
            own["sop_drop_qpn"] as u32,
            (u32::from(e.wqe_opcode) << 24) | e.qpn
        );
        assert_eq!(
            own["flags_rqpn"] as u32,
            (u32::from(e.grh) << 28) | e.src_qpn
        );
        assert_eq!(own["srqn_uidx"] as u32 & 0xff_ffff, e.srqn);
        assert_eq!(own["syndrome"] as u8, e.syndrome);
        assert_eq!(own["vendor_err_synd"] as u8, e.vendor_syndrome);
    }
    // The initial op_own: opcode INVALID, never software-owned.
    let mut b = [0u8; 64];
    b[cqe::off::OP_OWN] = cqe::OP_OWN_INVALID;
    assert_eq!(
        b[cqe::off::OP_OWN] >> 4,
        c.fact("const:MLX5_CQE_INVALID") as u8
    );
    println!("{} CQEs verified", cases.len());
}
