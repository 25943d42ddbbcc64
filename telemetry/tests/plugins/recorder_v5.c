/* Test plugin: records every callback of the v5 profiler API (see recorder.h for the log).
 * Exports only ncclProfiler_v5. Built with -DRECORDER_V4 it exports only ncclProfiler_v4 (v4
 * init order, 8-bit type, no API events or parentGroup); with -DRECORDER_V6 only
 * ncclProfiler_v6 (v5 plus the copy-engine events). Layouts are written from the reference's
 * offset tables and checked below. */
#include "recorder.h"

#if defined(RECORDER_V4)
#define REC_API 4
#define REC_SYMBOL ncclProfiler_v4
typedef uint8_t rec_type_t;
#elif defined(RECORDER_V6)
#define REC_API 6
#define REC_SYMBOL ncclProfiler_v6
typedef uint64_t rec_type_t;
#else
#define REC_API 5
#define REC_SYMBOL ncclProfiler_v5
typedef uint64_t rec_type_t;
#endif

typedef struct {
    rec_type_t type;
    void *parentObj;
    int rank;
    union {
        struct {
            bool graphCaptured;
            int groupDepth;
        } groupApi;
        struct {
            const char *func;
            size_t count;
            const char *datatype;
            int root;
            void *stream;
            bool graphCaptured;
        } collApi;
        struct {
            const char *func;
            size_t count;
            const char *datatype;
            void *stream;
            bool graphCaptured;
        } p2pApi;
        struct {
            void *stream;
        } kernelLaunch;
        struct {
            uint64_t seqNumber;
            const char *func;
            const void *sendBuff;
            void *recvBuff;
            size_t count;
            int root;
            const char *datatype;
            uint8_t nChannels;
            uint8_t nWarps;
            const char *algo;
            const char *proto;
#if REC_API >= 5
            void *parentGroup;
#endif
        } coll;
        struct {
            const char *func;
            void *buff;
            const char *datatype;
            size_t count;
            int peer;
            uint8_t nChannels;
#if REC_API >= 5
            void *parentGroup;
#endif
        } p2p;
        struct {
            pid_t pid;
            uint8_t channelId;
            int peer;
            int nSteps;
            int chunkSize;
            int isSend;
        } proxyOp;
        struct {
            int step;
        } proxyStep;
        struct {
            uint8_t channelId;
            uint64_t pTimer;
        } kernelCh;
        struct {
            int64_t id;
            void *data;
        } netPlugin;
#if REC_API >= 6
        struct {
            uint64_t seqNumber;
            const char *func;
            const void *sendBuff;
            void *recvBuff;
            size_t count;
            int root;
            const char *datatype;
            const char *syncStrategy;
            bool intraBatchSync;
            uint32_t batchSize;
            uint32_t numBatches;
            uint32_t ceSeqNum;
            void *stream;
        } ceColl;
        struct {
            bool isComplete;
            int nRanks;
        } ceSync;
        struct {
            int numOps;
            size_t totalBytes;
            bool useIntraSync;
        } ceBatch;
#endif
    };
} rec_descr_t;

typedef union {
    struct {
        size_t transSize;
    } proxyStep;
    struct {
        int appendedProxyOps;
    } proxyCtrl;
    struct {
        void *data;
    } netPlugin;
    struct {
        uint64_t pTimer;
    } kernelCh;
} rec_args_t;

#if REC_API == 4
_Static_assert(sizeof(rec_descr_t) == 104, "v4 descriptor size");
_Static_assert(offsetof(rec_descr_t, coll.proto) == 96, "v4 coll.proto");
#else
_Static_assert(sizeof(rec_descr_t) == 112, "v5/v6 descriptor size");
_Static_assert(offsetof(rec_descr_t, coll.parentGroup) == 104, "coll.parentGroup");
_Static_assert(offsetof(rec_descr_t, p2p.parentGroup) == 64, "p2p.parentGroup");
#endif
_Static_assert(offsetof(rec_descr_t, groupApi.groupDepth) == 28, "groupApi.groupDepth");
_Static_assert(offsetof(rec_descr_t, collApi.graphCaptured) == 64, "collApi.graphCaptured");
_Static_assert(offsetof(rec_descr_t, p2pApi.graphCaptured) == 56, "p2pApi.graphCaptured");
_Static_assert(offsetof(rec_descr_t, coll.nChannels) == 80, "coll.nChannels");
_Static_assert(offsetof(rec_descr_t, p2p.nChannels) == 60, "p2p.nChannels");
_Static_assert(offsetof(rec_descr_t, proxyOp.isSend) == 44, "proxyOp.isSend");
_Static_assert(offsetof(rec_descr_t, kernelCh.pTimer) == 32, "kernelCh.pTimer");
_Static_assert(offsetof(rec_descr_t, netPlugin.data) == 32, "netPlugin.data");
#if REC_API >= 6
_Static_assert(offsetof(rec_descr_t, ceColl.stream) == 104, "ceColl.stream");
_Static_assert(offsetof(rec_descr_t, ceBatch.useIntraSync) == 40, "ceBatch.useIntraSync");
#endif
_Static_assert(sizeof(rec_args_t) == 8, "v4+ state args");

