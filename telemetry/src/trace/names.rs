//! How collectives are named in a trace: kernel names HTA classifies as communication, and the
//! values PyTorch writes for its collective metadata keys.

/// NCCL's datatype spelling as the short type token NCCL uses in its kernel names.
pub(crate) fn type_token(datatype: &str) -> &'static str {
    match datatype {
        "ncclInt8" => "i8",
        "ncclUint8" => "u8",
        "ncclInt32" => "i32",
        "ncclUint32" => "u32",
        "ncclInt64" => "i64",
        "ncclUint64" => "u64",
        "ncclFloat16" => "f16",
        "ncclFloat32" => "f32",
        "ncclFloat64" => "f64",
        "ncclBfloat16" => "bf16",
        "ncclFloat8e4m3" => "f8e4m3",
        "ncclFloat8e5m2" => "f8e5m2",
        _ => "unknown",
    }
}

/// PyTorch's `dtype` value (c10's ScalarType name) for an NCCL datatype.
pub(crate) fn torch_dtype(datatype: &str) -> &'static str {
    match datatype {
        "ncclInt8" => "Char",
        "ncclUint8" => "Byte",
        "ncclInt32" => "Int",
        "ncclUint32" => "UInt32",
        "ncclInt64" => "Long",
        "ncclUint64" => "UInt64",
        "ncclFloat16" => "Half",
        "ncclFloat32" => "Float",
        "ncclFloat64" => "Double",
        "ncclBfloat16" => "BFloat16",
        "ncclFloat8e4m3" => "Float8_e4m3fn",
        "ncclFloat8e5m2" => "Float8_e5m2",
        _ => "Undefined",
    }
}

/// PyTorch's `Collective name` for an NCCL function.
pub(crate) fn torch_collective(func: &str) -> &'static str {
    match func {
        "AllReduce" => "allreduce",
        "Broadcast" => "broadcast",
        "Reduce" => "reduce",
        "AllGather" => "all_gather",
        "ReduceScatter" => "reduce_scatter",
        "AlltoAll" => "all_to_all",
        "Gather" => "gather",
        "Scatter" => "scatter",
        "Send" => "send",
        "Recv" => "recv",
        "SendRecv" => "sendrecv",
        _ => "unknown",
    }
}

/// Input and output element counts of one rank (PyTorch's `In msg nelems` / `Out msg nelems`)
/// from NCCL's `count`, which is per rank for the gathering and scattering functions.
pub(crate) fn msg_nelems(func: &str, count: usize, nranks: usize) -> (usize, usize) {
    let all = count.saturating_mul(nranks);
    match func {
        "AllGather" | "Gather" => (count, all),
        "ReduceScatter" | "Scatter" => (all, count),
        "AlltoAll" => (all, all),
        _ => (count, count),
    }
}

/// The kernel-like row's name. The `ncclKernel_` prefix is what HTA's kernel classifier calls
/// communication and the only one its straggler analysis counts (newer NCCL's `ncclDevKernel_`
/// is not); the rest follows NCCL's pre-2.19 layout: function, algorithm, protocol, type.
pub(crate) fn kernel_name(func: &str, algo: Option<(&str, &str)>, datatype: &str) -> String {
    let t = type_token(datatype);
    match algo {
        Some((a, p)) if !a.is_empty() => format!("ncclKernel_{func}_{a}_{p}_{t}"),
        _ => format!("ncclKernel_{func}_{t}"),
    }
}

/// The CPU call's row name: NCCL's API function for it.
pub(crate) fn api_name(func: &str) -> String {
    format!("nccl{func}")
}

/// NCCL's name of a ProxyOp or ProxyStep state number, for row arguments.
pub(crate) fn state_name(state: u32) -> &'static str {
    crate::event::state_name(state).unwrap_or("Other")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_nccl_and_pytorch() {
        assert_eq!(
            kernel_name("AllReduce", Some(("RING", "SIMPLE")), "ncclFloat32"),
            "ncclKernel_AllReduce_RING_SIMPLE_f32"
        );
        assert_eq!(kernel_name("Send", None, "ncclBfloat16"), "ncclKernel_Send_bf16");
        assert_eq!(api_name("AlltoAll"), "ncclAlltoAll");
        assert_eq!((torch_collective("AllGather"), torch_dtype("ncclFloat32")), ("all_gather", "Float"));
        assert_eq!(msg_nelems("AllGather", 10, 4), (10, 40));
        assert_eq!(msg_nelems("ReduceScatter", 10, 4), (40, 10));
        assert_eq!(msg_nelems("AlltoAll", 10, 4), (40, 40));
        assert_eq!(msg_nelems("AllReduce", 10, 4), (10, 10));
        assert_eq!((state_name(8), state_name(20), state_name(19)), ("SendGPUWait", "SendPeerWait", "InProgress"));
    }
}
