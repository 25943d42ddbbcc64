//! Owned verbs objects (device context, protection domain, memory region, completion queue,
//! RC queue pair), each freed on drop after the objects that depend on it (they hold an `Arc`
//! of what they were created from). Untested on hardware: no machine this was written on has
//! an RDMA device. `qp_attr`, which turns a `conn::Transition` into `ibv_modify_qp` arguments,
//! is pure and tested.

use crate::conn::Transition;
use crate::error::{Error, Result};
use crate::mr_cache::Registrar;
use crate::sys;
use crate::verbs::{check, errno, Verbs};
use libc::c_int;
use std::ffi::CStr;
use std::sync::Arc;

/// Retry and timeout values for RTS: 4.096 µs × 2^14 ≈ 67 ms per attempt, 7 retries, and an
/// infinite receiver-not-ready retry count (7), since credits, not RNR, pace the sender.
const TIMEOUT: u8 = 14;
const RETRY_CNT: u8 = 7;
const RNR_RETRY: u8 = 7;
const MIN_RNR_TIMER: u8 = 12;

/// The `ibv_modify_qp` attributes and mask for one transition of an RC QP.
pub fn qp_attr(t: &Transition) -> (sys::IbvQpAttr, c_int) {
    let mut a = sys::IbvQpAttr::default();
    match *t {
        Transition::Init { port } => {
            a.qp_state = sys::IBV_QPS_INIT;
            a.port_num = port;
            a.pkey_index = 0;
            a.qp_access_flags = sys::IBV_ACCESS_LOCAL_WRITE | sys::IBV_ACCESS_REMOTE_WRITE;
            (a, sys::IBV_QP_STATE | sys::IBV_QP_PKEY_INDEX | sys::IBV_QP_PORT | sys::IBV_QP_ACCESS_FLAGS)
        }
        Transition::Rtr { port, dest_qpn, rq_psn, mtu, dlid, dgid, gid_index } => {
            a.qp_state = sys::IBV_QPS_RTR;
            a.path_mtu = mtu.code();
            a.dest_qp_num = dest_qpn;
            a.rq_psn = rq_psn;
            a.max_dest_rd_atomic = 1;
            a.min_rnr_timer = MIN_RNR_TIMER;
            a.ah_attr.port_num = port;
            a.ah_attr.dlid = dlid;
            if let Some(i) = gid_index {
                a.ah_attr.is_global = 1;
                a.ah_attr.grh.dgid = sys::IbvGid { raw: dgid };
                a.ah_attr.grh.sgid_index = i;
                a.ah_attr.grh.hop_limit = 255;
            }
            (
                a,
                sys::IBV_QP_STATE
                    | sys::IBV_QP_AV
                    | sys::IBV_QP_PATH_MTU
                    | sys::IBV_QP_DEST_QPN
                    | sys::IBV_QP_RQ_PSN
                    | sys::IBV_QP_MAX_DEST_RD_ATOMIC
                    | sys::IBV_QP_MIN_RNR_TIMER,
            )
        }
        Transition::Rts { sq_psn } => {
            a.qp_state = sys::IBV_QPS_RTS;
            a.sq_psn = sq_psn;
            a.timeout = TIMEOUT;
            a.retry_cnt = RETRY_CNT;
            a.rnr_retry = RNR_RETRY;
            a.max_rd_atomic = 1;
            (
                a,
                sys::IBV_QP_STATE
                    | sys::IBV_QP_SQ_PSN
                    | sys::IBV_QP_TIMEOUT
                    | sys::IBV_QP_RETRY_CNT
                    | sys::IBV_QP_RNR_RETRY
                    | sys::IBV_QP_MAX_QP_RD_ATOMIC,
            )
        }
    }
}

/// An open device.
pub struct Context {
    v: Arc<Verbs>,
    ctx: *mut sys::IbvContext,
    pub name: String,
}

// Verbs objects may be used from any thread (rdma-core locks inside where it must).
unsafe impl Send for Context {}
unsafe impl Sync for Context {}