static void rec_init_common(void **context, uint64_t comm, int *mask, const char *name, int nNodes, int nranks,
                            int rank, rec_logger_t logfn) {
    char suffix[96];
    snprintf(suffix, sizeof suffix, "-%" PRIu64 "-%d.log", comm, rank);
    rec_apply_mask(mask);
    struct rec_ctx *c = rec_ctx_new(suffix);
    *context = c;
    if (!c) return;
    struct rec_line l = {.n = 0};
    rec_add(&l, "init v=%d comm=%" PRIu64 " nnodes=%d nranks=%d rank=%d mask=%d logfn=%d name=%s", REC_API, comm,
            nNodes, nranks, rank, mask ? *mask : -1, logfn != NULL, rec_str(name));
    rec_emit(c, &l);
    /* INFO (3), subsystem PROFILE (16384); the %% checks that the host formats the message. */
    if (logfn) logfn(3, 16384, __FILE__, __LINE__, "recorder v%d: comm %" PRIu64 " rank %d is 100%% ready", REC_API,
                     comm, rank);
}

#if REC_API == 4
static int rec_init(void **context, int *mask, const char *name, uint64_t commHash, int nNodes, int nranks, int rank,
                    rec_logger_t logfn) {
    rec_init_common(context, commHash, mask, name, nNodes, nranks, rank, logfn);
    return 0;
}
#else
static int rec_init(void **context, uint64_t commId, int *mask, const char *name, int nNodes, int nranks, int rank,
                    rec_logger_t logfn) {
    rec_init_common(context, commId, mask, name, nNodes, nranks, rank, logfn);
    return 0;
}
#endif

