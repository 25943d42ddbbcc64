// nvlink-probe: what one SM, and B SMs, can move over NVLink between GPU 0 and GPU 1, and which
// copy pattern gets there (occl issue 30). One process, both GPUs, peer access both ways.
//
//   ./nvlink-probe SECTION     SECTION: push | pull | tma-push | tma-pull | fifo | ce | local | ce-fifo | all
//
// Every section prints a markdown table of GB/s = bytes delivered to the destination / time,
// timed with cudaEvents, median of 5 runs after one warm-up run. Every case clears its
// destination first and checks all of it afterwards (a GPU kernel compares it with the source
// pattern): a wrong result prints BAD instead of a rate, a failed launch ERR.
//
//   push      (1a, 1b) SM copy kernel on GPU0: reads GPU0's buffer, writes GPU1's buffer.
//             16-byte __ldcg loads, U loads per thread before its U stores, with plain (st.wb),
//             st.cg, st.cs and st.wt stores; plus occl's shape (each block one contiguous range,
//             as copy_packs) and occl's broadcast root (the same, also writing a local copy).
//   pull      (2) the same kernels on GPU1, reading GPU0's buffer and writing its own.
//   tma-push  (1c) Hopper bulk copies on GPU0: one thread per block moves C-byte chunks through
//             NB shared-memory buffers: cp.async.bulk global->shared (mbarrier) then
//             cp.async.bulk shared->global (bulk_group) into GPU1; and a variant where the
//             block's 512 threads fill shared memory with plain loads and one thread bulk-stores.
//   tma-pull  the same kernels on GPU1 (bulk loads from GPU0's memory).
//   fifo      (3) occl's broadcast protocol: per channel a ring of S slots of K bytes in GPU1's
//             memory; the producer on GPU0 fills a slot, fences and releases a head flag in GPU1's
//             memory; a consumer kernel on GPU1 copies the slot out and releases a tail flag in
//             GPU0's memory. 1 or 2 channels ("lanes", 512 threads each) per block.
//   ce        (4) copy engines: cudaMemcpyPeerAsync on 1, 2, 4 streams, and local D2D, alone and
//             beside a kernel that fills every SM's thread slots for ~200 ms.
//   ce-fifo   (6) copy engines push, SMs copy out: Q rings of S slots of K bytes in GPU1's memory;
//             on GPU0, one stream per ring waits (cuStreamWaitValue64) for a free slot, peer-copies
//             a chunk into it and writes the ring's head (cuStreamWriteValue64); a kernel of B
//             512-thread blocks on GPU1 (B/Q a ring) copies each chunk out and frees its slot.
//   local     (5) SM copies within GPU0 (a channel's copy-out of its slot, an all-to-all's own
//             block): occl's copy_packs shape and the bulk copies of (1c), GPU0 buffer -> GPU0.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <unistd.h>
#include <vector>

typedef unsigned long long u64;
typedef unsigned u32;

static const char* g_case = "setup";  // the case being run, named when a CUDA call fails
#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d [%s] %s: %s\n", __FILE__, __LINE__, g_case, #x, cudaGetErrorString(e_)); \
            printf("\n**aborted in case `%s`: %s**\n", g_case, cudaGetErrorString(e_));        \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

static const u64 MiB = 1ull << 20, GiB = 1ull << 30;
static const u64 TIMEOUT_NS = 2000000000ull;  // a spin or barrier wait longer than this is a bug
static const int REPS = 5;

#define DEV static __device__ __forceinline__

// ---------------------------------------------------------------- pattern and check

// 32-bit word i of the source buffer (and so of every correct destination).
__host__ __device__ inline u32 pat(u64 i) { return (u32)(i * 2654435761ull) ^ 0x5bd1e995u ^ (u32)(i >> 32); }

__global__ void fill(u32* p, u64 n) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) p[i] = pat(i);
}

__device__ u64 g_bad;  // one per device
__global__ void check(const u32* p, u64 n) {
    u64 bad = 0;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) bad += p[i] != pat(i);
    if (bad) atomicAdd(&g_bad, bad);
}

// Words of dev's buffer p (nbytes) that differ from the pattern.
static u64 count_bad(int dev, const void* p, u64 nbytes) {
    CK(cudaSetDevice(dev));
    const u64 zero = 0;
    CK(cudaMemcpyToSymbol(g_bad, &zero, sizeof zero));
    check<<<1024, 512>>>((const u32*)p, nbytes / 4);
    CK(cudaGetLastError());
    u64 bad;
    CK(cudaMemcpyFromSymbol(&bad, g_bad, sizeof bad));
    return bad;
}

DEV u64 gtimer() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// ---------------------------------------------------------------- (1a, 1b, 2) SM copy kernels

enum { S_WB, S_CG, S_CS, S_WT };
static const char* st_name[] = {"st", "st.cg", "st.cs", "st.wt"};

template <int ST>
DEV void st16(uint4* p, uint4 v) {
    if (ST == S_WB) *p = v;
    else if (ST == S_CG) __stcg(p, v);
    else if (ST == S_CS) __stcs(p, v);
    else __stwt(p, v);
}

// Tiles of T*U packs dealt round-robin to blocks; a thread loads its U packs (stride T, so every
// warp access is coalesced) before storing them. nv must be a multiple of T*U. (d1 unused.)
template <int U, int ST>
__global__ void __launch_bounds__(1024) copy_tiles(uint4* __restrict__ d0, uint4* __restrict__ d1, const uint4* __restrict__ s, u64 nv) {
    const u64 T = blockDim.x, tile = T * U;
    for (u64 i = blockIdx.x * tile + threadIdx.x; i < nv; i += gridDim.x * tile) {
        uint4 x[U];
#pragma unroll
        for (int u = 0; u < U; u++) x[u] = __ldcg(s + i + u * T);
#pragma unroll
        for (int u = 0; u < U; u++) st16<ST>(d0 + i + u * T, x[u]);
    }
}

// occl's copy_packs: block b copies one contiguous range (a channel's share), U packs a thread
// per step, into ND destinations (ND = 2: occl's broadcast root also writes its own output).
template <int U, int ND>
__global__ void __launch_bounds__(1024) copy_ranges(uint4* __restrict__ d0, uint4* __restrict__ d1, const uint4* __restrict__ s, u64 nv) {
    const u64 T = blockDim.x, lo = nv * blockIdx.x / gridDim.x, hi = nv * (blockIdx.x + 1) / gridDim.x;
    u64 i = lo + threadIdx.x;
    for (; i + (U - 1) * T < hi; i += U * T) {
        uint4 x[U];
#pragma unroll
        for (int u = 0; u < U; u++) x[u] = __ldcg(s + i + u * T);
#pragma unroll
        for (int u = 0; u < U; u++) d0[i + u * T] = x[u];
        if (ND == 2)
#pragma unroll
            for (int u = 0; u < U; u++) d1[i + u * T] = x[u];
    }
    for (; i < hi; i += T) {
        const uint4 x = __ldcg(s + i);
        d0[i] = x;
        if (ND == 2) d1[i] = x;
    }
}

