/*
 * One rank of a job that drives occl's libnccl.so.2 through NCCL's C API on host buffers.
 *
 *   host_collectives <rank> <nranks> <id file>
 *
 * Rank 0 makes the job's unique ids and writes them to <id file> (atomically, by rename); the
 * others wait for it. Every check compares exact values; the first failure prints its line and
 * exits 1. Success prints "OK rank <r>".
 */
#define _GNU_SOURCE
#include <nccl.h>
#include <nccl_device.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static int me, n;

#define CHECK(cond)                                                                          \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      fprintf(stderr, "rank %d: check failed at line %d: %s (last error: %s)\n", me, __LINE__, \
              #cond, ncclGetLastError(NULL));                                                \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

#define NCCL(call)                                                                             \
  do {                                                                                         \
    ncclResult_t r_ = (call);                                                                  \
    if (r_ != ncclSuccess) {                                                                   \
      fprintf(stderr, "rank %d: %s failed at line %d: %d %s: %s\n", me, #call, __LINE__, r_,   \
              ncclGetErrorString(r_), ncclGetLastError(NULL));                                 \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

#define NIDS 10

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void share_ids(const char* path, ncclUniqueId* ids) {
  if (me == 0) {
    for (int i = 0; i < NIDS; i++) NCCL(ncclGetUniqueId(&ids[i]));
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE* f = fopen(tmp, "wb");
    CHECK(f != NULL);
    CHECK(fwrite(ids, sizeof(ncclUniqueId), NIDS, f) == NIDS);
    CHECK(fclose(f) == 0);
    CHECK(rename(tmp, path) == 0);
    return;
  }
  double deadline = now() + 30;
  for (;;) {
    FILE* f = fopen(path, "rb");
    if (f) {
      size_t got = fread(ids, sizeof(ncclUniqueId), NIDS, f);
      fclose(f);
      if (got == NIDS) return;
    }
    CHECK(now() < deadline);
    usleep(10000);
  }
}

/* ---- element access by ncclDataType_t, through double (exact for the small values used) ---- */

static size_t dt_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

/* Half and bfloat16 of small integers and halves (exact). */
static uint16_t to_half(double v) {
  if (v == 0) return 0;
  uint16_t sign = v < 0 ? 0x8000 : 0;
  if (v < 0) v = -v;
  int e = 0;
  while (v >= 2) { v /= 2; e++; }
  while (v < 1) { v *= 2; e--; }
  return sign | (uint16_t)((e + 15) << 10) | (uint16_t)((v - 1) * 1024);
}
static double from_half(uint16_t h) {
  if ((h & 0x7fff) == 0) return 0;
  int e = ((h >> 10) & 0x1f) - 15;
  double m = 1 + (h & 0x3ff) / 1024.0;
  double v = m;
  for (; e > 0; e--) v *= 2;
  for (; e < 0; e++) v /= 2;
  return (h & 0x8000) ? -v : v;
}
static uint16_t to_bf16(double v) {
  float f = (float)v;
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}
static double from_bf16(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static void set(ncclDataType_t t, void* buf, size_t i, double v) {
  switch (t) {
    case ncclInt8: ((int8_t*)buf)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t*)buf)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t*)buf)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t*)buf)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t*)buf)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t*)buf)[i] = (uint64_t)v; break;
    case ncclFloat16: ((uint16_t*)buf)[i] = to_half(v); break;
    case ncclBfloat16: ((uint16_t*)buf)[i] = to_bf16(v); break;
    case ncclFloat32: ((float*)buf)[i] = (float)v; break;
    case ncclFloat64: ((double*)buf)[i] = v; break;
    default: CHECK(0);
  }
}

static double get(ncclDataType_t t, const void* buf, size_t i) {
  switch (t) {
    case ncclInt8: return ((const int8_t*)buf)[i];
    case ncclUint8: return ((const uint8_t*)buf)[i];
    case ncclInt32: return ((const int32_t*)buf)[i];
    case ncclUint32: return ((const uint32_t*)buf)[i];
    case ncclInt64: return (double)((const int64_t*)buf)[i];
    case ncclUint64: return (double)((const uint64_t*)buf)[i];
    case ncclFloat16: return from_half(((const uint16_t*)buf)[i]);
    case ncclBfloat16: return from_bf16(((const uint16_t*)buf)[i]);
    case ncclFloat32: return ((const float*)buf)[i];
    case ncclFloat64: return ((const double*)buf)[i];
    default: CHECK(0); return 0;
  }
}

/* Rank r's element j: 1 to 3, varying with both (a product over 4 ranks fits int8). */
static double val(int r, size_t j) { return (double)(1 + (r + j) % 2 + ((r * 3 + j) % 4 == 0)); }

