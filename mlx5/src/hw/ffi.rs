//! Raw declarations for the parts of rdma-core v44 (`<infiniband/verbs.h>`,
//! `<infiniband/mlx5dv.h>`, x86-64) that the hardware provider calls.
//!
//! Only the structs passed by pointer are declared, with the exact v44 layout; objects the
//! provider only hands back to rdma-core (`ibv_context`, `ibv_pd`, `ibv_cq`, `ibv_srq`,
//! `ibv_ah`, `ibv_device`, `ibv_comp_channel`) are opaque. Of `ibv_qp` only the documented
//! prefix up to `qp_type` is declared (the provider reads `qp_num`); `ibv_mr` is declared in
//! full (7 public fields; the provider reads `lkey`/`rkey`).
//!
//! Every offset and size here is compared with the installed headers by
//! `mlx5/tests/conformance.rs` (a C harness printing `offsetof`/`sizeof`), so this module is
//! public for that test; nothing else should need it.
#![allow(non_camel_case_types, missing_docs)]

use std::ffi::{c_char, c_int, c_void};

/// Opaque `struct ibv_device`.
#[repr(C)]
pub struct ibv_device {
    _opaque: [u8; 0],
}
/// Opaque `struct ibv_context`.
#[repr(C)]
pub struct ibv_context {
    _opaque: [u8; 0],
}
/// Opaque `struct ibv_pd`.
#[repr(C)]
pub struct ibv_pd {
    _opaque: [u8; 0],
}
/// Opaque `struct ibv_cq` (the CQN comes from `mlx5dv_cq`).
#[repr(C)]
pub struct ibv_cq {
    _opaque: [u8; 0],
}
/// Opaque `struct ibv_srq` (the SRQN comes from `mlx5dv_srq`).
#[repr(C)]
pub struct ibv_srq {
    _opaque: [u8; 0],
}
/// Opaque `struct ibv_ah`.
#[repr(C)]
pub struct ibv_ah {
    _opaque: [u8; 0],
}
/// Opaque `struct ibv_comp_channel`.
#[repr(C)]
pub struct ibv_comp_channel {
    _opaque: [u8; 0],
}

/// `union ibv_gid` (16 bytes; 8-byte aligned because of its `__be64` view).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

/// `struct ibv_mr` (complete: 48 bytes).
#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// The documented prefix of `struct ibv_qp` (the rest — mutex, cond, events_completed — is
/// never touched, so never declared; only offsets are checked, not the size).
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
    pub state: u32,
    pub qp_type: u32,
}

/// `struct ibv_port_attr` (52 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_port_attr {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// Bytes of `ibv_port_attr` the exported `ibv_query_port` symbol fills: it takes the
/// `struct _compat_ibv_port_attr` of libibverbs (the v44 layout up to and including `flags`),
/// so `port_cap_flags2` stays as initialised (zero). `lid`, `link_layer`, `state` and
/// `active_mtu` are all inside.
pub const COMPAT_PORT_ATTR_BYTES: usize = 48;

/// `struct ibv_device_attr` (232 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: u32,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: u32,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

impl Default for ibv_device_attr {
    fn default() -> Self {
        // SAFETY: plain integers and a char array; all-zero is a valid value.
        unsafe { std::mem::zeroed() }
    }
}

/// `struct ibv_qp_cap` (20 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr` (64 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

/// `struct ibv_global_route` (24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr` (144 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_qp_attr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_srq_attr` (12 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr` (24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}

/// `struct mlx5dv_qp` (96 bytes): what `mlx5dv_init_obj` reports for a QP.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mlx5dv_qp {
    pub dbrec: *mut u32,
    pub sq: mlx5dv_qp_wq,
    pub rq: mlx5dv_qp_wq,
    pub bf: mlx5dv_qp_bf,
    pub comp_mask: u64,
    pub uar_mmap_offset: i64,
    pub tirn: u32,
    pub tisn: u32,
    pub rqn: u32,
    pub sqn: u32,
    pub tir_icm_addr: u64,
}

