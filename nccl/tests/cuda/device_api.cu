/*
 * Kernels written against occl's nccl_device.h, run on occl's libnccl.so.2 over the GPUs of one
 * host, checking every result:
 *   - an all-reduce through lsa pointers between lsa barriers (as nccl-tests' -D 1), launched
 *     many times and replayed from a CUDA graph (barrier epochs must carry over);
 *   - an all-to-all through GIN puts with signals and counters between world barriers (as
 *     nccl-tests' GIN kernel), with one thread or a whole block per put, at aligned and odd sizes;
 *   - a ring of putValue + signal add + waitSignalFollowShadow over a GIN barrier and an lsa
 *     barrier of the program's own resource requirements, through ncclSymPtr;
 *   - ncclDevCommCreate refusing NVLink multicast, and the communicator still working after;
 *   - all-to-all, all-gather (out of place and in place) and broadcast from every root with their
 *     output in a symmetric window, back to back: occl writes them straight into the peers'
 *     windows, from its kernels' windowed mode under the default policy and on the copy engines
 *     under NCCL_CTA_POLICY=2;
 *   - gather to and scatter from every root, groups of sends and receives (on the copy engines
 *     under NCCL_CTA_POLICY=2).
 *
 *   device_api threads [N]             one process drives N GPUs (default: all) from one thread
 *   device_api rank <r> <n> <id file>  one rank per process, on GPU r modulo the GPUs present
 *
 * Each rank prints "OK rank <r>" and the process exits 0 when every check passed; the first
 * failure prints its line and exits 1. Without the GPUs a mode needs (two for threads, one for a
 * rank) it prints "SKIPPED: <why>" and exits 77.
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(c)                                                                                  \
  do {                                                                                            \
    if (!(c)) {                                                                                   \
      fprintf(stderr, "%s:%d: check failed: %s (last NCCL error: %s)\n", __FILE__, __LINE__, #c, \
              ncclGetLastError(NULL));                                                            \
      exit(1);                                                                                    \
    }                                                                                             \
  } while (0)
#define CUDA(c)                                                                                           \
  do {                                                                                                    \
    cudaError_t e_ = (c);                                                                                 \
    if (e_ != cudaSuccess) {                                                                              \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #c, cudaGetErrorString(e_));                 \
      exit(1);                                                                                            \
    }                                                                                                     \
  } while (0)
#define NCCL(c)                                                                                             \
  do {                                                                                                      \
    ncclResult_t r_ = (c);                                                                                  \
    if (r_ != ncclSuccess) {                                                                                \
      fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #c, ncclGetErrorString(r_),             \
              ncclGetLastError(NULL));                                                                      \
      exit(1);                                                                                              \
    }                                                                                                       \
  } while (0)

static const int CTAS = 4;
static const int THREADS = 256;
static const int RING_SIGNAL = CTAS; /* after the all-to-all's signals 0..CTAS-1 */
static const size_t AR_COUNT = (1 << 20) + 3;
static const size_t A2A_ODD = 65536 + 3; /* floats per peer: 4-byte alignment only */
static const size_t A2A_EVEN = 65536;    /* 16-byte aligned blocks */

/* ---- kernels ---- */

__global__ void fill_ar(float* send, size_t count, int rank, int k) {
  for (size_t i = threadIdx.x + (size_t)blockIdx.x * blockDim.x; i < count; i += (size_t)blockDim.x * gridDim.x)
    send[i] = (float)((rank + 1) * (int)(i % 97) + k);
}

__global__ void check_ar(float const* recv, size_t count, int n, int k, unsigned* errors) {
  for (size_t i = threadIdx.x + (size_t)blockIdx.x * blockDim.x; i < count; i += (size_t)blockDim.x * gridDim.x) {
    float want = (float)(n * (n + 1) / 2 * (int)(i % 97) + n * k);
    if (recv[i] != want) atomicAdd(errors, 1u);
  }
}

/* Each rank sums a share of every rank's send buffer and writes the sum into every rank's
   receive buffer; barriers before (peers' inputs are ready) and after (peers' writes landed). */