static double reduce_expect(ncclRedOp_t op, size_t j, int nr, const int* ranks) {
  double acc = 0;
  for (int k = 0; k < nr; k++) {
    double v = val(ranks[k], j);
    if (k == 0) { acc = v; continue; }
    switch (op) {
      case ncclSum: case ncclAvg: acc += v; break;
      case ncclProd: acc *= v; break;
      case ncclMax: acc = v > acc ? v : acc; break;
      case ncclMin: acc = v < acc ? v : acc; break;
      default: CHECK(0);
    }
  }
  return op == ncclAvg ? acc / nr : acc;
}

static void* alloc(size_t bytes) {
  void* p = calloc(1, bytes ? bytes : 1);
  CHECK(p != NULL);
  return p;
}

static int all_ranks[64];

/* ---- checks on one communicator ---- */

static void check_all_reduce(ncclComm_t comm) {
  const ncclDataType_t types[] = {ncclInt8, ncclUint8, ncclInt32, ncclUint32, ncclInt64,
                                  ncclUint64, ncclFloat16, ncclBfloat16, ncclFloat32, ncclFloat64};
  const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
  const size_t count = 1000;
  for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
    ncclDataType_t t = types[ti];
    int is_float = t >= ncclFloat16;
    for (size_t oi = 0; oi < sizeof ops / sizeof *ops; oi++) {
      ncclRedOp_t op = ops[oi];
      if (op == ncclAvg && !is_float) continue; /* integer averages round; checked elsewhere */
      void* s = alloc(count * dt_size(t));
      void* r = alloc(count * dt_size(t));
      for (size_t j = 0; j < count; j++) set(t, s, j, val(me, j));
      NCCL(ncclAllReduce(s, r, count, t, op, comm, NULL));
      for (size_t j = 0; j < count; j++) {
        double want = reduce_expect(op, j, n, all_ranks);
        if (t == ncclFloat16) want = from_half(to_half(want));
        if (t == ncclBfloat16) want = from_bf16(to_bf16(want));
        if (get(t, r, j) != want) {
          fprintf(stderr, "rank %d: all-reduce type %d op %d element %zu: got %g want %g\n", me, t, op, j,
                  get(t, r, j), want);
          exit(1);
        }
      }
      /* In place gives the same. */
      NCCL(ncclAllReduce(s, s, count, t, op, comm, NULL));
      CHECK(memcmp(s, r, count * dt_size(t)) == 0);
      free(s);
      free(r);
    }
  }
}

static void check_rooted(ncclComm_t comm) {
  const size_t count = 777;
  int root = n - 1;
  /* Broadcast (out of place) from the last rank, int64. */
  int64_t* b = alloc(count * 8);
  int64_t* out = alloc(count * 8);
  for (size_t j = 0; j < count; j++) b[j] = me == root ? (int64_t)(j * 1000003 + 7) : -1;
  NCCL(ncclBroadcast(b, out, count, ncclInt64, root, comm, NULL));
  for (size_t j = 0; j < count; j++) CHECK(out[j] == (int64_t)(j * 1000003 + 7));
  /* ncclBcast (in place) from rank 0, uint8. */
  uint8_t* u = alloc(count);
  for (size_t j = 0; j < count; j++) u[j] = me == 0 ? (uint8_t)(j * 7) : 0;
  NCCL(ncclBcast(u, count, ncclUint8, 0, comm, NULL));
  for (size_t j = 0; j < count; j++) CHECK(u[j] == (uint8_t)(j * 7));
  /* Reduce (max, double) to rank 1; recvbuff may be NULL elsewhere. */
  double* s = alloc(count * 8);
  double* r = me == 1 ? alloc(count * 8) : NULL;
  for (size_t j = 0; j < count; j++) s[j] = val(me, j);
  NCCL(ncclReduce(s, r, count, ncclFloat64, ncclMax, 1, comm, NULL));
  if (me == 1)
    for (size_t j = 0; j < count; j++) CHECK(r[j] == reduce_expect(ncclMax, j, n, all_ranks));
  free(b); free(out); free(u); free(s); free(r);
}

