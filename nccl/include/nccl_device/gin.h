/*
 * Part of occl's nccl_device.h: GIN (GPU-initiated one-sided puts and signals), as occl offers it
 * on one host.
 *
 * Every peer of an occl device communicator is an lsa peer, so a put is made by the calling
 * threads themselves: they copy the bytes into the peer's part of the destination window
 * through its lsa pointer, make the copy visible system-wide (a fence), and then apply the
 * remote action to the peer's signal (a system-scope atomic add with release) and the local
 * action to this rank's counter. A put has therefore completed, source consumed and data in
 * place, when it returns; flush only orders memory.
 *
 * Signals are 64-bit words in every rank's resource buffer (at devComm.ginSignalOffset), counters
 * and signal shadows 64-bit words of this rank alone. Waits compare "rolling" values: a wait for
 * `least` on `bits` bits ends once (value - least) mod 2^bits is below 2^(bits-1), so counts may
 * wrap.
 */
#ifndef OCCL_NCCL_DEVICE_GIN_H_
#define OCCL_NCCL_DEVICE_GIN_H_
#include "core.h"
#include "ptr.h"

#if defined(__CUDACC__)
/* Actions of a put: after the data, on the peer ... */
struct ncclGin_None {};
struct ncclGin_SignalAdd {
  ncclGinSignal_t signal;
  uint64_t value;
};
/* +1; for a given signal, do not mix it with other operations between resets. */
struct ncclGin_SignalInc {
  ncclGinSignal_t signal;
};
/* ... and here, once the source has been read. */
struct ncclGin_CounterInc {
  ncclGinCounter_t counter;
};

/* Space in shared memory for a put's descriptor; occl's puts need none and ignore it. */
struct ncclGinDescriptorSmem {
  alignas(16) char space[64];
};
struct ncclGin_DescriptorSmem {
  ncclGinDescriptorSmem* descriptor;
};

namespace occl_dev {
NCCL_DEVICE_INLINE void remote_action(uint64_t*, ncclGin_None) {}
NCCL_DEVICE_INLINE void remote_action(uint64_t* signals, ncclGin_SignalInc a) {
  add(signals + a.signal, uint64_t(1), cuda::memory_order_release);
}
NCCL_DEVICE_INLINE void remote_action(uint64_t* signals, ncclGin_SignalAdd a) {
  add(signals + a.signal, a.value, cuda::memory_order_release);
}
NCCL_DEVICE_INLINE void local_action(uint64_t*, ncclGin_None) {}
NCCL_DEVICE_INLINE void local_action(uint64_t* counters, ncclGin_CounterInc a) {
  add(counters + a.counter, uint64_t(1), cuda::memory_order_release);
}

/* The coop's threads copy `bytes` from src to dst together: 16 bytes at a time, four in flight
   per thread, when both are 16-byte aligned, else in the widest unit both allow. */
template <typename Coop>
NCCL_DEVICE_INLINE void copy(Coop coop, char* dst, char const* src, size_t bytes) {
  int t = coop.thread_rank(), n = coop.size();
  uintptr_t mis = (uintptr_t)dst | (uintptr_t)src;
  size_t done = 0;
  if ((mis & 15) == 0) {
    uint4* d = (uint4*)dst;
    uint4 const* s = (uint4 const*)src;
    size_t vecs = bytes / 16, i = t;
    for (; i + 3 * (size_t)n < vecs; i += 4 * (size_t)n) {
      uint4 a = s[i], b = s[i + n], c = s[i + 2 * n], e = s[i + 3 * n];
      d[i] = a;
      d[i + n] = b;
      d[i + 2 * n] = c;
      d[i + 3 * n] = e;
    }
    for (; i < vecs; i += n) d[i] = s[i];
    done = vecs * 16;
  } else if ((mis & 7) == 0) {
    size_t words = bytes / 8;
    for (size_t i = t; i < words; i += n) ((uint64_t*)dst)[i] = ((uint64_t const*)src)[i];
    done = words * 8;
  } else if ((mis & 3) == 0) {
    size_t words = bytes / 4;
    for (size_t i = t; i < words; i += n) ((uint32_t*)dst)[i] = ((uint32_t const*)src)[i];
    done = words * 4;
  }
  for (size_t i = done + t; i < bytes; i += n) dst[i] = src[i];
}
}  // namespace occl_dev