__global__ void lsa_all_reduce(ncclWindow_t send, ncclWindow_t recv, size_t count, ncclDevComm dc) {
  ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), dc, ncclTeamLsa(dc), dc.lsaBarrier, blockIdx.x};
  bar.sync(ncclCoopCta(), cuda::memory_order_acquire);
  size_t first = threadIdx.x + (size_t)blockDim.x * (dc.lsaRank + (size_t)blockIdx.x * dc.lsaSize);
  size_t stride = (size_t)blockDim.x * gridDim.x * dc.lsaSize;
  ncclSymPtr<float> out(recv, 0);
  for (size_t i = first; i < count; i += stride) {
    float v = 0;
    for (int p = 0; p < dc.lsaSize; p++) v += ((float const*)ncclGetLsaPointer(send, 0, p))[i];
    for (int p = 0; p < dc.nRanks; p++) out.peerPtr(p)[i] = v;
  }
  bar.sync(ncclCoopCta(), cuda::memory_order_release);
}

__device__ float a2a_value(int from, int to, size_t j, int k) {
  return (float)((from * 131 + to * 7 + (int)(j % 101) + k) % 4096);
}

__global__ void fill_a2a(float* send, size_t count, int n, int rank, int k) {
  for (size_t i = threadIdx.x + (size_t)blockIdx.x * blockDim.x; i < count * n; i += (size_t)blockDim.x * gridDim.x)
    send[i] = a2a_value(rank, (int)(i / count), i % count, k);
}

__global__ void check_a2a(float const* recv, size_t count, int n, int rank, int k, unsigned* errors) {
  for (size_t i = threadIdx.x + (size_t)blockIdx.x * blockDim.x; i < count * n; i += (size_t)blockDim.x * gridDim.x)
    if (recv[i] != a2a_value((int)(i / count), rank, i % count, k)) atomicAdd(errors, 1u);
}

/* Block b puts this rank's block for every peer p = b (mod blocks) into p's receive buffer, at
   this rank's place, raising p's signal b; block (rank mod blocks) waits for all n of its own.
   perThread: thread t of block 0 makes the put to peer t on its own (as nccl-tests does). */
__global__ void gin_all_to_all(ncclWindow_t send, ncclWindow_t recv, size_t count, ncclDevComm dc, bool perThread) {
  ncclGin gin{dc, 0};
  unsigned sig = blockIdx.x;
  uint64_t before = gin.readSignal(sig);
  ncclBarrierSession<ncclCoopCta> bar{ncclCoopCta(), ncclTeamTagWorld(), gin, blockIdx.x};
  bar.sync(ncclCoopCta(), cuda::memory_order_acquire, ncclGinFenceLevel::Relaxed);
  size_t bytes = count * sizeof(float);
  ncclTeam world = ncclTeamWorld(dc);
  if (perThread) {
    sig = 0;
    if (blockIdx.x == 0)
      for (int p = threadIdx.x; p < dc.nRanks; p += blockDim.x)
        gin.put(world, p, recv, dc.rank * bytes, send, p * bytes, bytes, ncclGin_SignalInc{0}, ncclGin_CounterInc{0});
  } else {
    for (int p = blockIdx.x; p < dc.nRanks; p += gridDim.x)
      gin.put(world, p, recv, dc.rank * bytes, send, p * bytes, bytes, ncclGin_SignalInc{sig}, ncclGin_CounterInc{0},
              ncclCoopCta());
  }
  unsigned mine = perThread ? 0 : dc.rank % gridDim.x;
  /* `before` was read from signal blockIdx.x before the barrier, so before any put of this launch */
  if (blockIdx.x == mine) gin.waitSignal(ncclCoopCta(), mine, before + dc.nRanks);
  gin.flush(ncclCoopCta());
  bar.sync(ncclCoopCta(), cuda::memory_order_release, ncclGinFenceLevel::Relaxed);
}

__device__ float ag_value(int from, size_t j, int k) {
  return (float)((from * 37 + (int)(j % 89) + k) % 4096);
}

__global__ void fill_ag(float* buf, size_t count, int rank, int k) {
  for (size_t i = threadIdx.x + (size_t)blockIdx.x * blockDim.x; i < count; i += (size_t)blockDim.x * gridDim.x)
    buf[i] = ag_value(rank, i, k);
}