static void check_gathers(ncclComm_t comm) {
  const size_t count = 513;
  /* All-gather, float, out of place and in place. */
  float* s = alloc(count * 4);
  float* g = alloc(count * n * 4);
  for (size_t j = 0; j < count; j++) s[j] = (float)(me * 10000 + j);
  NCCL(ncclAllGather(s, g, count, ncclFloat32, comm, NULL));
  for (int q = 0; q < n; q++)
    for (size_t j = 0; j < count; j++) CHECK(g[q * count + j] == (float)(q * 10000 + j));
  memset(g, 0, count * n * 4);
  memcpy(g + me * count, s, count * 4);
  NCCL(ncclAllGather(g + me * count, g, count, ncclFloat32, comm, NULL));
  for (int q = 0; q < n; q++)
    for (size_t j = 0; j < count; j++) CHECK(g[q * count + j] == (float)(q * 10000 + j));

  /* Reduce-scatter, sum of int32 and min of bfloat16. */
  int32_t* rs = alloc(count * n * 4);
  int32_t* rr = alloc(count * 4);
  for (size_t j = 0; j < count * n; j++) rs[j] = (int32_t)val(me, j);
  NCCL(ncclReduceScatter(rs, rr, count, ncclInt32, ncclSum, comm, NULL));
  for (size_t j = 0; j < count; j++) CHECK(rr[j] == reduce_expect(ncclSum, me * count + j, n, all_ranks));
  /* In place: recvbuff is this rank's block of sendbuff. */
  NCCL(ncclReduceScatter(rs, rs + me * count, count, ncclInt32, ncclSum, comm, NULL));
  CHECK(memcmp(rs + me * count, rr, count * 4) == 0);
  uint16_t* hs = alloc(count * n * 2);
  uint16_t* hr = alloc(count * 2);
  for (size_t j = 0; j < count * n; j++) hs[j] = to_bf16(val(me, j));
  NCCL(ncclReduceScatter(hs, hr, count, ncclBfloat16, ncclMin, comm, NULL));
  for (size_t j = 0; j < count; j++) CHECK(from_bf16(hr[j]) == reduce_expect(ncclMin, me * count + j, n, all_ranks));

  /* All-to-all, uint32: block q of rank p's input lands in block p of rank q's output. */
  uint32_t* as = alloc(count * n * 4);
  uint32_t* ar = alloc(count * n * 4);
  for (int q = 0; q < n; q++)
    for (size_t j = 0; j < count; j++) as[q * count + j] = (uint32_t)(me * 1000000 + q * 1000 + j);
  NCCL(ncclAlltoAll(as, ar, count, ncclUint32, comm, NULL));
  for (int p = 0; p < n; p++)
    for (size_t j = 0; j < count; j++) CHECK(ar[p * count + j] == (uint32_t)(p * 1000000 + me * 1000 + j));

  /* Gather to rank 0 and scatter from the last rank, int8. */
  int8_t* gs = alloc(count);
  int8_t* gr = alloc(count * n);
  for (size_t j = 0; j < count; j++) gs[j] = (int8_t)(me * 11 + j % 13);
  NCCL(ncclGather(gs, me == 0 ? gr : NULL, count, ncclInt8, 0, comm, NULL));
  if (me == 0)
    for (int q = 0; q < n; q++)
      for (size_t j = 0; j < count; j++) CHECK(gr[q * count + j] == (int8_t)(q * 11 + j % 13));
  int8_t* ss = alloc(count * n);
  int8_t* sr = alloc(count);
  if (me == n - 1)
    for (int q = 0; q < n; q++)
      for (size_t j = 0; j < count; j++) ss[q * count + j] = (int8_t)(q * 5 - (int)(j % 7));
  NCCL(ncclScatter(me == n - 1 ? ss : NULL, sr, count, ncclInt8, n - 1, comm, NULL));
  for (size_t j = 0; j < count; j++) CHECK(sr[j] == (int8_t)(me * 5 - (int)(j % 7)));
  free(s); free(g); free(rs); free(rr); free(hs); free(hr); free(as); free(ar);
  free(gs); free(gr); free(ss); free(sr);
}

