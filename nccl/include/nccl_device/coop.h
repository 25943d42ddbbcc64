/*
 * Part of occl's nccl_device.h: cooperative thread sets ("coops"). A device-API call that takes a
 * coop is made by every thread of the set together; each coop offers thread_rank(), size(),
 * num_threads() and sync(), as CUDA's cooperative groups do.
 */
#ifndef OCCL_NCCL_DEVICE_COOP_H_
#define OCCL_NCCL_DEVICE_COOP_H_
#include "utility.h"

#if defined(__CUDACC__)

/* N consecutive lanes of one warp, N a power of two up to 32, aligned to N. */
template <int N>
struct ncclCoopTile {
  static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0, "a tile is a power of two of at most 32 lanes");
  NCCL_DEVICE_INLINE int thread_rank() const { return occl_dev::lane() & (N - 1); }
  NCCL_DEVICE_INLINE constexpr int size() const { return N; }
  NCCL_DEVICE_INLINE constexpr int num_threads() const { return N; }
  NCCL_DEVICE_INLINE uint32_t laneMask() const {
    uint32_t ones = N == 32 ? 0xffffffffu : ((1u << N) - 1);
    return ones << (occl_dev::lane() & ~(N - 1));
  }
  NCCL_DEVICE_INLINE void sync() {
    if (N > 1) __syncwarp(laneMask());
  }
};

typedef ncclCoopTile<1> ncclCoopThread;
typedef ncclCoopTile<32> ncclCoopWarp;

/* Any set of lanes of one warp, by mask. */
struct ncclCoopLanes {
  uint32_t lmask;
  NCCL_DEVICE_INLINE constexpr ncclCoopLanes(uint32_t lmask = 0xffffffffu) : lmask(lmask) {}
  NCCL_DEVICE_INLINE int thread_rank() const { return __popc(lmask & occl_dev::lanes_below()); }
  NCCL_DEVICE_INLINE int size() const { return __popc(lmask); }
  NCCL_DEVICE_INLINE int num_threads() const { return __popc(lmask); }
  NCCL_DEVICE_INLINE void sync() { __syncwarp(lmask); }
};

/* Warps warp0 .. warp0+nWarps-1 of the block, synchronised by named barrier 1+id (id 0..14; two
   spans with one id must not be in a call at the same time). */
struct ncclCoopWarpSpan {
  uint32_t warp0 : 8, nWarps : 8, id : 8;
  NCCL_DEVICE_INLINE constexpr ncclCoopWarpSpan(int warp0, int nWarps, int id)
      : warp0(warp0), nWarps(nWarps), id(id) {}
  NCCL_DEVICE_INLINE int thread_rank() const { return (int)threadIdx.x - 32 * (int)warp0; }
  NCCL_DEVICE_INLINE int size() const { return 32 * (int)nWarps; }
  NCCL_DEVICE_INLINE int num_threads() const { return 32 * (int)nWarps; }
  NCCL_DEVICE_INLINE void sync() {
    asm volatile("barrier.sync %0, %1;" ::"r"(1 + (int)id), "r"(32 * (int)nWarps) : "memory");
  }
};