typedef void (*CopyK)(uint4*, uint4*, const uint4*, u64);
struct Pat {
    std::string name;
    CopyK k;
    int unroll;  // tile granularity (packs per thread per step)
    bool dual;   // also writes a local copy on the executing GPU
};

static std::vector<Pat> copy_patterns(bool with_dual) {
    std::vector<Pat> v;
#define TILES(ST)                                                                              \
    v.push_back({std::string("tiles ldcg U=1 ") + st_name[ST], copy_tiles<1, ST>, 1, false}); \
    v.push_back({std::string("tiles ldcg U=4 ") + st_name[ST], copy_tiles<4, ST>, 4, false}); \
    v.push_back({std::string("tiles ldcg U=8 ") + st_name[ST], copy_tiles<8, ST>, 8, false});
    TILES(S_WB) TILES(S_CG) TILES(S_CS) TILES(S_WT)
#undef TILES
    v.push_back({"ranges U=8 st (occl copy_packs)", copy_ranges<8, 1>, 8, false});
    if (with_dual) v.push_back({"ranges U=8 st + local copy (occl bcast root)", copy_ranges<8, 2>, 8, true});
    return v;
}

// ---------------------------------------------------------------- (1c) Hopper bulk copies

DEV u32 smem(const void* p) { return (u32)__cvta_generic_to_shared(p); }
DEV void mbar_init(u32 bar, u32 count) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory"); }
// Arrive (the only arrival) and expect `bytes` of transactions in the current phase.
DEV void mbar_expect(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
DEV bool mbar_try(u32 bar, u32 parity) {
    u32 ok;
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(ok)
        : "r"(bar), "r"(parity)
        : "memory");
    return ok != 0;
}
DEV void mbar_wait(u32 bar, u32 parity) {
    if (mbar_try(bar, parity)) return;
    const u64 t0 = gtimer();
    while (!mbar_try(bar, parity))
        if (gtimer() - t0 > TIMEOUT_NS) {
            printf("nvlink-probe: mbarrier wait timed out (block %d)\n", blockIdx.x);
            __trap();
        }
}
// global -> this CTA's shared memory, completion counted in bytes on mbarrier `bar`.
DEV void bulk_load(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst), "l"(src),
                 "r"(bytes), "r"(bar)
                 : "memory");
}
// this CTA's shared memory -> global, tracked in bulk async-groups of the issuing thread.
DEV void bulk_store(void* dst, u32 src, u32 bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(src), "r"(bytes) : "memory");
}
DEV void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// Until at most N of this thread's bulk groups still read their shared-memory source.
template <int N>
DEV void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory"); }
// Until all of this thread's bulk groups are complete (writes performed).
DEV void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
// Make this thread's generic-proxy shared-memory writes visible to the async proxy (bulk copies).
DEV void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// Chunk k of block b is chunk b + k*B of the buffer; thread 0 alone moves them through NB
// buffers of C bytes: bulk load -> wait mbarrier -> bulk store. The buffer a store reads from is
// reloaded one iteration later, once that store has read it (wait_group.read 1), so one store's
// shared-memory read overlaps the next load; remote writes in flight are not waited for.
template <int NB>
__global__ void tma_copy(char* __restrict__ dst, const char* __restrict__ src, u64 nbytes, u32 C) {
    extern __shared__ __align__(128) unsigned char sm[];
    __shared__ __align__(8) u64 bars[NB];
    if (threadIdx.x != 0) return;
    const u64 nch = nbytes / C, B = gridDim.x, b = blockIdx.x;
    const u64 mine = b < nch ? (nch - b + B - 1) / B : 0;
    for (int s = 0; s < NB; s++) mbar_init(smem(&bars[s]), 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    fence_proxy_async();
    for (u64 k = 0; k < mine && k < NB; k++) {
        mbar_expect(smem(&bars[k]), C);
        bulk_load(smem(sm + k * C), src + (b + k * B) * C, C, smem(&bars[k]));
    }
    for (u64 k = 0; k < mine; k++) {
        const int s = k % NB;
        mbar_wait(smem(&bars[s]), (u32)((k / NB) & 1));
        bulk_store(dst + (b + k * B) * C, smem(sm + s * C), C);
        bulk_commit();
        if (k >= 1 && k - 1 + NB < mine) {
            const int r = (k - 1) % NB;
            bulk_wait_read<1>();  // store k-1 is done reading buffer r
            mbar_expect(smem(&bars[r]), C);
            bulk_load(smem(sm + r * C), src + (b + (k - 1 + NB) * B) * C, C, smem(&bars[r]));
        }
    }
    bulk_wait_all();
}

// The block's threads load chunk k with __ldcg into buffer k % NB, then thread 0 bulk-stores
// it (how occl could reduce in registers and still push with the copy engine of the SM).
template <int NB>
__global__ void __launch_bounds__(1024) smem_bulk_copy(char* __restrict__ dst, const char* __restrict__ src, u64 nbytes, u32 C) {
    extern __shared__ __align__(128) unsigned char sm[];
    const u64 nch = nbytes / C;
    u64 k = 0;
    for (u64 c = blockIdx.x; c < nch; c += gridDim.x, k++) {
        const int s = k % NB;
        if (threadIdx.x == 0) bulk_wait_read<NB - 1>();  // store k-NB is done reading buffer s
        __syncthreads();
        const uint4* g = (const uint4*)(src + c * C);
        uint4* buf = (uint4*)(sm + s * C);
#pragma unroll 4
        for (u32 i = threadIdx.x; i < C / 16; i += blockDim.x) buf[i] = __ldcg(g + i);
        fence_proxy_async();
        __syncthreads();
        if (threadIdx.x == 0) {
            bulk_store(dst + c * C, smem(buf), C);
            bulk_commit();
        }
    }
    if (threadIdx.x == 0) bulk_wait_all();
}

// ---------------------------------------------------------------- (3) FIFO protocol

DEV u64 ld_acquire(const u64* p) {
    u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
DEV void st_release(u64* p, u64 v) { asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory"); }
DEV bool spin_ge(const u64* p, u64 want) {  // false on timeout
    if (ld_acquire(p) >= want) return true;
    const u64 t0 = gtimer();
    while (ld_acquire(p) < want)
        if (gtimer() - t0 > TIMEOUT_NS) return false;
    return true;
}

#define LANE 512
DEV void lane_sync(u32 l) { asm volatile("bar.sync %0, %1;" ::"r"(l + 1), "n"(LANE) : "memory"); }

// copy_packs for one 512-thread lane: 8 loads then their stores, into d0 and (if set) d1.
DEV void lane_copy(uint4* d0, uint4* d1, const uint4* s, u64 n, u32 t) {
    u64 i = t;
    for (; i + 7 * LANE < n; i += 8 * LANE) {
        uint4 x[8];
#pragma unroll
        for (int u = 0; u < 8; u++) x[u] = __ldcg(s + i + u * LANE);
#pragma unroll
        for (int u = 0; u < 8; u++) d0[i + u * LANE] = x[u];
        if (d1)
#pragma unroll
            for (int u = 0; u < 8; u++) d1[i + u * LANE] = x[u];
    }
    for (; i < n; i += LANE) {
        const uint4 x = __ldcg(s + i);
        d0[i] = x;
        if (d1) d1[i] = x;
    }
}

struct Fifo {
    const uint4* src;  // GPU0: the data
    uint4* out;        // GPU1: where the consumer puts it
    uint4* local;      // GPU0: the producer's own copy (occl's broadcast root), or null
    char* slots;       // GPU1: [channel][S][K]
    u64* head;         // GPU1: [channel * 16] chunks the producer has put in the channel's slots
    u64* tail;         // GPU0: [channel * 16] chunks the consumer has taken out
    u64 nv;            // 16-byte packs in all
    u64 K;             // slot bytes
    u32 S;             // slots per channel
    u32 fence;         // producer: __threadfence_system before its release of head (occl: no)
};

__device__ int g_fail;  // one per device: a flag wait timed out

// Channel ch = block * LANES + lane owns a contiguous share of the data, cut into K-byte chunks;
// chunk k goes through slot k % S.
template <int LANES, bool PRODUCER>
__global__ void __launch_bounds__(LANE * LANES) fifo_kernel(const Fifo f) {
    __shared__ int failed[LANES];
    const u32 l = threadIdx.x / LANE, t = threadIdx.x % LANE;
    const u64 ch = (u64)blockIdx.x * LANES + l, nch = (u64)gridDim.x * LANES;
    const u64 lo = f.nv * ch / nch, hi = f.nv * (ch + 1) / nch, kv = f.K / 16;
    if (t == 0) failed[l] = 0;
    u64 k = 0;
    for (u64 o = lo; o < hi; o += kv, k++) {
        uint4* slot = (uint4*)(f.slots + (ch * f.S + k % f.S) * f.K);
        const u64 m = hi - o < kv ? hi - o : kv;
        if (t == 0) {
            // producer: a free slot (the consumer has taken chunk k - S); consumer: chunk k is in
            const bool ok = PRODUCER ? (k < f.S || spin_ge(&f.tail[ch * 16], k + 1 - f.S)) : spin_ge(&f.head[ch * 16], k + 1);
            if (!ok) failed[l] = 1;
        }
        lane_sync(l);
        if (failed[l]) break;
        if (PRODUCER) lane_copy(slot, f.local ? f.local + o : nullptr, f.src + o, m, t);
        else lane_copy(f.out + o, nullptr, slot, m, t);
        lane_sync(l);
        if (t == 0) {
            if (PRODUCER) {
                if (f.fence) __threadfence_system();
                st_release(&f.head[ch * 16], k + 1);
            } else {
                st_release(&f.tail[ch * 16], k + 1);
            }
        }
    }
    if (t == 0 && failed[l]) atomicExch(&g_fail, 1);
}

// ---------------------------------------------------------------- (6) copy engines in, SMs out

struct CeFifo {
    uint4* out;   // GPU1: where the consumer puts the data
    char* slots;  // GPU1: [ring][S][K]
    u64* head;    // GPU1: [ring * 16] chunks the ring's stream has put in
    u64* gen;     // GPU0: [ring * S + slot] times the slot has been freed
    u32* cnt;     // GPU1: [ring * S + slot] blocks done with the slot, ever
    u64 bytes;    // in all; ring q carries bytes / Q from q * bytes / Q
    u64 K;
    u32 S, Q;
};

// Block b serves ring b % Q as its (b / Q)-th of M = B / Q blocks: for every chunk, thread 0
// waits for the ring's head, the block copies its M-th of the chunk out, and the last of the M
// blocks done frees the slot for the producer's stream (gen, in GPU0's memory).
__global__ void __launch_bounds__(LANE) ce_fifo_consumer(const CeFifo f) {
    __shared__ int failed;
    const u32 t = threadIdx.x, q = blockIdx.x % f.Q, M = gridDim.x / f.Q, i = blockIdx.x / f.Q;
    const u64 share = f.bytes / f.Q, nch = (share + f.K - 1) / f.K;
    if (t == 0) failed = 0;
    for (u64 j = 0; j < nch; j++) {
        const u32 sl = (u32)(j % f.S);
        const u64 m = share - j * f.K < f.K ? share - j * f.K : f.K;
        if (t == 0 && !spin_ge(&f.head[q * 16], j + 1)) failed = 1;
        __syncthreads();
        if (failed) break;
        const u64 nv = m / 16, lo = nv * i / M, hi = nv * (i + 1) / M;
        const uint4* slot = (const uint4*)(f.slots + ((u64)q * f.S + sl) * f.K);
        lane_copy(f.out + (q * share + j * f.K) / 16 + lo, nullptr, slot + lo, hi - lo, t);
        __syncthreads();
        if (t == 0 && atomicAdd(&f.cnt[q * f.S + sl], 1u) + 1 == M * (u32)(j / f.S + 1)) st_release(&f.gen[q * f.S + sl], j / f.S + 1);
    }
    if (t == 0 && failed) atomicExch(&g_fail, 1);
}

// ---------------------------------------------------------------- (4) spin kernel

__global__ void spin(u64 ns, int* sink) {
    const u64 t0 = gtimer();
    while (gtimer() - t0 < ns) {
    }
    if (threadIdx.x == 0 && blockIdx.x == 0) *sink = 1;
}

// ---------------------------------------------------------------- host side

struct Ctx {
    int sms[2];
    cudaStream_t s[2];
    char* A0;  // GPU0, 1 GiB: the source pattern
    char* D0;  // GPU0, 1 GiB: local destination (D2D copy, broadcast root's own copy)
    char* A1;  // GPU1, 1 GiB: the destination
};

static float elapsed(cudaEvent_t a, cudaEvent_t b) {
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Runs run(bytes) once to warm up on the whole `bytes`, then REPS times timed with events on
// stream s of device dev (run enqueues on s). A case slower than ~15 ms a run is timed on a
// smaller size (a multiple of `gran`) so the sweep stays short. Returns GB/s, or -1 if a launch
// failed (the error is not sticky, e.g. too much shared memory).
static double time_case(int dev, cudaStream_t s, u64 bytes, u64 gran, const std::function<void(u64)>& run) {
    CK(cudaSetDevice(dev));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0, s));
    run(bytes);
    cudaError_t le = cudaGetLastError();
    CK(cudaEventRecord(e1, s));
    CK(cudaStreamSynchronize(s));
    if (le != cudaSuccess) {
        fprintf(stderr, "[%s] launch: %s\n", g_case, cudaGetErrorString(le));
        return -1;
    }
    const double warm = elapsed(e0, e1);
    u64 tb = bytes;
    if (warm > 15.0) tb = std::max(gran, (u64)(bytes * (15.0 / warm)) / gran * gran);
    std::vector<double> t;
    for (int r = 0; r < REPS; r++) {
        CK(cudaEventRecord(e0, s));
        run(tb);
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        t.push_back(elapsed(e0, e1));
    }
    CK(cudaGetLastError());
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return tb / (median(t) * 1e-3) / 1e9;
}

// A destination checked after a case.
struct Dst {
    int dev;
    void* p;
};

// Clears the destinations, times the case, checks every destination; returns the cell text.
static std::string kernel_case(int dev, cudaStream_t s, u64 bytes, u64 gran, std::vector<Dst> dsts, const std::function<void(u64)>& run) {
    for (auto& d : dsts) {
        CK(cudaSetDevice(d.dev));
        CK(cudaMemset(d.p, 0, bytes));
        CK(cudaDeviceSynchronize());
    }
    const double gbs = time_case(dev, s, bytes, gran, run);
    if (gbs < 0) return "ERR";
    for (auto& d : dsts) {
        const u64 bad = count_bad(d.dev, d.p, bytes);
        if (bad) {
            fprintf(stderr, "[%s] %llu wrong words on GPU%d\n", g_case, bad, d.dev);
            return "BAD";
        }
    }
    char buf[32];
    snprintf(buf, sizeof buf, "%.0f", gbs);
    return buf;
}

static const int BS[] = {1, 4, 8, 12, 16, 24, 32, 64, 132};
static const int NBS = sizeof BS / sizeof BS[0];
// 1 GiB from 8 blocks on; fewer blocks move 64 MiB a block (the rate, not the size, matters).
static u64 bytes_for(int B) { return B >= 8 ? GiB : 64 * MiB * B; }

// first: the leading column names ("a | b"), lead: how many there are.
static void table_head(const char* first, int lead) {
    printf("| %s |", first);
    for (int i = 0; i < NBS; i++) printf(" B=%d |", BS[i]);
    printf("\n|");
    for (int i = 0; i < lead; i++) printf("---|");
    for (int i = 0; i < NBS; i++) printf("---:|");
    printf("\n");
    fflush(stdout);
}

// (1a, 1b, 2): exec = 0 pushes (GPU0 reads its buffer, writes GPU1's), exec = 1 pulls (GPU1
// reads GPU0's buffer, writes its own).
static void sec_copy(Ctx& c, int exec) {
    printf("\n### %s: SM copy kernel on GPU%d, GPU0 buffer -> GPU1 buffer, GB/s\n\n", exec ? "Pull (2)" : "Push (1a, 1b)", exec);
    printf("tiles: T*U-pack tiles dealt round-robin to blocks; ranges: one contiguous range per block (occl).\n"
           "All loads of a thread's group before its stores. B = blocks (normally one per SM), T = threads per block.\n"
           "B < 8 moves 64 MiB per block, else 1 GiB; a case slower than 15 ms per run is timed on a 16 MiB-multiple prefix.\n\n");
    table_head("pattern | T", 2);
    for (auto& p : copy_patterns(exec == 0)) {
        for (int T : {256, 512, 1024}) {
            printf("| %s | %d |", p.name.c_str(), T);
            for (int bi = 0; bi < NBS; bi++) {
                const int B = BS[bi];
                char name[160];
                snprintf(name, sizeof name, "%s %s T=%d B=%d", exec ? "pull" : "push", p.name.c_str(), T, B);
                g_case = name;
                std::vector<Dst> d = {{1, c.A1}};
                if (p.dual) d.push_back({0, c.D0});
                const u64 gran = 16 * MiB;
                std::string cell = kernel_case(exec, c.s[exec], bytes_for(B), gran, d, [&](u64 n) {
                    p.k<<<B, T, 0, c.s[exec]>>>((uint4*)c.A1, (uint4*)c.D0, (const uint4*)c.A0, n / 16);
                });
                printf(" %s |", cell.c_str());
                fflush(stdout);
            }
            printf("\n");
        }
    }
}

// (1c): Hopper bulk copies, push (exec 0) or pull (exec 1).
static void sec_tma(Ctx& c, int exec) {
    printf("\n### %s: bulk copies (cp.async.bulk) on GPU%d, GPU0 buffer -> GPU1 buffer, GB/s\n\n", exec ? "TMA pull" : "TMA push (1c)",
           exec);
    printf("bulk ld+st: 1 thread per block (32-thread blocks): cp.async.bulk global->shared + mbarrier, then\n"
           "shared->global, NB buffers of C bytes. ld.cg->smem+bulk st: 512 threads fill the buffer with __ldcg,\n"
           "fence.proxy.async, thread 0 bulk-stores it.\n\n");
    const int SMEM_MAX = 200 * 1024;
    CK(cudaSetDevice(exec));
    CK(cudaFuncSetAttribute(tma_copy<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_MAX));
    CK(cudaFuncSetAttribute(tma_copy<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_MAX));
    CK(cudaFuncSetAttribute(smem_bulk_copy<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_MAX));
    CK(cudaFuncSetAttribute(smem_bulk_copy<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_MAX));
    table_head("variant | NB | C", 3);
    for (int v = 0; v < 2; v++) {
        for (int NB : {2, 4}) {
            for (u32 C : {4u << 10, 8u << 10, 16u << 10, 32u << 10}) {
                printf("| %s | %d | %uK |", v ? "ld.cg->smem+bulk st T=512" : "bulk ld+st", NB, C >> 10);
                for (int bi = 0; bi < NBS; bi++) {
                    const int B = BS[bi];
                    char name[160];
                    snprintf(name, sizeof name, "%s %s NB=%d C=%u B=%d", exec ? "tma-pull" : "tma-push", v ? "smem" : "bulk", NB, C, B);
                    g_case = name;
                    const size_t sh = (size_t)NB * C;
                    std::string cell = kernel_case(exec, c.s[exec], bytes_for(B), 16 * MiB, {{1, c.A1}}, [&](u64 n) {
                        cudaStream_t s = c.s[exec];
                        if (v == 0 && NB == 2) tma_copy<2><<<B, 32, sh, s>>>(c.A1, c.A0, n, C);
                        if (v == 0 && NB == 4) tma_copy<4><<<B, 32, sh, s>>>(c.A1, c.A0, n, C);
                        if (v == 1 && NB == 2) smem_bulk_copy<2><<<B, 512, sh, s>>>(c.A1, c.A0, n, C);
                        if (v == 1 && NB == 4) smem_bulk_copy<4><<<B, 512, sh, s>>>(c.A1, c.A0, n, C);
                    });
                    printf(" %s |", cell.c_str());
                    fflush(stdout);
                }
                printf("\n");
            }
        }
    }
}

// Whether a flag wait timed out on device `dev` since the last call (g_fail), clearing it.
static bool take_fail(int dev) {
    const int zero = 0;
    int x;
    CK(cudaSetDevice(dev));
    CK(cudaMemcpyFromSymbol(&x, g_fail, sizeof x));
    CK(cudaMemcpyToSymbol(g_fail, &zero, sizeof zero));
    return x != 0;
}

// A FIFO case's cell: TIMEOUT, BAD (wrong words at the destinations) or GB/s of the median run.
static void fifo_cell(const char* name, bool fail, u64 bad, const std::vector<double>& t, u64 bytes) {
    if (fail) fprintf(stderr, "[%s] flag wait timed out\n", name);
    if (bad) fprintf(stderr, "[%s] %llu wrong words\n", name, bad);
    if (fail) printf(" TIMEOUT |");
    else if (bad) printf(" BAD |");
    else printf(" %.0f |", bytes / (median(t) * 1e-3) / 1e9);
    fflush(stdout);
}

// (3): producer on GPU0, consumer on GPU1, timed from the producer's start to the consumer's end.
static void sec_fifo(Ctx& c) {
    printf("\n### FIFO push (3): producer GPU0 -> slots in GPU1 -> consumer GPU1 output, 1 GiB, GB/s\n\n");
    printf("Per channel S slots of K bytes; producer: copy slot, bar, thread 0 __threadfence_system + st.release.sys head\n"
           "(GPU1 memory); consumer: acquire head, copy out, release tail (GPU0 memory). B blocks on each GPU,\n"
           "lanes = 512-thread channels per block (named barriers); channels = B * lanes.\n"
           "'+local': the producer also writes a local copy of the data (occl broadcast root, in != out).\n"
           "'no-fence': no __threadfence_system before the release (what occl does).\n\n");
    const int FB[] = {12, 24, 48};
    const u64 maxch = 48 * 2, maxS = 8, maxK = MiB;
    char* slots;
    u64 *head, *tail;
    CK(cudaSetDevice(1));
    CK(cudaMalloc(&slots, maxch * maxS * maxK));
    CK(cudaMalloc(&head, maxch * 16 * 8));
    CK(cudaSetDevice(0));
    CK(cudaMalloc(&tail, maxch * 16 * 8));
    cudaEvent_t e0, e1, eend;
    CK(cudaSetDevice(0));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&eend));
    CK(cudaSetDevice(1));
    CK(cudaEventCreate(&e1));
    for (int d = 0; d < 2; d++) take_fail(d);

    printf("| K | S | lanes |");
    for (int B : FB) printf(" B=%d |", B);
    printf("\n|---|---|---|");
    for (int i = 0; i < 3; i++) printf("---:|");
    printf("\n");
    struct Row {
        u64 K;
        u32 S;
        int lanes;
        bool local;
        bool fence;
    };
    std::vector<Row> rows;
    for (u64 K : {64 * 1024ull, 256 * 1024ull, MiB})
        for (u32 S : {2u, 4u, 8u})
            for (int L : {1, 2}) rows.push_back({K, S, L, false, true});
    for (int L : {1, 2}) rows.push_back({256 * 1024, 4, L, false, false});
    for (int L : {1, 2}) rows.push_back({256 * 1024, 4, L, true, true});
    for (int L : {1, 2}) rows.push_back({256 * 1024, 4, L, true, false});
    for (auto& r : rows) {
        printf("| %lluK | %u | %d%s%s |", r.K >> 10, r.S, r.lanes, r.local ? " +local" : "", r.fence ? "" : " no-fence");
        for (int B : FB) {
            char name[160];
            snprintf(name, sizeof name, "fifo K=%llu S=%u lanes=%d B=%d%s%s", r.K, r.S, r.lanes, B, r.local ? " +local" : "",
                     r.fence ? "" : " no-fence");
            g_case = name;
            const u64 bytes = GiB;
            Fifo f = {(const uint4*)c.A0, (uint4*)c.A1, r.local ? (uint4*)c.D0 : nullptr, slots, head, tail, bytes / 16, r.K, r.S, r.fence ? 1u : 0u};
            std::vector<Dst> dsts = {{1, c.A1}};
            if (r.local) dsts.push_back({0, c.D0});
            for (auto& d : dsts) {
                CK(cudaSetDevice(d.dev));
                CK(cudaMemset(d.p, 0, bytes));
            }
            std::vector<double> t;
            int fail = 0;
            for (int rep = 0; rep <= REPS; rep++) {
                CK(cudaSetDevice(1));
                CK(cudaMemset(head, 0, maxch * 16 * 8));
                CK(cudaDeviceSynchronize());
                CK(cudaSetDevice(0));
                CK(cudaMemset(tail, 0, maxch * 16 * 8));
                CK(cudaDeviceSynchronize());
                CK(cudaEventRecord(e0, c.s[0]));
                if (r.lanes == 1) fifo_kernel<1, true><<<B, LANE, 0, c.s[0]>>>(f);
                else fifo_kernel<2, true><<<B, 2 * LANE, 0, c.s[0]>>>(f);
                CK(cudaGetLastError());
                CK(cudaSetDevice(1));
                CK(cudaStreamWaitEvent(c.s[1], e0, 0));
                if (r.lanes == 1) fifo_kernel<1, false><<<B, LANE, 0, c.s[1]>>>(f);
                else fifo_kernel<2, false><<<B, 2 * LANE, 0, c.s[1]>>>(f);
                CK(cudaGetLastError());
                CK(cudaEventRecord(e1, c.s[1]));
                CK(cudaSetDevice(0));
                CK(cudaStreamWaitEvent(c.s[0], e1, 0));
                CK(cudaEventRecord(eend, c.s[0]));
                CK(cudaEventSynchronize(eend));
                if (rep > 0) t.push_back(elapsed(e0, eend));
                CK(cudaSetDevice(1));
                CK(cudaDeviceSynchronize());  // the consumer is done (so is the producer: eend)
                for (int d = 0; d < 2; d++) fail |= take_fail(d);
                if (fail) break;  // a timed-out run costs 2 s: don't repeat it
            }
            u64 bad = 0;
            for (auto& d : dsts) bad += count_bad(d.dev, d.p, bytes);
            fifo_cell(name, fail, bad, t, bytes);
        }
        printf("\n");
    }
}

