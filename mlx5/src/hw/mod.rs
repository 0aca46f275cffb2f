//! rdma-core hardware provider: ConnectX (mlx5) devices through `libibverbs.so.1` and
//! `libmlx5.so.1`, both opened with `dlopen` at run time (no build or link dependency).
//!
//! rdma-core creates the objects (PD, MR, CQ, SRQ, QP, AH) and moves QPs through their states;
//! `mlx5dv_init_obj` then hands over the queue memory — WQE/CQE buffers, doorbell records and
//! the BlueFlame register — which the driver ([`crate::sq`], [`crate::rq`], [`crate::srq`],
//! [`crate::cq`]) uses exactly as with the software device model. The send doorbell is
//! [`Doorbell::Mmio`]: the driver stores the doorbell record and then writes the WQE to the
//! BlueFlame register itself.
//!
//! # What this machine needs
//! The `libibverbs1` and `ibverbs-providers` packages (rdma-core) and an mlx5 device with an
//! active port. Without any of them, [`open`] returns [`Error::NoDevice`] naming what is
//! missing (library, symbol, kernel support, device, port); it never panics.
//!
//! # Symbols (rdma-core v44, checked with `nm -D`)
//! `dlsym` by plain name returns a symbol's default version: `ibv_*@@IBVERBS_1.1` and
//! `mlx5dv_init_obj@@MLX5_1.2`, `mlx5dv_is_supported@@MLX5_1.8` (optional). Two functions of
//! `verbs.h` are not what they seem:
//! - `ibv_query_port` is a macro around the static inline `___ibv_query_port`, which calls the
//!   provider's extended `query_port` when it can and otherwise the exported
//!   `ibv_query_port@@IBVERBS_1.1`. The exported symbol takes a
//!   `struct _compat_ibv_port_attr *`: `ibv_port_attr` up to and including `flags` (48 of its
//!   52 bytes). This provider calls the exported symbol with a zeroed full `ibv_port_attr`;
//!   every field it reads (`state`, `active_mtu`, `lid`, `link_layer`) is in the prefix.
//! - `ibv_reg_mr` is a macro around the inline `__ibv_reg_mr`, which calls the exported
//!   `ibv_reg_mr@@IBVERBS_1.1(pd, addr, length, int access)` unless an access flag from
//!   `IBV_ACCESS_OPTIONAL_RANGE` is used (then `ibv_reg_mr_iova2`). [`Access`] has no optional
//!   flags, so the exported `ibv_reg_mr` is exactly what the macro would call.
//!
//! # Choices and limits
//! - CQs must have 64-byte CQEs (rdma-core's default; `MLX5_CQE_SIZE=128` in the environment
//!   makes [`Provider::create_cq`] fail with a message) because the driver reads 64-byte
//!   entries. rdma-core initialises every `op_own` to 0xF0.
//! - The SQ stride must be 64 (one WQEBB), which mlx5 always uses.
//! - SRQ: `mlx5dv_srq` has no WQE count; [`SrqMem::ring`]'s [`RqMem::wqe_cnt`] is `tail + 1`, the WQEs of
//!   rdma-core's free list (`head` = 0, `next_wqe_index` of WQE `i` = `i + 1` for `i < tail`).
//!   rdma-core itself keeps one of them unposted (its "SRQ full" test is `head == tail`); the
//!   WQEs after `tail` (its ODP wait queue) are not handed over.
//! - RC over RoCE uses a GRH with GID index 0 and hop limit 64; the path MTU is the smaller of
//!   [`RcParams::mtu`] and the port's active MTU; `min_rnr_timer` is 12 (0.64 ms);
//!   `max_rd_atomic` is clamped to the device's `max_qp_rd_atom` / `max_qp_init_rd_atom`.
//! - UD address vectors come from the address handle itself (`mlx5dv_init_obj` with
//!   `MLX5DV_OBJ_AH`), converted to a [`DgramSeg`]. On InfiniBand that is exact (LID, SL, no
//!   GRH). A RoCE address vector also needs the destination MAC, hop limit and UDP source port,
//!   which [`DgramSeg`] cannot carry, so [`Provider::create_ah`] refuses RoCE destinations.
//! - Destroying a QP makes rdma-core "clean" its CQs (and SRQ) with rdma-core's own consumer
//!   index, which the driver never advances. Destroy a QP only when its CQs are idle (or about
//!   to be destroyed too).
//! - BlueFlame registers may be shared between QPs of one context by rdma-core; the driver's
//!   per-QP `offset` toggling is what UCX and other direct-verbs users do.

pub mod ffi;
mod loader;

use std::ffi::{CStr, c_int, c_void};
use std::ptr::NonNull;
use std::sync::Arc;

pub use loader::LibraryNames;
use loader::Libs;

use self::ffi::*;
use crate::error::{Error, Result};
use crate::queue::{BlueFlame, CqMem, Doorbell, RqMem, SqMem, SrqMem};
use crate::verbs::{
    Access, Context, Handle, LinkLayer, PortInfo, Provider, QpInit, QpType, RcParams, RcRemote,
    UdDest,
};
use crate::wqe::{DGRAM_BYTES, DgramSeg, WQEBB};

/// `min_rnr_timer` used for RC QPs (IB encoding 12 = 0.64 ms).
pub const MIN_RNR_TIMER: u8 = 12;
/// Hop limit of the GRH of RoCE connections.
pub const ROCE_HOP_LIMIT: u8 = 64;

/// `ibv_modify_qp` attribute masks of each QP transition, exactly the table "QP transitions"
/// of `mlx5-prm.md` (compared with the header's enum by `tests/conformance.rs`).
pub mod qp_masks {
    use super::ffi::*;
    use std::ffi::c_int;