/* Every thread of the block. */
struct ncclCoopCta {
  NCCL_DEVICE_INLINE int thread_rank() const {
    return (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  }
  NCCL_DEVICE_INLINE int size() const { return (int)(blockDim.x * blockDim.y * blockDim.z); }
  NCCL_DEVICE_INLINE int num_threads() const { return size(); }
  NCCL_DEVICE_INLINE void sync() { __syncthreads(); }
};

template <int N>
NCCL_DEVICE_INLINE uint32_t ncclCoopGetLaneMask(ncclCoopTile<N> coop) {
  return coop.laneMask();
}
NCCL_DEVICE_INLINE uint32_t ncclCoopGetLaneMask(ncclCoopLanes coop) { return coop.lmask; }
NCCL_DEVICE_INLINE uint32_t ncclCoopGetLaneMask(ncclCoopWarpSpan) { return 0xffffffffu; }
NCCL_DEVICE_INLINE uint32_t ncclCoopGetLaneMask(ncclCoopCta) { return 0xffffffffu; }

/* Known at compile time to be one thread. */
template <int N>
NCCL_DEVICE_INLINE constexpr bool ncclCoopIsThread(ncclCoopTile<N>) {
  return N == 1;
}
NCCL_DEVICE_INLINE constexpr bool ncclCoopIsThread(ncclCoopLanes) { return false; }
NCCL_DEVICE_INLINE constexpr bool ncclCoopIsThread(ncclCoopWarpSpan) { return false; }
NCCL_DEVICE_INLINE constexpr bool ncclCoopIsThread(ncclCoopCta) { return false; }

/* Known at compile time to lie within one warp. */
template <int N>
NCCL_DEVICE_INLINE constexpr bool ncclCoopWithinWarp(ncclCoopTile<N>) {
  return true;
}
NCCL_DEVICE_INLINE constexpr bool ncclCoopWithinWarp(ncclCoopLanes) { return true; }
NCCL_DEVICE_INLINE constexpr bool ncclCoopWithinWarp(ncclCoopWarpSpan) { return false; }
NCCL_DEVICE_INLINE constexpr bool ncclCoopWithinWarp(ncclCoopCta) { return false; }

/* The lanes of the calling warp that are running now. */
NCCL_DEVICE_INLINE ncclCoopLanes ncclCoopCoalesced() { return ncclCoopLanes(__activemask()); }

/* The lanes of the calling warp that may act together when `coop` as a whole is making a call:
   its whole warp for a coop wider than a warp, else the coop itself. */
template <typename Coop>
NCCL_DEVICE_INLINE ncclCoopWarp ncclCoopCoalesced(Coop) {
  return ncclCoopWarp();
}
NCCL_DEVICE_INLINE ncclCoopLanes ncclCoopCoalesced(ncclCoopLanes coop) { return coop; }
template <int N>
NCCL_DEVICE_INLINE ncclCoopTile<N> ncclCoopCoalesced(ncclCoopTile<N> coop) {
  return coop;
}

/* Root's `value` to every thread of the coop. */
namespace occl_dev {
template <typename T>
union Words {
  uint32_t w[(sizeof(T) + 3) / 4];
  T v;
  NCCL_DEVICE_INLINE Words() {}
};
/* One 16-byte cell per block for broadcasts over a whole block, 15 for warp spans (by id). */
NCCL_DEVICE_INLINE ulonglong2* bcast_cells() {
  __shared__ ulonglong2 cells[16];
  return cells;
}
}  // namespace occl_dev

template <int N, typename T>
NCCL_DEVICE_INLINE T ncclCoopBcast(ncclCoopTile<N> coop, T value, int root, bool entrySync = true) {
  occl_dev::Words<T> u;
  u.v = value;
  for (int i = 0; i < (int)((sizeof(T) + 3) / 4); i++) u.w[i] = __shfl_sync(coop.laneMask(), u.w[i], root, N);
  return u.v;
}
template <typename T>
NCCL_DEVICE_INLINE T ncclCoopBcast(ncclCoopLanes coop, T value, int root, bool entrySync = true) {
  /* the lane holding the root-th set bit of the mask */
  int src = __fns(coop.lmask, 0, root + 1);
  occl_dev::Words<T> u;
  u.v = value;
  for (int i = 0; i < (int)((sizeof(T) + 3) / 4); i++) u.w[i] = __shfl_sync(coop.lmask, u.w[i], src);
  return u.v;
}
template <typename T>
NCCL_DEVICE_INLINE T ncclCoopBcast(ncclCoopWarpSpan coop, T value, int root, bool entrySync = true) {
  static_assert(sizeof(T) <= sizeof(ulonglong2), "a warp-span broadcast carries at most 16 bytes");
  T* cell = (T*)&occl_dev::bcast_cells()[1 + coop.id];
  if (entrySync) coop.sync();
  if (coop.thread_rank() == root) *cell = value;
  coop.sync();
  return *cell;
}
template <typename T>
NCCL_DEVICE_INLINE T ncclCoopBcast(ncclCoopCta coop, T value, int root, bool entrySync = true) {
  static_assert(sizeof(T) <= sizeof(ulonglong2), "a block broadcast carries at most 16 bytes");
  T* cell = (T*)&occl_dev::bcast_cells()[0];
  if (entrySync) coop.sync();
  if (coop.thread_rank() == root) *cell = value;
  coop.sync();
  return *cell;
}

#endif /* __CUDACC__ */
#endif /* OCCL_NCCL_DEVICE_COOP_H_ */
