//! Device collectives between GPUs of different hosts, staged through pinned host memory over
//! the host transports (tcp, ib), in stream order: the stream copies the input into a pinned
//! buffer, runs the host collective in a host function (`cuLaunchHostFunc`), and copies the
//! result back. The call enqueues and returns like every device collective, and a CUDA graph
//! captures the three steps (a host function becomes a host node), so staged calls stay
//! capturable.
//!
//! A pre-multiply sum copies its device scalar into the pinned buffer too (stream-ordered, so
//! a replay reads the value of its moment), and the host function multiplies the staged input
//! by the scalar before it runs the sum.
//!
//! One pinned buffer serves the communicator's calls one after another: a call on another stream
//! than the last waits (on the device, through an event) for the last one, so the host
//! collectives run in call order on every rank whatever streams carry them. Work captured in a
//! graph is not ordered that way: replay it on one stream, as the calls it holds were made.

use super::err;
use super::kernels::cudarc::driver::{CudaContext, CudaStream};
use super::kernels::staging::{self, Mark, Pinned};
use super::PreMul;
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::op::{Op, Touched};
use crate::sync::lock;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// The first failure of a staged host collective: every later call reports it (the device
/// results of the failed call and of everything after it are not to be trusted).
#[derive(Default)]
struct Failure(Mutex<Option<Error>>);

impl Failure {
    fn get(&self) -> Option<Error> {
        lock(&self.0).as_ref().map(again)
    }

    fn set(&self, e: Error) {
        lock(&self.0).get_or_insert(e);
    }
}

/// The same error again (errors are not Clone: the system error's source is rebuilt as text).
fn again(e: &Error) -> Error {
    match e {
        Error::InvalidArgument(m) => Error::InvalidArgument(m.clone()),
        Error::InvalidUsage(m) => Error::InvalidUsage(m.clone()),
        Error::SystemError { context, source } => Error::SystemError {
            context: context.clone(),
            source: std::io::Error::new(source.kind(), source.to_string()),
        },
        Error::InternalError(m) => Error::InternalError(m.clone()),
        Error::RemoteError { peer, what } => Error::RemoteError { peer: *peer, what: what.clone() },
        Error::Timeout { what, secs } => Error::Timeout { what: what.clone(), secs: *secs },
    }
}

/// One enqueued host collective, the data of its host function.
struct Call {
    comm: Arc<Comm>,
    /// The device call, its host operator included; it runs on `send` and `recv`.
    op: Op,
    send: *const u8,
    recv: *mut u8,
    /// A pre-multiply sum: its scalar, and for a device one the pinned copy the stream made.
    pre: Option<(PreMul, *const u8)>,
    /// Bytes of the staged input (what the scalar multiplies).
    in_bytes: usize,
    failed: Arc<Failure>,
    /// Freed by its one run; a captured call runs once per replay and lives as long as the
    /// communicator's staging.
    once: bool,
}

impl Call {
    fn run(&self) -> Result<()> {
        if let Some(e) = self.failed.get() {
            return Err(e);
        }
        let dt = self.op.dt;
        if let Some((p, copy)) = self.pre {
            let size = dt.size();
            let scalar = match p {
                PreMul::Immediate(bits) => bits.to_ne_bytes(),
                // SAFETY: the stream copied the scalar's element into these 8 pinned bytes
                // before this host function (enqueue reserved them for this call).
                PreMul::Device(_) => unsafe { copy.cast::<[u8; 8]>().read_unaligned() },
            };
            // SAFETY: the staged input, in this call's part of the pinned buffer (as below),
            // which only this host function touches while it runs.
            let input = unsafe { std::slice::from_raw_parts_mut(self.send.cast_mut(), self.in_bytes) };
            crate::dtype::premultiply(dt, input, &scalar[..size])?;
        }
        // A buffer the device call has none of (a send's recv) stays none.
        let pinned = |dev: usize, p: usize| if dev == 0 { 0 } else { p };
        let op = Op {
            send: pinned(self.op.send, self.send as usize),
            recv: pinned(self.op.recv, self.recv as usize),
            ..self.op
        };
        // SAFETY: send and recv point into the pinned buffer, sized for this call when it was
        // enqueued and kept alive until the stream (or every replay) has run it.
        unsafe { self.comm.run_raw(op) }
    }
}