/// The anonymous `sq` / `rq` member of `struct mlx5dv_qp`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mlx5dv_qp_wq {
    pub buf: *mut c_void,
    pub wqe_cnt: u32,
    pub stride: u32,
}

/// The anonymous `bf` member of `struct mlx5dv_qp`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mlx5dv_qp_bf {
    pub reg: *mut c_void,
    pub size: u32,
}

/// `struct mlx5dv_cq` (48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mlx5dv_cq {
    pub buf: *mut c_void,
    pub dbrec: *mut u32,
    pub cqe_cnt: u32,
    pub cqe_size: u32,
    pub cq_uar: *mut c_void,
    pub cqn: u32,
    pub comp_mask: u64,
}

/// `struct mlx5dv_srq` (48 bytes). `comp_mask` is in/out: ask for
/// [`MLX5DV_SRQ_MASK_SRQN`] to get `srqn`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mlx5dv_srq {
    pub buf: *mut c_void,
    pub dbrec: *mut u32,
    pub stride: u32,
    pub head: u32,
    pub tail: u32,
    pub comp_mask: u64,
    pub srqn: u32,
}

/// `struct mlx5dv_ah` (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mlx5dv_ah {
    pub av: *mut mlx5_wqe_av,
    pub comp_mask: u64,
}

/// One `{ in, out }` member of `struct mlx5dv_obj`.
#[repr(C)]
pub struct mlx5dv_obj_pair<I, O> {
    pub r#in: *mut I,
    pub out: *mut O,
}

/// `struct mlx5dv_obj` (112 bytes). Members this crate never asks for are typed `c_void`.
#[repr(C)]
pub struct mlx5dv_obj {
    pub qp: mlx5dv_obj_pair<ibv_qp, mlx5dv_qp>,
    pub cq: mlx5dv_obj_pair<ibv_cq, mlx5dv_cq>,
    pub srq: mlx5dv_obj_pair<ibv_srq, mlx5dv_srq>,
    pub rwq: mlx5dv_obj_pair<c_void, c_void>,
    pub dm: mlx5dv_obj_pair<c_void, c_void>,
    pub ah: mlx5dv_obj_pair<ibv_ah, mlx5dv_ah>,
    pub pd: mlx5dv_obj_pair<c_void, c_void>,
}

impl Default for mlx5dv_obj {
    fn default() -> Self {
        // SAFETY: raw pointers only; all-null is valid (and what rdma-core expects for the
        // members not requested).
        unsafe { std::mem::zeroed() }
    }
}

/// `struct mlx5_wqe_av` (48 bytes): the address vector of an address handle (read through
/// `mlx5dv_ah.av`), the same bytes as a UD WQE's datagram segment. `key` is the
/// `union { struct { __be32 qkey; __be32 reserved; } qkey; __be64 dc_key; }` in memory order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct mlx5_wqe_av {
    pub key: [u32; 2],
    pub dqp_dct: u32,
    pub stat_rate_sl: u8,
    pub fl_mlid: u8,
    pub rlid: u16,
    pub reserved0: [u8; 4],
    pub rmac: [u8; 6],
    pub tclass: u8,
    pub hop_limit: u8,
    pub grh_gid_fl: u32,
    pub rgid: [u8; 16],
    _align: [u64; 0],
}

// ---- constants (verbs.h / mlx5dv.h enums) ----

pub const IBV_QPS_RESET: u32 = 0;
pub const IBV_QPS_INIT: u32 = 1;
pub const IBV_QPS_RTR: u32 = 2;
pub const IBV_QPS_RTS: u32 = 3;

pub const IBV_QPT_RC: u32 = 2;
pub const IBV_QPT_UD: u32 = 4;

pub const IBV_MTU_256: u32 = 1;
pub const IBV_MTU_512: u32 = 2;
pub const IBV_MTU_1024: u32 = 3;
pub const IBV_MTU_2048: u32 = 4;
pub const IBV_MTU_4096: u32 = 5;

pub const IBV_PORT_ACTIVE: u32 = 4;
pub const IBV_LINK_LAYER_UNSPECIFIED: u8 = 0;
pub const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