// (4): copy engines. Copies are enqueued on streams of GPU0 unless said; split copies give each
// of n streams 1/n of the bytes, all timed from one start event to the join of all.
static void sec_ce(Ctx& c) {
    printf("\n### Copy engines (4), GB/s (and ms per copy)\n\n");
    const int NS = 4;
    cudaStream_t st[2][NS];
    for (int d = 0; d < 2; d++) {
        CK(cudaSetDevice(d));
        for (int i = 0; i < NS; i++) CK(cudaStreamCreateWithFlags(&st[d][i], cudaStreamNonBlocking));
    }
    // A kernel that fills every thread slot of every SM of device d for `ms` milliseconds.
    int* sink[2];
    for (int d = 0; d < 2; d++) {
        CK(cudaSetDevice(d));
        CK(cudaMalloc(&sink[d], sizeof(int)));
    }
    auto spin_all = [&](int d, cudaStream_t s, double ms) {
        CK(cudaSetDevice(d));
        int per = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, spin, 1024, 0));
        spin<<<c.sms[d] * per, 1024, 0, s>>>((u64)(ms * 1e6), sink[d]);
        CK(cudaGetLastError());
    };
    {
        CK(cudaSetDevice(0));
        int per = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, spin, 1024, 0));
        printf("spin kernel: %d SMs x %d blocks of 1024 threads (every thread slot), ~200 ms\n\n", c.sms[0], per);
    }
    printf("| copy | streams | bytes | beside spin | GB/s | ms |\n|---|---:|---:|---|---:|---:|\n");
    // kind 0: peer GPU0 -> GPU1 (A0 -> A1), streams on device sdev; kinds 1-5: local D2D on GPU0 (A0 -> D0)
    auto one = [&](const char* label, int kind, int sdev, int nstr, u64 bytes, bool beside) {
        char name[160];
        snprintf(name, sizeof name, "ce %s %d streams %llu MiB%s", label, nstr, bytes >> 20, beside ? " beside spin" : "");
        g_case = name;
        Dst d = kind == 0 ? Dst{1, c.A1} : Dst{0, c.D0};  // kinds 1-5 are local
        CK(cudaSetDevice(d.dev));
        CK(cudaMemset(d.p, 0, bytes));
        CK(cudaDeviceSynchronize());
        CK(cudaSetDevice(sdev));
        cudaEvent_t e0, ej[NS], e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        for (int i = 0; i < NS; i++) CK(cudaEventCreate(&ej[i]));
        cudaStream_t spin_s[2] = {st[0][NS - 1], st[1][NS - 1]};  // never used by a copy here (nstr < NS when beside)
        std::vector<double> t;
        for (int rep = 0; rep <= REPS; rep++) {
            if (beside) {
                spin_all(0, spin_s[0], 200);
                if (kind == 0) spin_all(1, spin_s[1], 200);
                usleep(5000);  // let the spin kernel take the SMs first
            }
            CK(cudaSetDevice(sdev));
            cudaStream_t* s = st[sdev];
            CK(cudaEventRecord(e0, s[0]));
            const u64 part = bytes / nstr;
            for (int i = 0; i < nstr; i++) {
                if (i) CK(cudaStreamWaitEvent(s[i], e0, 0));
                if (kind == 0) CK(cudaMemcpyPeerAsync(c.A1 + i * part, 1, c.A0 + i * part, 0, part, s[i]));
                else if (kind == 1) CK(cudaMemcpyAsync(c.D0 + i * part, c.A0 + i * part, part, cudaMemcpyDeviceToDevice, s[i]));
                else if (kind == 3) CK(cudaMemcpyPeerAsync(c.D0 + i * part, 0, c.A0 + i * part, 0, part, s[i]));
                else if (kind == 4) CK(cudaMemcpy2DAsync(c.D0 + i * part, 2 * MiB, c.A0 + i * part, 2 * MiB, 2 * MiB,
                                                         part / (2 * MiB), cudaMemcpyDeviceToDevice, s[i]));
                else if (kind == 5) {
                    // 1 MiB rows, 32 rows a slice (the copy engine's native shape, were it used)
                    cudaMemcpy3DParms p = {};
                    p.srcPtr = make_cudaPitchedPtr(c.A0 + i * part, MiB, MiB, 32);
                    p.dstPtr = make_cudaPitchedPtr(c.D0 + i * part, MiB, MiB, 32);
                    p.extent = make_cudaExtent(MiB, 32, part / (32 * MiB));
                    p.kind = cudaMemcpyDeviceToDevice;
                    CK(cudaMemcpy3DAsync(&p, s[i]));
                }
                else {
                    // kind 2: a batch of one local copy, hinted to overlap with compute (copy engine).
                    void* dsts[1] = {c.D0 + i * part};
                    const void* srcs[1] = {c.A0 + i * part};
                    size_t sizes[1] = {part};
                    cudaMemcpyAttributes at = {};
                    at.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
                    at.srcLocHint.type = cudaMemLocationTypeDevice;
                    at.srcLocHint.id = 0;
                    at.dstLocHint.type = cudaMemLocationTypeDevice;
                    at.dstLocHint.id = 0;
                    at.flags = cudaMemcpyFlagPreferOverlapWithCompute;
                    size_t idx[1] = {0};
                    CK(cudaMemcpyBatchAsync(dsts, srcs, sizes, 1, &at, idx, 1, s[i]));
                }
                if (i) {
                    CK(cudaEventRecord(ej[i], s[i]));
                    CK(cudaStreamWaitEvent(s[0], ej[i], 0));
                }
            }
            CK(cudaEventRecord(e1, s[0]));
            CK(cudaEventSynchronize(e1));
            if (rep > 0) t.push_back(elapsed(e0, e1));
            if (beside)
                for (int dd = 0; dd < 2; dd++) {
                    CK(cudaSetDevice(dd));
                    CK(cudaDeviceSynchronize());
                }
        }
        const u64 bad = count_bad(d.dev, d.p, bytes);
        const double ms = median(t);
        if (bad) printf("| %s | %d | %llu MiB | %s | BAD | %.2f |\n", label, nstr, bytes >> 20, beside ? "yes" : "no", ms);
        else printf("| %s | %d | %llu MiB | %s | %.0f | %.2f |\n", label, nstr, bytes >> 20, beside ? "yes" : "no", bytes / (ms * 1e-3) / 1e9, ms);
        fflush(stdout);
    };
    for (u64 bytes : {64 * MiB, GiB})
        for (int n : {1, 2, 4}) one("cudaMemcpyPeerAsync GPU0->GPU1", 0, 0, n, bytes, false);
    one("cudaMemcpyPeerAsync GPU0->GPU1, stream on GPU1", 0, 1, 1, GiB, false);
    one("cudaMemcpyAsync D2D on GPU0", 1, 0, 1, GiB, false);
    one("cudaMemcpyAsync D2D on GPU0", 1, 0, 1, GiB, true);
    one("cudaMemcpyBatchAsync D2D on GPU0, PreferOverlapWithCompute", 2, 0, 1, GiB, false);
    one("cudaMemcpyBatchAsync D2D on GPU0, PreferOverlapWithCompute", 2, 0, 1, GiB, true);
    one("cudaMemcpyPeerAsync GPU0->GPU0 (local)", 3, 0, 1, GiB, false);
    one("cudaMemcpyPeerAsync GPU0->GPU0 (local)", 3, 0, 1, GiB, true);
    one("cudaMemcpy2DAsync D2D on GPU0, rows of 2 MiB", 4, 0, 1, GiB, false);
    one("cudaMemcpy2DAsync D2D on GPU0, rows of 2 MiB", 4, 0, 1, GiB, true);
    one("cudaMemcpy3DAsync D2D on GPU0, 1 MiB x 32 rows", 5, 0, 1, GiB, false);
    one("cudaMemcpy3DAsync D2D on GPU0, 1 MiB x 32 rows", 5, 0, 1, GiB, true);
    one("cudaMemcpyPeerAsync GPU0->GPU1", 0, 0, 1, GiB, false);
    one("cudaMemcpyPeerAsync GPU0->GPU1", 0, 0, 1, GiB, true);
    one("cudaMemcpyPeerAsync GPU0->GPU1", 0, 0, 2, GiB, true);
    // The spin kernel alone, to read the rows above against (a copy blocked behind it takes ~200 ms).
    {
        CK(cudaSetDevice(0));
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        CK(cudaEventRecord(a, st[0][NS - 1]));
        spin_all(0, st[0][NS - 1], 200);
        CK(cudaSetDevice(0));
        CK(cudaEventRecord(b, st[0][NS - 1]));
        CK(cudaEventSynchronize(b));
        printf("\nspin kernel alone: %.1f ms\n", elapsed(a, b));
    }
}