/// The host function: runs the call, keeps its failure, frees a one-shot call.
unsafe extern "C" fn run_call(data: *mut c_void) {
    // SAFETY: `data` is a Call that `Staged::enqueue` leaked for this run (or kept for replays).
    let call = unsafe { &*(data as *const Call) };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| call.run()));
    match r {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::error!("occl: rank {}: staged device collective failed: {e}", call.comm.rank());
            call.failed.set(e);
        }
        Err(_) => call.failed.set(Error::internal("a staged host collective panicked")),
    }
    if call.once {
        // SAFETY: leaked by `enqueue` for exactly this one run.
        drop(unsafe { Box::from_raw(data as *mut Call) });
    }
}

struct Inner {
    buf: Option<Pinned>,
    /// The current buffer's address is baked into a captured graph.
    buf_captured: bool,
    /// Buffers and calls that captured graphs may still use: freed with the communicator.
    kept_bufs: Vec<Pinned>,
    /// Boxed: a graph holds each call's address, which must not move as the vector grows.
    #[allow(clippy::vec_box)]
    kept_calls: Vec<Box<Call>>,
    /// The stream of the last call not captured (as an address), and the mark after it.
    last_stream: usize,
}

// SAFETY: the raw pointers in kept calls point into pinned buffers this struct owns.
unsafe impl Send for Inner {}

/// A communicator's staging: set up when a peer is on another host.
pub(crate) struct Staged {
    ctx: Arc<CudaContext>,
    comm: Arc<Comm>,
    inner: Mutex<Inner>,
    failed: Arc<Failure>,
    mark: Mark,
}

/// Where the output starts in the pinned buffer: after the input, on its own cache lines.
fn out_offset(in_bytes: usize) -> usize {
    in_bytes.next_multiple_of(256)
}

/// Where a device scalar's copy lies: after the output, 8 bytes of their own.
fn scalar_offset(out_end: usize) -> usize {
    out_end.next_multiple_of(8)
}

impl Staged {
    pub(crate) fn new(ctx: &Arc<CudaContext>, comm: Arc<Comm>) -> Result<Staged> {
        let mark = Mark::new(ctx).map_err(err("create the staging event"))?;
        Ok(Staged {
            ctx: ctx.clone(),
            comm,
            inner: Mutex::new(Inner {
                buf: None,
                buf_captured: false,
                kept_bufs: Vec::new(),
                kept_calls: Vec::new(),
                last_stream: 0,
            }),
            failed: Arc::default(),
            mark,
        })
    }

    /// The first failure of a staged call, if any.
    pub(crate) fn error(&self) -> Option<Error> {
        self.failed.get()
    }