/* recv holds `blocks` blocks of `count`: block b from rank b, or every block from `root` (>= 0). */
__global__ void check_ag(float const* recv, size_t count, int blocks, int root, int k, unsigned* errors) {
  for (size_t i = threadIdx.x + (size_t)blockIdx.x * blockDim.x; i < count * blocks; i += (size_t)blockDim.x * gridDim.x)
    if (recv[i] != ag_value(root >= 0 ? root : (int)(i / count), i % count, k)) atomicAdd(errors, 1u);
}

__global__ void check_counter(ncclDevComm dc, uint64_t want, unsigned* errors) {
  ncclGin gin{dc, 0};
  if (gin.readCounter(0) != want) atomicAdd(errors, 1u);
}

/* One block: a GIN barrier over every rank (the program's own requirement), then this rank's
   stamp into the next rank's slot with a signal add of 2, waiting for the previous rank's, then
   an lsa barrier of the program's own requirement. */
__global__ void gin_ring(ncclWindow_t slots, ncclDevComm dc, ncclGinBarrierHandle worldBar, ncclLsaBarrierHandle lsaBar,
                         int round, unsigned* errors) {
  ncclGin gin{dc, 0};
  {
    ncclGinBarrierSession<ncclCoopCta> gb{ncclCoopCta(), gin, ncclTeamWorld(dc), worldBar, 0};
    gb.sync(ncclCoopCta(), cuda::memory_order_acquire, ncclGinFenceLevel::Relaxed);
  }
  int n = dc.nRanks, next = (dc.rank + 1) % n, prev = (dc.rank + n - 1) % n;
  ncclSymPtr<uint64_t> s(slots, 0);
  gin.putValue(ncclTeamWorld(dc), next, s + dc.rank, (uint64_t)round * 1000 + dc.rank,
               ncclGin_SignalAdd{(ncclGinSignal_t)RING_SIGNAL, 2}, ncclCoopCta());
  uint32_t before = 0, delta = 0;
  gin.waitSignalFollowShadow(ncclCoopCta(), RING_SIGNAL, 2u, &before, &delta);
  if (threadIdx.x == 0) {
    uint64_t got = s.localPtr()[prev];
    if (got != (uint64_t)round * 1000 + prev || delta != 2 || before != (uint32_t)(2 * round)) atomicAdd(errors, 1u);
  }
  ncclLsaBarrierSession<ncclCoopCta> lb{ncclCoopCta(), dc, ncclTeamLsa(dc), lsaBar, 0};
  lb.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
}

/* ---- host ---- */

struct Rank {
  int rank, dev;
  ncclComm_t comm;
  cudaStream_t stream;
  float *send, *recv;
  uint64_t* slots;
  ncclWindow_t sendWin, recvWin, slotWin;
  ncclDevComm dc;
  ncclLsaBarrierHandle lsaBar;
  ncclGinBarrierHandle ginBar;
  ncclDevResourceRequirements lsaReq, ginReq;
  unsigned* errors;
};

static int nranks;

