/*
 * Part of occl's nccl_device.h: ncclBarrierSession, a barrier over an inner (lsa) team and an
 * outer (GIN) team together: the lsa barrier first, then the GIN one. With ncclTeamTagWorld the
 * inner team is the lsa team and the outer one the rail team, which on occl (one host) is the
 * caller alone, so a world barrier is an lsa barrier.
 */
#ifndef OCCL_NCCL_DEVICE_BARRIER_H_
#define OCCL_NCCL_DEVICE_BARRIER_H_
#include "gin_barrier.h"
#include "lsa_barrier.h"

#if defined(__CUDACC__)
template <typename Coop>
struct ncclBarrierSession {
  Coop coop;
  occl_dev::Maybe<ncclLsaBarrierSession<Coop>> inner;
  occl_dev::Maybe<ncclGinBarrierSession<Coop>> outer;

  NCCL_DEVICE_INLINE ncclBarrierSession(Coop coop, ncclTeam innerTeam, ncclTeam outerTeam, ncclGin gin,
                                        ncclLsaBarrierHandle innerBarHandle, ncclGinBarrierHandle outerBarHandle,
                                        uint32_t index, bool multimem = false, ncclMultimemHandle innerMmHandle = {})
      : coop(coop) {
    inner.make(coop, gin.comm, innerTeam, innerBarHandle, index, multimem, innerMmHandle);
    outer.make(coop, gin, outerTeam, outerBarHandle, index);
  }
  /* Barrier `index` over every rank: devComm.lsaBarrier and devComm.railGinBarrier (barrierCount). */
  NCCL_DEVICE_INLINE ncclBarrierSession(Coop coop, ncclTeamTagWorld, ncclGin gin, uint32_t index,
                                        bool multimem = false)
      : ncclBarrierSession(coop, ncclTeamLsa(gin.comm), ncclTeamRail(gin.comm), gin, gin.comm.lsaBarrier,
                           gin.comm.railGinBarrier, index, multimem, gin.comm.lsaMultimem) {}
  /* Barrier `index` over the lsa team (devComm.lsaBarrier). */
  NCCL_DEVICE_INLINE ncclBarrierSession(Coop coop, ncclTeamTagLsa, ncclDevComm const& comm, uint32_t index,
                                        bool multimem = false)
      : coop(coop) {
    inner.make(coop, comm, ncclTeamLsa(comm), comm.lsaBarrier, index, multimem, comm.lsaMultimem);
  }
  /* Barrier `index` over the rail team (devComm.railGinBarrier). */
  NCCL_DEVICE_INLINE ncclBarrierSession(Coop coop, ncclTeamTagRail, ncclGin gin, uint32_t index) : coop(coop) {
    outer.make(coop, gin, ncclTeamRail(gin.comm), gin.comm.railGinBarrier, index);
  }

  ncclBarrierSession(ncclBarrierSession const&) = delete;

  NCCL_DEVICE_INLINE ncclLsaBarrierSession<Coop>& lsaBarrier() { return inner.value; }
  NCCL_DEVICE_INLINE ncclGinBarrierSession<Coop>& ginBarrier() { return outer.value; }

  /* With both parts, the lsa part releases and the GIN part acquires. */
  NCCL_DEVICE_INLINE void sync(Coop c, cuda::memory_order order, ncclGinFenceLevel fence) {
    if (inner.present) inner.value.sync(c, outer.present ? occl_dev::store_order(order) : order);
    if (outer.present) outer.value.sync(c, inner.present ? occl_dev::load_order(order) : order, fence);
  }
};
#endif /* __CUDACC__ */

#endif /* OCCL_NCCL_DEVICE_BARRIER_H_ */
