//! libibverbs.so.1 opened with `dlopen` at run time, so this crate builds and its pure parts run
//! on machines without rdma-core; only a caller that wants a device needs the library.

use crate::error::{Error, Result};
use crate::sys;
use libc::{c_int, c_void};
use std::ffi::CStr;

/// The soname rdma-core has shipped since libibverbs 1.1.
pub const LIBRARY: &str = "libibverbs.so.1";

/// The loaded library: one function pointer per exported call occl makes.
///
/// The handle is never closed: provider libraries that libibverbs loads may keep threads and
/// atexit handlers that must not outlive their code, so unloading is not safe.
pub struct Verbs {
    pub(crate) get_device_list: sys::GetDeviceList,
    pub(crate) free_device_list: sys::FreeDeviceList,
    pub(crate) get_device_name: sys::GetDeviceName,
    pub(crate) open_device: sys::OpenDevice,
    pub(crate) close_device: sys::CloseDevice,
    pub(crate) query_port: sys::QueryPort,
    pub(crate) query_gid: sys::QueryGid,
    pub(crate) alloc_pd: sys::AllocPd,
    pub(crate) dealloc_pd: sys::DeallocPd,
    pub(crate) reg_mr: sys::RegMr,
    pub(crate) dereg_mr: sys::DeregMr,
    pub(crate) create_cq: sys::CreateCq,
    pub(crate) destroy_cq: sys::DestroyCq,
    pub(crate) create_qp: sys::CreateQp,
    pub(crate) destroy_qp: sys::DestroyQp,
    pub(crate) modify_qp: sys::ModifyQp,
}

// The struct holds only function pointers into a library that stays loaded.
unsafe impl Send for Verbs {}
unsafe impl Sync for Verbs {}

/// The last `dlerror()` text, or a fallback.
fn dlerror_text() -> String {
    // SAFETY: dlerror returns a thread-local NUL-terminated string or NULL.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        "no reason given".to_string()
    } else {
        // SAFETY: non-NULL and NUL-terminated per dlerror's contract.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// Looks `name` up in `handle` as a function of type `T`. `T` must be the function-pointer type
/// that matches the symbol's C signature (see `sys`).
unsafe fn symbol<T: Copy>(handle: *mut c_void, name: &'static str) -> Result<T> {
    debug_assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    let cname = format!("{name}\0");
    // SAFETY: handle came from dlopen; the name is NUL-terminated.
    let p = unsafe { libc::dlsym(handle, cname.as_ptr().cast()) };
    if p.is_null() {
        return Err(Error::SymbolMissing { name });
    }
    // SAFETY: the caller names the function type of this symbol; both are pointer-sized.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

impl Verbs {
    /// Opens libibverbs.so.1 and resolves every function occl uses. A missing library is
    /// `Error::LibraryMissing` with the install hint; a missing symbol is `SymbolMissing`.
    pub fn load() -> Result<Verbs> {
        let soname = format!("{LIBRARY}\0");
        // SAFETY: a NUL-terminated name; RTLD_NOW so a broken install fails here, not later.
        let handle = unsafe { libc::dlopen(soname.as_ptr().cast(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(Error::LibraryMissing { detail: dlerror_text() });
        }
        // SAFETY: each type is the C signature declared in verbs.h for that symbol (sys.rs).
        unsafe {
            Ok(Verbs {
                get_device_list: symbol(handle, "ibv_get_device_list")?,
                free_device_list: symbol(handle, "ibv_free_device_list")?,
                get_device_name: symbol(handle, "ibv_get_device_name")?,
                open_device: symbol(handle, "ibv_open_device")?,
                close_device: symbol(handle, "ibv_close_device")?,
                query_port: symbol(handle, "ibv_query_port")?,
                query_gid: symbol(handle, "ibv_query_gid")?,
                alloc_pd: symbol(handle, "ibv_alloc_pd")?,
                dealloc_pd: symbol(handle, "ibv_dealloc_pd")?,
                reg_mr: symbol(handle, "ibv_reg_mr")?,
                dereg_mr: symbol(handle, "ibv_dereg_mr")?,
                create_cq: symbol(handle, "ibv_create_cq")?,
                destroy_cq: symbol(handle, "ibv_destroy_cq")?,
                create_qp: symbol(handle, "ibv_create_qp")?,
                destroy_qp: symbol(handle, "ibv_destroy_qp")?,
                modify_qp: symbol(handle, "ibv_modify_qp")?,
            })
        }
    }
}

/// errno after a verbs call that returned NULL (those calls set errno).
pub(crate) fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// A verbs call's int result as a `Result`: verbs returns 0 or an errno value (some providers
/// return -1 and set errno instead).
pub(crate) fn check(call: &'static str, rc: c_int) -> Result<()> {
    match rc {
        0 => Ok(()),
        -1 => Err(Error::Verbs { call, errno: errno() }),
        e => Err(Error::Verbs { call, errno: e.abs() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine with rdma-core this resolves every symbol; without it, the error must carry
    /// the install hint. Either outcome is checked; neither is skipped.
    #[test]
    fn load_resolves_every_symbol_or_says_how_to_install() {
        match Verbs::load() {
            Ok(_) => println!("libibverbs.so.1 loaded; every symbol resolved"),
            Err(e @ Error::LibraryMissing { .. }) => {
                let text = e.to_string();
                assert!(text.starts_with("libibverbs.so.1 not found: install rdma-core"), "{text}");
                assert!(text.contains("ibverbs-providers libibverbs1"), "{text}");
            }
            Err(e) => panic!("libibverbs.so.1 is present but unusable: {e}"),
        }
    }

    #[test]
    fn check_maps_both_error_conventions() {
        assert!(check("x", 0).is_ok());
        assert_eq!(
            check("ibv_modify_qp", libc::EINVAL),
            Err(Error::Verbs { call: "ibv_modify_qp", errno: libc::EINVAL })
        );
    }
}
