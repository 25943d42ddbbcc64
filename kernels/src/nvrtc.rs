//! NVRTC, through cudarc's dynamically loaded bindings: the library's presence and version, and
//! one compilation of a source to a cubin for one architecture, with NVRTC's log on failure.
//!
//! cudarc's safe compile wrapper returns PTX and unwraps internally, so this calls the C API.

use crate::error::{Error, Result};
use cudarc::nvrtc::sys;
use std::ffi::{c_char, c_int, CString};

/// Whether libnvrtc can be opened. Every other function here must only run after this said yes:
/// cudarc panics on a missing library.
pub fn available() -> bool {
    // SAFETY: only tries to open the library; no NVRTC function is called.
    unsafe { sys::is_culib_present() }
}

fn check(call: &'static str, r: sys::nvrtcResult) -> Result<()> {
    if r == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(Error::Nvrtc { call, code: format!("{r:?}") })
    }
}

fn require() -> Result<()> {
    if available() {
        Ok(())
    } else {
        Err(Error::NoNvrtc)
    }
}

/// NVRTC's (major, minor) version.
pub fn version() -> Result<(i32, i32)> {
    require()?;
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: two valid out-pointers.
    check("nvrtcVersion", unsafe { sys::nvrtcVersion(&mut major, &mut minor) })?;
    Ok((major, minor))
}

/// The real architectures (`sm_XY` as XY) this NVRTC can build for.
pub fn supported_archs() -> Result<Vec<u32>> {
    require()?;
    let mut n: c_int = 0;
    // SAFETY: valid out-pointer.
    check("nvrtcGetNumSupportedArchs", unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) })?;
    let mut v = vec![0 as c_int; usize::try_from(n).unwrap_or(0)];
    if !v.is_empty() {
        // SAFETY: `v` holds the `n` ints NVRTC writes.
        check("nvrtcGetSupportedArchs", unsafe { sys::nvrtcGetSupportedArchs(v.as_mut_ptr()) })?;
    }
    Ok(v.into_iter().filter_map(|a| u32::try_from(a).ok()).collect())
}

/// Destroys the program however compilation ends.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram and destroyed only here. A failure leaks, no more.
        let _ = unsafe { sys::nvrtcDestroyProgram(&mut self.0) };
    }
}

impl Program {
    fn log(&self) -> String {
        let mut size = 0usize;
        // SAFETY: a live program and a valid out-pointer.
        if unsafe { sys::nvrtcGetProgramLogSize(self.0, &mut size) } != sys::nvrtcResult::NVRTC_SUCCESS {
            return String::from("(NVRTC returned no log)");
        }
        let mut buf = vec![0u8; size.max(1)];
        // SAFETY: `buf` holds the `size` bytes (with the NUL) that NVRTC writes.
        if unsafe { sys::nvrtcGetProgramLog(self.0, buf.as_mut_ptr().cast::<c_char>()) }
            != sys::nvrtcResult::NVRTC_SUCCESS
        {
            return String::from("(NVRTC returned no log)");
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    }
}

/// Compiles `src` (named `name` in messages) with `options`, which must name a real architecture
/// (`--gpu-architecture=sm_XY`), and returns the cubin.
pub fn compile_cubin(src: &str, name: &str, arch: &str, options: &[String]) -> Result<Vec<u8>> {
    require()?;
    let invalid = |what: &str| Error::InvalidArgument(format!("{what} holds a NUL byte"));
    let csrc = CString::new(src).map_err(|_| invalid("kernel source"))?;
    let cname = CString::new(name).map_err(|_| invalid("kernel source name"))?;
    let copts: Vec<CString> = options
        .iter()
        .map(|o| CString::new(o.as_str()))
        .collect::<Result<_, _>>()
        .map_err(|_| invalid("an NVRTC option"))?;
    let ptrs: Vec<*const c_char> = copts.iter().map(|o| o.as_ptr()).collect();
    let nopts = c_int::try_from(ptrs.len()).map_err(|_| Error::InvalidArgument("too many NVRTC options".into()))?;

    let mut raw: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: NUL-terminated strings that outlive the program; no headers are passed.
    check("nvrtcCreateProgram", unsafe {
        sys::nvrtcCreateProgram(&mut raw, csrc.as_ptr(), cname.as_ptr(), 0, std::ptr::null(), std::ptr::null())
    })?;
    let prog = Program(raw);
    // SAFETY: a live program; `ptrs` points at `nopts` NUL-terminated strings alive for the call.
    let r = unsafe { sys::nvrtcCompileProgram(prog.0, nopts, ptrs.as_ptr()) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::Compile {
            name: name.to_string(),
            arch: arch.to_string(),
            options: options.to_vec(),
            log: prog.log(),
        });
    }
    let log = prog.log();
    if !log.trim().is_empty() {
        tracing::debug!(target: "occl_kernels", %name, %arch, "NVRTC log:\n{log}");
    }
    let mut size = 0usize;
    // SAFETY: a compiled program and a valid out-pointer.
    check("nvrtcGetCUBINSize", unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) })?;
    let mut cubin = vec![0u8; size];
    if size > 0 {
        // SAFETY: `cubin` holds the `size` bytes NVRTC writes.
        check("nvrtcGetCUBIN", unsafe { sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr().cast::<c_char>()) })?;
    }
    if cubin.is_empty() {
        return Err(Error::Nvrtc {
            call: "nvrtcGetCUBIN",
            code: "empty cubin (was a virtual architecture given?)".into(),
        });
    }
    Ok(cubin)
}
