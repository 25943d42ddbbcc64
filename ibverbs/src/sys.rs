//! The C ABI of libibverbs.so.1, declared by hand (no build-time dependency on rdma-core).
//!
//! Matched against rdma-core's `libibverbs/verbs.h` at commit 691953d8 (August 2026) and the
//! `IBVERBS_1.1` symbol version of `libibverbs.map.in`, which every rdma-core since v13 exports
//! as the default version; these struct layouts are part of that frozen ABI. Only what occl
//! uses is declared. Structs that libibverbs allocates and occl only reads through a pointer
//! (`ibv_qp`, `ibv_cq`, `ibv_context`) are declared up to the last field read: never
//! allocate them here. Layout tests below pin every size and offset occl relies on
//! (x86-64 and aarch64 Linux: LP64).

use libc::{c_char, c_int, c_void};

/// `union ibv_gid`: 16 bytes, 8-aligned (it overlays two big-endian u64s).
#[repr(C, align(8))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IbvGid {
    pub raw: [u8; 16],
}

/// Opaque `struct ibv_device`; its name is read through `ibv_get_device_name`.
#[repr(C)]
pub struct IbvDevice {
    _opaque: [u8; 0],
}

/// `struct ibv_context_ops`: 32 function pointers. `ibv_poll_cq`, `ibv_post_send` and
/// `ibv_post_recv` are `static inline` in verbs.h and call through this table, so there is no
/// symbol to look up for them; the other slots are unused here.
#[repr(C)]
pub struct IbvContextOps {
    _compat_0_10: [*const c_void; 11],
    pub poll_cq: Option<unsafe extern "C" fn(*mut IbvCq, c_int, *mut IbvWc) -> c_int>,
    _req_notify_cq_to_destroy_qp: [*const c_void; 13],
    pub post_send: Option<unsafe extern "C" fn(*mut IbvQp, *mut IbvSendWr, *mut *mut IbvSendWr) -> c_int>,
    pub post_recv: Option<unsafe extern "C" fn(*mut IbvQp, *mut IbvRecvWr, *mut *mut IbvRecvWr) -> c_int>,
    _create_ah_to_async_event: [*const c_void; 5],
}

/// `struct ibv_context`, up to the ops table.
#[repr(C)]
pub struct IbvContext {
    pub device: *mut IbvDevice,
    pub ops: IbvContextOps,
}

/// `struct _compat_ibv_port_attr` followed by the fields rdma-core added later. The exported
/// `ibv_query_port@IBVERBS_1.1` fills only the compatible prefix (48 bytes, `link_layer`
/// included); the caller zeroes the rest, as verbs.h's inline wrapper does.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IbvPortAttr {
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
    pub active_speed_ex: u32,
}

/// `enum ibv_port_state`: IBV_PORT_ACTIVE.
pub const IBV_PORT_ACTIVE: u32 = 4;
/// `IBV_LINK_LAYER_*`.
pub const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