// (6): producer streams on GPU0 (copy engines and stream memory operations), consumer kernel on
// GPU1; timed from the producers' start to the consumer's end. A stream wait has no timeout: a
// consumer that gives up leaves the producers waiting, and run.sh's timeout ends the section.
static void sec_ce_fifo(Ctx& c) {
    printf("\n### Copy engines in, SMs out (6): GPU0 -> slots in GPU1 (copy engines) -> GPU1 output (B blocks), 1 GiB, GB/s\n\n");
    printf("Q rings of S=4 slots of K bytes, one GPU0 stream a ring: cuStreamWaitValue64 (the slot freed), a peer\n"
           "cudaMemcpyAsync into it, cuStreamWriteValue64 (head). Consumer: B blocks of 512 threads on GPU1, B/Q a\n"
           "ring, each copying its part of every chunk out; the ring's last block done with a chunk frees its slot.\n\n");
    const int CB[] = {2, 4, 8, 12, 16, 24};
    const u32 S = 4, maxQ = 4;
    const u64 maxK = 16 * MiB, bytes = GiB;
    char* slots;
    u64 *head, *gen;
    u32* cnt;
    CK(cudaSetDevice(1));
    CK(cudaMalloc(&slots, maxQ * S * maxK));
    CK(cudaMalloc(&head, maxQ * 16 * 8));
    CK(cudaMalloc(&cnt, maxQ * S * 4));
    CK(cudaSetDevice(0));
    CK(cudaMalloc(&gen, maxQ * S * 8));
    cudaStream_t ps[maxQ];
    cudaEvent_t e0, e1, eend, ej[maxQ];
    for (u32 q = 0; q < maxQ; q++) {
        CK(cudaStreamCreateWithFlags(&ps[q], cudaStreamNonBlocking));
        CK(cudaEventCreateWithFlags(&ej[q], cudaEventDisableTiming));
    }
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&eend));
    CK(cudaSetDevice(1));
    CK(cudaEventCreate(&e1));
    take_fail(1);
    printf("| K | Q |");
    for (int B : CB) printf(" B=%d |", B);
    printf("\n|---|---|");
    for (int B : CB) printf("---:|"), (void)B;
    printf("\n");
    fflush(stdout);
    for (u64 K : {MiB, 4 * MiB, 16 * MiB}) {
        for (u32 Q : {1u, 2u, 4u}) {
            printf("| %lluM | %u |", K >> 20, Q);
            for (int B : CB) {
                if (B % Q) {
                    printf(" - |");
                    continue;
                }
                char name[160];
                snprintf(name, sizeof name, "ce-fifo K=%llu Q=%u B=%d", K, Q, B);
                g_case = name;
                CeFifo f = {(uint4*)c.A1, slots, head, gen, cnt, bytes, K, S, Q};
                CK(cudaSetDevice(1));
                CK(cudaMemset(c.A1, 0, bytes));
                std::vector<double> t;
                int fail = 0;
                for (int rep = 0; rep <= REPS; rep++) {
                    CK(cudaSetDevice(1));
                    CK(cudaMemset(head, 0, maxQ * 16 * 8));
                    CK(cudaMemset(cnt, 0, maxQ * S * 4));
                    CK(cudaDeviceSynchronize());
                    CK(cudaSetDevice(0));
                    CK(cudaMemset(gen, 0, maxQ * S * 8));
                    CK(cudaDeviceSynchronize());
                    CK(cudaEventRecord(e0, c.s[0]));
                    // The consumer first: the host blocks once a stream's queue is full, until the GPU
                    // drains it, which the producers' waits do only once the consumer runs.
                    CK(cudaSetDevice(1));
                    CK(cudaStreamWaitEvent(c.s[1], e0, 0));
                    ce_fifo_consumer<<<B, LANE, 0, c.s[1]>>>(f);
                    CK(cudaGetLastError());
                    CK(cudaEventRecord(e1, c.s[1]));
                    CK(cudaSetDevice(0));
                    const u64 share = bytes / Q, nch = (share + K - 1) / K;
                    for (u32 q = 0; q < Q; q++) {
                        CK(cudaStreamWaitEvent(ps[q], e0, 0));
                        for (u64 j = 0; j < nch; j++) {
                            const u64 sl = j % S, m = std::min(K, share - j * K);
                            if (j >= S) {
                                CUresult r = cuStreamWaitValue64((CUstream)ps[q], (CUdeviceptr)(gen + q * S + sl), j / S, CU_STREAM_WAIT_VALUE_GEQ);
                                if (r != CUDA_SUCCESS) {
                                    fprintf(stderr, "[%s] cuStreamWaitValue64: %d\n", name, (int)r);
                                    exit(1);
                                }
                            }
                            CK(cudaMemcpyAsync(slots + (q * S + sl) * K, c.A0 + q * share + j * K, m, cudaMemcpyDeviceToDevice, ps[q]));
                            CUresult r = cuStreamWriteValue64((CUstream)ps[q], (CUdeviceptr)(head + q * 16), j + 1, CU_STREAM_WRITE_VALUE_DEFAULT);
                            if (r != CUDA_SUCCESS) {
                                fprintf(stderr, "[%s] cuStreamWriteValue64: %d\n", name, (int)r);
                                exit(1);
                            }
                        }
                        CK(cudaEventRecord(ej[q], ps[q]));
                    }
                    for (u32 q = 0; q < Q; q++) CK(cudaStreamWaitEvent(c.s[0], ej[q], 0));
                    CK(cudaStreamWaitEvent(c.s[0], e1, 0));
                    CK(cudaEventRecord(eend, c.s[0]));
                    CK(cudaEventSynchronize(eend));
                    if (rep > 0) t.push_back(elapsed(e0, eend));
                    CK(cudaSetDevice(1));
                    CK(cudaDeviceSynchronize());
                    fail |= take_fail(1);
                    if (fail) break;
                }
                fifo_cell(name, fail, fail ? 0 : count_bad(1, c.A1, bytes), t, bytes);
            }
            printf("\n");
        }
    }
}

