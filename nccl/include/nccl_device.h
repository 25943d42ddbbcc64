/*
 * nccl_device.h for occl's libnccl.so.2: NCCL 2.28's device API, written for occl from the
 * published API.
 *
 * What occl offers: device communicators (ncclDevCommCreate) whose ranks are the GPUs of one
 * host; windows (ncclCommWindowRegister on memory from ncclMemAlloc) read and written through
 * lsa pointers; lsa barriers; GIN puts, signals, counters and barriers, which occl carries out
 * with the GPUs' own loads and stores; world barriers. What it refuses at ncclDevCommCreate:
 * NVLink multicast (lsaMultimem, multimem teams: occl never creates multicast objects), the
 * low-latency all-to-all (lsaLLA2A*), and communicators with a rank on another host (occl stages
 * traffic between hosts through host memory; GPU-initiated networking is not offered).
 *
 * Include it after nccl.h (it includes nccl.h itself). The kernels that use it must be compiled
 * against these headers and run on occl's library: the device communicator's and the window's
 * layouts are occl's own (see nccl_device/core.h).
 */
#ifndef OCCL_NCCL_DEVICE_H_
#define OCCL_NCCL_DEVICE_H_
#include "nccl.h"
#include "nccl_device/utility.h"
#include "nccl_device/coop.h"
#include "nccl_device/core.h"
#include "nccl_device/ptr.h"
#include "nccl_device/lsa_barrier.h"
#include "nccl_device/gin.h"
#include "nccl_device/gin_barrier.h"
#include "nccl_device/barrier.h"
#endif /* OCCL_NCCL_DEVICE_H_ */
