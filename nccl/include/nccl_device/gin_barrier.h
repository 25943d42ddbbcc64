/*
 * Part of occl's nccl_device.h: barriers through GIN signals, over any team.
 *
 * Barrier `index` of a handle is signal signal0+index of every member plus this member's epoch
 * (in its resource buffer at `bufHandle`, one uint32 per barrier): the number of increments the
 * signal has received from this barrier so far. Arriving adds one to the signal of every other
 * member; waiting lasts until this member's signal has gained one from each of them.
 */
#ifndef OCCL_NCCL_DEVICE_GIN_BARRIER_H_
#define OCCL_NCCL_DEVICE_GIN_BARRIER_H_
#include "gin.h"

/* A resource requirement for nBarriers GIN barriers over `team`; link outReq into
   ncclDevCommRequirements.resourceRequirementsList before ncclDevCommCreate, which fills
   *outHandle. */
NCCL_EXTERN_C ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, ncclTeam_t team, int nBarriers,
                                                           ncclGinBarrierHandle_t* outHandle,
                                                           ncclDevResourceRequirements_t* outReq);

#if defined(__cplusplus)
/* How strongly a barrier orders GIN traffic: on occl every put has landed when it returns, so
   the one level there is costs nothing more. */
enum class ncclGinFenceLevel { Relaxed };
#endif

#if defined(__CUDACC__)
template <typename Coop>
struct ncclGinBarrierSession {
  Coop coop;
  ncclGin gin;
  ncclTeam team;
  ncclGinBarrierHandle handle;
  uint32_t index;
  uint32_t epoch;

  NCCL_DEVICE_INLINE ncclGinBarrierSession(Coop coop, ncclGin gin, ncclTeam team, ncclGinBarrierHandle handle,
                                           uint32_t index)
      : coop(coop), gin(gin), team(team), handle(handle), index(index) {
    epoch = *epochWord();
  }
  /* Barrier `index` of the device communicator's rail barriers (devComm.railGinBarrier). */
  NCCL_DEVICE_INLINE ncclGinBarrierSession(Coop coop, ncclGin gin, ncclTeamTagRail, uint32_t index)
      : ncclGinBarrierSession(coop, gin, ncclTeamRail(gin.comm), gin.comm.railGinBarrier, index) {}

  ncclGinBarrierSession(ncclGinBarrierSession const&) = delete;

  NCCL_DEVICE_INLINE ~ncclGinBarrierSession() {
    if (coop.thread_rank() == 0) *epochWord() = epoch;
    coop.sync();
  }

  NCCL_DEVICE_INLINE void sync(Coop, cuda::memory_order order, ncclGinFenceLevel) {
    ncclGinSignal_t signal = handle.signal0 + index;
    coop.sync();
    for (int i = coop.thread_rank(); i < team.nRanks - 1; i += coop.size()) {
      int peer = team.rank + 1 + i;
      if (peer >= team.nRanks) peer -= team.nRanks;
      uint64_t* theirs = gin.signals(ncclTeamRankToLsa(gin.comm, team, peer)) + signal;
      occl_dev::add(theirs, uint64_t(1), order);
    }
    epoch += (uint32_t)(team.nRanks - 1);
    if (coop.thread_rank() == 0) {
      uint32_t want = epoch;
      occl_dev::spin(gin.signals(gin.comm.lsaRank) + signal, order, occl_dev::watch(gin.comm),
                     [want](uint64_t got) { return occl_dev::reached(want, got, 32); });
    }
    coop.sync();
  }

  /* internal */
  NCCL_DEVICE_INLINE uint32_t* epochWord() const {
    return (uint32_t*)ncclGetResourceBufferLocalPointer(gin.comm, handle.bufHandle) + index;
  }
};
#endif /* __CUDACC__ */

#endif /* OCCL_NCCL_DEVICE_GIN_BARRIER_H_ */