// (5): copies within GPU0 (A0 -> D0), by SM copy kernels and by bulk copies.
static void sec_local(Ctx& c) {
    printf("\n### Local (5): copies within GPU0, GPU0 buffer -> GPU0 buffer, GB/s (bytes copied / time)\n\n");
    printf("ranges: occl's copy_packs shape (one contiguous range per block, U=8 16-byte __ldcg loads before\n"
           "the stores); bulk ld+st: (1c)'s one issuing thread per 32-thread block, NB buffers of C bytes.\n\n");
    const int SMEM_MAX = 200 * 1024;
    CK(cudaSetDevice(0));
    CK(cudaFuncSetAttribute(tma_copy<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_MAX));
    CK(cudaFuncSetAttribute(smem_bulk_copy<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_MAX));
    table_head("variant | T", 2);
    struct Row {
        const char* name;
        int T;
        u32 C;  // 0: an SM copy kernel
        int v;  // bulk: 0 ld+st, 1 ld.cg->smem + bulk st
    };
    const Row rows[] = {{"ranges U=8 (occl copy_packs)", 512, 0, 0},  {"ranges U=8 (occl copy_packs)", 1024, 0, 0},
                        {"bulk ld+st NB=4 C=16K", 32, 16u << 10, 0},  {"bulk ld+st NB=4 C=32K", 32, 32u << 10, 0},
                        {"ld.cg->smem+bulk st NB=4 C=32K", 512, 32u << 10, 1}};
    for (const Row& r : rows) {
        printf("| %s | %d |", r.name, r.T);
        for (int bi = 0; bi < NBS; bi++) {
            const int B = BS[bi];
            char name[160];
            snprintf(name, sizeof name, "local %s T=%d B=%d", r.name, r.T, B);
            g_case = name;
            std::string cell = kernel_case(0, c.s[0], bytes_for(B), 16 * MiB, {{0, c.D0}}, [&](u64 n) {
                cudaStream_t st = c.s[0];
                if (r.C == 0) copy_ranges<8, 1><<<B, r.T, 0, st>>>((uint4*)c.D0, nullptr, (const uint4*)c.A0, n / 16);
                else if (r.v == 0) tma_copy<4><<<B, r.T, 4 * r.C, st>>>(c.D0, c.A0, n, r.C);
                else smem_bulk_copy<4><<<B, r.T, 4 * r.C, st>>>(c.D0, c.A0, n, r.C);
            });
            printf(" %s |", cell.c_str());
            fflush(stdout);
        }
        printf("\n");
    }
}