static void check_p2p_and_groups(ncclComm_t comm) {
  const size_t count = 100000; /* larger than a FIFO slot: several steps */
  int next = (me + 1) % n, prev = (me + n - 1) % n;
  double* s = alloc(count * 8);
  double* r = alloc(count * 8);
  double* self = alloc(count * 8);
  for (size_t j = 0; j < count; j++) s[j] = me * 1e6 + j;
  /* A ring shift and a send to itself: deadlocks one call at a time, completes as a group. */
  NCCL(ncclGroupStart());
  NCCL(ncclRecv(r, count, ncclFloat64, prev, comm, NULL));
  NCCL(ncclSend(s, count, ncclFloat64, next, comm, NULL));
  NCCL(ncclSend(s, count, ncclFloat64, me, comm, NULL));
  NCCL(ncclRecv(self, count, ncclFloat64, me, comm, NULL));
  NCCL(ncclGroupEnd());
  for (size_t j = 0; j < count; j++) CHECK(r[j] == prev * 1e6 + j && self[j] == s[j]);

  /* Collectives collected in a (nested) group run at the outermost end. */
  int32_t a[64], ar[64];
  int64_t b[32];
  for (int j = 0; j < 64; j++) a[j] = me + j;
  for (int j = 0; j < 32; j++) b[j] = me == 0 ? j * 3 : 0;
  NCCL(ncclGroupStart());
  NCCL(ncclAllReduce(a, ar, 64, ncclInt32, ncclSum, comm, NULL));
  NCCL(ncclGroupStart());
  NCCL(ncclBroadcast(b, b, 32, ncclInt64, 0, comm, NULL));
  NCCL(ncclGroupEnd());
  NCCL(ncclGroupEnd());
  for (int j = 0; j < 64; j++) CHECK(ar[j] == n * (n - 1) / 2 + n * j);
  for (int j = 0; j < 32; j++) CHECK(b[j] == j * 3);

  /* A simulated group prices its calls and runs none of them; the next group runs normally. */
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  for (int j = 0; j < 64; j++) ar[j] = -1;
  NCCL(ncclGroupStart());
  NCCL(ncclAllReduce(a, ar, 64, ncclInt32, ncclSum, comm, NULL));
  NCCL(ncclGroupSimulateEnd(&sim));
  CHECK(sim.estimatedTime > 0 && sim.estimatedTime < 1e6);
  for (int j = 0; j < 64; j++) CHECK(ar[j] == -1);
  ncclSimInfo_t big = NCCL_SIM_INFO_INITIALIZER;
  for (size_t j = 0; j < count; j++) r[j] = -1;
  NCCL(ncclGroupStart());
  NCCL(ncclAllReduce(a, ar, 64, ncclInt32, ncclSum, comm, NULL));
  NCCL(ncclRecv(r, count, ncclFloat64, prev, comm, NULL));
  NCCL(ncclSend(s, count, ncclFloat64, next, comm, NULL));
  NCCL(ncclGroupSimulateEnd(&big));
  CHECK(big.estimatedTime > sim.estimatedTime);
  for (size_t j = 0; j < count; j++) CHECK(r[j] == -1);
  ncclSimInfo_t bad = NCCL_SIM_INFO_INITIALIZER;
  bad.magic = 0;
  NCCL(ncclGroupStart());
  NCCL(ncclAllReduce(a, ar, 64, ncclInt32, ncclSum, comm, NULL));
  CHECK(ncclGroupSimulateEnd(&bad) == ncclInvalidArgument); /* closes the group, runs nothing */
  for (int j = 0; j < 64; j++) CHECK(ar[j] == -1);
  CHECK(ncclGroupEnd() == ncclInvalidUsage);
  CHECK(ncclGroupSimulateEnd(&sim) == ncclInvalidUsage);
  NCCL(ncclAllReduce(a, ar, 64, ncclInt32, ncclSum, comm, NULL));
  for (int j = 0; j < 64; j++) CHECK(ar[j] == n * (n - 1) / 2 + n * j);
  free(s); free(r); free(self);
}

static void check_premulsum(ncclComm_t comm) {
  const size_t count = 300;
  float two = 2.0f;
  double half_ = 0.5;
  ncclRedOp_t op_f, op_d;
  NCCL(ncclRedOpCreatePreMulSum(&op_f, &two, ncclFloat32, ncclScalarHostImmediate, comm));
  NCCL(ncclRedOpCreatePreMulSum(&op_d, &half_, ncclFloat64, ncclScalarDevice, comm));
  CHECK(op_f >= ncclNumOps && op_d >= ncclNumOps && op_f != op_d);
  two = 100.0f; /* immediate: the value was read at creation */
  float* fs = alloc(count * 4);
  float* fr = alloc(count * 4);
  double* ds = alloc(count * 8 * n);
  double* dr = alloc(count * 8);
  for (size_t j = 0; j < count; j++) fs[j] = (float)val(me, j);
  for (size_t j = 0; j < count * n; j++) ds[j] = val(me, j);
  NCCL(ncclAllReduce(fs, fr, count, ncclFloat32, op_f, comm, NULL));
  for (size_t j = 0; j < count; j++) CHECK(fr[j] == 2 * reduce_expect(ncclSum, j, n, all_ranks));
  NCCL(ncclReduceScatter(ds, dr, count, ncclFloat64, op_d, comm, NULL));
  for (size_t j = 0; j < count; j++) CHECK(dr[j] == 0.5 * reduce_expect(ncclSum, me * count + j, n, all_ranks));
  /* In a group the scaled inputs must live until ncclGroupEnd runs the calls. */
  memset(fr, 0, count * 4);
  memset(dr, 0, count * 8);
  NCCL(ncclGroupStart());
  NCCL(ncclAllReduce(fs, fr, count, ncclFloat32, op_f, comm, NULL));
  NCCL(ncclReduceScatter(ds, dr, count, ncclFloat64, op_d, comm, NULL));
  NCCL(ncclGroupEnd());
  for (size_t j = 0; j < count; j++) CHECK(fr[j] == 2 * reduce_expect(ncclSum, j, n, all_ranks));
  for (size_t j = 0; j < count; j++) CHECK(dr[j] == 0.5 * reduce_expect(ncclSum, me * count + j, n, all_ranks));
  /* An operator serves its own datatype only. */
  CHECK(ncclAllReduce(ds, dr, count, ncclFloat64, op_f, comm, NULL) == ncclInvalidArgument);
  NCCL(ncclRedOpDestroy(op_f, comm));
  NCCL(ncclRedOpDestroy(op_d, comm));
  CHECK(ncclAllReduce(fs, fr, count, ncclFloat32, op_f, comm, NULL) == ncclInvalidArgument);
  free(fs); free(fr); free(ds); free(dr);
}

