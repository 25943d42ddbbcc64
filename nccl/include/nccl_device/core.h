/*
 * Part of occl's nccl_device.h: the device communicator, teams, windows and the requirements a
 * program passes to ncclDevCommCreate.
 *
 * Layouts. ncclDevCommRequirements and the structs it points to have NCCL 2.28's field order and
 * types: programs fill them by name or by position and the library reads them. ncclDevComm, the
 * window (struct ncclWindow_vidmem) and the barrier handles are occl's own: they are filled by
 * occl's libnccl.so.2 and read by the inline functions below, which are compiled into the
 * program's kernels. A program that uses them must be compiled against this header and run on
 * occl's library (a program compiled against NVIDIA's nccl_device.h runs its host API on occl,
 * not its device kernels).
 *
 * Lsa ("load/store accessible") peers are the ranks whose memory this GPU reads and writes
 * directly. occl offers the device API when every rank of the communicator is one: the ranks are
 * the GPUs of one host, mapped to each other through CUDA IPC (or by address within a process).
 */
#ifndef OCCL_NCCL_DEVICE_CORE_H_
#define OCCL_NCCL_DEVICE_CORE_H_
#include "../nccl.h"
#include "coop.h"
#include "utility.h"

#if defined(__CUDACC__)
/* nccl.h defines struct ncclTeam for host compilers only. */
struct ncclTeam {
  int nRanks, rank, stride;
};
#endif

typedef struct ncclTeamRequirements ncclTeamRequirements_t;
typedef struct ncclMultimemHandle ncclMultimemHandle_t;
typedef uint32_t ncclDevResourceHandle;
typedef ncclDevResourceHandle ncclDevResourceHandle_t;
typedef uint32_t ncclGinSignal_t;
typedef uint32_t ncclGinCounter_t;

/* Most GIN contexts a device communicator can have (occl gives one). */
#define NCCL_GIN_MAX_CONTEXTS 4
/* Most lsa peers a window can name. */
#define OCCL_NCCL_LSA_MAX 64
/* Written by the library into every window and device communicator it makes. */
#define OCCL_NCCL_WINDOW_MAGIC 0x6f63574eu
#define OCCL_NCCL_DEVCOMM_MAGIC 0x6f63444du

/* A team is nRanks ranks of the communicator, `stride` apart; `rank` is the caller's index. */
#if defined(__cplusplus)
struct ncclTeamTagWorld {};
struct ncclTeamTagLsa {};
struct ncclTeamTagRail {};
#endif

/* What a device communicator must hold (NCCL 2.28's layout). Zero it, then set what you need. */
struct ncclDevCommRequirements {
  ncclDevResourceRequirements_t* resourceRequirementsList; /* extra buffers and signals (a list) */
  ncclTeamRequirements_t* teamRequirementsList;            /* teams that need multicast (a list) */
  bool lsaMultimem;        /* NVLink multicast over the lsa team: refused by occl */
  int barrierCount;        /* world barriers (ncclBarrierSession with ncclTeamTagWorld) */
  int lsaBarrierCount;     /* lsa barriers (devComm.lsaBarrier) */
  int railGinBarrierCount; /* GIN barriers over the rail team (devComm.railGinBarrier) */
  int lsaLLA2ABlockCount, lsaLLA2ASlotCount; /* low-latency all-to-all: refused by occl */
  bool ginForceEnable;     /* GIN is always available on occl */
  int ginContextCount;     /* a hint; occl gives one context */
  int ginSignalCount;      /* signals 0 .. ginSignalCount-1 for ncclGin */
  int ginCounterCount;     /* counters 0 .. ginCounterCount-1 for ncclGin */
};

/* A buffer (and signals and counters) of the device communicator's own memory, for a barrier or
   any other use; the library writes where it put them through the out pointers. */
struct ncclDevResourceRequirements {
  ncclDevResourceRequirements_t* next;
  size_t bufferSize, bufferAlign;
  ncclDevResourceHandle_t* outBufferHandle;
  int ginSignalCount;
  int ginCounterCount;
  ncclGinSignal_t* outGinSignalStart;
  ncclGinCounter_t* outGinCounterStart;
};