impl Context {
    /// Opens the device called `name`.
    pub fn open(v: Arc<Verbs>, name: &str) -> Result<Arc<Context>> {
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer; the list is freed before returning.
        let list = unsafe { (v.get_device_list)(&mut n) };
        if list.is_null() {
            return Err(Error::Verbs { call: "ibv_get_device_list", errno: errno() });
        }
        let mut ctx = std::ptr::null_mut();
        for i in 0..n.max(0) as usize {
            // SAFETY: n entries; names live as long as the list.
            let dev = unsafe { *list.add(i) };
            let p = if dev.is_null() { std::ptr::null() } else { unsafe { (v.get_device_name)(dev) } };
            if !p.is_null() && unsafe { CStr::from_ptr(p) }.to_bytes() == name.as_bytes() {
                // SAFETY: dev from the list, valid until freed.
                ctx = unsafe { (v.open_device)(dev) };
                if ctx.is_null() {
                    let e = errno();
                    unsafe { (v.free_device_list)(list) };
                    return Err(Error::Verbs { call: "ibv_open_device", errno: e });
                }
                break;
            }
        }
        // SAFETY: freed once; an open context stays valid after the list is freed.
        unsafe { (v.free_device_list)(list) };
        if ctx.is_null() {
            return Err(Error::NoDevice(format!("device {name} is gone")));
        }
        Ok(Arc::new(Context { v, ctx, name: name.to_string() }))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: opened in `open`; everything created from it holds an Arc and is gone.
        unsafe { (self.v.close_device)(self.ctx) };
    }
}

/// A protection domain.
pub struct Pd {
    ctx: Arc<Context>,
    pd: *mut sys::IbvPd,
}

unsafe impl Send for Pd {}
unsafe impl Sync for Pd {}

impl Pd {
    pub fn new(ctx: Arc<Context>) -> Result<Arc<Pd>> {
        // SAFETY: an open context.
        let pd = unsafe { (ctx.v.alloc_pd)(ctx.ctx) };
        if pd.is_null() {
            return Err(Error::Verbs { call: "ibv_alloc_pd", errno: errno() });
        }
        Ok(Arc::new(Pd { ctx, pd }))
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: MRs and QPs hold an Arc<Pd>, so none is left.
        unsafe { (self.ctx.v.dealloc_pd)(self.pd) };
    }
}

/// A registered memory region.
pub struct Mr {
    pd: Arc<Pd>,
    mr: *mut sys::IbvMr,
}

unsafe impl Send for Mr {}
unsafe impl Sync for Mr {}

impl Mr {
    /// Registers `[addr, addr + len)` for local and remote writes. The memory must stay mapped
    /// until the region is dropped.
    pub fn register(pd: Arc<Pd>, addr: usize, len: usize) -> Result<Mr> {
        let access = (sys::IBV_ACCESS_LOCAL_WRITE | sys::IBV_ACCESS_REMOTE_WRITE) as c_int;
        // SAFETY: a live PD; the kernel pins the range or fails.
        let mr = unsafe { (pd.ctx.v.reg_mr)(pd.pd, addr as *mut libc::c_void, len, access) };
        if mr.is_null() {
            return Err(Error::Verbs { call: "ibv_reg_mr", errno: errno() });
        }
        Ok(Mr { pd, mr })
    }

    pub fn lkey(&self) -> u32 {
        // SAFETY: valid until drop.
        unsafe { (*self.mr).lkey }
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: valid until drop.
        unsafe { (*self.mr).rkey }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered in `register`, deregistered once.
        unsafe { (self.pd.ctx.v.dereg_mr)(self.mr) };
    }
}

/// Plugs `ibv_reg_mr` into the registration cache.
pub struct PdRegistrar(pub Arc<Pd>);

impl Registrar for PdRegistrar {
    type Handle = Arc<Mr>;
    type Error = Error;
    fn register(&mut self, addr: usize, len: usize) -> Result<Arc<Mr>> {
        Mr::register(self.0.clone(), addr, len).map(Arc::new)
    }
    /// The region is deregistered when the last clone (a work request in flight) is dropped.
    fn deregister(&mut self, mr: Arc<Mr>) {
        drop(mr);
    }
}

