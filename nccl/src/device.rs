//! Is a pointer GPU memory? Host calls must refuse device buffers: the CPU would fault on them.
//!
//! Device memory exists only in a process that has loaded the CUDA driver, so this asks the
//! driver only when `libcuda.so.1` is already loaded (`RTLD_NOLOAD`: never loads it, never
//! initialises CUDA). Until it is, every pointer is host memory; once it is, its
//! `cuPointerGetAttribute` is kept for the rest of the process.

use std::ffi::c_void;
use std::sync::OnceLock;

type PointerGetAttribute = unsafe extern "C" fn(data: *mut c_void, attribute: i32, ptr: u64) -> i32;

const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: i32 = 2;
const CU_POINTER_ATTRIBUTE_IS_MANAGED: i32 = 8;
const CU_MEMORYTYPE_DEVICE: u32 = 2;

/// The driver's handle when the process has loaded `libcuda.so.1` (never loads it).
fn loaded() -> Option<*mut c_void> {
    // SAFETY: dlopen with RTLD_NOLOAD only returns a handle to a library already loaded; the
    // handle is never closed, so its symbols stay valid.
    let h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    (!h.is_null()).then_some(h)
}

/// Whether the process has loaded the CUDA driver (a GPU process).
pub(crate) fn driver_loaded() -> bool {
    loaded().is_some()
}

fn driver() -> Option<PointerGetAttribute> {
    static FOUND: OnceLock<PointerGetAttribute> = OnceLock::new();
    if let Some(f) = FOUND.get() {
        return Some(*f);
    }
    let h = loaded()?;
    // SAFETY: a live handle (never closed) and a NUL-terminated name.
    let sym = unsafe { libc::dlsym(h, c"cuPointerGetAttribute".as_ptr()) };
    if sym.is_null() {
        return None;
    }
    // SAFETY: the driver's cuPointerGetAttribute has this signature (CUresult, void*, enum, CUdeviceptr).
    let f = unsafe { std::mem::transmute::<*mut c_void, PointerGetAttribute>(sym) };
    Some(*FOUND.get_or_init(|| f))
}

/// True when `p` is device memory that the CPU cannot touch (not managed memory, which it
/// can). Any driver error (a plain host pointer, CUDA not initialised) means host memory.
pub(crate) fn is_device(p: *const c_void) -> bool {
    if p.is_null() {
        return false;
    }
    let Some(get) = driver() else { return false };
    let mut kind: u32 = 0;
    let mut managed: i32 = 0;
    // SAFETY: the driver writes one unsigned int / one int into the live locals.
    unsafe {
        if get((&raw mut kind).cast(), CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p as u64) != 0 {
            return false;
        }
        if get((&raw mut managed).cast(), CU_POINTER_ATTRIBUTE_IS_MANAGED, p as u64) == 0 && managed != 0 {
            return false;
        }
    }
    kind == CU_MEMORYTYPE_DEVICE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_loaded_driver_every_pointer_is_host_memory() {
        let x = [0u8; 8];
        // The test process never loads libcuda.so.1.
        assert!(!is_device(x.as_ptr().cast()));
        assert!(!is_device(std::ptr::null()));
        assert!(!driver_loaded());
        assert_eq!(crate::gpu::current_device(), None, "no driver, no device communicator");
    }
}