static void set_up(Rank* rs, int k) {
  size_t bytes = (AR_COUNT > A2A_ODD * nranks ? AR_COUNT : A2A_ODD * nranks) * sizeof(float);
  NCCL(ncclGroupStart());
  for (int i = 0; i < k; i++) {
    Rank& r = rs[i];
    CUDA(cudaSetDevice(r.dev));
    CUDA(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
    CUDA(cudaMalloc(&r.errors, sizeof(unsigned)));
    CUDA(cudaMemset(r.errors, 0, sizeof(unsigned)));
    NCCL(ncclMemAlloc((void**)&r.send, bytes));
    NCCL(ncclMemAlloc((void**)&r.recv, bytes));
    NCCL(ncclMemAlloc((void**)&r.slots, 4096));
    CUDA(cudaMemset(r.slots, 0, 4096));
    NCCL(ncclCommWindowRegister(r.comm, r.send, bytes, &r.sendWin, NCCL_WIN_COLL_SYMMETRIC));
    NCCL(ncclCommWindowRegister(r.comm, r.recv, bytes, &r.recvWin, NCCL_WIN_COLL_SYMMETRIC));
    NCCL(ncclCommWindowRegister(r.comm, r.slots, 4096, &r.slotWin, NCCL_WIN_DEFAULT));
  }
  NCCL(ncclGroupEnd());

  /* Multicast is refused by every rank, and the communicators stay usable. */
  ncclDevCommRequirements bad;
  memset(&bad, 0, sizeof bad);
  bad.lsaMultimem = true;
  NCCL(ncclGroupStart());
  for (int i = 0; i < k; i++) {
    CHECK(ncclDevCommCreate(rs[i].comm, &bad, &rs[i].dc) == ncclInvalidUsage);
    CHECK(strstr(ncclGetLastError(NULL), "multicast") != NULL);
  }
  CHECK(ncclGroupEnd() == ncclInvalidUsage);

  NCCL(ncclGroupStart());
  for (int i = 0; i < k; i++) {
    Rank& r = rs[i];
    ncclDevCommRequirements reqs;
    memset(&reqs, 0, sizeof reqs);
    NCCL(ncclLsaBarrierCreateRequirement(ncclTeamLsa(r.comm), 1, &r.lsaBar, &r.lsaReq));
    NCCL(ncclGinBarrierCreateRequirement(r.comm, ncclTeamWorld(r.comm), 1, &r.ginBar, &r.ginReq));
    r.lsaReq.next = &r.ginReq;
    reqs.resourceRequirementsList = &r.lsaReq;
    reqs.lsaBarrierCount = CTAS;
    reqs.barrierCount = CTAS;
    reqs.ginSignalCount = CTAS + 1;
    reqs.ginCounterCount = 1;
    NCCL(ncclDevCommCreate(r.comm, &reqs, &r.dc));
  }
  NCCL(ncclGroupEnd());
  for (int i = 0; i < k; i++) {
    CHECK(rs[i].dc.rank == rs[i].rank && rs[i].dc.nRanks == nranks);
    CHECK(rs[i].dc.lsaSize == nranks && rs[i].dc.ginSignalCount >= CTAS + 1);
  }
}

static void sync_all(Rank* rs, int k) {
  for (int i = 0; i < k; i++) {
    CUDA(cudaSetDevice(rs[i].dev));
    CUDA(cudaStreamSynchronize(rs[i].stream));
    ncclResult_t async;
    NCCL(ncclCommGetAsyncError(rs[i].comm, &async));
    CHECK(async == ncclSuccess);
  }
}

static void expect_no_errors(Rank* rs, int k, const char* what) {
  sync_all(rs, k);
  for (int i = 0; i < k; i++) {
    unsigned e = 0;
    CUDA(cudaSetDevice(rs[i].dev));
    CUDA(cudaMemcpy(&e, rs[i].errors, sizeof e, cudaMemcpyDeviceToHost));
    if (e != 0) {
      fprintf(stderr, "rank %d: %s: %u wrong values\n", rs[i].rank, what, e);
      exit(1);
    }
  }
}

static void all_reduce(Rank* rs, int k) {
  for (int it = 0; it < 20; it++) {
    for (int i = 0; i < k; i++) {
      Rank& r = rs[i];
      CUDA(cudaSetDevice(r.dev));
      fill_ar<<<64, THREADS, 0, r.stream>>>(r.send, AR_COUNT, r.rank, it);
      lsa_all_reduce<<<CTAS, THREADS, 0, r.stream>>>(r.sendWin, r.recvWin, AR_COUNT, r.dc);
      check_ar<<<64, THREADS, 0, r.stream>>>(r.recv, AR_COUNT, nranks, it, r.errors);
      CUDA(cudaGetLastError());
    }
  }
  expect_no_errors(rs, k, "lsa all-reduce");
  /* The same in a graph, replayed: the epochs live in device memory, not in the graph. */
  cudaGraphExec_t exec[16];
  for (int i = 0; i < k; i++) {
    Rank& r = rs[i];
    CUDA(cudaSetDevice(r.dev));
    cudaGraph_t g;
    CUDA(cudaStreamBeginCapture(r.stream, cudaStreamCaptureModeThreadLocal));
    fill_ar<<<64, THREADS, 0, r.stream>>>(r.send, AR_COUNT, r.rank, 77);
    lsa_all_reduce<<<CTAS, THREADS, 0, r.stream>>>(r.sendWin, r.recvWin, AR_COUNT, r.dc);
    check_ar<<<64, THREADS, 0, r.stream>>>(r.recv, AR_COUNT, nranks, 77, r.errors);
    CUDA(cudaStreamEndCapture(r.stream, &g));
    CUDA(cudaGraphInstantiate(&exec[i], g, 0));
    CUDA(cudaGraphDestroy(g));
  }
  for (int rep = 0; rep < 10; rep++) {
    for (int i = 0; i < k; i++) {
      CUDA(cudaSetDevice(rs[i].dev));
      CUDA(cudaGraphLaunch(exec[i], rs[i].stream));
    }
  }
  expect_no_errors(rs, k, "lsa all-reduce replayed from a graph");
  for (int i = 0; i < k; i++) CUDA(cudaGraphExecDestroy(exec[i]));
}

static void all_to_all(Rank* rs, int k) {
  int launches = 0;
  for (int it = 0; it < 16; it++) {
    size_t count = it % 2 ? A2A_ODD : A2A_EVEN;
    bool perThread = (it / 2) % 2;
    for (int i = 0; i < k; i++) {
      Rank& r = rs[i];
      CUDA(cudaSetDevice(r.dev));
      fill_a2a<<<64, THREADS, 0, r.stream>>>(r.send, count, nranks, r.rank, it);
      gin_all_to_all<<<CTAS, THREADS, 0, r.stream>>>(r.sendWin, r.recvWin, count, r.dc, perThread);
      check_a2a<<<64, THREADS, 0, r.stream>>>(r.recv, count, nranks, r.rank, it, r.errors);
      CUDA(cudaGetLastError());
    }
    launches++;
  }
  for (int i = 0; i < k; i++) {
    CUDA(cudaSetDevice(rs[i].dev));
    check_counter<<<1, 1, 0, rs[i].stream>>>(rs[i].dc, (uint64_t)launches * nranks, rs[i].errors);
  }
  expect_no_errors(rs, k, "GIN all-to-all");
}

static void ring(Rank* rs, int k) {
  for (int round = 0; round < 10; round++) {
    for (int i = 0; i < k; i++) {
      Rank& r = rs[i];
      CUDA(cudaSetDevice(r.dev));
      gin_ring<<<1, THREADS, 0, r.stream>>>(r.slotWin, r.dc, r.ginBar, r.lsaBar, round, r.errors);
      CUDA(cudaGetLastError());
    }
  }
  expect_no_errors(rs, k, "GIN ring");
}

/* Collectives whose output lies in the symmetric receive window, back to back (under
   NCCL_CTA_POLICY=2 each call's flags must be reset for the next): all-to-all, all-gather out of
   place and in place, and a broadcast, whose root goes round every rank. */
static void window_collectives(Rank* rs, int k) {
  const size_t count = A2A_EVEN;
  for (int it = 0; it < 4 * nranks + 4; it++) {
    int what = it % 4, root = (it / 4) % nranks;
    for (int i = 0; i < k; i++) {
      Rank& r = rs[i];
      CUDA(cudaSetDevice(r.dev));
      if (what == 0) fill_a2a<<<64, THREADS, 0, r.stream>>>(r.send, count, nranks, r.rank, it);
      if (what == 1 || what == 3) fill_ag<<<64, THREADS, 0, r.stream>>>(r.send, count, r.rank, it);
      if (what == 2) fill_ag<<<64, THREADS, 0, r.stream>>>(r.recv + r.rank * count, count, r.rank, it);
      CUDA(cudaGetLastError());
    }
    NCCL(ncclGroupStart());
    for (int i = 0; i < k; i++) {
      Rank& r = rs[i];
      CUDA(cudaSetDevice(r.dev));
      if (what == 0) NCCL(ncclAlltoAll(r.send, r.recv, count, ncclFloat32, r.comm, r.stream));
      if (what == 1) NCCL(ncclAllGather(r.send, r.recv, count, ncclFloat32, r.comm, r.stream));
      if (what == 2) NCCL(ncclAllGather(r.recv + r.rank * count, r.recv, count, ncclFloat32, r.comm, r.stream));
      if (what == 3) NCCL(ncclBroadcast(r.send, r.recv, count, ncclFloat32, root, r.comm, r.stream));
    }
    NCCL(ncclGroupEnd());
    for (int i = 0; i < k; i++) {
      Rank& r = rs[i];
      CUDA(cudaSetDevice(r.dev));
      if (what == 0) check_a2a<<<64, THREADS, 0, r.stream>>>(r.recv, count, nranks, r.rank, it, r.errors);
      if (what == 1 || what == 2) check_ag<<<64, THREADS, 0, r.stream>>>(r.recv, count, nranks, -1, it, r.errors);
      if (what == 3) check_ag<<<64, THREADS, 0, r.stream>>>(r.recv, count, 1, root, it, r.errors);
      CUDA(cudaGetLastError());
    }
  }
  expect_no_errors(rs, k, "collectives in symmetric windows");
}

/* recv holds the root's block for this rank (fill_a2a's on the root). */
__global__ void check_scatter(float const* recv, size_t count, int root, int rank, int k, unsigned* errors) {
  for (size_t i = threadIdx.x + (size_t)blockIdx.x * blockDim.x; i < count; i += (size_t)blockDim.x * gridDim.x)
    if (recv[i] != a2a_value(root, rank, i, k)) atomicAdd(errors, 1u);
}

/* Gather to and scatter from every root in turn, back to back: groups of sends and receives,
   on the copy engines under NCCL_CTA_POLICY=2. Both buffers lie in windows, which these two
   leave alone. */
static void gather_scatter(Rank* rs, int k) {
  for (int it = 0; it < 4 * nranks; it++) {
    int scatter = it % 2, root = (it / 2) % nranks;
    size_t count = it % 4 < 2 ? A2A_EVEN : A2A_ODD;
    for (int i = 0; i < k; i++) {
      Rank& r = rs[i];
      CUDA(cudaSetDevice(r.dev));
      if (!scatter) fill_ag<<<64, THREADS, 0, r.stream>>>(r.send, count, r.rank, it);
      if (scatter && r.rank == root) fill_a2a<<<64, THREADS, 0, r.stream>>>(r.send, count, nranks, root, it);
      CUDA(cudaGetLastError());
    }
    NCCL(ncclGroupStart());
    for (int i = 0; i < k; i++) {
      Rank& r = rs[i];
      CUDA(cudaSetDevice(r.dev));
      if (!scatter) NCCL(ncclGather(r.send, r.recv, count, ncclFloat32, root, r.comm, r.stream));
      if (scatter) NCCL(ncclScatter(r.send, r.recv, count, ncclFloat32, root, r.comm, r.stream));
    }
    NCCL(ncclGroupEnd());
    for (int i = 0; i < k; i++) {
      Rank& r = rs[i];
      CUDA(cudaSetDevice(r.dev));
      if (!scatter && r.rank == root) check_ag<<<64, THREADS, 0, r.stream>>>(r.recv, count, nranks, -1, it, r.errors);
      if (scatter) check_scatter<<<64, THREADS, 0, r.stream>>>(r.recv, count, root, r.rank, it, r.errors);
      CUDA(cudaGetLastError());
    }
  }
  expect_no_errors(rs, k, "gather and scatter");
}

static void tear_down(Rank* rs, int k) {
  /* Collectives run on registered buffers (windows are a hint to them). */
  NCCL(ncclGroupStart());
  for (int i = 0; i < k; i++) {
    CUDA(cudaSetDevice(rs[i].dev));
    NCCL(ncclAllReduce(rs[i].send, rs[i].recv, 1024, ncclFloat32, ncclSum, rs[i].comm, rs[i].stream));
  }
  NCCL(ncclGroupEnd());
  sync_all(rs, k);
  /* Released rank by rank, without a barrier: one thread releases every rank of its process. */
  for (int i = 0; i < k; i++) {
    Rank& r = rs[i];
    CUDA(cudaSetDevice(r.dev));
    NCCL(ncclDevCommDestroy(r.comm, &r.dc));
    CHECK(ncclDevCommDestroy(r.comm, &r.dc) == ncclInvalidArgument);
    NCCL(ncclCommWindowDeregister(r.comm, r.sendWin));
    NCCL(ncclCommWindowDeregister(r.comm, r.recvWin));
    NCCL(ncclCommWindowDeregister(r.comm, r.slotWin));
    CHECK(ncclCommWindowDeregister(r.comm, r.slotWin) == ncclInvalidArgument);
  }
  for (int i = 0; i < k; i++) {
    Rank& r = rs[i];
    CUDA(cudaSetDevice(r.dev));
    NCCL(ncclMemFree(r.send));
    NCCL(ncclMemFree(r.recv));
    NCCL(ncclMemFree(r.slots));
    CUDA(cudaFree(r.errors));
    CUDA(cudaStreamDestroy(r.stream));
    NCCL(ncclCommDestroy(r.comm));
    printf("OK rank %d\n", r.rank);
  }
}

static void run(Rank* rs, int k) {
  set_up(rs, k);
  all_reduce(rs, k);
  all_to_all(rs, k);
  ring(rs, k);
  window_collectives(rs, k);
  gather_scatter(rs, k);
  tear_down(rs, k);
}

static int devices(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    printf("SKIPPED: no usable CUDA device (cudaGetDeviceCount: %s)\n", cudaGetErrorString(e));
    exit(77);
  }
  return n;
}

