//! Run-time loading of `libibverbs.so.1` and `libmlx5.so.1` (`dlopen`/`dlsym` through
//! `libloading`): no build- or link-time dependency on rdma-core.
//!
//! Symbols are resolved by plain name, so `dlsym` returns each symbol's *default* version:
//! `IBVERBS_1.1` for every `ibv_*` function used here (libibverbs also exports the old
//! `IBVERBS_1.0` ABI under the same names), `MLX5_1.2` for `mlx5dv_init_obj` (the `MLX5_1.0`
//! one is the compat version) and `MLX5_1.8` for the optional `mlx5dv_is_supported`.
//! Checked with `nm -D --defined-only` on Debian 12's rdma-core 44.0.

use libloading::Library;

use super::ffi::*;
use crate::error::{Error, Result};

/// Which shared objects to open. [`LibraryNames::DEFAULT`] is what [`super::open`] uses; other
/// names exist for tests that simulate a machine without rdma-core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LibraryNames<'a> {
    /// The verbs library (`libibverbs.so.1`).
    pub ibverbs: &'a str,
    /// The mlx5 provider library with the direct-verbs API (`libmlx5.so.1`).
    pub mlx5: &'a str,
}

impl LibraryNames<'static> {
    /// `libibverbs.so.1` and `libmlx5.so.1` (the sonames of rdma-core's packages).
    pub const DEFAULT: LibraryNames<'static> = LibraryNames {
        ibverbs: "libibverbs.so.1",
        mlx5: "libmlx5.so.1",
    };
}

/// The loaded libraries and the function pointers taken from them. The pointers stay valid as
/// long as this value (which owns the [`Library`] handles) lives; the provider keeps it in an
/// `Arc` shared by every object it creates.
pub(crate) struct Libs {
    pub get_device_list: ibv_get_device_list_fn,
    pub free_device_list: ibv_free_device_list_fn,
    pub get_device_name: ibv_get_device_name_fn,
    pub open_device: ibv_open_device_fn,
    pub close_device: ibv_close_device_fn,
    pub query_device: ibv_query_device_fn,
    pub query_port: ibv_query_port_fn,
    pub query_gid: ibv_query_gid_fn,
    pub alloc_pd: ibv_alloc_pd_fn,
    pub dealloc_pd: ibv_dealloc_pd_fn,
    pub reg_mr: ibv_reg_mr_fn,
    pub dereg_mr: ibv_dereg_mr_fn,
    pub create_cq: ibv_create_cq_fn,
    pub destroy_cq: ibv_destroy_cq_fn,
    pub create_srq: ibv_create_srq_fn,
    pub destroy_srq: ibv_destroy_srq_fn,
    pub create_qp: ibv_create_qp_fn,
    pub modify_qp: ibv_modify_qp_fn,
    pub destroy_qp: ibv_destroy_qp_fn,
    pub create_ah: ibv_create_ah_fn,
    pub destroy_ah: ibv_destroy_ah_fn,
    pub init_obj: mlx5dv_init_obj_fn,
    /// Absent before rdma-core 29 (`MLX5_1.8`); then every device is tried as mlx5.
    pub is_supported: Option<mlx5dv_is_supported_fn>,
    // Declared last: the function pointers above must not outlive the mappings.
    _mlx5: Library,
    _ibverbs: Library,
}

impl std::fmt::Debug for Libs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Libs").finish_non_exhaustive()
    }
}

/// libloading's message with its source (the `dlerror()` text), which its `Display` omits.
fn dl_message(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(src) => src.to_string(),
        None => e.to_string(),
    }
}

/// Opens a shared object by name.
fn load(name: &str) -> Result<Library> {
    // SAFETY: loading runs the library's initialisers. rdma-core's are the ordinary ones of a
    // system library (no requirements on the caller); any other name comes through
    // `open_with_libraries`/`list_devices_with_libraries`, whose `unsafe` contract covers it.
    unsafe { Library::new(name) }.map_err(|e| Error::NoDevice {
        reason: format!("{name} could not be loaded: {}", dl_message(&e)),
    })
}

/// Looks up `sym` (NUL-free name) and copies it out as a `T` (a function pointer type).
///
/// # Safety
/// `T` must be the symbol's real type (the prototype of its default version).
unsafe fn sym<T: Copy>(lib: &Library, lib_name: &str, sym: &str) -> Result<T> {
    // SAFETY: forwarded to the caller.
    let s = unsafe { lib.get::<T>(sym.as_bytes()) }.map_err(|e| Error::NoDevice {
        reason: format!(
            "{lib_name} has no symbol {sym} (rdma-core too old?): {}",
            dl_message(&e)
        ),
    })?;
    Ok(*s)
}

impl Libs {
    /// Loads both libraries and resolves every symbol, or says precisely what is missing.
    pub(crate) fn load(names: LibraryNames<'_>) -> Result<Libs> {
        let ibverbs = load(names.ibverbs)?;
        let mlx5 = load(names.mlx5)?;
        let (iv, ivn) = (&ibverbs, names.ibverbs);
        let (m, mn) = (&mlx5, names.mlx5);
        // SAFETY: every type below is the prototype of the named symbol in rdma-core v44
        // (`ffi.rs`, compared with the headers by tests/conformance.rs).
        unsafe {
            Ok(Libs {
                get_device_list: sym(iv, ivn, "ibv_get_device_list")?,
                free_device_list: sym(iv, ivn, "ibv_free_device_list")?,
                get_device_name: sym(iv, ivn, "ibv_get_device_name")?,
                open_device: sym(iv, ivn, "ibv_open_device")?,
                close_device: sym(iv, ivn, "ibv_close_device")?,
                query_device: sym(iv, ivn, "ibv_query_device")?,
                query_port: sym(iv, ivn, "ibv_query_port")?,
                query_gid: sym(iv, ivn, "ibv_query_gid")?,
                alloc_pd: sym(iv, ivn, "ibv_alloc_pd")?,
                dealloc_pd: sym(iv, ivn, "ibv_dealloc_pd")?,
                reg_mr: sym(iv, ivn, "ibv_reg_mr")?,
                dereg_mr: sym(iv, ivn, "ibv_dereg_mr")?,
                create_cq: sym(iv, ivn, "ibv_create_cq")?,
                destroy_cq: sym(iv, ivn, "ibv_destroy_cq")?,
                create_srq: sym(iv, ivn, "ibv_create_srq")?,
                destroy_srq: sym(iv, ivn, "ibv_destroy_srq")?,
                create_qp: sym(iv, ivn, "ibv_create_qp")?,
                modify_qp: sym(iv, ivn, "ibv_modify_qp")?,
                destroy_qp: sym(iv, ivn, "ibv_destroy_qp")?,
                create_ah: sym(iv, ivn, "ibv_create_ah")?,
                destroy_ah: sym(iv, ivn, "ibv_destroy_ah")?,
                init_obj: sym(m, mn, "mlx5dv_init_obj")?,
                is_supported: sym(m, mn, "mlx5dv_is_supported").ok(),
                _mlx5: mlx5,
                _ibverbs: ibverbs,
            })
        }
    }
}