pub const IBV_ACCESS_LOCAL_WRITE: u32 = 1;
pub const IBV_ACCESS_REMOTE_WRITE: u32 = 1 << 1;
pub const IBV_ACCESS_REMOTE_READ: u32 = 1 << 2;
pub const IBV_ACCESS_REMOTE_ATOMIC: u32 = 1 << 3;

pub const IBV_QP_STATE: c_int = 1 << 0;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_QKEY: c_int = 1 << 6;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;

pub const MLX5DV_OBJ_QP: u64 = 1 << 0;
pub const MLX5DV_OBJ_CQ: u64 = 1 << 1;
pub const MLX5DV_OBJ_SRQ: u64 = 1 << 2;
pub const MLX5DV_OBJ_AH: u64 = 1 << 5;
pub const MLX5DV_SRQ_MASK_SRQN: u64 = 1 << 0;

/// `mlx5_wqe_av.grh_gid_fl` bit 30: a GRH is present.
pub const MLX5_AV_GRH: u32 = 1 << 30;

// ---- function signatures (the exported symbols' real prototypes) ----

pub type ibv_get_device_list_fn =
    unsafe extern "C" fn(num_devices: *mut c_int) -> *mut *mut ibv_device;
pub type ibv_free_device_list_fn = unsafe extern "C" fn(list: *mut *mut ibv_device);
pub type ibv_get_device_name_fn = unsafe extern "C" fn(device: *mut ibv_device) -> *const c_char;
pub type ibv_open_device_fn = unsafe extern "C" fn(device: *mut ibv_device) -> *mut ibv_context;
pub type ibv_close_device_fn = unsafe extern "C" fn(context: *mut ibv_context) -> c_int;
pub type ibv_query_device_fn =
    unsafe extern "C" fn(context: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int;
/// The exported `ibv_query_port@@IBVERBS_1.1`, whose third parameter is really a
/// `struct _compat_ibv_port_attr *` (see [`COMPAT_PORT_ATTR_BYTES`]).
pub type ibv_query_port_fn = unsafe extern "C" fn(
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut ibv_port_attr,
) -> c_int;
pub type ibv_query_gid_fn = unsafe extern "C" fn(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int;
pub type ibv_alloc_pd_fn = unsafe extern "C" fn(context: *mut ibv_context) -> *mut ibv_pd;
pub type ibv_dealloc_pd_fn = unsafe extern "C" fn(pd: *mut ibv_pd) -> c_int;
/// The exported `ibv_reg_mr@@IBVERBS_1.1` (`int access`), which the header's `ibv_reg_mr`
/// macro calls when no optional access flag is used — the case here.
pub type ibv_reg_mr_fn = unsafe extern "C" fn(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr;
pub type ibv_dereg_mr_fn = unsafe extern "C" fn(mr: *mut ibv_mr) -> c_int;
pub type ibv_create_cq_fn = unsafe extern "C" fn(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq;
pub type ibv_destroy_cq_fn = unsafe extern "C" fn(cq: *mut ibv_cq) -> c_int;
pub type ibv_create_srq_fn =
    unsafe extern "C" fn(pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> *mut ibv_srq;
pub type ibv_destroy_srq_fn = unsafe extern "C" fn(srq: *mut ibv_srq) -> c_int;
pub type ibv_create_qp_fn =
    unsafe extern "C" fn(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp;
pub type ibv_modify_qp_fn =
    unsafe extern "C" fn(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, attr_mask: c_int) -> c_int;
pub type ibv_destroy_qp_fn = unsafe extern "C" fn(qp: *mut ibv_qp) -> c_int;
pub type ibv_create_ah_fn =
    unsafe extern "C" fn(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah;
pub type ibv_destroy_ah_fn = unsafe extern "C" fn(ah: *mut ibv_ah) -> c_int;
pub type mlx5dv_init_obj_fn = unsafe extern "C" fn(obj: *mut mlx5dv_obj, obj_type: u64) -> c_int;
pub type mlx5dv_is_supported_fn = unsafe extern "C" fn(device: *mut ibv_device) -> bool;