    /// RC RESET→INIT.
    pub const RC_RESET_INIT: c_int =
        IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    /// RC INIT→RTR.
    pub const RC_INIT_RTR: c_int = IBV_QP_STATE
        | IBV_QP_AV
        | IBV_QP_PATH_MTU
        | IBV_QP_DEST_QPN
        | IBV_QP_RQ_PSN
        | IBV_QP_MAX_DEST_RD_ATOMIC
        | IBV_QP_MIN_RNR_TIMER;
    /// RC RTR→RTS.
    pub const RC_RTR_RTS: c_int = IBV_QP_STATE
        | IBV_QP_TIMEOUT
        | IBV_QP_RETRY_CNT
        | IBV_QP_RNR_RETRY
        | IBV_QP_SQ_PSN
        | IBV_QP_MAX_QP_RD_ATOMIC;
    /// UD RESET→INIT.
    pub const UD_RESET_INIT: c_int = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
    /// UD INIT→RTR.
    pub const UD_INIT_RTR: c_int = IBV_QP_STATE;
    /// UD RTR→RTS.
    pub const UD_RTR_RTS: c_int = IBV_QP_STATE | IBV_QP_SQ_PSN;
}

/// An RDMA device as `ibv_get_device_list` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Kernel device name (`mlx5_0`).
    pub name: String,
    /// Whether `libmlx5` drives it (`mlx5dv_is_supported`; `true` when that function is absent).
    pub mlx5: bool,
}

/// Opens `device` (or the first mlx5 device) and uses `port` (1-based).
///
/// # Errors
/// [`Error::NoDevice`] naming what is missing: a library ("libibverbs.so.1 could not be loaded:
/// …"), a symbol, kernel support ("ibv_get_device_list returned no devices (errno ENOSYS: no
/// RDMA support in this kernel)"), the device ("device mlx5_3 not found; available: …"), or the
/// port ("port 2 of mlx5_0 not active (state DOWN)"). [`Error::Verbs`] for a failing query.
pub fn open(device: Option<&str>, port: u8) -> Result<Context> {
    // SAFETY: the sonames of rdma-core's own packages.
    unsafe { open_with_libraries(LibraryNames::DEFAULT, device, port) }
}

/// [`open`] with other library names (tests simulate a machine without rdma-core with a
/// nonexistent name).
///
/// # Safety
/// Loading a library runs its initialisers, and the symbols found are called with rdma-core's
/// signatures (`infiniband/verbs.h`, `infiniband/mlx5dv.h`): each name that loads must be
/// rdma-core's libibverbs (ABI of [`crate::hw::ffi`]) or libmlx5, or a library without those
/// symbols (the open then fails with [`Error::NoDevice`]).
///
/// # Errors
/// As [`open`].
pub unsafe fn open_with_libraries(
    names: LibraryNames<'_>,
    device: Option<&str>,
    port: u8,
) -> Result<Context> {
    let libs = Arc::new(Libs::load(names)?);
    let dev = DeviceCtx::open(libs, device, port)?;
    Ok(Context::new(Arc::new(HwProvider { dev: Arc::new(dev) })))
}

/// Lists the RDMA devices.
///
/// # Errors
/// [`Error::NoDevice`] as for [`open`] when the libraries, the kernel support or any device
/// are missing.
pub fn list_devices() -> Result<Vec<DeviceInfo>> {
    // SAFETY: the sonames of rdma-core's own packages.
    unsafe { list_devices_with_libraries(LibraryNames::DEFAULT) }
}

/// [`list_devices`] with other library names.
///
/// # Safety
/// As [`open_with_libraries`].
///
/// # Errors
/// As [`list_devices`].
pub unsafe fn list_devices_with_libraries(names: LibraryNames<'_>) -> Result<Vec<DeviceInfo>> {
    let libs = Libs::load(names)?;
    let list = DeviceList::get(&libs)?;
    Ok(list.entries().into_iter().map(|(_, info)| info).collect())
}

// ---------------------------------------------------------------------------------------------
// errno helpers

fn errno_name(e: i32) -> &'static str {
    match e {
        libc::ENOSYS => "ENOSYS",
        libc::ENOMEM => "ENOMEM",
        libc::EPERM => "EPERM",
        libc::EACCES => "EACCES",
        libc::ENODEV => "ENODEV",
        libc::ENOENT => "ENOENT",
        libc::EINVAL => "EINVAL",
        libc::ENXIO => "ENXIO",
        _ => "errno",
    }
}

/// The error of a call that returned NULL and set `errno`.
fn null_err(call: &'static str) -> Error {
    Error::Verbs {
        call,
        source: std::io::Error::last_os_error(),
    }
}

/// Maps an `int` return: 0 is success; v44 returns a positive errno, older versions -1 with
/// `errno` set (or a negative errno).
fn rc_result(call: &'static str, rc: c_int) -> Result<()> {
    match rc {
        0 => Ok(()),
        -1 => Err(null_err(call)),
        rc => Err(Error::Verbs {
            call,
            source: std::io::Error::from_raw_os_error(rc.abs()),
        }),
    }
}

/// Logs a failed destroy call (from `Drop`, where errors cannot be returned).
fn log_destroy(call: &'static str, rc: c_int) {
    if let Err(e) = rc_result(call, rc) {
        tracing::warn!("{e} (object leaked)");
    }
}

// ---------------------------------------------------------------------------------------------
// device list

/// `ibv_get_device_list` result, freed on drop.
struct DeviceList<'a> {
    libs: &'a Libs,
    list: NonNull<*mut ibv_device>,
    n: usize,
}