struct ncclGin {
  ncclDevComm const& comm;
  uint32_t nContexts : 8, contextId : 8, _unused : 16;

  /* Context contextIndex (taken modulo the device communicator's context count). */
  NCCL_DEVICE_INLINE ncclGin(ncclDevComm const& comm, int contextIndex) : comm(comm) {
    int n = comm.ginContextCount > 0 ? comm.ginContextCount : 1;
    nContexts = n;
    contextId = (uint32_t)contextIndex % (uint32_t)n;
    _unused = 0;
  }

  /* Copies `bytes` from this rank's srcOffset of srcWnd to member `peer` of `team` at dstOffset
     of dstWnd, then applies the actions. All threads of coop take part. */
  template <typename RemoteAction = ncclGin_None, typename LocalAction = ncclGin_None,
            typename Coop = ncclCoopThread, typename DescriptorSmem = ncclGin_None>
  NCCL_DEVICE_INLINE void put(ncclTeam team, int peer, ncclWindow_t dstWnd, size_t dstOffset, ncclWindow_t srcWnd,
                              size_t srcOffset, size_t bytes, RemoteAction remoteAction = ncclGin_None{},
                              LocalAction localAction = ncclGin_None{}, Coop coop = ncclCoopThread{},
                              DescriptorSmem descriptor = ncclGin_None{},
                              cuda::thread_scope alreadyReleased = cuda::thread_scope_thread,
                              cuda::thread_scope expected_scope = cuda::thread_scope_device) const {
    coop.sync();
    int lsa = ncclTeamRankToLsa(comm, team, peer);
    occl_dev::copy(coop, (char*)ncclGetLsaPointer(dstWnd, dstOffset, lsa), (char const*)ncclGetLocalPointer(srcWnd, srcOffset),
                   bytes);
    /* each copying thread's stores, then the coop's single signal */
    cuda::atomic_thread_fence(cuda::memory_order_release, cuda::thread_scope_system);
    coop.sync();
    if (coop.thread_rank() == 0) {
      occl_dev::remote_action(signals(lsa), remoteAction);
      occl_dev::local_action(comm.ginCounters, localAction);
    }
    coop.sync();
  }

  /* The same, counted in elements of T between two window positions. */
  template <typename T, typename RemoteAction = ncclGin_None, typename LocalAction = ncclGin_None,
            typename Coop = ncclCoopThread, typename DescriptorSmem = ncclGin_None>
  NCCL_DEVICE_INLINE void put(ncclTeam team, int peer, ncclSymPtr<T> dstElts, ncclSymPtr<T> srcElts, size_t nElts,
                              RemoteAction remoteAction = ncclGin_None{}, LocalAction localAction = ncclGin_None{},
                              Coop coop = ncclCoopThread{}, DescriptorSmem descriptor = ncclGin_None{},
                              cuda::thread_scope alreadyReleased = cuda::thread_scope_thread,
                              cuda::thread_scope expected_scope = cuda::thread_scope_device) const {
    put(team, peer, dstElts.window, dstElts.offset, srcElts.window, srcElts.offset, nElts * sizeof(T), remoteAction,
        localAction, coop, descriptor, alreadyReleased, expected_scope);
  }

