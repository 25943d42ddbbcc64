/*
 * Part of occl's nccl_device.h: barriers among lsa peers through their memory.
 *
 * Barrier `index` of a handle keeps, in every member's resource buffer, an epoch (how many times
 * this member has passed it) and one inbox word per member. Arriving at epoch e+1 writes e+1 into
 * the caller's word of every other member's inbox (a system-scope store, with release when the
 * order asks for it); waiting reads the caller's own inbox until every peer's word has reached
 * e+1. The epoch lives in device memory from session to session, so a barrier stays consistent
 * over any number of launches and graph replays as long as every member passes it equally often.
 *
 * Resource buffer of a handle for n members and B barriers: epoch[B] (uint32), then inbox[B][n]
 * (uint32) at offset 4*B.
 */
#ifndef OCCL_NCCL_DEVICE_LSA_BARRIER_H_
#define OCCL_NCCL_DEVICE_LSA_BARRIER_H_
#include "core.h"

/* A resource requirement for nBarriers barriers over `team` (a part of the lsa team); link
   outReq into ncclDevCommRequirements.resourceRequirementsList before ncclDevCommCreate, which
   fills *outHandle. */
NCCL_EXTERN_C ncclResult_t ncclLsaBarrierCreateRequirement(ncclTeam_t team, int nBarriers,
                                                           ncclLsaBarrierHandle_t* outHandle,
                                                           ncclDevResourceRequirements_t* outReq);

#if defined(__CUDACC__)
template <typename Coop>
struct ncclLsaBarrierSession {
  Coop coop;
  ncclDevComm const& comm;
  ncclTeam team;
  ncclLsaBarrierHandle handle;
  uint32_t index;
  uint32_t epoch;

  /* Barrier `index` of `handle` over `team`. occl has no multicast, so `multimem` changes nothing:
     the barrier always goes through the members' memory. */
  NCCL_DEVICE_INLINE ncclLsaBarrierSession(Coop coop, ncclDevComm const& comm, ncclTeam team,
                                           ncclLsaBarrierHandle handle, uint32_t index, bool multimem = false,
                                           ncclMultimemHandle mmHandle = {})
      : coop(coop), comm(comm), team(team), handle(handle), index(index) {
    epoch = *epochWord();
  }
  /* Barrier `index` of the device communicator's own lsa barriers (devComm.lsaBarrier). */
  NCCL_DEVICE_INLINE ncclLsaBarrierSession(Coop coop, ncclDevComm const& comm, ncclTeamTagLsa, uint32_t index,
                                           bool multimem = false)
      : ncclLsaBarrierSession(coop, comm, ncclTeamLsa(comm), comm.lsaBarrier, index, multimem) {}

  ncclLsaBarrierSession(ncclLsaBarrierSession const&) = delete;

  /* Keeps the epoch for the next session. */
  NCCL_DEVICE_INLINE ~ncclLsaBarrierSession() {
    if (coop.thread_rank() == 0) *epochWord() = epoch;
    coop.sync();
  }

  /* Tells every other member this one has arrived (release: after this coop's earlier writes). */
  NCCL_DEVICE_INLINE void arrive(Coop, cuda::memory_order order) {
    coop.sync();
    for (int i = coop.thread_rank(); i < team.nRanks - 1; i += coop.size()) {
      int peer = i < team.rank ? i : i + 1;
      occl_dev::store(inbox(peer) + team.rank, epoch + 1, order);
    }
  }

  /* Waits until every other member has arrived (acquire: before this coop's later reads). */
  NCCL_DEVICE_INLINE void wait(Coop, cuda::memory_order order) {
    uint32_t want = epoch + 1;
    uint32_t* mine = inbox(team.rank);
    occl_dev::Watch w = occl_dev::watch(comm);
    for (int i = coop.thread_rank(); i < team.nRanks - 1; i += coop.size()) {
      int peer = i < team.rank ? i : i + 1;
      occl_dev::spin(mine + peer, order, w, [want](uint32_t got) { return occl_dev::reached(want, got, 32); });
    }
    epoch = want;
    coop.sync();
  }

  NCCL_DEVICE_INLINE void sync(Coop c, cuda::memory_order order) {
    arrive(c, order);
    wait(c, order);
  }

  /* internal */
  NCCL_DEVICE_INLINE uint32_t* epochWord() const {
    return (uint32_t*)ncclGetResourceBufferLocalPointer(comm, handle.bufHandle) + index;
  }
  /* Member `owner`'s inbox words for this barrier (one per member). */
  NCCL_DEVICE_INLINE uint32_t* inbox(int owner) const {
    uint32_t* base = (uint32_t*)ncclGetResourceBufferPeerPointer(comm, handle.bufHandle, team, owner);
    return base + handle.nBarriers + index * team.nRanks;
  }
};
#endif /* __CUDACC__ */

#endif /* OCCL_NCCL_DEVICE_LSA_BARRIER_H_ */