impl<'a> DeviceList<'a> {
    fn get(libs: &'a Libs) -> Result<Self> {
        let mut n: c_int = 0;
        // SAFETY: `ibv_get_device_list(int *)` writes the count and returns a NULL-terminated
        // array (or NULL with errno).
        let list = unsafe { (libs.get_device_list)(&mut n) };
        let Some(list) = NonNull::new(list) else {
            let err = std::io::Error::last_os_error();
            let code = err.raw_os_error().unwrap_or(0);
            let why = if code == libc::ENOSYS {
                "no RDMA support in this kernel".to_string()
            } else {
                err.to_string()
            };
            return Err(Error::NoDevice {
                reason: format!(
                    "ibv_get_device_list returned no devices (errno {}: {why})",
                    errno_name(code)
                ),
            });
        };
        let list = DeviceList {
            libs,
            list,
            n: usize::try_from(n).unwrap_or(0),
        };
        if list.n == 0 {
            return Err(Error::NoDevice {
                reason: "ibv_get_device_list returned no devices (the kernel supports RDMA but no device is present)"
                    .into(),
            });
        }
        Ok(list)
    }

    /// The devices with their names and whether they are mlx5 devices.
    fn entries(&self) -> Vec<(NonNull<ibv_device>, DeviceInfo)> {
        (0..self.n)
            .filter_map(|i| {
                // SAFETY: the array holds `n` valid device pointers (then NULL).
                let dev = NonNull::new(unsafe { *self.list.as_ptr().add(i) })?;
                // SAFETY: a device of the list; the name is a NUL-terminated string inside it.
                let name = unsafe { CStr::from_ptr((self.libs.get_device_name)(dev.as_ptr())) }
                    .to_string_lossy()
                    .into_owned();
                let mlx5 = match self.libs.is_supported {
                    // SAFETY: `mlx5dv_is_supported(struct ibv_device *)` on a listed device.
                    Some(f) => unsafe { f(dev.as_ptr()) },
                    None => true,
                };
                Some((dev, DeviceInfo { name, mlx5 }))
            })
            .collect()
    }
}

impl Drop for DeviceList<'_> {
    fn drop(&mut self) {
        // SAFETY: the list came from `ibv_get_device_list` and is freed once. Opened devices
        // stay valid (documented by rdma-core).
        unsafe { (self.libs.free_device_list)(self.list.as_ptr()) }
    }
}

// ---------------------------------------------------------------------------------------------
// device context

/// An open device: the libraries, the `ibv_context` and what was queried at open time.
/// Closed when the last object created on it is gone (every object holds an `Arc` to it).
struct DeviceCtx {
    libs: Arc<Libs>,
    ctx: NonNull<ibv_context>,
    name: String,
    port: PortInfo,
    /// `min(max_qp_rd_atom, max_qp_init_rd_atom)` of the device.
    max_rd_atomic: u8,
}

// SAFETY: an `ibv_context` may be used from any thread (libibverbs and libmlx5 lock
// internally); this type only passes the pointer to rdma-core calls.
unsafe impl Send for DeviceCtx {}
// SAFETY: as above; no interior mutability on the Rust side.
unsafe impl Sync for DeviceCtx {}

impl Drop for DeviceCtx {
    fn drop(&mut self) {
        // SAFETY: opened by `ibv_open_device`, closed once, after every object created on it
        // (they all hold an `Arc<DeviceCtx>`).
        log_destroy("ibv_close_device", unsafe {
            (self.libs.close_device)(self.ctx.as_ptr())
        });
    }
}

fn mtu_bytes(enum_value: u32) -> u32 {
    match enum_value {
        IBV_MTU_256..=IBV_MTU_4096 => 128 << enum_value,
        _ => 256,
    }
}

fn mtu_enum(bytes: u32) -> Result<u32> {
    Ok(match bytes {
        256 => IBV_MTU_256,
        512 => IBV_MTU_512,
        1024 => IBV_MTU_1024,
        2048 => IBV_MTU_2048,
        4096 => IBV_MTU_4096,
        _ => {
            return Err(Error::InvalidArgument(format!(
                "path MTU {bytes} is not one of 256, 512, 1024, 2048, 4096"
            )));
        }
    })
}

fn port_state_name(s: u32) -> &'static str {
    match s {
        0 => "NOP",
        1 => "DOWN",
        2 => "INIT",
        3 => "ARMED",
        4 => "ACTIVE",
        5 => "ACTIVE_DEFER",
        _ => "unknown",
    }
}