static void check_memory_and_windows(ncclComm_t comm) {
  const size_t count = 1 << 16;
  float *s, *r;
  NCCL(ncclMemAlloc((void**)&s, count * 4));
  NCCL(ncclMemAlloc((void**)&r, count * 4));
  ncclWindow_t ws, wr;
  NCCL(ncclCommWindowRegister(comm, s, count * 4, &ws, NCCL_WIN_COLL_SYMMETRIC));
  NCCL(ncclCommWindowRegister(comm, r, count * 4, &wr, NCCL_WIN_DEFAULT));
  for (size_t j = 0; j < count; j++) s[j] = (float)val(me, j);
  NCCL(ncclAllReduce(s, r, count, ncclFloat32, ncclSum, comm, NULL));
  for (size_t j = 0; j < count; j++) CHECK(r[j] == reduce_expect(ncclSum, j, n, all_ranks));
  NCCL(ncclCommWindowDeregister(comm, ws));
  NCCL(ncclCommWindowDeregister(comm, wr));
  CHECK(ncclCommWindowDeregister(comm, wr) == ncclInvalidArgument);
  void* h;
  NCCL(ncclCommRegister(comm, s, count * 4, &h));
  NCCL(ncclCommDeregister(comm, h));
  CHECK(ncclCommDeregister(comm, h) == ncclInvalidArgument);
  NCCL(ncclMemFree(s));
  NCCL(ncclMemFree(r));
  CHECK(ncclMemFree(r) == ncclInvalidArgument);
}

static void check_refusals(ncclComm_t comm) {
  float x[4] = {0}, y[4];
  CHECK(ncclAllReduce(x, y, 4, ncclFloat32, ncclSum, NULL, NULL) == ncclInvalidArgument);
  CHECK(strstr(ncclGetLastError(NULL), "ncclAllReduce") != NULL);
  CHECK(ncclAllReduce(x, y, 4, (ncclDataType_t)99, ncclSum, comm, NULL) == ncclInvalidArgument);
  CHECK(strstr(ncclGetLastError(comm), "datatype 99") != NULL);
  CHECK(ncclAllReduce(x, y, 4, ncclFloat32, (ncclRedOp_t)77, comm, NULL) == ncclInvalidArgument);
  CHECK(ncclBroadcast(x, y, 4, ncclFloat32, n, comm, NULL) == ncclInvalidArgument);
  CHECK(ncclAllReduce(NULL, y, 4, ncclFloat32, ncclSum, comm, NULL) == ncclInvalidArgument);
  /* A stream asks for the GPU path, which a communicator made without a current CUDA context
     (this process never loads CUDA) lacks: refused, saying how to get it. */
  CHECK(ncclAllReduce(x, y, 4, ncclFloat32, ncclSum, comm, (cudaStream_t)0x1) == ncclInvalidUsage);
  CHECK(strstr(ncclGetLastError(NULL), "without a current CUDA context") != NULL);
  CHECK(strstr(ncclGetLastError(NULL), "cudaSetDevice") != NULL);
  { int dev = 7; CHECK(ncclCommCuDevice(comm, &dev) == ncclSuccess && dev == -1); }
  /* The device API needs a GPU communicator: refused on this one, saying how to get one. Its
     host-side helpers work on any communicator (this one's lsa team is the rank alone). */
  struct ncclDevCommRequirements reqs;
  memset(&reqs, 0, sizeof reqs);
  reqs.lsaBarrierCount = 1;
  struct ncclDevComm dc;
  CHECK(ncclDevCommCreate(comm, &reqs, &dc) == ncclInvalidUsage);
  CHECK(strstr(ncclGetLastError(NULL), "ncclDevCommCreate") != NULL);
  CHECK(strstr(ncclGetLastError(NULL), "cudaSetDevice") != NULL);
  CHECK(ncclDevCommCreate(comm, NULL, &dc) == ncclInvalidArgument);
  CHECK(pncclDevCommDestroy(comm, NULL) == ncclInvalidArgument);
  CHECK(strstr(pncclGetLastError(NULL), "ncclDevCommDestroy") != NULL);
  ncclTeam_t world = ncclTeamWorld(comm), lsa = ncclTeamLsa(comm), rail = ncclTeamRail(comm);
  CHECK(world.nRanks == n && world.rank == me && world.stride == 1);
  CHECK(lsa.nRanks == 1 && lsa.rank == 0 && lsa.stride == 1);
  CHECK(rail.nRanks == n && rail.rank == me && rail.stride == 1);
  CHECK(ncclTeamRankToWorld(comm, world, n - 1) == n - 1);
  CHECK(ncclTeamRankIsMember(world, rail, 0) && ncclTeamRankToTeam(world, rail, 0) == 0);
  struct ncclLsaBarrierHandle bar;
  struct ncclDevResourceRequirements bar_req;
  NCCL(ncclLsaBarrierCreateRequirement(world, 4, &bar, &bar_req));
  CHECK(bar.nBarriers == 4 && bar_req.bufferSize == (size_t)(4 * 4 * (1 + n)) && bar_req.outBufferHandle == &bar.bufHandle);
  struct ncclGinBarrierHandle gbar;
  NCCL(ncclGinBarrierCreateRequirement(comm, world, 2, &gbar, &bar_req));
  CHECK(bar_req.ginSignalCount == 2 && bar_req.outGinSignalStart == &gbar.signal0);
  /* Functions this build does not implement exist, refuse and name themselves. */
  CHECK(ncclLLA2ACalcSlots(16, 8) == -1);
  CHECK(strstr(ncclGetLastError(NULL), "ncclLLA2ACalcSlots") != NULL);
  /* The communicator is still fine after refused calls. */
  ncclResult_t async;
  NCCL(ncclCommGetAsyncError(comm, &async));
  CHECK(async == ncclSuccess);
}