  /* Writes one value of at most 8 bytes to the peer, then applies the remote action. */
  template <typename T, typename RemoteAction = ncclGin_None, typename Coop = ncclCoopThread,
            typename DescriptorSmem = ncclGin_None>
  NCCL_DEVICE_INLINE void putValue(ncclTeam team, int peer, ncclWindow_t dstWnd, size_t dstOffset, T value,
                                   RemoteAction remoteAction = ncclGin_None{}, Coop coop = ncclCoopThread{},
                                   DescriptorSmem descriptor = ncclGin_None{},
                                   cuda::thread_scope alreadyReleased = cuda::thread_scope_thread,
                                   cuda::thread_scope expected_scope = cuda::thread_scope_device) const {
    static_assert(sizeof(T) <= 8, "putValue carries at most 8 bytes");
    coop.sync();
    if (coop.thread_rank() == 0) {
      int lsa = ncclTeamRankToLsa(comm, team, peer);
      *(T volatile*)ncclGetLsaPointer(dstWnd, dstOffset, lsa) = value;
      cuda::atomic_thread_fence(cuda::memory_order_release, cuda::thread_scope_system);
      occl_dev::remote_action(signals(lsa), remoteAction);
    }
    coop.sync();
  }
  template <typename T, typename RemoteAction = ncclGin_None, typename Coop = ncclCoopThread,
            typename DescriptorSmem = ncclGin_None>
  NCCL_DEVICE_INLINE void putValue(ncclTeam team, int peer, ncclSymPtr<T> dst, T value,
                                   RemoteAction remoteAction = ncclGin_None{}, Coop coop = ncclCoopThread{},
                                   DescriptorSmem descriptor = ncclGin_None{},
                                   cuda::thread_scope alreadyReleased = cuda::thread_scope_thread,
                                   cuda::thread_scope expected_scope = cuda::thread_scope_device) const {
    putValue(team, peer, dst.window, dst.offset, value, remoteAction, coop, descriptor, alreadyReleased,
             expected_scope);
  }

  /* Applies a remote action alone (after this coop's earlier writes). */
  template <typename RemoteAction, typename Coop = ncclCoopThread, typename DescriptorSmem = ncclGin_None>
  NCCL_DEVICE_INLINE void signal(ncclTeam team, int peer, RemoteAction remoteAction, Coop coop = ncclCoopThread(),
                                 DescriptorSmem descriptor = ncclGin_None{},
                                 cuda::thread_scope alreadyReleased = cuda::thread_scope_thread,
                                 cuda::thread_scope expected_scope = cuda::thread_scope_device) const {
    coop.sync();
    if (coop.thread_rank() == 0) occl_dev::remote_action(signals(ncclTeamRankToLsa(comm, team, peer)), remoteAction);
    coop.sync();
  }

  /* The sources of this coop's puts may be reused: true as soon as a put returns on occl. */
  template <typename Coop>
  NCCL_DEVICE_INLINE void flush(Coop coop, cuda::memory_order ord = cuda::memory_order_acquire) const {
    coop.sync();
    if (ord != cuda::memory_order_relaxed) cuda::atomic_thread_fence(ord, cuda::thread_scope_system);
    coop.sync();
  }

  NCCL_DEVICE_INLINE uint64_t readCounter(ncclGinCounter_t counter, int bits = 56,
                                          cuda::memory_order ord = cuda::memory_order_acquire) const {
    return occl_dev::load(comm.ginCounters + counter, ord) & mask(bits);
  }
  template <typename Coop>
  NCCL_DEVICE_INLINE void waitCounter(Coop coop, ncclGinCounter_t counter, uint64_t least, int bits = 56,
                                      cuda::memory_order ord = cuda::memory_order_acquire) const {
    waitWord(coop, comm.ginCounters + counter, least, bits, ord);
  }

  /* Each signal has a shadow that only the program changes (and resetSignal). */
  NCCL_DEVICE_INLINE uint64_t* getSignalShadowPtr(ncclGinSignal_t signal) const {
    return comm.ginSignalShadows + signal;
  }
  NCCL_DEVICE_INLINE void increaseSignalShadow(ncclGinSignal_t signal, uint64_t delta) const {
    atomicAdd((unsigned long long*)getSignalShadowPtr(signal), (unsigned long long)delta);
  }