/* A team that wants NVLink multicast: refused by occl when multimem is set. */
struct ncclTeamRequirements {
  ncclTeamRequirements_t* next;
  ncclTeam_t team;
  bool multimem;
  ncclMultimemHandle_t* outMultimemHandle;
};

/* A multicast object's address; always NULL on occl, which never creates one. */
struct ncclMultimemHandle {
  void* mcBasePtr;
};

/* nBarriers barriers in the resource buffer `bufHandle`. */
struct ncclLsaBarrierHandle {
  ncclDevResourceHandle_t bufHandle;
  int nBarriers;
};

/* Barriers through GIN signals signal0, signal0+1, ...; their epochs in `bufHandle`. */
struct ncclGinBarrierHandle {
  ncclGinSignal_t signal0;
  ncclDevResourceHandle_t bufHandle;
};

/* What ncclCommWindowRegister returns (ncclWindow_t), in device memory: where every lsa peer's
   registered buffer lies in this process's address space. */
struct ncclWindow_vidmem {
  char* local;      /* this rank's buffer (lsaPeers[lsaRank]) */
  uint64_t size;    /* bytes this rank registered */
  int worldRank;    /* this rank in the communicator */
  int lsaRank;      /* this rank's index in lsaPeers */
  int lsaSize;      /* entries of lsaPeers in use */
  uint32_t magic;   /* OCCL_NCCL_WINDOW_MAGIC */
  char* lsaPeers[OCCL_NCCL_LSA_MAX];
};

/* The device communicator: filled by ncclDevCommCreate, passed to kernels by value. */
struct ncclDevComm {
  int rank, nRanks;       /* this rank in the communicator, and its size */
  int lsaRank, lsaSize;   /* this rank in the lsa team, and its size */
  ncclWindow_t resourceWindow;          /* every rank's resource buffer (barriers, signals) */
  ncclLsaBarrierHandle_t lsaBarrier;    /* lsaBarrierCount (or barrierCount) lsa barriers */
  ncclGinBarrierHandle_t railGinBarrier; /* railGinBarrierCount (or barrierCount) GIN barriers */
  ncclMultimemHandle_t lsaMultimem;     /* always NULL */
  int ginContextCount;                  /* 1 */
  int ginSignalCount;                   /* signals: the requirements' plus the barriers' */
  int ginCounterCount;
  uint32_t ginSignalOffset;             /* byte offset of the signals in each resource buffer */
  uint64_t* ginCounters;                /* this rank's counters */
  uint64_t* ginSignalShadows;           /* this rank's signal shadows */
  uint64_t* errorWord;                  /* occl's error word of this rank; waits give up once set */
  uint64_t timeoutNs;                   /* OCCL_TIMEOUT: a wait on a peer gives up after it */
  uint32_t magic;                       /* OCCL_NCCL_DEVCOMM_MAGIC */
  uint32_t reserved;
};

/* Host functions (nccl.h also declares them for C programs). */
NCCL_EXTERN_C ncclResult_t ncclDevCommCreate(ncclComm_t comm, ncclDevCommRequirements_t const* reqs,
                                             ncclDevComm_t* outDevComm);
NCCL_EXTERN_C ncclResult_t ncclDevCommDestroy(ncclComm_t comm, ncclDevComm_t const* devComm);
NCCL_EXTERN_C ncclTeam_t ncclTeamWorld(ncclComm_t comm);
NCCL_EXTERN_C ncclTeam_t ncclTeamLsa(ncclComm_t comm);
NCCL_EXTERN_C ncclTeam_t ncclTeamRail(ncclComm_t comm);
NCCL_EXTERN_C int ncclTeamRankToWorld(ncclComm_t comm, ncclTeam_t team, int rank);
NCCL_EXTERN_C int ncclTeamRankToLsa(ncclComm_t comm, ncclTeam_t team, int rank);

/* Team arithmetic, usable on host and device. */