/* A config of another NCCL's size, placed so that its last byte ends a readable page: a read
 * past `size` faults. */
static ncclConfig_t* config_of_size(size_t size, int blocking) {
  long page = sysconf(_SC_PAGESIZE);
  char* m = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(m != MAP_FAILED);
  CHECK(mprotect(m + page, page, PROT_NONE) == 0);
  ncclConfig_t full = NCCL_CONFIG_INITIALIZER;
  full.size = size;
  full.blocking = blocking;
  char* at = m + page - size;
  memcpy(at, &full, size < sizeof full ? size : sizeof full);
  if (size > sizeof full) memset(at + sizeof full, 0x5a, size - sizeof full); /* unknown fields */
  return (ncclConfig_t*)at;
}

static void check_sum_small(ncclComm_t comm, int nr, const int* ranks) {
  int32_t s[3] = {me, 1, me * me}, r[3];
  NCCL(ncclAllReduce(s, r, 3, ncclInt32, ncclSum, comm, NULL));
  int32_t want[3] = {0, nr, 0};
  for (int k = 0; k < nr; k++) { want[0] += ranks[k]; want[2] += ranks[k] * ranks[k]; }
  CHECK(r[0] == want[0] && r[1] == want[1] && r[2] == want[2]);
}

static void check_configs(const ncclUniqueId* ids) {
  /* 2.19 (48 bytes, up to splitShare), 2.27 (72, up to nvlsCTAs), 2.28 (80), and a future one
   * with fields this library does not know. */
  const size_t sizes[] = {48, 72, sizeof(ncclConfig_t), sizeof(ncclConfig_t) + 24};
  CHECK(sizeof(ncclConfig_t) == 80);
  for (int i = 0; i < 4; i++) {
    ncclComm_t c;
    NCCL(ncclCommInitRankConfig(&c, n, ids[1 + i], me, config_of_size(sizes[i], i % 2 ? 1 : NCCL_CONFIG_UNDEF_INT)));
    check_sum_small(c, n, all_ranks);
    NCCL(ncclCommFinalize(c));
    NCCL(ncclCommDestroy(c));
  }
  ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
  bad.magic = 0;
  ncclComm_t c = (ncclComm_t)0x1;
  CHECK(ncclCommInitRankConfig(&c, n, ids[1], me, &bad) == ncclInvalidArgument);
  CHECK(strstr(ncclGetLastError(NULL), "NCCL_CONFIG_INITIALIZER") != NULL);
  ncclConfig_t blk = NCCL_CONFIG_INITIALIZER;
  blk.blocking = 7;
  CHECK(ncclCommInitRankConfig(&c, n, ids[1], me, &blk) == ncclInvalidArgument);
  ncclConfig_t cga = NCCL_CONFIG_INITIALIZER;
  cga.cgaClusterSize = -2;
  CHECK(ncclCommInitRankConfig(&c, n, ids[1], me, &cga) == ncclInvalidArgument);
  CHECK(strstr(ncclGetLastError(NULL), "cgaClusterSize is -2") != NULL);
}