impl DeviceCtx {
    fn open(libs: Arc<Libs>, device: Option<&str>, port: u8) -> Result<DeviceCtx> {
        let list = DeviceList::get(&libs)?;
        let entries = list.entries();
        let names = || {
            entries
                .iter()
                .map(|(_, i)| i.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let (dev, info) = match device {
            Some(want) => {
                let Some((dev, info)) = entries.iter().find(|(_, i)| i.name == want) else {
                    return Err(Error::NoDevice {
                        reason: format!("device {want} not found; available: {}", names()),
                    });
                };
                if !info.mlx5 {
                    return Err(Error::NoDevice {
                        reason: format!(
                            "device {want} is not an mlx5 device (mlx5dv_is_supported returned false)"
                        ),
                    });
                }
                (*dev, info.clone())
            }
            None => match entries.iter().find(|(_, i)| i.mlx5) {
                Some((dev, info)) => (*dev, info.clone()),
                None => {
                    return Err(Error::NoDevice {
                        reason: format!("no mlx5 device among the RDMA devices: {}", names()),
                    });
                }
            },
        };
        // SAFETY: a device of the live list; opening keeps it valid after the list is freed.
        let ctx = unsafe { (libs.open_device)(dev.as_ptr()) };
        let Some(ctx) = NonNull::new(ctx) else {
            return Err(Error::NoDevice {
                reason: format!(
                    "ibv_open_device({}) failed: {}",
                    info.name,
                    std::io::Error::last_os_error()
                ),
            });
        };
        drop(list);
        // From here on `DeviceCtx::drop` closes the context on every error path.
        let mut dev = DeviceCtx {
            libs,
            ctx,
            name: info.name,
            port: PortInfo {
                port,
                lid: 0,
                link_layer: LinkLayer::InfiniBand,
                active_mtu: 256,
                gid: [0; 16],
            },
            max_rd_atomic: 1,
        };
        let attr = dev.query_device()?;
        if port == 0 || port > attr.phys_port_cnt {
            return Err(Error::NoDevice {
                reason: format!(
                    "port {port} does not exist on {} (it has {} port(s), numbered from 1)",
                    dev.name, attr.phys_port_cnt
                ),
            });
        }
        dev.max_rd_atomic = attr
            .max_qp_rd_atom
            .min(attr.max_qp_init_rd_atom)
            .clamp(1, 255) as u8;
        let pa = dev.query_port(port)?;
        if pa.state != IBV_PORT_ACTIVE {
            return Err(Error::NoDevice {
                reason: format!(
                    "port {port} of {} not active (state {})",
                    dev.name,
                    port_state_name(pa.state)
                ),
            });
        }
        let link_layer = if pa.link_layer == IBV_LINK_LAYER_ETHERNET {
            LinkLayer::Ethernet
        } else {
            LinkLayer::InfiniBand
        };
        let gid = match dev.query_gid(port, 0) {
            Ok(g) => g,
            // InfiniBand addresses by LID; the GID is informational there.
            Err(_) if link_layer == LinkLayer::InfiniBand => [0; 16],
            Err(e) => return Err(e),
        };
        dev.port = PortInfo {
            port,
            lid: pa.lid,
            link_layer,
            active_mtu: mtu_bytes(pa.active_mtu),
            gid,
        };
        Ok(dev)
    }

    fn query_device(&self) -> Result<ibv_device_attr> {
        let mut attr = ibv_device_attr::default();
        // SAFETY: open context; `attr` is a full `ibv_device_attr`.
        let rc = unsafe { (self.libs.query_device)(self.ctx.as_ptr(), &mut attr) };
        rc_result("ibv_query_device", rc)?;
        Ok(attr)
    }

    fn query_port(&self, port: u8) -> Result<ibv_port_attr> {
        let mut attr = ibv_port_attr::default();
        // SAFETY: open context; the exported symbol writes COMPAT_PORT_ATTR_BYTES (48) bytes,
        // and `attr` is the full 52-byte `ibv_port_attr` (module docs, "Symbols").
        let rc = unsafe { (self.libs.query_port)(self.ctx.as_ptr(), port, &mut attr) };
        rc_result("ibv_query_port", rc)?;
        Ok(attr)
    }

    fn query_gid(&self, port: u8, index: c_int) -> Result<[u8; 16]> {
        let mut gid = ibv_gid::default();
        // SAFETY: open context; `gid` is a `union ibv_gid`.
        let rc = unsafe { (self.libs.query_gid)(self.ctx.as_ptr(), port, index, &mut gid) };
        rc_result("ibv_query_gid", rc)?;
        Ok(gid.raw)
    }

    /// `mlx5dv_init_obj(obj, types)`.
    fn init_obj(&self, obj: &mut mlx5dv_obj, types: u64) -> Result<()> {
        // SAFETY: the `in` members named by `types` are live objects of this context and the
        // `out` members point to structs of the declared v44 layout.
        let rc = unsafe { (self.libs.init_obj)(obj, types) };
        rc_result("mlx5dv_init_obj", rc)
    }
}

// ---------------------------------------------------------------------------------------------
// objects (the `Handle`s): each destroys its rdma-core object on drop and keeps alive, through
// `Arc`s, every object it depends on (context, PD, CQs, SRQ), so destruction order is always
// valid whatever order the user drops things in.

struct PdObj {
    dev: Arc<DeviceCtx>,
    pd: NonNull<ibv_pd>,
}

impl Drop for PdObj {
    fn drop(&mut self) {
        // SAFETY: allocated by `ibv_alloc_pd`; every MR/SRQ/QP/AH of it holds an Arc to this.
        log_destroy("ibv_dealloc_pd", unsafe {
            (self.dev.libs.dealloc_pd)(self.pd.as_ptr())
        });
    }
}

/// Protection domain handle.
#[derive(Clone)]
struct HwPd(Arc<PdObj>);

struct HwMr {
    pd: Arc<PdObj>,
    mr: NonNull<ibv_mr>,
}

impl Drop for HwMr {
    fn drop(&mut self) {
        // SAFETY: registered by `ibv_reg_mr`, deregistered once.
        log_destroy("ibv_dereg_mr", unsafe {
            (self.pd.dev.libs.dereg_mr)(self.mr.as_ptr())
        });
    }
}

struct CqObj {
    dev: Arc<DeviceCtx>,
    cq: NonNull<ibv_cq>,
}

impl Drop for CqObj {
    fn drop(&mut self) {
        // SAFETY: created by `ibv_create_cq`; every QP using it holds an Arc to this.
        log_destroy("ibv_destroy_cq", unsafe {
            (self.dev.libs.destroy_cq)(self.cq.as_ptr())
        });
    }
}

/// Completion queue handle.
struct HwCq(Arc<CqObj>);

struct SrqObj {
    pd: Arc<PdObj>,
    srq: NonNull<ibv_srq>,
}

impl Drop for SrqObj {
    fn drop(&mut self) {
        // SAFETY: created by `ibv_create_srq`; every QP using it holds an Arc to this.
        log_destroy("ibv_destroy_srq", unsafe {
            (self.pd.dev.libs.destroy_srq)(self.srq.as_ptr())
        });
    }
}

/// Shared receive queue handle.
struct HwSrq(Arc<SrqObj>);

/// Queue pair handle.
struct HwQp {
    qp: NonNull<ibv_qp>,
    qp_type: QpType,
    pd: Arc<PdObj>,
    _send_cq: Arc<CqObj>,
    _recv_cq: Arc<CqObj>,
    _srq: Option<Arc<SrqObj>>,
}

impl Drop for HwQp {
    fn drop(&mut self) {
        // SAFETY: created by `ibv_create_qp`, destroyed once, before its CQs/SRQ/PD (the
        // fields are dropped after this).
        log_destroy("ibv_destroy_qp", unsafe {
            (self.pd.dev.libs.destroy_qp)(self.qp.as_ptr())
        });
    }
}

/// Address handle.
struct HwAh {
    pd: Arc<PdObj>,
    ah: NonNull<ibv_ah>,
}

impl Drop for HwAh {
    fn drop(&mut self) {
        // SAFETY: created by `ibv_create_ah`, destroyed once.
        log_destroy("ibv_destroy_ah", unsafe {
            (self.pd.dev.libs.destroy_ah)(self.ah.as_ptr())
        });
    }
}

// SAFETY: (all handle types below) rdma-core objects may be used and destroyed from any
// thread; the handles only pass their pointers back to rdma-core and have no Rust-side
// mutability.
unsafe impl Send for PdObj {}
// SAFETY: see above.
unsafe impl Sync for PdObj {}
// SAFETY: see above.
unsafe impl Send for HwMr {}
// SAFETY: see above.
unsafe impl Sync for HwMr {}
// SAFETY: see above.
unsafe impl Send for CqObj {}
// SAFETY: see above.
unsafe impl Sync for CqObj {}
// SAFETY: see above.
unsafe impl Send for SrqObj {}
// SAFETY: see above.
unsafe impl Sync for SrqObj {}
// SAFETY: see above.
unsafe impl Send for HwQp {}
// SAFETY: see above.
unsafe impl Sync for HwQp {}
// SAFETY: see above.
unsafe impl Send for HwAh {}
// SAFETY: see above.
unsafe impl Sync for HwAh {}

fn downcast<'a, T: 'static>(h: &'a Handle, what: &str) -> Result<&'a T> {
    h.downcast_ref::<T>().ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{what} handle was not created by the rdma-core provider"
        ))
    })
}