/// A completion queue.
pub struct Cq {
    ctx: Arc<Context>,
    cq: *mut sys::IbvCq,
}

unsafe impl Send for Cq {}
unsafe impl Sync for Cq {}

impl Cq {
    pub fn new(ctx: Arc<Context>, entries: u32) -> Result<Arc<Cq>> {
        let n = c_int::try_from(entries).map_err(|_| Error::Conn(format!("{entries} CQ entries")))?;
        // SAFETY: an open context; no channel, no completion vector.
        let cq = unsafe { (ctx.v.create_cq)(ctx.ctx, n, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
        if cq.is_null() {
            return Err(Error::Verbs { call: "ibv_create_cq", errno: errno() });
        }
        Ok(Arc::new(Cq { ctx, cq }))
    }

    /// Polls up to `wc.len()` completions (the inline `ibv_poll_cq`: through the ops table).
    pub fn poll(&self, wc: &mut [sys::IbvWc]) -> Result<usize> {
        // SAFETY: cq is live; its context pointer and ops table are the provider's.
        let f = unsafe { (*(*self.cq).context).ops.poll_cq }
            .ok_or(Error::Verbs { call: "ibv_poll_cq (no provider op)", errno: libc::ENOSYS })?;
        let n = c_int::try_from(wc.len()).unwrap_or(c_int::MAX);
        // SAFETY: wc holds n entries.
        let got = unsafe { f(self.cq, n, wc.as_mut_ptr()) };
        if got < 0 {
            return Err(Error::Verbs { call: "ibv_poll_cq", errno: libc::EIO });
        }
        Ok(got as usize)
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: QPs hold an Arc<Cq>, so none uses it any more.
        unsafe { (self.ctx.v.destroy_cq)(self.cq) };
    }
}

/// A reliable-connected queue pair.
pub struct Qp {
    pd: Arc<Pd>,
    _cq: Arc<Cq>,
    qp: *mut sys::IbvQp,
}

unsafe impl Send for Qp {}

impl Qp {
    /// An RC QP in RESET whose sends and receives complete on `cq`.
    pub fn new(pd: Arc<Pd>, cq: Arc<Cq>, max_send: u32, max_recv: u32) -> Result<Qp> {
        let mut init = sys::IbvQpInitAttr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq.cq,
            recv_cq: cq.cq,
            srq: std::ptr::null_mut(),
            cap: sys::IbvQpCap {
                max_send_wr: max_send,
                max_recv_wr: max_recv,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: sys::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: live PD and CQ; init is a valid attribute struct.
        let qp = unsafe { (pd.ctx.v.create_qp)(pd.pd, &mut init) };
        if qp.is_null() {
            return Err(Error::Verbs { call: "ibv_create_qp", errno: errno() });
        }
        Ok(Qp { pd, _cq: cq, qp })
    }

    pub fn qp_num(&self) -> u32 {
        // SAFETY: valid until drop.
        unsafe { (*self.qp).qp_num }
    }

    /// Applies one step of `conn::Connection`.
    pub fn modify(&self, t: &Transition) -> Result<()> {
        let (mut attr, mask) = qp_attr(t);
        // SAFETY: a live QP and a fully initialised attribute struct.
        check("ibv_modify_qp", unsafe { (self.pd.ctx.v.modify_qp)(self.qp, &mut attr, mask) })
    }

    /// Posts one signalled RDMA write with immediate (`imm` in host order) of `local` (an
    /// address, length and lkey) to `remote` with `rkey`. A zero length sends only the
    /// immediate (credits).
    pub fn post_write_imm(&self, wr_id: u64, local: sys::IbvSge, remote: u64, rkey: u32, imm: u32) -> Result<()> {
        let mut sge = local;
        let mut wr = sys::IbvSendWr::default();
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = if local.length == 0 { 0 } else { 1 };
        wr.opcode = sys::IBV_WR_RDMA_WRITE_WITH_IMM;
        wr.send_flags = sys::IBV_SEND_SIGNALED;
        wr.imm_data = imm.to_be();
        wr.remote_addr = remote;
        wr.rkey = rkey;
        let mut bad = std::ptr::null_mut();
        // SAFETY: the inline ibv_post_send: through the QP's context ops table.
        let f = unsafe { (*(*self.qp).context).ops.post_send }
            .ok_or(Error::Verbs { call: "ibv_post_send (no provider op)", errno: libc::ENOSYS })?;
        // SAFETY: wr and sge live across the call; the provider copies them.
        check("ibv_post_send", unsafe { f(self.qp, &mut wr, &mut bad) })
    }

    /// Posts one zero-length receive: writes with immediate consume a receive each.
    pub fn post_recv(&self, wr_id: u64) -> Result<()> {
        let mut wr = sys::IbvRecvWr { wr_id, next: std::ptr::null_mut(), sg_list: std::ptr::null_mut(), num_sge: 0 };
        let mut bad = std::ptr::null_mut();
        // SAFETY: the inline ibv_post_recv, as above.
        let f = unsafe { (*(*self.qp).context).ops.post_recv }
            .ok_or(Error::Verbs { call: "ibv_post_recv (no provider op)", errno: libc::ENOSYS })?;
        // SAFETY: wr lives across the call.
        check("ibv_post_recv", unsafe { f(self.qp, &mut wr, &mut bad) })
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        unsafe { (self.pd.ctx.v.destroy_qp)(self.qp) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::Mtu;

    #[test]
    fn qp_attrs_for_each_transition() {
        let (a, m) = qp_attr(&Transition::Init { port: 2 });
        assert_eq!((a.qp_state, a.port_num), (sys::IBV_QPS_INIT, 2));
        assert_eq!(a.qp_access_flags, sys::IBV_ACCESS_LOCAL_WRITE | sys::IBV_ACCESS_REMOTE_WRITE);
        assert_eq!(m, sys::IBV_QP_STATE | sys::IBV_QP_PKEY_INDEX | sys::IBV_QP_PORT | sys::IBV_QP_ACCESS_FLAGS);

        let rtr = Transition::Rtr {
            port: 1,
            dest_qpn: 0x12345,
            rq_psn: 77,
            mtu: Mtu::M4096,
            dlid: 9,
            dgid: [7; 16],
            gid_index: None,
        };
        let (a, m) = qp_attr(&rtr);
        assert_eq!((a.qp_state, a.dest_qp_num, a.rq_psn, a.path_mtu), (sys::IBV_QPS_RTR, 0x12345, 77, 5));
        assert_eq!((a.ah_attr.dlid, a.ah_attr.is_global, a.ah_attr.port_num), (9, 0, 1), "InfiniBand: by LID");
        assert_ne!(m & sys::IBV_QP_AV, 0);
        assert_ne!(m & sys::IBV_QP_DEST_QPN, 0);
        assert_eq!(m & sys::IBV_QP_SQ_PSN, 0, "SQ PSN belongs to RTS");
        let roce = Transition::Rtr {
            port: 1,
            dest_qpn: 0x12345,
            rq_psn: 77,
            mtu: Mtu::M1024,
            dlid: 0,
            dgid: [7; 16],
            gid_index: Some(3),
        };
        let (a, _) = qp_attr(&roce);
        assert_eq!((a.ah_attr.is_global, a.ah_attr.grh.sgid_index, a.ah_attr.grh.dgid.raw), (1, 3, [7; 16]), "RoCE");

        let (a, m) = qp_attr(&Transition::Rts { sq_psn: 5 });
        assert_eq!((a.qp_state, a.sq_psn, a.retry_cnt, a.rnr_retry), (sys::IBV_QPS_RTS, 5, 7, 7));
        assert_ne!(m & sys::IBV_QP_SQ_PSN, 0);
        assert_eq!(m & sys::IBV_QP_AV, 0);
    }
}
