// A kernel that holds K SMs for a while and does nothing else: K blocks, each asking for enough
// shared memory that no other block of it fits on the same SM (nor a matrix multiply's block),
// each spinning on %globaltimer for `ns` from its own start. For overlap-hold.py (ctypes).
#include <cuda_runtime.h>

typedef unsigned long long u64;

__device__ __forceinline__ u64 gtimer() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void hold(u64 ns, int* sink) {
    extern __shared__ unsigned char sm[];
    if (threadIdx.x != 0) return;
    const u64 t0 = gtimer();
    unsigned spins = 0;
    while (gtimer() - t0 < ns) spins++;
    sm[0] = (unsigned char)spins;  // uses the shared memory, so it is not dropped
    if (sm[0] == 255 && spins == 0) *sink = 1;
}

// Enqueues one hold of `blocks` SMs for `ns` on `stream`; 0 or a CUDA error code.
extern "C" int occl_hold(int blocks, u64 ns, int smem, void* stream) {
    static int* sink = nullptr;
    if (!sink && cudaMalloc(&sink, sizeof(int)) != cudaSuccess) return -1;
    cudaError_t e = cudaFuncSetAttribute(hold, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return (int)e;
    hold<<<blocks, 32, smem, (cudaStream_t)stream>>>(ns, sink);
    return (int)cudaGetLastError();
}