static void check_nonblocking(ncclUniqueId id) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  cfg.commName = "nonblocking";
  ncclComm_t c;
  ncclResult_t r = ncclCommInitRankConfig(&c, n, id, me, &cfg);
  CHECK(r == ncclInProgress || r == ncclSuccess);
  CHECK(c != NULL);
  ncclResult_t state = ncclInProgress;
  double deadline = now() + 30;
  while (state == ncclInProgress) {
    NCCL(ncclCommGetAsyncError(c, &state));
    CHECK(now() < deadline);
    if (state == ncclInProgress) usleep(1000);
  }
  CHECK(state == ncclSuccess);
  check_sum_small(c, n, all_ranks);
  NCCL(ncclCommDestroy(c));
}

static void check_scalable(const ncclUniqueId* ids) {
  ncclComm_t c;
  ncclUniqueId two[2] = {ids[6], ids[7]};
  NCCL(ncclCommInitRankScalable(&c, n, me, 2, two, NULL));
  int count, rank;
  NCCL(ncclCommCount(c, &count));
  NCCL(ncclCommUserRank(c, &rank));
  CHECK(count == n && rank == me);
  check_sum_small(c, n, all_ranks);
  NCCL(ncclCommDestroy(c));
}

static void check_split(ncclComm_t comm) {
  /* Colour by parity, ordered by descending parent rank; with 4 ranks, rank 3 opts out. */
  int color = (n == 4 && me == 3) ? NCCL_SPLIT_NOCOLOR : me % 2;
  ncclComm_t sub = (ncclComm_t)0x1;
  NCCL(ncclCommSplit(comm, color, -me, &sub, NULL));
  if (color == NCCL_SPLIT_NOCOLOR) {
    CHECK(sub == NULL);
    return;
  }
  int members[64], nm = 0;
  for (int q = n - 1; q >= 0; q--)
    if (q % 2 == color && !(n == 4 && q == 3)) members[nm++] = q;
  int count, rank;
  NCCL(ncclCommCount(sub, &count));
  NCCL(ncclCommUserRank(sub, &rank));
  CHECK(count == nm);
  CHECK(members[rank] == me);
  check_sum_small(sub, nm, members);
  NCCL(ncclCommDestroy(sub));
}

/* Rank 0 aborts; every other rank is blocked receiving from it and must fail, not hang. */
static void check_abort(ncclUniqueId id) {
  ncclComm_t c;
  NCCL(ncclCommInitRank(&c, n, id, me));
  check_sum_small(c, n, all_ranks);
  if (me == 0) {
    usleep(200000);
    NCCL(ncclCommAbort(c));
    usleep(3000000); /* stay alive: the others must learn of the abort, not of an exit */
    return;
  }
  float buf[16];
  double t0 = now();
  ncclResult_t r = ncclRecv(buf, 16, ncclFloat32, 0, c, NULL);
  double took = now() - t0;
  CHECK(r == ncclRemoteError || r == ncclSystemError);
  CHECK(took < 2.5);
  ncclResult_t async;
  NCCL(ncclCommGetAsyncError(c, &async));
  CHECK(async == r);
  CHECK(strstr(ncclGetLastError(c), "ncclRecv") != NULL);
  NCCL(ncclCommAbort(c));
}

struct blocked {
  ncclComm_t c;
  ncclResult_t r;
};

static void* recv_from_1(void* p) {
  struct blocked* b = p;
  float buf[16];
  b->r = ncclRecv(buf, 16, ncclFloat32, 1, b->c, NULL);
  return NULL;
}

/* Rank 0 revokes while a thread of its own waits on a receive that never comes; every rank
 * then revokes, finds the communicator quiescent and closed to operations, and shrinks it
 * (excluding nobody) into a working one. */
static void check_revoke(ncclUniqueId id) {
  ncclComm_t c;
  NCCL(ncclCommInitRank(&c, n, id, me));
  check_sum_small(c, n, all_ranks);
  CHECK(ncclCommRevoke(c, 1) == ncclInvalidArgument);
  CHECK(ncclCommRevoke(NULL, NCCL_REVOKE_DEFAULT) == ncclSuccess);
  if (me == 0) {
    struct blocked b = {c, ncclSuccess};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, recv_from_1, &b) == 0);
    usleep(200000);
    double t0 = now();
    NCCL(ncclCommRevoke(c, NCCL_REVOKE_DEFAULT));
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(b.r != ncclSuccess && b.r != ncclInProgress);
    CHECK(now() - t0 < 2.5);
  } else {
    usleep(400000);
    NCCL(ncclCommRevoke(c, NCCL_REVOKE_DEFAULT));
  }
  ncclResult_t async;
  NCCL(ncclCommGetAsyncError(c, &async));
  CHECK(async == ncclSuccess);
  float x[4] = {0}, y[4];
  CHECK(ncclAllReduce(x, y, 4, ncclFloat32, ncclSum, c, NULL) == ncclInvalidUsage);
  CHECK(strstr(ncclGetLastError(NULL), "revoked") != NULL);
  CHECK(ncclCommFinalize(c) == ncclInvalidUsage);
  CHECK(ncclCommRevoke(c, NCCL_REVOKE_DEFAULT) == ncclInvalidArgument);
  ncclComm_t s;
  NCCL(ncclCommShrink(c, NULL, 0, &s, NULL, NCCL_SHRINK_DEFAULT));
  check_sum_small(s, n, all_ranks);
  NCCL(ncclCommDestroy(s));
  ncclComm_t sp;
  CHECK(ncclCommSplit(c, 0, me, &sp, NULL) == ncclInvalidUsage);
  CHECK(strstr(ncclGetLastError(NULL), "ncclCommShrink") != NULL);
  NCCL(ncclCommDestroy(c));
}

