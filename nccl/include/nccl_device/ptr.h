/*
 * Part of occl's nccl_device.h: ncclSymPtr<T>, a typed position in a window (the same offset on
 * every rank), turned into an address of this rank's or a peer's part on demand.
 */
#ifndef OCCL_NCCL_DEVICE_PTR_H_
#define OCCL_NCCL_DEVICE_PTR_H_
#include "core.h"

#if defined(__cplusplus)
template <typename T>
struct ncclSymPtr {
  using ElementType = T;
  ncclWindow_t window;
  size_t offset; /* in bytes */

  NCCL_HOST_DEVICE_INLINE constexpr ncclSymPtr(ncclWindow_t window = nullptr, size_t offset = 0)
      : window(window), offset(offset) {}

  template <typename U>
  NCCL_HOST_DEVICE_INLINE operator ncclSymPtr<U>() const {
    return ncclSymPtr<U>(window, offset);
  }

  /* Moves by whole elements of T, as a T* would. */
  template <typename Int>
  NCCL_HOST_DEVICE_INLINE ncclSymPtr& operator+=(Int d) {
    offset += (size_t)((long long)d * (long long)sizeof(T));
    return *this;
  }
  template <typename Int>
  NCCL_HOST_DEVICE_INLINE ncclSymPtr& operator-=(Int d) {
    offset -= (size_t)((long long)d * (long long)sizeof(T));
    return *this;
  }

#if defined(__CUDACC__)
  NCCL_DEVICE_INLINE T* localPtr() const { return (T*)ncclGetLocalPointer(window, offset); }
  NCCL_DEVICE_INLINE T* lsaPtr(int peer) const { return (T*)ncclGetLsaPointer(window, offset, peer); }
  NCCL_DEVICE_INLINE T* peerPtr(int peer) const { return (T*)ncclGetPeerPointer(window, offset, peer); }
  NCCL_DEVICE_INLINE T* peerPtr(ncclTeam team, int peer) const {
    return (T*)ncclGetPeerPointer(window, offset, team, peer);
  }
  NCCL_DEVICE_INLINE T* multimemPtr(ncclMultimemHandle mm) const {
    return (T*)ncclGetMultimemPointer(window, offset, mm);
  }
  NCCL_DEVICE_INLINE T* lsaMultimemPtr(ncclDevComm const& comm) const {
    return (T*)ncclGetLsaMultimemPointer(window, offset, comm);
  }
#endif
};

template <typename T, typename Int>
NCCL_HOST_DEVICE_INLINE ncclSymPtr<T> operator+(ncclSymPtr<T> p, Int d) {
  return p += d;
}
template <typename T, typename Int>
NCCL_HOST_DEVICE_INLINE ncclSymPtr<T> operator-(ncclSymPtr<T> p, Int d) {
  return p -= d;
}
template <typename T>
NCCL_HOST_DEVICE_INLINE ptrdiff_t operator-(ncclSymPtr<T> a, ncclSymPtr<T> b) {
  return ((ptrdiff_t)a.offset - (ptrdiff_t)b.offset) / (ptrdiff_t)sizeof(T);
}
template <typename T>
NCCL_HOST_DEVICE_INLINE bool operator==(ncclSymPtr<T> a, ncclSymPtr<T> b) {
  return a.window == b.window && a.offset == b.offset;
}
template <typename T>
NCCL_HOST_DEVICE_INLINE bool operator!=(ncclSymPtr<T> a, ncclSymPtr<T> b) {
  return !(a == b);
}

#if defined(__CUDACC__)
/* The resource buffer `h` of the device communicator as a window position. */
NCCL_DEVICE_INLINE ncclSymPtr<char> ncclGetResourceBuffer(ncclDevComm const& comm, ncclDevResourceHandle h) {
  return ncclSymPtr<char>(comm.resourceWindow, ncclGetResourceBufferOffset(h));
}
#endif
#endif /* __cplusplus */

#endif /* OCCL_NCCL_DEVICE_PTR_H_ */
