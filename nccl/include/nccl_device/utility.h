/*
 * Part of occl's nccl_device.h: the inline-function macros of NCCL's device API and the helpers
 * occl's device code shares (system-scope atomics, rolling comparisons, bounded spinning).
 */
#ifndef OCCL_NCCL_DEVICE_UTILITY_H_
#define OCCL_NCCL_DEVICE_UTILITY_H_

#include <stddef.h>
#include <stdint.h>
#if !defined(__cplusplus)
#include <stdbool.h>
#endif

#if defined(__CUDACC__)
#define NCCL_DEVICE_INLINE __device__ __forceinline__
#define NCCL_HOST_DEVICE_INLINE __host__ __device__ __forceinline__
#elif defined(__cplusplus)
#define NCCL_DEVICE_INLINE inline
#define NCCL_HOST_DEVICE_INLINE inline
#else
#define NCCL_DEVICE_INLINE static inline
#define NCCL_HOST_DEVICE_INLINE static inline
#endif
#ifndef __host__
#define __host__
#endif

#if defined(__cplusplus)
#define NCCL_EXTERN_C extern "C"
#else
#define NCCL_EXTERN_C
#endif

#if defined(__CUDACC__)
#include <cuda/atomic>
#include <new>

/* occl's own helpers; not part of NCCL's API. */
namespace occl_dev {

/* The part of `order` that applies to a load (acquire) or a store (release). */
NCCL_DEVICE_INLINE cuda::memory_order load_order(cuda::memory_order order) {
  if (order == cuda::memory_order_release) return cuda::memory_order_relaxed;
  if (order == cuda::memory_order_acq_rel) return cuda::memory_order_acquire;
  return order;
}
NCCL_DEVICE_INLINE cuda::memory_order store_order(cuda::memory_order order) {
  if (order == cuda::memory_order_acquire || order == cuda::memory_order_consume) return cuda::memory_order_relaxed;
  if (order == cuda::memory_order_acq_rel) return cuda::memory_order_release;
  return order;
}

/* Every wait on a peer crosses GPUs, so every flag is a system-scope atomic. */
template <typename T>
NCCL_DEVICE_INLINE T load(T* p, cuda::memory_order order) {
  return cuda::atomic_ref<T, cuda::thread_scope_system>(*p).load(load_order(order));
}
template <typename T>
NCCL_DEVICE_INLINE void store(T* p, T v, cuda::memory_order order) {
  cuda::atomic_ref<T, cuda::thread_scope_system>(*p).store(v, store_order(order));
}
template <typename T>
NCCL_DEVICE_INLINE void add(T* p, T v, cuda::memory_order order) {
  cuda::atomic_ref<T, cuda::thread_scope_system>(*p).fetch_add(v, store_order(order));
}

/* Whether `want` has been reached by `got` on a counter of `bits` bits that may wrap: the
   distance from want to got, taken modulo 2^bits, lies in the lower half. */
NCCL_HOST_DEVICE_INLINE bool reached(uint64_t want, uint64_t got, int bits) {
  uint64_t mask = bits >= 64 ? ~uint64_t(0) : (uint64_t(1) << bits) - 1;
  return ((got - want) & mask) <= (mask >> 1);
}

NCCL_DEVICE_INLINE uint64_t clock_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* Where a spinning thread learns to give up: occl's error word of this rank (set by an abort, a
   dead peer or another wait's timeout) and how long a wait may last. */
struct Watch {
  uint64_t* error;
  uint64_t timeout_ns;
};

/* Polls `*p` until `done(value)` holds. Every 1024 polls it looks at the error word and the
   clock; when the communicator has failed or the wait outlasted the timeout it marks the error
   word (the host reports ncclCommGetAsyncError) and returns false, so that a kernel whose
   peer is gone ends instead of hanging. */
template <typename T, typename Done>
NCCL_DEVICE_INLINE bool spin(T* p, cuda::memory_order order, Watch w, Done done, T* last = nullptr) {
  T v = load(p, order);
  uint64_t t0 = 0;
  unsigned polls = 0;
  while (!done(v)) {
    if ((++polls & 1023) == 0) {
      uint64_t t = clock_ns();
      if (t0 == 0) t0 = t;
      bool failed = w.error != nullptr && load(w.error, cuda::memory_order_relaxed) != 0;
      if (failed || (w.timeout_ns != 0 && t - t0 > w.timeout_ns)) {
        if (w.error != nullptr) store(w.error, uint64_t(1), cuda::memory_order_relaxed);
        if (last) *last = v;
        return false;
      }
    }
    v = load(p, order);
  }
  if (last) *last = v;
  return true;
}

NCCL_DEVICE_INLINE int lane() {
  int l;
  asm("mov.u32 %0, %%laneid;" : "=r"(l));
  return l;
}
NCCL_DEVICE_INLINE uint32_t lanes_below() {
  uint32_t m;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
  return m;
}

/* Holds a T that a constructor may or may not build (the parts of a barrier session). */
template <typename T>
struct Maybe {
  bool present;
  union {
    T value;
  };
  NCCL_DEVICE_INLINE Maybe() : present(false) {}
  NCCL_DEVICE_INLINE ~Maybe() {
    if (present) value.~T();
  }
  Maybe(Maybe const&) = delete;
  template <typename... A>
  NCCL_DEVICE_INLINE void make(A&&... a) {
    new (&value) T(static_cast<A&&>(a)...);
    present = true;
  }
};

}  // namespace occl_dev
#endif /* __CUDACC__ */

#endif /* OCCL_NCCL_DEVICE_UTILITY_H_ */