static void check_shrink(ncclComm_t comm) {
  /* The last rank is excluded and does not call; the others go on without it. */
  if (me == n - 1) return;
  int excl[1] = {n - 1};
  ncclComm_t small;
  NCCL(ncclCommShrink(comm, excl, 1, &small, NULL, NCCL_SHRINK_DEFAULT));
  int count, rank;
  NCCL(ncclCommCount(small, &count));
  NCCL(ncclCommUserRank(small, &rank));
  CHECK(count == n - 1 && rank == me);
  check_sum_small(small, n - 1, all_ranks);
  NCCL(ncclCommDestroy(small));
}

/* Several ranks in this process, driven from one thread through groups. */
static void check_single_process(void) {
  ncclComm_t comms[3];
  NCCL(ncclCommInitAll(comms, 3, NULL));
  int32_t s[3][8], r[3][8];
  NCCL(ncclGroupStart());
  for (int i = 0; i < 3; i++) {
    for (int j = 0; j < 8; j++) s[i][j] = i * 10 + j;
    NCCL(ncclAllReduce(s[i], r[i], 8, ncclInt32, ncclSum, comms[i], NULL));
  }
  NCCL(ncclGroupEnd());
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 8; j++) CHECK(r[i][j] == 30 + 3 * j);
  for (int i = 0; i < 3; i++) NCCL(ncclCommDestroy(comms[i]));

  /* ncclCommInitRank of both ranks from one thread inside a group completes at its end. */
  ncclUniqueId id;
  NCCL(ncclGetUniqueId(&id));
  ncclComm_t two[2];
  NCCL(ncclGroupStart());
  for (int i = 0; i < 2; i++) NCCL(ncclCommInitRank(&two[i], 2, id, i));
  NCCL(ncclGroupEnd());
  double a[2][4], b[2][4];
  NCCL(ncclGroupStart());
  for (int i = 0; i < 2; i++) {
    for (int j = 0; j < 4; j++) a[i][j] = i + j * 0.5;
    NCCL(ncclAllReduce(a[i], b[i], 4, ncclFloat64, ncclMax, two[i], NULL));
  }
  NCCL(ncclGroupEnd());
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++) CHECK(b[i][j] == 1 + j * 0.5);
  for (int i = 0; i < 2; i++) NCCL(ncclCommDestroy(two[i]));
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s <rank> <nranks> <id file>\n", argv[0]);
    return 2;
  }
  me = atoi(argv[1]);
  n = atoi(argv[2]);
  CHECK(n >= 2 && n <= 64 && me >= 0 && me < n);
  for (int q = 0; q < 64; q++) all_ranks[q] = q;

  int version;
  NCCL(ncclGetVersion(&version));
  CHECK(version == NCCL_VERSION_CODE && version == 22809 && NCCL_VERSION(2, 28, 9) == 22809);
  CHECK(strcmp(ncclGetErrorString(ncclSuccess), "no error") == 0);
  CHECK(strlen(ncclGetErrorString(ncclRemoteError)) > 0);
  CHECK(sizeof(ncclUniqueId) == 128);

  ncclUniqueId ids[NIDS];
  share_ids(argv[3], ids);

  ncclComm_t comm;
  NCCL(ncclCommInitRank(&comm, n, ids[0], me));
  int count, rank, dev;
  NCCL(ncclCommCount(comm, &count));
  NCCL(ncclCommUserRank(comm, &rank));
  NCCL(ncclCommCuDevice(comm, &dev));
  CHECK(count == n && rank == me && dev == -1);

  check_all_reduce(comm);
  check_rooted(comm);
  check_gathers(comm);
  check_p2p_and_groups(comm);
  check_premulsum(comm);
  check_memory_and_windows(comm);
  check_refusals(comm);
  check_configs(ids);
  check_nonblocking(ids[5]);
  check_scalable(ids);
  check_split(comm);
  if (me == 0) check_single_process();
  check_shrink(comm);
  NCCL(ncclCommFinalize(comm));
  NCCL(ncclCommDestroy(comm));
  check_revoke(ids[9]);
  /* Last, on a fresh id of its own: rank 0 aborts while the others wait on it. */
  check_abort(ids[8]);
  printf("OK rank %d\n", me);
  return 0;
}