fn nonnull<T>(p: *mut T, what: &str) -> Result<NonNull<T>> {
    NonNull::new(p)
        .ok_or_else(|| Error::InvalidArgument(format!("mlx5dv_init_obj returned a NULL {what}")))
}

/// Converts an address handle's address vector (bytes of `struct mlx5_wqe_av`) into the
/// [`DgramSeg`] for `dest`, refusing fields [`DgramSeg`] cannot represent.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the field (RoCE vectors: MAC, hop limit, UDP port).
pub fn dgram_from_av(av: &[u8; DGRAM_BYTES], qkey: u32, dqpn: u32) -> Result<DgramSeg> {
    use std::mem::offset_of;
    let o_fl = offset_of!(mlx5_wqe_av, fl_mlid);
    let o_res = offset_of!(mlx5_wqe_av, reserved0);
    let o_grh = offset_of!(mlx5_wqe_av, grh_gid_fl);
    let grh_gid_fl = u32::from_be_bytes(av[o_grh..o_grh + 4].try_into().expect("4 bytes"));
    let unsupported = if av[o_fl] != 0 {
        Some("fl_mlid (source path bits / force loopback)")
    } else if av[o_res..o_grh].iter().any(|&b| b != 0) {
        Some("rmac/tclass/hop_limit (a RoCE or GRH-routed destination)")
    } else if grh_gid_fl & !MLX5_AV_GRH != 0 {
        Some("grh_gid_fl flow label or source GID index")
    } else {
        None
    };
    if let Some(field) = unsupported {
        return Err(Error::InvalidArgument(format!(
            "the address vector uses {field}, which wqe::DgramSeg cannot carry"
        )));
    }
    let mut seg = DgramSeg::read(av);
    seg.qkey = qkey;
    seg.dqpn = dqpn & 0x00ff_ffff;
    Ok(seg)
}

// ---------------------------------------------------------------------------------------------
// the provider

/// The rdma-core provider behind a [`Context`] from [`open`].
pub struct HwProvider {
    dev: Arc<DeviceCtx>,
}

impl std::fmt::Debug for HwProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HwProvider")
            .field("device", &self.dev.name)
            .field("port", &self.dev.port)
            .finish()
    }
}

impl HwProvider {
    fn modify_qp(
        &self,
        qp: &HwQp,
        attr: &mut ibv_qp_attr,
        mask: c_int,
        call: &'static str,
    ) -> Result<()> {
        // SAFETY: live QP; `attr` is a full `ibv_qp_attr`.
        let rc = unsafe { (self.dev.libs.modify_qp)(qp.qp.as_ptr(), attr, mask) };
        rc_result(call, rc)
    }

    fn qp_of<'a>(&self, qp: &'a Handle, want: QpType) -> Result<&'a HwQp> {
        let qp: &HwQp = downcast::<Arc<HwQp>>(qp, "QP")?;
        if qp.qp_type != want {
            return Err(Error::InvalidArgument(format!(
                "{:?} transition on a {:?} QP",
                want, qp.qp_type
            )));
        }
        Ok(qp)
    }
}

impl Provider for HwProvider {
    fn name(&self) -> String {
        format!("rdma-core {}", self.dev.name)
    }

    fn port(&self) -> PortInfo {
        self.dev.port
    }

    fn alloc_pd(&self) -> Result<Handle> {
        // SAFETY: open context.
        let pd = unsafe { (self.dev.libs.alloc_pd)(self.dev.ctx.as_ptr()) };
        let pd = NonNull::new(pd).ok_or_else(|| null_err("ibv_alloc_pd"))?;
        Ok(Box::new(HwPd(Arc::new(PdObj {
            dev: self.dev.clone(),
            pd,
        }))))
    }