/* Whether rank bRank of team b belongs to team a. */
NCCL_EXTERN_C NCCL_HOST_DEVICE_INLINE bool ncclTeamRankIsMember(ncclTeam_t a, ncclTeam_t b, int bRank) {
  int offset = (bRank - b.rank) * b.stride; /* distance from the caller in the communicator */
  if (offset % a.stride != 0) return false;
  int aRank = a.rank + offset / a.stride;
  return 0 <= aRank && aRank < a.nRanks;
}

/* The index in team a of rank bRank of team b (a member of both). */
NCCL_EXTERN_C NCCL_HOST_DEVICE_INLINE int ncclTeamRankToTeam(ncclTeam_t a, ncclTeam_t b, int bRank) {
  return a.rank + (bRank - b.rank) * b.stride / a.stride;
}

/* Splits `parent` into blocks of innerSize consecutive members: the caller's block ... */
NCCL_EXTERN_C NCCL_HOST_DEVICE_INLINE ncclTeam_t ncclTeamInnerFactor(ncclTeam_t parent, int innerSize) {
  ncclTeam_t t;
  t.nRanks = innerSize;
  t.rank = parent.rank % innerSize;
  t.stride = parent.stride;
  return t;
}

/* ... and the members at the caller's position in every block. */
NCCL_EXTERN_C NCCL_HOST_DEVICE_INLINE ncclTeam_t ncclTeamOuterFactor(ncclTeam_t parent, int innerSize) {
  ncclTeam_t t;
  t.nRanks = parent.nRanks / innerSize;
  t.rank = parent.rank / innerSize;
  t.stride = parent.stride * innerSize;
  return t;
}

/* The index-th member (in parent's order) of parent that is not in subset, subset being an
   evenly spaced part of parent that contains the caller. */
NCCL_EXTERN_C NCCL_HOST_DEVICE_INLINE int ncclTeamRankInDifference(ncclTeam_t parent, ncclTeam_t subset, int index) {
  int step = subset.stride / parent.stride;        /* subset members are `step` apart in parent */
  int first = parent.rank - subset.rank * step;    /* parent index of subset's first member */
  if (step < 0) {
    step = -step;
    first -= (subset.nRanks - 1) * step;
  }
  if (index < first) return index;                 /* before the subset */
  int gaps = (subset.nRanks - 1) * (step - 1);     /* non-members between subset members */
  int k = index - first;
  if (k < gaps) return first + 1 + (k / (step - 1)) * step + k % (step - 1);
  return first + (subset.nRanks - 1) * step + 1 + (k - gaps); /* after the subset */
}

/* Resource buffers are placed in 128-byte units; a handle is a unit index. */
NCCL_EXTERN_C NCCL_HOST_DEVICE_INLINE size_t ncclGetResourceBufferOffset(ncclDevResourceHandle_t h) {
  return (size_t)h * 128;
}

#if defined(__cplusplus)
NCCL_HOST_DEVICE_INLINE ncclTeam ncclTeamWorld(ncclDevComm const& comm) {
  ncclTeam t;
  t.nRanks = comm.nRanks;
  t.rank = comm.rank;
  t.stride = 1;
  return t;
}
NCCL_HOST_DEVICE_INLINE ncclTeam ncclTeamLsa(ncclDevComm const& comm) {
  ncclTeam t;
  t.nRanks = comm.lsaSize;
  t.rank = comm.lsaRank;
  t.stride = 1;
  return t;
}
/* The ranks at the caller's position in every lsa team (one per host: on occl, the caller). */
NCCL_HOST_DEVICE_INLINE ncclTeam ncclTeamRail(ncclDevComm const& comm) {
  ncclTeam t;
  t.nRanks = comm.nRanks / comm.lsaSize;
  t.rank = comm.rank / comm.lsaSize;
  t.stride = comm.lsaSize;
  return t;
}
NCCL_HOST_DEVICE_INLINE int ncclTeamRankToWorld(ncclDevComm const& comm, ncclTeam team, int rank) {
  return comm.rank + (rank - team.rank) * team.stride;
}
NCCL_HOST_DEVICE_INLINE int ncclTeamRankToLsa(ncclDevComm const& comm, ncclTeam team, int rank) {
  return comm.lsaRank + (rank - team.rank) * team.stride;
}
#endif