static void share_id(const char* path, int rank, ncclUniqueId* id) {
  if (rank == 0) {
    NCCL(ncclGetUniqueId(id));
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE* f = fopen(tmp, "wb");
    CHECK(f != NULL && fwrite(id, sizeof *id, 1, f) == 1 && fclose(f) == 0);
    CHECK(rename(tmp, path) == 0);
    return;
  }
  for (int tries = 0; tries < 6000; tries++) {
    FILE* f = fopen(path, "rb");
    if (f != NULL) {
      size_t got = fread(id, sizeof *id, 1, f);
      fclose(f);
      if (got == 1) return;
    }
    usleep(10000);
  }
  fprintf(stderr, "rank %d: no unique id in %s after 60 s\n", rank, path);
  exit(1);
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (argc >= 2 && strcmp(argv[1], "threads") == 0) {
    int have = devices();
    int n = argc >= 3 ? atoi(argv[2]) : have;
    if (have < 2 || n > have) {
      printf("SKIPPED: threads mode needs %d GPUs (at least 2); %d present\n", n < 2 ? 2 : n, have);
      return 77;
    }
    if (n > 8) n = 8; /* occl's device communicators serve up to 8 ranks */
    nranks = n;
    CUDA(cudaSetDevice(0));
    CUDA(cudaFree(0)); /* a current context: occl puts the communicators on the GPUs */
    ncclComm_t comms[16];
    NCCL(ncclCommInitAll(comms, n, NULL));
    Rank rs[16];
    memset(rs, 0, sizeof rs);
    for (int i = 0; i < n; i++) {
      rs[i].rank = i;
      rs[i].dev = i;
      rs[i].comm = comms[i];
    }
    run(rs, n);
    return 0;
  }
  if (argc == 5 && strcmp(argv[1], "rank") == 0) {
    int have = devices();
    if (have < 1) {
      printf("SKIPPED: no CUDA device\n");
      return 77;
    }
    Rank r;
    memset(&r, 0, sizeof r);
    r.rank = atoi(argv[2]);
    nranks = atoi(argv[3]);
    r.dev = r.rank % have;
    CUDA(cudaSetDevice(r.dev));
    CUDA(cudaFree(0));
    ncclUniqueId id;
    share_id(argv[4], r.rank, &id);
    NCCL(ncclCommInitRank(&r.comm, nranks, id, r.rank));
    run(&r, 1);
    return 0;
  }
  fprintf(stderr, "usage: %s threads [N] | rank <r> <n> <id file>\n", argv[0]);
  return 2;
}