    unsafe fn reg_mr(
        &self,
        pd: &Handle,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<(Handle, u32, u32)> {
        let pd = downcast::<HwPd>(pd, "PD")?;
        if len == 0 {
            return Err(Error::InvalidArgument(
                "cannot register a zero-length memory region".into(),
            ));
        }
        // `Access` uses the IBV_ACCESS_* values (checked by tests/conformance.rs).
        let flags = access.bits() as c_int;
        // SAFETY: live PD; the caller keeps [addr, addr+len) mapped until the MR is dropped
        // (Provider::reg_mr contract).
        let mr =
            unsafe { (self.dev.libs.reg_mr)(pd.0.pd.as_ptr(), addr.cast::<c_void>(), len, flags) };
        let mr = NonNull::new(mr).ok_or_else(|| null_err("ibv_reg_mr"))?;
        // SAFETY: a registered `ibv_mr`; lkey/rkey are public fields of the v44 layout.
        let (lkey, rkey) = unsafe { ((*mr.as_ptr()).lkey, (*mr.as_ptr()).rkey) };
        Ok((
            Box::new(HwMr {
                pd: pd.0.clone(),
                mr,
            }),
            lkey,
            rkey,
        ))
    }

    fn create_cq(&self, cqe: u32) -> Result<(Handle, CqMem)> {
        let n = c_int::try_from(cqe.max(1))
            .map_err(|_| Error::InvalidArgument(format!("CQ size {cqe}")))?;
        // SAFETY: open context; no user context, no completion channel, vector 0.
        let cq = unsafe {
            (self.dev.libs.create_cq)(
                self.dev.ctx.as_ptr(),
                n,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        let cq = NonNull::new(cq).ok_or_else(|| null_err("ibv_create_cq"))?;
        let obj = Arc::new(CqObj {
            dev: self.dev.clone(),
            cq,
        });
        // SAFETY: zero is a valid value of this plain struct of pointers and integers.
        let mut out: mlx5dv_cq = unsafe { std::mem::zeroed() };
        let mut o = mlx5dv_obj::default();
        o.cq.r#in = cq.as_ptr();
        o.cq.out = &mut out;
        self.dev.init_obj(&mut o, MLX5DV_OBJ_CQ)?;
        if out.cqe_size != 64 {
            return Err(Error::InvalidArgument(format!(
                "CQ created with {}-byte CQEs (MLX5_CQE_SIZE set?); the driver reads 64-byte CQEs",
                out.cqe_size
            )));
        }
        if !out.cqe_cnt.is_power_of_two() {
            return Err(Error::InvalidArgument(format!(
                "CQ has {} entries, not a power of two",
                out.cqe_cnt
            )));
        }
        let buf = nonnull(out.buf.cast::<u8>(), "CQ buffer")?;
        let dbrec = nonnull(out.dbrec, "CQ doorbell record")?;
        // SAFETY: rdma-core's CQ buffer of `cqe_cnt` 64-byte CQEs (checked above; initialised
        // invalid by the provider) and its doorbell record, valid until `ibv_destroy_cq`,
        // which runs when the last holder of `obj` drops it; the description holds a clone.
        // Only the NIC and the driver queue built on the description use them (rdma-core's
        // own poll path is never called on this CQ).
        let mem = unsafe { CqMem::new(buf, out.cqe_cnt, dbrec, out.cqn) }.owned_by(obj.clone());
        Ok((Box::new(HwCq(obj)), mem))
    }

    fn create_srq(&self, pd: &Handle, max_wr: u32, max_sge: u32) -> Result<(Handle, SrqMem)> {
        let pd = downcast::<HwPd>(pd, "PD")?;
        let mut init = ibv_srq_init_attr {
            srq_context: std::ptr::null_mut(),
            attr: ibv_srq_attr {
                max_wr,
                max_sge,
                srq_limit: 0,
            },
        };
        // SAFETY: live PD; `init` is a full `ibv_srq_init_attr`.
        let srq = unsafe { (self.dev.libs.create_srq)(pd.0.pd.as_ptr(), &mut init) };
        let srq = NonNull::new(srq).ok_or_else(|| null_err("ibv_create_srq"))?;
        let obj = Arc::new(SrqObj {
            pd: pd.0.clone(),
            srq,
        });
        // SAFETY: zero is a valid value of this plain struct of pointers and integers.
        let mut out: mlx5dv_srq = unsafe { std::mem::zeroed() };
        out.comp_mask = MLX5DV_SRQ_MASK_SRQN;
        let mut o = mlx5dv_obj::default();
        o.srq.r#in = srq.as_ptr();
        o.srq.out = &mut out;
        self.dev.init_obj(&mut o, MLX5DV_OBJ_SRQ)?;
        if out.comp_mask & MLX5DV_SRQ_MASK_SRQN == 0 {
            return Err(Error::InvalidArgument(
                "mlx5dv_init_obj did not report the SRQ number".into(),
            ));
        }
        let wqe_cnt = out.tail.wrapping_add(1);
        if out.head != 0
            || !wqe_cnt.is_power_of_two()
            || out.stride < 32
            || !out.stride.is_power_of_two()
        {
            return Err(Error::InvalidArgument(format!(
                "unexpected SRQ layout from rdma-core: head {} tail {} stride {}",
                out.head, out.tail, out.stride
            )));
        }
        let buf = nonnull(out.buf.cast::<u8>(), "SRQ buffer")?;
        let dbrec = nonnull(out.dbrec, "SRQ doorbell record")?;
        // SAFETY: rdma-core's SRQ buffer of `wqe_cnt` WQEs of `stride` bytes (layout checked
        // above) and its doorbell record, valid until `ibv_destroy_srq`, which runs when the
        // last holder of `obj` drops it; the description holds a clone. Only the NIC and the
        // driver queue built on the description use them (`ibv_post_srq_recv` is never called).
        let mem = unsafe {
            SrqMem::new(
                buf,
                wqe_cnt,
                out.stride,
                (out.stride - 16) / 16,
                dbrec,
                out.srqn,
            )
        }
        .owned_by(obj.clone());
        Ok((Box::new(HwSrq(obj)), mem))
    }

    fn create_qp(
        &self,
        pd: &Handle,
        init: &QpInit<'_>,
    ) -> Result<(Handle, u32, SqMem, Option<RqMem>)> {
        let pd = downcast::<HwPd>(pd, "PD")?;
        let send_cq = downcast::<HwCq>(init.send_cq.handle(), "send CQ")?;
        let recv_cq = downcast::<HwCq>(init.recv_cq.handle(), "receive CQ")?;
        let srq = init
            .srq
            .map(|s| downcast::<HwSrq>(s.handle(), "SRQ"))
            .transpose()?;
        let caps = init.caps;
        let mut attr = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: send_cq.0.cq.as_ptr(),
            recv_cq: recv_cq.0.cq.as_ptr(),
            srq: srq.map_or(std::ptr::null_mut(), |s| s.0.srq.as_ptr()),
            cap: ibv_qp_cap {
                max_send_wr: caps.max_send_wr,
                max_recv_wr: if srq.is_some() { 0 } else { caps.max_recv_wr },
                max_send_sge: caps.max_send_sge,
                max_recv_sge: if srq.is_some() { 0 } else { caps.max_recv_sge },
                max_inline_data: caps.max_inline_data,
            },
            qp_type: match init.qp_type {
                QpType::Rc => IBV_QPT_RC,
                QpType::Ud => IBV_QPT_UD,
            },
            sq_sig_all: 0,
        };
        // SAFETY: live PD, CQs and SRQ of this context; `attr` is a full `ibv_qp_init_attr`
        // (rdma-core writes the actual capabilities back into `attr.cap`).
        let qp = unsafe { (self.dev.libs.create_qp)(pd.0.pd.as_ptr(), &mut attr) };
        let qp = NonNull::new(qp).ok_or_else(|| null_err("ibv_create_qp"))?;
        let handle = Arc::new(HwQp {
            qp,
            qp_type: init.qp_type,
            pd: pd.0.clone(),
            _send_cq: send_cq.0.clone(),
            _recv_cq: recv_cq.0.clone(),
            _srq: srq.map(|s| s.0.clone()),
        });
        // SAFETY: a live `ibv_qp`; `qp_num` is a public field of the v44 layout.
        let qpn = unsafe { (*qp.as_ptr()).qp_num };
        // SAFETY: zero is a valid value of this plain struct of pointers and integers.
        let mut out: mlx5dv_qp = unsafe { std::mem::zeroed() };
        let mut o = mlx5dv_obj::default();
        o.qp.r#in = qp.as_ptr();
        o.qp.out = &mut out;
        self.dev.init_obj(&mut o, MLX5DV_OBJ_QP)?;
        if out.sq.stride as usize != WQEBB || !out.sq.wqe_cnt.is_power_of_two() {
            return Err(Error::InvalidArgument(format!(
                "unexpected send queue from rdma-core: {} WQEs of stride {} (expected a power of two of 64 B)",
                out.sq.wqe_cnt, out.sq.stride
            )));
        }
        let dbrec = nonnull(out.dbrec, "QP doorbell record")?;
        let sq_buf = nonnull(out.sq.buf.cast::<u8>(), "send queue buffer")?;
        let bf = BlueFlame::new(
            nonnull(out.bf.reg.cast::<u8>(), "BlueFlame register")?,
            out.bf.size,
        );
        // SAFETY: rdma-core's send queue of `wqe_cnt` 64-byte WQEBBs (checked above), the QP's
        // doorbell record and its BlueFlame register (two buffers of `bf.size` bytes in the
        // context's UAR page), valid until `ibv_destroy_qp` (the UAR: until the context
        // closes, which the QP's PD keeps open); that runs when the last holder of `handle`
        // drops it, and the description holds a clone. Only the NIC and the driver queue
        // built on the description use them (`ibv_post_send` is never called); the limits
        // are the capabilities rdma-core created the QP with.
        let sq = unsafe {
            SqMem::new(
                sq_buf,
                out.sq.wqe_cnt,
                dbrec,
                attr.cap.max_inline_data,
                attr.cap.max_send_sge,
                Doorbell::Mmio(bf),
            )
        }
        .owned_by(handle.clone());
        let rq = if srq.is_none() && out.rq.wqe_cnt > 0 {
            if !out.rq.wqe_cnt.is_power_of_two()
                || out.rq.stride < 16
                || !out.rq.stride.is_power_of_two()
            {
                return Err(Error::InvalidArgument(format!(
                    "unexpected receive queue from rdma-core: {} WQEs of stride {}",
                    out.rq.wqe_cnt, out.rq.stride
                )));
            }
            let rq_buf = nonnull(out.rq.buf.cast::<u8>(), "receive queue buffer")?;
            // rdma-core's rq.max_gs: the whole stride is data segments (no WQE signature).
            let max_sge = out.rq.stride / 16;
            // SAFETY: rdma-core's receive queue of `wqe_cnt` WQEs of `stride` bytes (checked
            // above) and the QP's doorbell record (word 0), valid until `ibv_destroy_qp`, which
            // runs when the last holder of `handle` drops it; the description holds a clone.
            // Only the NIC and the driver queue built on it use them (`ibv_post_recv` is never
            // called).
            Some(
                unsafe { RqMem::new(rq_buf, out.rq.wqe_cnt, out.rq.stride, max_sge, dbrec) }
                    .owned_by(handle.clone()),
            )
        } else {
            None
        };
        Ok((Box::new(handle), qpn, sq, rq))
    }

    fn connect_rc(&self, qp: &Handle, remote: &RcRemote, params: &RcParams) -> Result<()> {
        let qp = self.qp_of(qp, QpType::Rc)?;
        let port = self.dev.port;
        let path_mtu = mtu_enum(params.mtu.min(port.active_mtu))?;
        let rd_atomic = params.max_rd_atomic.clamp(1, self.dev.max_rd_atomic);

        let mut a = ibv_qp_attr {
            qp_state: IBV_QPS_INIT,
            pkey_index: 0,
            port_num: port.port,
            qp_access_flags: params.access.bits()
                & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC),
            ..Default::default()
        };
        self.modify_qp(
            qp,
            &mut a,
            qp_masks::RC_RESET_INIT,
            "ibv_modify_qp(RC RESET->INIT)",
        )?;

        let mut ah_attr = ibv_ah_attr {
            dlid: remote.lid,
            port_num: port.port,
            ..Default::default()
        };
        if port.link_layer == LinkLayer::Ethernet {
            ah_attr.is_global = 1;
            ah_attr.grh = ibv_global_route {
                dgid: ibv_gid { raw: remote.gid },
                flow_label: 0,
                sgid_index: 0,
                hop_limit: ROCE_HOP_LIMIT,
                traffic_class: 0,
            };
        }
        let mut a = ibv_qp_attr {
            qp_state: IBV_QPS_RTR,
            path_mtu,
            dest_qp_num: remote.qpn & 0x00ff_ffff,
            rq_psn: remote.psn & 0x00ff_ffff,
            max_dest_rd_atomic: rd_atomic,
            min_rnr_timer: MIN_RNR_TIMER,
            ah_attr,
            ..Default::default()
        };
        self.modify_qp(
            qp,
            &mut a,
            qp_masks::RC_INIT_RTR,
            "ibv_modify_qp(RC INIT->RTR)",
        )?;

        let mut a = ibv_qp_attr {
            qp_state: IBV_QPS_RTS,
            timeout: params.timeout,
            retry_cnt: params.retry_cnt.min(7),
            rnr_retry: params.rnr_retry.min(7),
            sq_psn: params.psn & 0x00ff_ffff,
            max_rd_atomic: rd_atomic,
            ..Default::default()
        };
        self.modify_qp(
            qp,
            &mut a,
            qp_masks::RC_RTR_RTS,
            "ibv_modify_qp(RC RTR->RTS)",
        )
    }

    fn activate_ud(&self, qp: &Handle, qkey: u32) -> Result<()> {
        let qp = self.qp_of(qp, QpType::Ud)?;
        let mut a = ibv_qp_attr {
            qp_state: IBV_QPS_INIT,
            pkey_index: 0,
            port_num: self.dev.port.port,
            qkey,
            ..Default::default()
        };
        self.modify_qp(
            qp,
            &mut a,
            qp_masks::UD_RESET_INIT,
            "ibv_modify_qp(UD RESET->INIT)",
        )?;
        let mut a = ibv_qp_attr {
            qp_state: IBV_QPS_RTR,
            ..Default::default()
        };
        self.modify_qp(
            qp,
            &mut a,
            qp_masks::UD_INIT_RTR,
            "ibv_modify_qp(UD INIT->RTR)",
        )?;
        let mut a = ibv_qp_attr {
            qp_state: IBV_QPS_RTS,
            sq_psn: 0,
            ..Default::default()
        };
        self.modify_qp(
            qp,
            &mut a,
            qp_masks::UD_RTR_RTS,
            "ibv_modify_qp(UD RTR->RTS)",
        )
    }

    fn create_ah(&self, pd: &Handle, dest: &UdDest) -> Result<(Handle, DgramSeg)> {
        let pd = downcast::<HwPd>(pd, "PD")?;
        if self.dev.port.link_layer == LinkLayer::Ethernet {
            return Err(Error::InvalidArgument(
                "UD over RoCE needs the destination MAC, hop limit and UDP source port in the address \
                 vector, which wqe::DgramSeg cannot carry; use InfiniBand or the UDP transport"
                    .into(),
            ));
        }
        let mut attr = ibv_ah_attr {
            dlid: dest.lid,
            port_num: self.dev.port.port,
            ..Default::default()
        };
        // SAFETY: live PD; `attr` is a full `ibv_ah_attr`.
        let ah = unsafe { (self.dev.libs.create_ah)(pd.0.pd.as_ptr(), &mut attr) };
        let ah = NonNull::new(ah).ok_or_else(|| null_err("ibv_create_ah"))?;
        let handle = HwAh {
            pd: pd.0.clone(),
            ah,
        };
        // SAFETY: zero is a valid value of this plain struct.
        let mut out: mlx5dv_ah = unsafe { std::mem::zeroed() };
        let mut o = mlx5dv_obj::default();
        o.ah.r#in = ah.as_ptr();
        o.ah.out = &mut out;
        self.dev.init_obj(&mut o, MLX5DV_OBJ_AH)?;
        let av = nonnull(out.av, "address vector")?;
        let mut bytes = [0u8; DGRAM_BYTES];
        // SAFETY: `av` points to the AH's 48-byte `struct mlx5_wqe_av`, alive as long as the AH.
        unsafe {
            std::ptr::copy_nonoverlapping(av.as_ptr().cast::<u8>(), bytes.as_mut_ptr(), DGRAM_BYTES)
        };
        let seg = dgram_from_av(&bytes, dest.qkey, dest.qpn)?;
        Ok((Box::new(handle), seg))
    }
}

#[cfg(test)]
mod tests;