static int rec_start(void *context, void **eHandle, rec_descr_t *d) {
    *eHandle = NULL;
    struct rec_ctx *c = context;
    if (!c || !d) return 0;
    struct rec_event *e = rec_event_new(c);
    struct rec_line l = {.n = 0};
    rec_add(&l, "start type=%" PRIu64 " handle=%lu parent=%ld rank=%d", (uint64_t)d->type, e ? e->id : 0,
            rec_id(d->parentObj), d->rank);
    switch ((uint64_t)d->type) {
    case 0x2:
        rec_add(&l, " seq=%" PRIu64 " func=%s send=%zu recv=%zu count=%zu root=%d dtype=%s nch=%u nwarps=%u algo=%s proto=%s",
                d->coll.seqNumber, rec_str(d->coll.func), (size_t)d->coll.sendBuff, (size_t)d->coll.recvBuff,
                d->coll.count, d->coll.root, rec_str(d->coll.datatype), d->coll.nChannels, d->coll.nWarps,
                rec_str(d->coll.algo), rec_str(d->coll.proto));
#if REC_API >= 5
        rec_add(&l, " pgroup=%ld", rec_id(d->coll.parentGroup));
#endif
        break;
    case 0x4:
        rec_add(&l, " func=%s buff=%zu dtype=%s count=%zu peer=%d nch=%u", rec_str(d->p2p.func), (size_t)d->p2p.buff,
                rec_str(d->p2p.datatype), d->p2p.count, d->p2p.peer, d->p2p.nChannels);
#if REC_API >= 5
        rec_add(&l, " pgroup=%ld", rec_id(d->p2p.parentGroup));
#endif
        break;
    case 0x8:
        rec_add(&l, " pid=%d ch=%u peer=%d nsteps=%d chunk=%d send=%d", (int)d->proxyOp.pid, d->proxyOp.channelId,
                d->proxyOp.peer, d->proxyOp.nSteps, d->proxyOp.chunkSize, d->proxyOp.isSend);
        break;
    case 0x10:
        rec_add(&l, " step=%d", d->proxyStep.step);
        break;
    case 0x40:
        rec_add(&l, " ch=%u ptimer=%" PRIu64, d->kernelCh.channelId, d->kernelCh.pTimer);
        break;
    case 0x80:
        rec_add(&l, " id=%" PRId64, d->netPlugin.id);
        rec_add_net_payload(&l, d->netPlugin.id, d->netPlugin.data);
        if (e) e->net_id = d->netPlugin.id;
        break;
    case 0x100:
        rec_add(&l, " captured=%d depth=%d", (int)d->groupApi.graphCaptured, d->groupApi.groupDepth);
        break;
    case 0x200:
        rec_add(&l, " func=%s count=%zu dtype=%s root=%d stream=%zu captured=%d", rec_str(d->collApi.func),
                d->collApi.count, rec_str(d->collApi.datatype), d->collApi.root, (size_t)d->collApi.stream,
                (int)d->collApi.graphCaptured);
        break;
    case 0x400:
        rec_add(&l, " func=%s count=%zu dtype=%s stream=%zu captured=%d", rec_str(d->p2pApi.func), d->p2pApi.count,
                rec_str(d->p2pApi.datatype), (size_t)d->p2pApi.stream, (int)d->p2pApi.graphCaptured);
        break;
    case 0x800:
        rec_add(&l, " stream=%zu", (size_t)d->kernelLaunch.stream);
        break;
#if REC_API >= 6
    case 0x1000:
        rec_add(&l, " seq=%" PRIu64 " func=%s count=%zu root=%d dtype=%s sync=%s intra=%d batch=%u nbatches=%u ceseq=%u stream=%zu",
                d->ceColl.seqNumber, rec_str(d->ceColl.func), d->ceColl.count, d->ceColl.root,
                rec_str(d->ceColl.datatype), rec_str(d->ceColl.syncStrategy), (int)d->ceColl.intraBatchSync,
                d->ceColl.batchSize, d->ceColl.numBatches, d->ceColl.ceSeqNum, (size_t)d->ceColl.stream);
        break;
    case 0x2000:
        rec_add(&l, " complete=%d nranks=%d", (int)d->ceSync.isComplete, d->ceSync.nRanks);
        break;
    case 0x4000:
        rec_add(&l, " nops=%d bytes=%zu intra=%d", d->ceBatch.numOps, d->ceBatch.totalBytes,
                (int)d->ceBatch.useIntraSync);
        break;
#endif
    default:
        break;
    }
    rec_emit(c, &l);
    *eHandle = e;
    return 0;
}

static int rec_stop(void *eHandle) {
    rec_stop_line(eHandle);
    return 0;
}

static int rec_state(void *eHandle, int state, rec_args_t *a) {
    struct rec_event *e = rec_event_of(eHandle);
    if (!e) return 0;
    struct rec_line l = {.n = 0};
    rec_add(&l, "state handle=%lu state=%d", e->id, state);
    if (!a) {
        rec_add(&l, " args=null");
    } else if ((state >= 8 && state <= 12) || state == 20) {
        rec_add(&l, " size=%zu", a->proxyStep.transSize);
    } else if (state >= 13 && state <= 18) {
        rec_add(&l, " appended=%d", a->proxyCtrl.appendedProxyOps);
    } else if (state == 21) {
        rec_add_net_payload(&l, e->net_id, a->netPlugin.data);
    } else if (state == 22) {
        rec_add(&l, " ptimer=%" PRIu64, a->kernelCh.pTimer);
    } else {
        uint64_t raw;
        memcpy(&raw, a, sizeof raw);
        rec_add(&l, " raw=%" PRIu64, raw);
    }
    rec_emit(e->ctx, &l);
    return 0;
}

static int rec_fini(void *context) {
    rec_finalize(context);
    return 0;
}

#define REC_STR2(x) #x
#define REC_STR(x) REC_STR2(x)

#if REC_API == 4
typedef int (*rec_init_fn)(void **, int *, const char *, uint64_t, int, int, int, rec_logger_t);
#else
typedef int (*rec_init_fn)(void **, uint64_t, int *, const char *, int, int, int, rec_logger_t);
#endif

typedef struct {
    const char *name;
    rec_init_fn init;
    int (*startEvent)(void *, void **, rec_descr_t *);
    int (*stopEvent)(void *);
    int (*recordEventState)(void *, int, rec_args_t *);
    int (*finalize)(void *);
} rec_table_t;

_Static_assert(sizeof(rec_table_t) == 48, "function table");

__attribute__((visibility("default"))) const rec_table_t REC_SYMBOL = {
    "occl-test-recorder-v" REC_STR(REC_API), rec_init, rec_start, rec_stop, rec_state, rec_fini,
};
