// A kernel that holds K SMs for a while and does nothing else: K blocks whose dynamic shared
// memory (reserved at launch, used or not) leaves no room on their SM for another of them or for
// a matrix multiply's block, each spinning on %globaltimer for `ns` from its own start. For
// overlap-hold.py (ctypes).
#include <cuda_runtime.h>

typedef unsigned long long u64;

__device__ __forceinline__ u64 gtimer() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void hold(u64 ns) {
    if (threadIdx.x != 0) return;
    const u64 t0 = gtimer();
    while (gtimer() - t0 < ns) {
    }
}

// Enqueues one hold of `blocks` SMs for `ns` on `stream`, each block reserving `smem` bytes of
// shared memory; with `cluster` > 1, launched as clusters of that many blocks spread over the
// GPU's processing clusters, as NCCL launches its kernels on sm90 (cgaClusterSize, default 4).
// 0 or a CUDA error code.
extern "C" int occl_hold(int blocks, u64 ns, int smem, int cluster, void* stream) {
    cudaError_t e = cudaFuncSetAttribute(hold, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return (int)e;
    if (cluster <= 1) {
        hold<<<blocks, 32, smem, (cudaStream_t)stream>>>(ns);
        return (int)cudaGetLastError();
    }
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attrs[2];
    attrs[0].id = cudaLaunchAttributeClusterDimension;
    attrs[0].val.clusterDim.x = cluster;
    attrs[0].val.clusterDim.y = 1;
    attrs[0].val.clusterDim.z = 1;
    attrs[1].id = cudaLaunchAttributeClusterSchedulingPolicyPreference;
    attrs[1].val.clusterSchedulingPolicyPreference = cudaClusterSchedulingPolicySpread;
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(32);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = (cudaStream_t)stream;
    cfg.attrs = attrs;
    cfg.numAttrs = 2;
    return (int)cudaLaunchKernelEx(&cfg, hold, ns);
}
