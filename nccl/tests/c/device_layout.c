/* Prints the size and field offsets of the device API's structs as this compiler lays them out
   from nccl_device.h; the library's layout test compares them with its own. */
#include <stdio.h>
#include "nccl_device.h"

#define SIZE(t) printf(#t ".sizeof %zu\n", sizeof(struct t))
#define FIELD(t, f) printf(#t "." #f " %zu\n", offsetof(struct t, f))

int main(void) {
  SIZE(ncclTeam);
  FIELD(ncclTeam, nRanks); FIELD(ncclTeam, rank); FIELD(ncclTeam, stride);
  SIZE(ncclDevCommRequirements);
  FIELD(ncclDevCommRequirements, resourceRequirementsList); FIELD(ncclDevCommRequirements, teamRequirementsList);
  FIELD(ncclDevCommRequirements, lsaMultimem); FIELD(ncclDevCommRequirements, barrierCount);
  FIELD(ncclDevCommRequirements, lsaBarrierCount); FIELD(ncclDevCommRequirements, railGinBarrierCount);
  FIELD(ncclDevCommRequirements, lsaLLA2ABlockCount); FIELD(ncclDevCommRequirements, lsaLLA2ASlotCount);
  FIELD(ncclDevCommRequirements, ginForceEnable); FIELD(ncclDevCommRequirements, ginContextCount);
  FIELD(ncclDevCommRequirements, ginSignalCount); FIELD(ncclDevCommRequirements, ginCounterCount);
  SIZE(ncclDevResourceRequirements);
  FIELD(ncclDevResourceRequirements, next); FIELD(ncclDevResourceRequirements, bufferSize);
  FIELD(ncclDevResourceRequirements, bufferAlign); FIELD(ncclDevResourceRequirements, outBufferHandle);
  FIELD(ncclDevResourceRequirements, ginSignalCount); FIELD(ncclDevResourceRequirements, ginCounterCount);
  FIELD(ncclDevResourceRequirements, outGinSignalStart); FIELD(ncclDevResourceRequirements, outGinCounterStart);
  SIZE(ncclTeamRequirements);
  FIELD(ncclTeamRequirements, next); FIELD(ncclTeamRequirements, team);
  FIELD(ncclTeamRequirements, multimem); FIELD(ncclTeamRequirements, outMultimemHandle);
  SIZE(ncclLsaBarrierHandle);
  FIELD(ncclLsaBarrierHandle, bufHandle); FIELD(ncclLsaBarrierHandle, nBarriers);
  SIZE(ncclGinBarrierHandle);
  FIELD(ncclGinBarrierHandle, signal0); FIELD(ncclGinBarrierHandle, bufHandle);
  SIZE(ncclMultimemHandle);
  FIELD(ncclMultimemHandle, mcBasePtr);
  SIZE(ncclWindow_vidmem);
  FIELD(ncclWindow_vidmem, local); FIELD(ncclWindow_vidmem, size); FIELD(ncclWindow_vidmem, worldRank);
  FIELD(ncclWindow_vidmem, lsaRank); FIELD(ncclWindow_vidmem, lsaSize); FIELD(ncclWindow_vidmem, magic);
  FIELD(ncclWindow_vidmem, lsaPeers);
  SIZE(ncclDevComm);
  FIELD(ncclDevComm, rank); FIELD(ncclDevComm, nRanks); FIELD(ncclDevComm, lsaRank); FIELD(ncclDevComm, lsaSize);
  FIELD(ncclDevComm, resourceWindow); FIELD(ncclDevComm, lsaBarrier); FIELD(ncclDevComm, railGinBarrier);
  FIELD(ncclDevComm, lsaMultimem); FIELD(ncclDevComm, ginContextCount); FIELD(ncclDevComm, ginSignalCount);
  FIELD(ncclDevComm, ginCounterCount); FIELD(ncclDevComm, ginSignalOffset); FIELD(ncclDevComm, ginCounters);
  FIELD(ncclDevComm, ginSignalShadows); FIELD(ncclDevComm, errorWord); FIELD(ncclDevComm, timeoutNs);
  FIELD(ncclDevComm, magic); FIELD(ncclDevComm, reserved);
  printf("LSA_MAX %d\n", OCCL_NCCL_LSA_MAX);
  printf("WINDOW_MAGIC %u\n", OCCL_NCCL_WINDOW_MAGIC);
  printf("DEVCOMM_MAGIC %u\n", OCCL_NCCL_DEVCOMM_MAGIC);
  printf("RESOURCE_UNIT %zu\n", ncclGetResourceBufferOffset(1));
  return 0;
}