int main(int argc, char** argv) {
    const std::string sec = argc > 1 ? argv[1] : "all";
    int n = 0;
    CK(cudaGetDeviceCount(&n));
    if (n < 2) {
        printf("need 2 GPUs, found %d\n", n);
        return 1;
    }
    int p01 = 0, p10 = 0;
    CK(cudaDeviceCanAccessPeer(&p01, 0, 1));
    CK(cudaDeviceCanAccessPeer(&p10, 1, 0));
    if (!p01 || !p10) {
        printf("GPU0 and GPU1 cannot access each other\n");
        return 1;
    }
    Ctx c;
    for (int d = 0; d < 2; d++) {
        CK(cudaSetDevice(d));
        CK(cudaDeviceEnablePeerAccess(1 - d, 0));
        CK(cudaStreamCreateWithFlags(&c.s[d], cudaStreamNonBlocking));
        cudaDeviceProp pr;
        CK(cudaGetDeviceProperties(&pr, d));
        c.sms[d] = pr.multiProcessorCount;
        if (sec == "all" || sec == "push") printf("GPU%d: %s, %d SMs\n", d, pr.name, pr.multiProcessorCount);
    }
    CK(cudaSetDevice(0));
    CK(cudaMalloc(&c.A0, GiB));
    CK(cudaMalloc(&c.D0, GiB));
    fill<<<1024, 512>>>((u32*)c.A0, GiB / 4);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaSetDevice(1));
    CK(cudaMalloc(&c.A1, GiB));

    bool any = false;
    if (sec == "all" || sec == "push") any = true, sec_copy(c, 0);
    if (sec == "all" || sec == "pull") any = true, sec_copy(c, 1);
    if (sec == "all" || sec == "tma-push") any = true, sec_tma(c, 0);
    if (sec == "all" || sec == "tma-pull") any = true, sec_tma(c, 1);
    if (sec == "all" || sec == "fifo") any = true, sec_fifo(c);
    if (sec == "all" || sec == "ce") any = true, sec_ce(c);
    if (sec == "all" || sec == "local") any = true, sec_local(c);
    if (sec == "all" || sec == "ce-fifo") any = true, sec_ce_fifo(c);
    if (!any) {
        printf("unknown section %s (push pull tma-push tma-pull fifo ce local ce-fifo all)\n", sec.c_str());
        return 1;
    }
    return 0;
}
