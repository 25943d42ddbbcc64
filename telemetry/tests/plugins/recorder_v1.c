/* Test plugin: records every callback of the v1 profiler API (NCCL 2.23; see recorder.h for
 * the log). Exports only ncclProfiler_v1. func, datatype, algo and proto are numeric codes. */
#include "recorder.h"

typedef struct {
    uint8_t type;
    void *parentObj;
    int rank;
    union {
        struct {
            const char *name;
            uint64_t commHash;
            uint64_t seqNumber;
            uint8_t func;
            const void *sendBuff;
            void *recvBuff;
            size_t count;
            int root;
            uint8_t datatype;
            uint32_t op;
            size_t trafficBytes;
            uint8_t nMaxChannels;
            uint8_t nWarps;
            uint8_t algo;
            uint8_t proto;
            int isCollnet;
            int isNvls;
        } coll;
        struct {
            const char *name;
            uint64_t commHash;
            uint8_t func;
            void *buff;
            uint8_t datatype;
            size_t count;
            int peer;
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
    };
} rec_descr_v1_t;

typedef union {
    struct {
        size_t transSize;
        int steps;
    } proxyOp;
    struct {
        int appendedProxyOps;
    } proxyCtrl;
} rec_args_v1_t;

_Static_assert(sizeof(rec_descr_v1_t) == 120, "v1 descriptor size");
_Static_assert(offsetof(rec_descr_v1_t, coll.func) == 48, "v1 coll.func");
_Static_assert(offsetof(rec_descr_v1_t, coll.datatype) == 84, "v1 coll.datatype");
_Static_assert(offsetof(rec_descr_v1_t, coll.op) == 88, "v1 coll.op");
_Static_assert(offsetof(rec_descr_v1_t, coll.algo) == 106, "v1 coll.algo");
_Static_assert(offsetof(rec_descr_v1_t, coll.isNvls) == 112, "v1 coll.isNvls");
_Static_assert(offsetof(rec_descr_v1_t, p2p.datatype) == 56, "v1 p2p.datatype");
_Static_assert(offsetof(rec_descr_v1_t, p2p.peer) == 72, "v1 p2p.peer");
_Static_assert(sizeof(rec_args_v1_t) == 16, "v1 state args");

static unsigned rec_inits;

static int rec_init(void **context, int *mask) {
    char suffix[96];
    unsigned n = __atomic_fetch_add(&rec_inits, 1, __ATOMIC_RELAXED);
    snprintf(suffix, sizeof suffix, "-v1-%ld-%u.log", (long)getpid(), n);
    rec_apply_mask(mask);
    struct rec_ctx *c = rec_ctx_new(suffix);
    *context = c;
    if (!c) return 0;
    struct rec_line l = {.n = 0};
    rec_add(&l, "init v=1 mask=%d name=(none)", mask ? *mask : -1);
    rec_emit(c, &l);
    return 0;
}

static int rec_start(void *context, void **eHandle, rec_descr_v1_t *d) {
    *eHandle = NULL;
    struct rec_ctx *c = context;
    if (!c || !d) return 0;
    struct rec_event *e = rec_event_new(c);
    struct rec_line l = {.n = 0};
    rec_add(&l, "start type=%u handle=%lu parent=%ld rank=%d", d->type, e ? e->id : 0, rec_id(d->parentObj), d->rank);
    switch (d->type) {
    case 0x2:
        rec_add(&l,
                " cname=%s comm=%" PRIu64 " seq=%" PRIu64 " func=%u send=%zu recv=%zu count=%zu root=%d dtype=%u op=%u"
                " traffic=%zu nch=%u nwarps=%u algo=%u proto=%u collnet=%d nvls=%d",
                rec_str(d->coll.name), d->coll.commHash, d->coll.seqNumber, d->coll.func, (size_t)d->coll.sendBuff,
                (size_t)d->coll.recvBuff, d->coll.count, d->coll.root, d->coll.datatype, d->coll.op,
                d->coll.trafficBytes, d->coll.nMaxChannels, d->coll.nWarps, d->coll.algo, d->coll.proto,
                d->coll.isCollnet, d->coll.isNvls);
        break;
    case 0x4:
        rec_add(&l, " cname=%s comm=%" PRIu64 " func=%u buff=%zu dtype=%u count=%zu peer=%d", rec_str(d->p2p.name),
                d->p2p.commHash, d->p2p.func, (size_t)d->p2p.buff, d->p2p.datatype, d->p2p.count, d->p2p.peer);
        break;
    case 0x8:
        rec_add(&l, " pid=%d ch=%u peer=%d nsteps=%d chunk=%d send=%d", (int)d->proxyOp.pid, d->proxyOp.channelId,
                d->proxyOp.peer, d->proxyOp.nSteps, d->proxyOp.chunkSize, d->proxyOp.isSend);
        break;
    case 0x10:
        rec_add(&l, " step=%d", d->proxyStep.step);
        break;
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

static int rec_state(void *eHandle, int state, rec_args_v1_t *a) {
    struct rec_event *e = rec_event_of(eHandle);
    if (!e) return 0;
    struct rec_line l = {.n = 0};
    rec_add(&l, "state handle=%lu state=%d", e->id, state);
    if (!a) {
        rec_add(&l, " args=null");
    } else {
        uint64_t raw[2];
        memcpy(raw, a, sizeof raw);
        if (state >= 13 && state <= 18) {
            rec_add(&l, " appended=%d", a->proxyCtrl.appendedProxyOps);
        } else {
            rec_add(&l, " size=%zu steps=%d", a->proxyOp.transSize, a->proxyOp.steps);
        }
        rec_add(&l, " raw0=%" PRIu64 " raw1=%" PRIu64, raw[0], raw[1]);
    }
    rec_emit(e->ctx, &l);
    return 0;
}

static int rec_fini(void *context) {
    rec_finalize(context);
    return 0;
}

typedef struct {
    const char *name;
    int (*init)(void **, int *);
    int (*startEvent)(void *, void **, rec_descr_v1_t *);
    int (*stopEvent)(void *);
    int (*recordEventState)(void *, int, rec_args_v1_t *);
    int (*finalize)(void *);
} rec_table_v1_t;

_Static_assert(sizeof(rec_table_v1_t) == 48, "function table");

__attribute__((visibility("default"))) const rec_table_v1_t ncclProfiler_v1 = {
    "occl-test-recorder-v1", rec_init, rec_start, rec_stop, rec_state, rec_fini,
};
