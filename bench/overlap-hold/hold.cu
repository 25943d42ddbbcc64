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
// shared memory; 0 or a CUDA error code.
extern "C" int occl_hold(int blocks, u64 ns, int smem, void* stream) {
    cudaError_t e = cudaFuncSetAttribute(hold, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return (int)e;
    hold<<<blocks, 32, smem, (cudaStream_t)stream>>>(ns);
    return (int)cudaGetLastError();
}