  NCCL_DEVICE_INLINE uint64_t readSignal(ncclGinSignal_t signal, int bits = 64,
                                         cuda::memory_order ord = cuda::memory_order_acquire) const {
    return occl_dev::load(signals(comm.lsaRank) + signal, ord) & mask(bits);
  }
  /* Until this rank's signal reaches `least`. */
  template <typename Coop>
  NCCL_DEVICE_INLINE void waitSignal(Coop coop, ncclGinSignal_t signal, uint64_t least, int bits = 64,
                                     cuda::memory_order ord = cuda::memory_order_acquire) const {
    waitWord(coop, signals(comm.lsaRank) + signal, least, bits, ord);
  }
  /* Until the signal reaches its shadow. */
  template <typename Coop>
  NCCL_DEVICE_INLINE void waitSignalMeetShadow(Coop coop, ncclGinSignal_t signal, int bits = 64,
                                               cuda::memory_order ord = cuda::memory_order_acquire) const {
    coop.sync();
    uint64_t least = *getSignalShadowPtr(signal);
    waitWord(coop, signals(comm.lsaRank) + signal, least, bits, ord);
  }
  /* Until the signal exceeds its shadow by leastDelta; then *before is the old shadow, *delta what
     the signal gained on it, and the shadow is moved up to the signal. */
  template <typename Coop, typename Uint>
  NCCL_DEVICE_INLINE void waitSignalFollowShadow(Coop coop, ncclGinSignal_t signal, Uint leastDelta, Uint* before,
                                                 Uint* delta, int bits = 64,
                                                 cuda::memory_order ord = cuda::memory_order_acquire) const {
    coop.sync();
    uint64_t* shadow = getSignalShadowPtr(signal);
    uint64_t old = *shadow, now = old;
    if (coop.thread_rank() == 0) {
      occl_dev::spin(signals(comm.lsaRank) + signal, ord, occl_dev::watch(comm),
                     [=](uint64_t got) { return occl_dev::reached(old + (uint64_t)leastDelta, got, bits); }, &now);
    }
    now = ncclCoopBcast(coop, now, 0, /*entrySync=*/false);
    if (coop.thread_rank() == 0) *shadow = now;
    *before = (Uint)(old & mask(bits));
    *delta = (Uint)((now - old) & mask(bits));
    coop.sync();
  }

  /* Zero; nothing may be changing them at the same time. */
  NCCL_DEVICE_INLINE void resetCounter(ncclGinCounter_t counter) const {
    occl_dev::store(comm.ginCounters + counter, uint64_t(0), cuda::memory_order_relaxed);
  }
  NCCL_DEVICE_INLINE void resetSignal(ncclGinSignal_t signal) const {
    occl_dev::store(signals(comm.lsaRank) + signal, uint64_t(0), cuda::memory_order_relaxed);
    *getSignalShadowPtr(signal) = 0;
  }

  /* internal */
  NCCL_DEVICE_INLINE uint64_t* signals(int lsaPeer) const {
    return (uint64_t*)((char*)ncclGetLsaPointer(comm.resourceWindow, 0, lsaPeer) + comm.ginSignalOffset);
  }
  static NCCL_DEVICE_INLINE uint64_t mask(int bits) { return bits >= 64 ? ~uint64_t(0) : (uint64_t(1) << bits) - 1; }
  template <typename Coop>
  NCCL_DEVICE_INLINE void waitWord(Coop coop, uint64_t* word, uint64_t least, int bits, cuda::memory_order ord) const {
    coop.sync();
    if (coop.thread_rank() == 0) {
      occl_dev::spin(word, ord, occl_dev::watch(comm),
                     [=](uint64_t got) { return occl_dev::reached(least, got, bits); });
    }
    coop.sync();
  }
};
#endif /* __CUDACC__ */

#endif /* OCCL_NCCL_DEVICE_GIN_H_ */