/// `struct ibv_pd`.
#[repr(C)]
pub struct IbvPd {
    pub context: *mut IbvContext,
    pub handle: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct IbvMr {
    pub context: *mut IbvContext,
    pub pd: *mut IbvPd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_cq`, up to the context (read by the inline `ibv_poll_cq`).
#[repr(C)]
pub struct IbvCq {
    pub context: *mut IbvContext,
}

/// `struct ibv_qp`, up to `qp_num`.
#[repr(C)]
pub struct IbvQp {
    pub context: *mut IbvContext,
    pub qp_context: *mut c_void,
    pub pd: *mut IbvPd,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IbvQpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub struct IbvQpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut c_void,
    pub cap: IbvQpCap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

/// `IBV_QPT_RC`.
pub const IBV_QPT_RC: u32 = 2;

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IbvGlobalRoute {
    pub dgid: IbvGid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IbvAhAttr {
    pub grh: IbvGlobalRoute,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IbvQpAttr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub cap: IbvQpCap,
    pub ah_attr: IbvAhAttr,
    pub alt_ah_attr: IbvAhAttr,
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

/// `enum ibv_qp_state`.
pub const IBV_QPS_INIT: u32 = 1;
pub const IBV_QPS_RTR: u32 = 2;
pub const IBV_QPS_RTS: u32 = 3;

/// `enum ibv_qp_attr_mask`.
pub const IBV_QP_STATE: c_int = 1 << 0;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
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

/// `enum ibv_access_flags`.
pub const IBV_ACCESS_LOCAL_WRITE: u32 = 1;
pub const IBV_ACCESS_REMOTE_WRITE: u32 = 1 << 1;

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IbvSge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_send_wr` (128 bytes). The `wr` union is spelled as its `rdma` member plus the
/// rest of the largest member (`atomic`, 32 bytes); the trailing `bind_mw`/`tso` union (48
/// bytes) is padding here, since occl posts only RDMA writes.
#[repr(C)]
pub struct IbvSendWr {
    pub wr_id: u64,
    pub next: *mut IbvSendWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: u32,
    /// Network byte order, as verbs.h says.
    pub imm_data: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    _wr_rest: [u32; 5],
    pub remote_srqn: u32,
    _bind_mw_or_tso: [u64; 6],
}

impl Default for IbvSendWr {
    fn default() -> Self {
        IbvSendWr {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
            opcode: 0,
            send_flags: 0,
            imm_data: 0,
            remote_addr: 0,
            rkey: 0,
            _wr_rest: [0; 5],
            remote_srqn: 0,
            _bind_mw_or_tso: [0; 6],
        }
    }
}

/// `enum ibv_wr_opcode`: IBV_WR_RDMA_WRITE_WITH_IMM.
pub const IBV_WR_RDMA_WRITE_WITH_IMM: u32 = 1;
/// `enum ibv_send_flags`: IBV_SEND_SIGNALED.
pub const IBV_SEND_SIGNALED: u32 = 1 << 1;

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct IbvRecvWr {
    pub wr_id: u64,
    pub next: *mut IbvRecvWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
}

/// `struct ibv_wc` (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IbvWc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Network byte order when `wc_flags` has IBV_WC_WITH_IMM.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `enum ibv_wc_status`: IBV_WC_SUCCESS.
pub const IBV_WC_SUCCESS: u32 = 0;
/// `enum ibv_wc_opcode`: IBV_WC_RECV_RDMA_WITH_IMM.
pub const IBV_WC_RECV_RDMA_WITH_IMM: u32 = (1 << 7) + 1;
/// `enum ibv_wc_flags`: IBV_WC_WITH_IMM.
pub const IBV_WC_WITH_IMM: u32 = 1 << 1;

/// The exported functions occl calls, with their C signatures.
pub type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut IbvDevice;
pub type FreeDeviceList = unsafe extern "C" fn(*mut *mut IbvDevice);
pub type GetDeviceName = unsafe extern "C" fn(*mut IbvDevice) -> *const c_char;
pub type OpenDevice = unsafe extern "C" fn(*mut IbvDevice) -> *mut IbvContext;
pub type CloseDevice = unsafe extern "C" fn(*mut IbvContext) -> c_int;
pub type QueryPort = unsafe extern "C" fn(*mut IbvContext, u8, *mut IbvPortAttr) -> c_int;
pub type QueryGid = unsafe extern "C" fn(*mut IbvContext, u8, c_int, *mut IbvGid) -> c_int;
pub type AllocPd = unsafe extern "C" fn(*mut IbvContext) -> *mut IbvPd;
pub type DeallocPd = unsafe extern "C" fn(*mut IbvPd) -> c_int;
pub type RegMr = unsafe extern "C" fn(*mut IbvPd, *mut c_void, usize, c_int) -> *mut IbvMr;
pub type DeregMr = unsafe extern "C" fn(*mut IbvMr) -> c_int;
pub type CreateCq = unsafe extern "C" fn(*mut IbvContext, c_int, *mut c_void, *mut c_void, c_int) -> *mut IbvCq;
pub type DestroyCq = unsafe extern "C" fn(*mut IbvCq) -> c_int;
pub type CreateQp = unsafe extern "C" fn(*mut IbvPd, *mut IbvQpInitAttr) -> *mut IbvQp;
pub type DestroyQp = unsafe extern "C" fn(*mut IbvQp) -> c_int;
pub type ModifyQp = unsafe extern "C" fn(*mut IbvQp, *mut IbvQpAttr, c_int) -> c_int;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    // Sizes and offsets worked out from verbs.h for LP64; a mismatch here means a field was
    // declared wrongly and the library would read or write the wrong bytes.
    #[test]
    fn layouts_match_verbs_h() {
        assert_eq!(size_of::<IbvGid>(), 16);
        assert_eq!(size_of::<IbvContextOps>(), 32 * 8);
        assert_eq!(offset_of!(IbvContextOps, poll_cq), 11 * 8);
        assert_eq!(offset_of!(IbvContextOps, post_send), 25 * 8);
        assert_eq!(offset_of!(IbvContextOps, post_recv), 26 * 8);
        assert_eq!(offset_of!(IbvContext, ops), 8);
        assert_eq!(size_of::<IbvPortAttr>(), 56);
        assert_eq!(offset_of!(IbvPortAttr, lid), 34);
        assert_eq!(offset_of!(IbvPortAttr, link_layer), 46);
        assert_eq!(size_of::<IbvMr>(), 48);
        assert_eq!(offset_of!(IbvMr, lkey), 36);
        assert_eq!(offset_of!(IbvMr, rkey), 40);
        assert_eq!(offset_of!(IbvQp, qp_num), 52);
        assert_eq!(size_of::<IbvQpInitAttr>(), 64);
        assert_eq!(offset_of!(IbvQpInitAttr, qp_type), 52);
        assert_eq!(size_of::<IbvGlobalRoute>(), 24);
        assert_eq!(size_of::<IbvAhAttr>(), 32);
        assert_eq!(offset_of!(IbvAhAttr, port_num), 30);
        assert_eq!(size_of::<IbvQpAttr>(), 144);
        assert_eq!(offset_of!(IbvQpAttr, ah_attr), 56);
        assert_eq!(offset_of!(IbvQpAttr, pkey_index), 120);
        assert_eq!(offset_of!(IbvQpAttr, min_rnr_timer), 128);
        assert_eq!(offset_of!(IbvQpAttr, port_num), 129);
        assert_eq!(offset_of!(IbvQpAttr, rnr_retry), 132);
        assert_eq!(offset_of!(IbvQpAttr, rate_limit), 136);
        assert_eq!(size_of::<IbvSge>(), 16);
        assert_eq!(size_of::<IbvSendWr>(), 128);
        assert_eq!(offset_of!(IbvSendWr, imm_data), 36);
        assert_eq!(offset_of!(IbvSendWr, remote_addr), 40);
        assert_eq!(offset_of!(IbvSendWr, rkey), 48);
        assert_eq!(offset_of!(IbvSendWr, remote_srqn), 72);
        assert_eq!(size_of::<IbvRecvWr>(), 32);
        assert_eq!(size_of::<IbvWc>(), 48);
        assert_eq!(offset_of!(IbvWc, imm_data), 24);
        assert_eq!(offset_of!(IbvWc, wc_flags), 36);
    }
}