    /// Enqueues the checked device call `op` on `stream`: what it reads of `send` (`touched`)
    /// copied in first, what it writes of `recv` copied back after; `premul`, a pre-multiply
    /// sum's scalar.
    ///
    /// # Safety
    /// The device addresses are this GPU's memory of the touched sizes, live until the stream
    /// has run the call.
    pub(crate) unsafe fn enqueue(
        &self,
        stream: &CudaStream,
        op: Op,
        premul: Option<PreMul>,
        touched: Touched,
    ) -> Result<()> {
        if let Some(e) = self.failed.get() {
            return Err(e);
        }
        let input = (touched.send > 0).then_some((op.send as u64, touched.send));
        let output = (touched.recv > 0).then_some((op.recv as u64, touched.recv));
        let capturing = staging::capturing(stream).map_err(err("query the stream's capture"))?;
        let in_bytes = input.map_or(0, |(_, b)| b);
        let out_at = out_offset(in_bytes);
        let scalar_at = scalar_offset(out_at + output.map_or(0, |(_, b)| b));
        let need = (scalar_at + 8).max(1);
        let mut g = lock(&self.inner);
        let base = self.buffer(&mut g, need, capturing)?;
        let (send, recv, scalar) = (base, base.wrapping_add(out_at), base.wrapping_add(scalar_at));
        let pre = premul.map(|p| (p, scalar.cast_const()));
        let key = stream.cu_stream() as usize;
        if !capturing && g.last_stream != 0 && g.last_stream != key {
            self.mark.wait_on(stream).map_err(err("order staged calls across streams"))?;
        }
        let call = Box::new(Call {
            comm: self.comm.clone(),
            op,
            send,
            recv,
            pre,
            in_bytes,
            failed: self.failed.clone(),
            once: !capturing,
        });
        // SAFETY: the pinned buffer holds `need` bytes; the caller's promise covers the device side.
        unsafe {
            if let Some((src, bytes)) = input.filter(|&(_, b)| b > 0) {
                staging::copy_to_host(stream, send, src, bytes).map_err(err("stage the input to the host"))?;
            }
            if let Some(PreMul::Device(p)) = premul {
                staging::copy_to_host(stream, scalar, p, op.dt.size())
                    .map_err(err("stage the pre-multiply scalar to the host"))?;
            }
            if capturing {
                let p = &*call as *const Call as *mut c_void;
                staging::host_function(stream, run_call, p).map_err(err("enqueue the host collective"))?;
                g.kept_calls.push(call);
            } else {
                let p = Box::into_raw(call);
                if let Err(e) = staging::host_function(stream, run_call, p.cast()) {
                    // Not enqueued: nobody else will free it.
                    drop(Box::from_raw(p));
                    return Err(err("enqueue the host collective")(e));
                }
            }
            if let Some((dst, bytes)) = output.filter(|&(_, b)| b > 0) {
                staging::copy_to_device(stream, dst, recv, bytes).map_err(err("copy the result to the device"))?;
            }
        }
        if capturing {
            g.buf_captured = true;
        } else {
            self.mark.record(stream).map_err(err("mark the staged call"))?;
            g.last_stream = key;
        }
        Ok(())
    }

    /// The pinned buffer, grown to `need` bytes. A buffer that work in flight may use is freed
    /// only once the device is idle; one that a graph captured, only with the communicator.
    fn buffer(&self, g: &mut Inner, need: usize, capturing: bool) -> Result<*mut u8> {
        if let Some(b) = &g.buf {
            if b.bytes() >= need {
                return Ok(b.ptr());
            }
        }
        let size = need.max(g.buf.as_ref().map_or(0, |b| b.bytes() * 2)).next_multiple_of(1 << 20);
        let fresh = Pinned::alloc(&self.ctx, size).map_err(err("allocate the pinned staging buffer"))?;
        if let Some(old) = g.buf.replace(fresh) {
            if g.buf_captured || capturing {
                g.kept_bufs.push(old);
            } else {
                self.ctx
                    .synchronize()
                    .map_err(|e| Error::sys("cuCtxSynchronize", std::io::Error::other(format!("{e:?}"))))?;
                drop(old);
            }
        }
        g.buf_captured = false;
        Ok(g.buf.as_ref().map_or(std::ptr::null_mut(), Pinned::ptr))
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        // Host functions still queued read the calls and buffers freed below.
        let _ = self.ctx.synchronize();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_starts_on_its_own_lines_after_the_input() {
        assert_eq!(out_offset(0), 0);
        assert_eq!(out_offset(1), 256);
        assert_eq!(out_offset(256), 256);
        assert_eq!(out_offset(257), 512);
        assert_eq!(scalar_offset(0), 0);
        assert_eq!(scalar_offset(258), 264);
    }

    #[test]
    fn a_failure_is_reported_again_with_its_kind_and_text() {
        let f = Failure::default();
        assert!(f.get().is_none());
        f.set(Error::remote(3, "lost its connection"));
        f.set(Error::usage("a later failure does not replace the first"));
        for _ in 0..2 {
            let e = f.get().expect("kept");
            assert_eq!(e.kind(), crate::ErrorKind::RemoteError);
            assert_eq!(e.to_string(), "remote error: peer rank 3: lost its connection");
        }
        let s = again(&Error::sys("open", std::io::Error::from_raw_os_error(libc::ENOENT)));
        assert_eq!(s.kind(), crate::ErrorKind::SystemError);
        assert!(s.to_string().contains("open"), "{s}");
    }
}