#if defined(__CUDACC__)
/* Windows are written once by the library and never change while kernels run: read them through
   the read-only cache. */
namespace occl_dev {
NCCL_DEVICE_INLINE char* win_peer(ncclWindow_t w, int lsaPeer) { return (char*)__ldg((unsigned long long const*)&w->lsaPeers[lsaPeer]); }
NCCL_DEVICE_INLINE char* win_local(ncclWindow_t w) { return (char*)__ldg((unsigned long long const*)&w->local); }
NCCL_DEVICE_INLINE int win_int(int const* p) { return __ldg(p); }
}  // namespace occl_dev

/* This rank's byte `offset` of window w. */
NCCL_DEVICE_INLINE void* ncclGetLocalPointer(ncclWindow_t w, size_t offset) { return occl_dev::win_local(w) + offset; }

/* Byte `offset` of lsa peer `peer`'s part of window w (peer: an index in the lsa team). */
NCCL_DEVICE_INLINE void* ncclGetLsaPointer(ncclWindow_t w, size_t offset, int peer) {
  return occl_dev::win_peer(w, peer) + offset;
}

/* Byte `offset` of rank `peer`'s part of window w (peer: a rank of the communicator). */
NCCL_DEVICE_INLINE void* ncclGetPeerPointer(ncclWindow_t w, size_t offset, int peer) {
  int lsa = occl_dev::win_int(&w->lsaRank) + peer - occl_dev::win_int(&w->worldRank);
  return occl_dev::win_peer(w, lsa) + offset;
}

/* Byte `offset` of member `peer` of `team`'s part of window w. */
NCCL_DEVICE_INLINE void* ncclGetPeerPointer(ncclWindow_t w, size_t offset, ncclTeam team, int peer) {
  int lsa = occl_dev::win_int(&w->lsaRank) + (peer - team.rank) * team.stride;
  return occl_dev::win_peer(w, lsa) + offset;
}

/* Multicast addresses. occl never creates multicast objects (ncclDevCommCreate refuses
   lsaMultimem and multimem teams), so there is none to return: NULL. */
NCCL_DEVICE_INLINE void* ncclGetMultimemPointer(ncclWindow_t w, size_t offset, ncclMultimemHandle mm) {
  return nullptr;
}
NCCL_DEVICE_INLINE void* ncclGetLsaMultimemPointer(ncclWindow_t w, size_t offset, ncclDevComm const& comm) {
  return nullptr;
}

/* The device communicator's resource buffers (barrier state and the like), by handle. */
NCCL_DEVICE_INLINE void* ncclGetResourceBufferLocalPointer(ncclDevComm const& comm, ncclDevResourceHandle h) {
  return ncclGetLocalPointer(comm.resourceWindow, ncclGetResourceBufferOffset(h));
}
NCCL_DEVICE_INLINE void* ncclGetResourceBufferLsaPointer(ncclDevComm const& comm, ncclDevResourceHandle h, int peer) {
  return ncclGetLsaPointer(comm.resourceWindow, ncclGetResourceBufferOffset(h), peer);
}
NCCL_DEVICE_INLINE void* ncclGetResourceBufferPeerPointer(ncclDevComm const& comm, ncclDevResourceHandle h, ncclTeam team,
                                                          int peer) {
  return ncclGetPeerPointer(comm.resourceWindow, ncclGetResourceBufferOffset(h), team, peer);
}
NCCL_DEVICE_INLINE void* ncclGetResourceBufferMultimemPointer(ncclDevComm const& comm, ncclDevResourceHandle h,
                                                              ncclMultimemHandle mm) {
  return nullptr;
}
NCCL_DEVICE_INLINE void* ncclGetResourceBufferLsaMultimemPointer(ncclDevComm const& comm, ncclDevResourceHandle h) {
  return nullptr;
}

namespace occl_dev {
NCCL_DEVICE_INLINE Watch watch(ncclDevComm const& comm) { return Watch{comm.errorWord, comm.timeoutNs}; }
}  // namespace occl_dev
#endif /* __CUDACC__ */

#endif /* OCCL_NCCL_DEVICE_CORE_H_ */
