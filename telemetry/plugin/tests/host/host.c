/* An NCCL-shaped host for libnccl-profiler-occl.so, built once per profiler API version with
 * -DHOST_API=<1..6>. It loads the library as NCCL does (dlopen RTLD_NOW|RTLD_LOCAL, then the
 * data symbol ncclProfiler_v<N>), creates communicators, and emits NCCL's event sequences from
 * the threads NCCL uses: an application thread (API events, Group, Coll, P2p), a proxy thread
 * (ProxyOp, ProxyStep with their states, KernelCh), a network thread (NetPlugin, parented to the
 * proxy's step) and a proxy-control thread (ProxyCtrl). Layouts follow the reference's offset
 * tables and are checked with static assertions below.
 *
 *   host <library> run       two communicators, every event of the version, then finalize
 *   host <library> garbage   NULL and foreign values, unknown types and states, double stops
 *   host <library> reload    init/events/finalize, dlclose, and the same again
 *
 * Environment: HOST_PAUSE=1 (run) prints "PAUSED" before finalize and waits for a line on stdin;
 * HOST_METRICS_PORT=<port> (run) says after finalize whether that port still accepts;
 * HOST_ROUNDS=<n> (run) emits the iterations n times (default 1), HOST_ROUND_MS=<ms> apart, for a
 * scraper watching a running job (each round's threads end when their iterations are through).
 * Output: key=value lines on stdout, NCCL logger calls on stderr as "NCCL-LOG <level> <text>".
 * Exit status 0 unless the host saw something wrong (it says what). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#ifndef HOST_API
#error "build with -DHOST_API=<1..6>"
#endif

#define STR2(x) #x
#define STR(x) STR2(x)

#if HOST_API >= 5
typedef uint64_t type_t;
#else
typedef uint8_t type_t;
#endif

enum {
    T_GROUP = 1, T_COLL = 2, T_P2P = 4, T_PROXYOP = 8, T_PROXYSTEP = 16, T_PROXYCTRL = 32,
    T_KERNELCH = 64, T_NETPLUGIN = 128, T_GROUPAPI = 256, T_COLLAPI = 512, T_P2PAPI = 1024,
    T_KERNELLAUNCH = 2048, T_CECOLL = 4096, T_CESYNC = 8192, T_CEBATCH = 16384
};

struct proxy_op {
    pid_t pid;
    uint8_t channelId;
    int peer, nSteps, chunkSize, isSend;
};

typedef struct {
    type_t type;
    void *parentObj;
    int rank;
    union {
#if HOST_API == 1
        struct {
            const char *name;
            uint64_t commHash, seqNumber;
            uint8_t func;
            const void *sendBuff;
            void *recvBuff;
            size_t count;
            int root;
            uint8_t datatype;
            uint32_t op;
            size_t trafficBytes;
            uint8_t nMaxChannels, nWarps, algo, proto;
            int isCollnet, isNvls;
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
#elif HOST_API <= 3
        struct {
            const char *name;
            uint64_t commHash, seqNumber;
            const char *func;
            const void *sendBuff;
            void *recvBuff;
            size_t count;
            int root;
            const char *datatype;
#if HOST_API == 2
            size_t trafficBytes;
#endif
            uint8_t nMaxChannels, nWarps;
            const char *algo, *proto;
        } coll;
        struct {
            const char *name;
            uint64_t commHash;
            const char *func;
            void *buff;
            const char *datatype;
            size_t count;
            int peer;
        } p2p;
#else
        struct {
            uint64_t seqNumber;
            const char *func;
            const void *sendBuff;
            void *recvBuff;
            size_t count;
            int root;
            const char *datatype;
            uint8_t nChannels, nWarps;
            const char *algo, *proto;
#if HOST_API >= 5
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
#if HOST_API >= 5
            void *parentGroup;
#endif
        } p2p;
#endif
        struct proxy_op proxyOp;
        struct {
            int step;
        } proxyStep;
#if HOST_API >= 3
        struct {
            uint8_t channelId;
#if HOST_API >= 4
            uint64_t pTimer;
#endif
        } kernelCh;
        struct {
            int64_t id;
            void *data;
        } netPlugin;
#endif
#if HOST_API >= 5
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
#endif
#if HOST_API >= 6
        struct {
            uint64_t seqNumber;
            const char *func;
            const void *sendBuff;
            void *recvBuff;
            size_t count;
            int root;
            const char *datatype, *syncStrategy;
            bool intraBatchSync;
            uint32_t batchSize, numBatches, ceSeqNum;
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
} descr_t;

#if HOST_API <= 3
typedef union {
    struct {
        size_t transSize;
        int steps;
    } proxyOp;
    struct {
        int appendedProxyOps;
    } proxyCtrl;
} args_t;
#else
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
} args_t;
#endif

typedef void (*logger_t)(int, unsigned long, const char *, int, const char *, ...);
#if HOST_API <= 3
typedef int (*init_t)(void **, int *);
#elif HOST_API == 4
typedef int (*init_t)(void **, int *, const char *, uint64_t, int, int, int, logger_t);
#else
typedef int (*init_t)(void **, uint64_t, int *, const char *, int, int, int, logger_t);
#endif

typedef struct {
    const char *name;
    init_t init;
    int (*startEvent)(void *, void **, descr_t *);
    int (*stopEvent)(void *);
    int (*recordEventState)(void *, int, args_t *);
    int (*finalize)(void *);
} table_t;

/* Sizes and offsets of the reference (§6, §7, §8). */
_Static_assert(sizeof(table_t) == 48, "table");
_Static_assert(offsetof(descr_t, coll) == 24, "union at 24");
#if HOST_API == 1
_Static_assert(sizeof(descr_t) == 120, "v1");
_Static_assert(offsetof(descr_t, coll.datatype) == 84 && offsetof(descr_t, coll.op) == 88, "v1 coll");
_Static_assert(offsetof(descr_t, coll.algo) == 106 && offsetof(descr_t, coll.isNvls) == 112, "v1 coll");
_Static_assert(offsetof(descr_t, p2p.datatype) == 56 && offsetof(descr_t, p2p.peer) == 72, "v1 p2p");
#elif HOST_API == 2
_Static_assert(sizeof(descr_t) == 128, "v2");
_Static_assert(offsetof(descr_t, coll.trafficBytes) == 96 && offsetof(descr_t, coll.proto) == 120, "v2 coll");
#elif HOST_API == 3
_Static_assert(sizeof(descr_t) == 120, "v3");
_Static_assert(offsetof(descr_t, coll.nMaxChannels) == 96 && offsetof(descr_t, coll.proto) == 112, "v3 coll");
_Static_assert(offsetof(descr_t, netPlugin.data) == 32, "v3 net");
#elif HOST_API == 4
_Static_assert(sizeof(descr_t) == 104, "v4");
_Static_assert(offsetof(descr_t, coll.proto) == 96 && offsetof(descr_t, p2p.nChannels) == 60, "v4");
_Static_assert(offsetof(descr_t, kernelCh.pTimer) == 32, "v4 kernelCh");
#else
_Static_assert(sizeof(descr_t) == 112, "v5/v6");
_Static_assert(offsetof(descr_t, coll.parentGroup) == 104 && offsetof(descr_t, p2p.parentGroup) == 64, "v5");
_Static_assert(offsetof(descr_t, collApi.stream) == 56 && offsetof(descr_t, collApi.graphCaptured) == 64, "v5");
#if HOST_API == 6
_Static_assert(offsetof(descr_t, ceColl.stream) == 104 && offsetof(descr_t, ceBatch.useIntraSync) == 40, "v6");
#endif
#endif
_Static_assert(offsetof(descr_t, proxyOp.isSend) == 44, "proxyOp");
#if HOST_API <= 3
_Static_assert(sizeof(args_t) == 16, "args v1-v3");
#else
_Static_assert(sizeof(args_t) == 8, "args v4+");
#endif

#define NITER 16
#define NSTEPS 4
#define CHUNK 65536
#define NCTRL 10
#define NCOMMS 2
#define MAXH (1 << 16)

static const table_t *T;
static int failures;

#define FAIL(...)                                                                                     \
    do {                                                                                              \
        fprintf(stdout, "FAIL " __VA_ARGS__);                                                         \
        fputc('\n', stdout);                                                                          \
        __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);                                           \
    } while (0)

/* Every handle the plugin returned, to check uniqueness across threads and communicators. */
static pthread_mutex_t hmu = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t handles[MAXH];
static int nhandles, nnull;

static void keep(void *h) {
    pthread_mutex_lock(&hmu);
    if (!h) nnull++;
    else if (nhandles < MAXH) handles[nhandles++] = (uintptr_t)h;
    pthread_mutex_unlock(&hmu);
}

static void *start(void *ctx, descr_t *d) {
    void *h = (void *)0x1; /* the plugin must overwrite it */
    if (T->startEvent(ctx, &h, d) != 0) FAIL("startEvent returned non-zero");
    keep(h);
    return h;
}

static void stop(void *h) {
    if (h && T->stopEvent(h) != 0) FAIL("stopEvent returned non-zero");
}

static void record(void *h, int state, args_t *a) {
    if (h && T->recordEventState(h, state, a) != 0) FAIL("recordEventState returned non-zero");
}

static descr_t descr(uint64_t type, void *parent, int rank) {
    descr_t d;
    memset(&d, 0, sizeof d);
    d.type = (type_t)type;
    d.parentObj = parent;
    d.rank = rank;
    return d;
}

__attribute__((unused)) static void nccl_logger(int level, unsigned long flags, const char *file, int line, const char *fmt, ...) {
    (void)flags, (void)file, (void)line;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "NCCL-LOG %d %s\n", level, msg);
}

static void *init_comm(int c, int *mask) {
    void *ctx = (void *)0x1;
    int rc;
    char name[32];
    snprintf(name, sizeof name, "harness-%d", c);
    (void)name;
#if HOST_API <= 3
    rc = T->init(&ctx, mask);
#elif HOST_API == 4
    rc = T->init(&ctx, mask, name, 0x1000 + (uint64_t)c, 1, NCOMMS, c, nccl_logger);
#else
    rc = T->init(&ctx, 0x1000 + (uint64_t)c, mask, name, 1, NCOMMS, c, nccl_logger);
#endif
    if (rc != 0) FAIL("init returned %d", rc);
    printf("init comm=%d mask=%d ctx_null=%d\n", c, *mask, ctx == NULL);
    return ctx;
}

/* A blocking queue of pointers between the host's threads. */
struct queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    void *items[64];
    int head, len;
};

static void q_init(struct queue *q) {
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->head = q->len = 0;
}

static void q_push(struct queue *q, void *p) {
    pthread_mutex_lock(&q->mu);
    while (q->len == 64) pthread_cond_wait(&q->cv, &q->mu);
    q->items[(q->head + q->len++) % 64] = p;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

static void *q_pop(struct queue *q) {
    pthread_mutex_lock(&q->mu);
    while (q->len == 0) pthread_cond_wait(&q->cv, &q->mu);
    void *p = q->items[q->head];
    q->head = (q->head + 1) % 64;
    q->len--;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return p;
}

struct work {
    void *coll, *p2p;
    int iter;
    int done; /* the sentinel */
};

struct net_req {
    void *step;
    int send;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int finished;
};

struct comm {
    int id;
    void *ctx;
    struct queue to_proxy, to_net;
};

/* NCCL's socket payload, version 1: type u8 @0, fd int @8, op int @12, length size_t @16. */
__attribute__((unused)) static void sock_payload(unsigned char p[24], int send) {
    memset(p, 0, 24);
    p[0] = 1;
    int fd = 7, op = send ? 0 : 1;
    size_t len = CHUNK;
    memcpy(p + 8, &fd, sizeof fd);
    memcpy(p + 12, &op, sizeof op);
    memcpy(p + 16, &len, sizeof len);
}

static void *net_thread(void *arg) {
    struct comm *cm = arg;
    for (;;) {
        struct net_req *r = q_pop(&cm->to_net);
        if (!r) return NULL;
#if HOST_API >= 3
        unsigned char payload[24];
        sock_payload(payload, r->send);
        descr_t d = descr(T_NETPLUGIN, r->step, cm->id);
        d.netPlugin.id = (2 << 16) | 1;
        d.netPlugin.data = payload;
        void *h = start(cm->ctx, &d);
#if HOST_API >= 4
        args_t a;
        memset(&a, 0, sizeof a);
        a.netPlugin.data = payload;
        record(h, 21, &a);
#endif
        stop(h);
#endif
        pthread_mutex_lock(&r->mu);
        r->finished = 1;
        pthread_cond_signal(&r->cv);
        pthread_mutex_unlock(&r->mu);
    }
}

/* One ProxyOp with its steps, the way the proxy thread progresses it. */
static void proxy_op(struct comm *cm, void *parent, int channel, int send) {
    descr_t d = descr(T_PROXYOP, parent, cm->id);
    d.proxyOp.pid = getpid();
    d.proxyOp.channelId = (uint8_t)channel;
    d.proxyOp.peer = 1 - cm->id;
    d.proxyOp.nSteps = NSTEPS;
    d.proxyOp.chunkSize = CHUNK;
    d.proxyOp.isSend = send;
    void *op = start(cm->ctx, &d);
    args_t a;
    memset(&a, 0, sizeof a);
#if HOST_API <= 3
    a.proxyOp.transSize = (size_t)NSTEPS * CHUNK;
    a.proxyOp.steps = NSTEPS;
    record(op, send ? 0 : 4, &a);
#else
    record(op, 19, &a);
#endif
    for (int s = 0; s < NSTEPS; s++) {
        descr_t sd = descr(T_PROXYSTEP, op, cm->id);
        sd.proxyStep.step = s;
        void *st = start(cm->ctx, &sd);
        args_t sa;
        memset(&sa, 0, sizeof sa);
#if HOST_API >= 4
        sa.proxyStep.transSize = CHUNK;
        args_t *ap = &sa;
#else
        args_t *ap = NULL; /* NCCL <= 2.26 passes no step arguments */
#endif
        if (send) {
            record(st, 8, ap);
#if HOST_API >= 4
            record(st, 20, ap);
#endif
            record(st, 9, ap);
        } else {
            record(st, 10, ap);
            record(st, 11, ap);
        }
        /* The network thread reports its request under this step. */
        struct net_req r = {.step = st, .send = send, .finished = 0};
        pthread_mutex_init(&r.mu, NULL);
        pthread_cond_init(&r.cv, NULL);
        q_push(&cm->to_net, &r);
        pthread_mutex_lock(&r.mu);
        while (!r.finished) pthread_cond_wait(&r.cv, &r.mu);
        pthread_mutex_unlock(&r.mu);
        if (!send) record(st, 12, ap);
        stop(st);
    }
#if HOST_API <= 3
    record(op, send ? 3 : 7, &a);
#endif
    stop(op);
}

static void *proxy_thread(void *arg) {
    struct comm *cm = arg;
    for (;;) {
        struct work *w = q_pop(&cm->to_proxy);
        if (w->done) {
            free(w);
            q_push(&cm->to_net, NULL);
            return NULL;
        }
        proxy_op(cm, w->coll, 0, 1);
        proxy_op(cm, w->coll, 1, 0);
        proxy_op(cm, w->p2p, 0, 1);
#if HOST_API >= 3
        descr_t k = descr(T_KERNELCH, w->coll, 0);
        k.kernelCh.channelId = 0;
#if HOST_API >= 4
        k.kernelCh.pTimer = 1000 + (uint64_t)w->iter;
#endif
        void *kh = start(cm->ctx, &k);
#if HOST_API >= 4
        args_t a;
        memset(&a, 0, sizeof a);
        a.kernelCh.pTimer = 2000 + (uint64_t)w->iter;
        record(kh, 22, &a);
#endif
        stop(kh);
#endif
        free(w);
    }
}

static void *ctrl_thread(void *arg) {
    struct comm *cm = arg;
    for (int i = 0; i < NCTRL; i++) {
        descr_t d = descr(T_PROXYCTRL, NULL, 0);
        void *c = start(cm->ctx, &d);
        args_t a;
        memset(&a, 0, sizeof a);
        record(c, 15, &a);
        record(c, 16, &a);
        record(c, 17, &a);
        a.proxyCtrl.appendedProxyOps = 3;
        record(c, 18, &a);
        stop(c);
        void *m = start(cm->ctx, &d);
        memset(&a, 0, sizeof a);
        record(m, 14, &a);
        stop(m);
    }
    return NULL;
}

static void *app_thread(void *arg) {
    struct comm *cm = arg;
    for (int i = 0; i < NITER; i++) {
        size_t count = 1024 * (size_t)(i + 1);
        void *coll_parent, *p2p_parent;
#if HOST_API >= 5
        descr_t d = descr(T_GROUPAPI, NULL, 0);
        d.groupApi.groupDepth = 1;
        void *ga = start(cm->ctx, &d);
        record(ga, 23, NULL);
        d = descr(T_COLLAPI, ga, 0);
        d.collApi.func = "AllReduce";
        d.collApi.count = count;
        d.collApi.datatype = "ncclFloat32";
        d.collApi.stream = (void *)0xABC;
        void *ca = start(cm->ctx, &d);
        stop(ca);
        d = descr(T_P2PAPI, ga, 0);
        d.p2pApi.func = "Send";
        d.p2pApi.count = 256;
        d.p2pApi.datatype = "ncclInt32";
        d.p2pApi.stream = (void *)0xABC;
        void *pa = start(cm->ctx, &d);
        stop(pa);
        record(ga, 24, NULL);
        d = descr(T_KERNELLAUNCH, ga, 0);
        d.kernelLaunch.stream = (void *)0xABC;
        stop(start(cm->ctx, &d));
#endif
        descr_t g = descr(T_GROUP, NULL, 0);
        void *group = start(cm->ctx, &g);
#if HOST_API >= 5
        coll_parent = ca;
        p2p_parent = pa;
#else
        coll_parent = p2p_parent = group;
#endif
        descr_t c = descr(T_COLL, coll_parent, cm->id);
        c.coll.seqNumber = (uint64_t)i;
        c.coll.sendBuff = (void *)0x1000;
        c.coll.recvBuff = (void *)0x2000;
        c.coll.count = count;
        c.coll.root = 0;
        c.coll.nWarps = 8;
#if HOST_API == 1
        c.coll.name = "harness";
        c.coll.commHash = 0x1000 + (uint64_t)cm->id;
        c.coll.func = 4;     /* AllReduce */
        c.coll.datatype = 7; /* ncclFloat32 */
        c.coll.algo = 1;     /* RING */
        c.coll.proto = 2;    /* SIMPLE */
        c.coll.nMaxChannels = 2;
#else
#if HOST_API <= 3
        c.coll.name = "harness";
        c.coll.commHash = 0x1000 + (uint64_t)cm->id;
        c.coll.nMaxChannels = 2;
#else
        c.coll.nChannels = 2;
#endif
        c.coll.func = "AllReduce";
        c.coll.datatype = "ncclFloat32";
        c.coll.algo = "RING";
        c.coll.proto = "SIMPLE";
#endif
#if HOST_API >= 5
        c.coll.parentGroup = group;
#endif
        void *coll = start(cm->ctx, &c);
        descr_t p = descr(T_P2P, p2p_parent, cm->id);
        p.p2p.buff = (void *)0x3000;
        p.p2p.count = 256;
        p.p2p.peer = 1 - cm->id;
#if HOST_API == 1
        p.p2p.func = 6;     /* Send */
        p.p2p.datatype = 2; /* ncclInt32 */
#else
        p.p2p.func = "Send";
        p.p2p.datatype = "ncclInt32";
#endif
#if HOST_API >= 4
        p.p2p.nChannels = 1;
#endif
#if HOST_API >= 5
        p.p2p.parentGroup = group;
#endif
        void *p2p = start(cm->ctx, &p);
        /* Host enqueue done: the children arrive later, on the proxy thread. */
        stop(coll);
        stop(p2p);
        stop(group);
#if HOST_API >= 5
        stop(ga);
#endif
#if HOST_API >= 6
        descr_t e = descr(T_CECOLL, ca, 0);
        e.ceColl.seqNumber = (uint64_t)i;
        e.ceColl.func = "AllGather";
        e.ceColl.count = count;
        e.ceColl.datatype = "ncclBfloat16";
        e.ceColl.syncStrategy = "UC";
        e.ceColl.ceSeqNum = (uint32_t)i;
        e.ceColl.stream = (void *)0xABC;
        void *ce = start(cm->ctx, &e);
        descr_t s = descr(T_CESYNC, ce, 0);
        s.ceSync.isComplete = true;
        s.ceSync.nRanks = NCOMMS;
        stop(start(cm->ctx, &s));
        descr_t b = descr(T_CEBATCH, ce, 0);
        b.ceBatch.numOps = 2;
        b.ceBatch.totalBytes = 4096;
        stop(start(cm->ctx, &b));
        stop(ce);
#endif
        struct work *w = calloc(1, sizeof *w);
        w->coll = coll;
        w->p2p = p2p;
        w->iter = i;
        q_push(&cm->to_proxy, w);
    }
    struct work *w = calloc(1, sizeof *w);
    w->done = 1;
    q_push(&cm->to_proxy, w);
    return NULL;
}

static void *load(const char *lib, void **dl) {
    *dl = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!*dl) {
        printf("FAIL dlopen %s: %s\n", lib, dlerror());
        exit(2);
    }
    int found = 0;
    for (int v = 1; v <= 6; v++) {
        char sym[32];
        snprintf(sym, sizeof sym, "ncclProfiler_v%d", v);
        found += dlsym(*dl, sym) != NULL;
    }
    printf("symbols=%d\n", found);
    T = dlsym(*dl, "ncclProfiler_v" STR(HOST_API));
    if (!T) {
        printf("FAIL no ncclProfiler_v%d\n", HOST_API);
        exit(2);
    }
    if (!T->name || strcmp(T->name, "occl") != 0) FAIL("name %s", T->name ? T->name : "(null)");
    if (!T->init || !T->startEvent || !T->stopEvent || !T->recordEventState || !T->finalize) FAIL("a NULL function");
    return *dl;
}

static int port_accepts(int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ok = connect(s, (struct sockaddr *)&a, sizeof a) == 0;
    close(s);
    return ok;
}

static int cmp(const void *a, const void *b) {
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

static void run(void) {
    struct comm cms[NCOMMS];
    int mask = -1;
    for (int c = 0; c < NCOMMS; c++) {
        cms[c].id = c;
        cms[c].ctx = init_comm(c, &mask);
        q_init(&cms[c].to_proxy);
        q_init(&cms[c].to_net);
    }
    const char *rounds_env = getenv("HOST_ROUNDS"), *gap_env = getenv("HOST_ROUND_MS");
    int rounds = rounds_env ? atoi(rounds_env) : 1, gap_ms = gap_env ? atoi(gap_env) : 0;
    for (int r = 0; r < rounds; r++) {
        if (r > 0 && gap_ms > 0) usleep((useconds_t)gap_ms * 1000);
        pthread_t th[NCOMMS][4];
        for (int c = 0; c < NCOMMS; c++) {
            pthread_create(&th[c][0], NULL, app_thread, &cms[c]);
            pthread_create(&th[c][1], NULL, proxy_thread, &cms[c]);
            pthread_create(&th[c][2], NULL, net_thread, &cms[c]);
            pthread_create(&th[c][3], NULL, ctrl_thread, &cms[c]);
        }
        for (int c = 0; c < NCOMMS; c++)
            for (int t = 0; t < 4; t++) pthread_join(th[c][t], NULL);
    }
    qsort(handles, (size_t)nhandles, sizeof handles[0], cmp);
    int dup = 0;
    for (int i = 1; i < nhandles; i++) dup += handles[i] == handles[i - 1];
    for (int i = 0; i < nhandles; i++)
        for (int c = 0; c < NCOMMS; c++) dup += handles[i] == (uintptr_t)cms[c].ctx;
    printf("handles=%d nulls=%d duplicates=%d\n", nhandles, nnull, dup);
    if (getenv("HOST_PAUSE")) {
        printf("PAUSED\n");
        fflush(stdout);
        char line[16];
        if (!fgets(line, sizeof line, stdin)) FAIL("stdin closed");
    }
    for (int c = 0; c < NCOMMS; c++)
        if (T->finalize(cms[c].ctx) != 0) FAIL("finalize");
    const char *port = getenv("HOST_METRICS_PORT");
    if (port) printf("metrics_after_finalize=%s\n", port_accepts(atoi(port)) ? "open" : "refused");
}

/* Values NCCL should never pass, and some it does (NULL handles, stops after stops). */
static void garbage(void) {
    int mask = 0;
    void *ctx = init_comm(0, &mask);
    int bad = 0;
#define EXPECT_NULL(h, what)                                                                          \
    do {                                                                                              \
        if ((h) != NULL) {                                                                            \
            printf("FAIL %s got a handle\n", what);                                                   \
            bad++;                                                                                    \
        }                                                                                             \
    } while (0)
    void *h = (void *)0x1;
    T->startEvent(ctx, &h, NULL);
    EXPECT_NULL(h, "a NULL descriptor");
    /* v3/v4 know every bit of their 8-bit type, so theirs is two bits at once. */
    descr_t d = descr(HOST_API <= 2 ? T_KERNELCH : HOST_API <= 4 ? 0x81 : HOST_API == 5 ? T_CECOLL : 0x8000, NULL, 0);
    EXPECT_NULL(start(ctx, &d), "an unknown type");
    d = descr(0, NULL, 0);
    EXPECT_NULL(start(ctx, &d), "type 0");
    d = descr(T_COLL | T_P2P, NULL, 0);
    EXPECT_NULL(start(ctx, &d), "two types");
    descr_t grp = descr(T_GROUP, NULL, 0);
    EXPECT_NULL(start((void *)0xdeadbeef000, &grp), "a foreign context");
    EXPECT_NULL(start(NULL, &grp), "a NULL context");
    T->startEvent(ctx, NULL, &grp); /* nowhere to put the handle */

    /* A Coll whose strings are NULL or not UTF-8 (v1: codes out of range), under a foreign parent. */
    static const char not_utf8[] = {'A', (char)0xff, (char)0xfe, 0};
    descr_t c = descr(T_COLL, (void *)0xdeadbeef, 0);
    c.coll.seqNumber = 99;
#if HOST_API == 1
    c.coll.func = 200;
    c.coll.datatype = 99;
    c.coll.algo = 42;
    c.coll.proto = 9;
#else
    c.coll.func = NULL;
    c.coll.datatype = not_utf8;
    c.coll.algo = NULL;
    c.coll.proto = "SIMPLE";
#endif
    (void)not_utf8;
    void *coll = start(ctx, &c);
    if (!coll) {
        printf("FAIL the odd Coll got no handle\n");
        bad++;
    }
    /* A ProxyOp of another process (PXN). */
    descr_t op = descr(T_PROXYOP, coll, 0);
    op.proxyOp.pid = getpid() + 1;
    EXPECT_NULL(start(ctx, &op), "a foreign ProxyOp");
    /* A ProxyStep without parent, states with NULL and with odd arguments. */
    descr_t st = descr(T_PROXYSTEP, NULL, 0);
    st.proxyStep.step = 3;
    void *step = start(ctx, &st);
    record(step, 9, NULL);
    record(step, 99, NULL);
    record(step, -5, NULL);
    record(step, 23, NULL);
    args_t a;
    memset(&a, 0xff, sizeof a);
    record(step, 10, &a);
    /* NULL, foreign and wrong-kind handles. */
    T->stopEvent(NULL);
    T->recordEventState(NULL, 9, NULL);
    T->stopEvent((void *)0x1234);
    T->recordEventState((void *)0xdeadbeef, 9, &a);
    T->stopEvent(ctx);
    stop(step);
    stop(step);
    stop(coll);
    T->finalize(NULL);
    T->finalize((void *)0x99);
    if (T->finalize(ctx) != 0) FAIL("finalize");
    T->finalize(ctx);
    /* After finalize: a dead context and dead handles. */
    EXPECT_NULL(start(ctx, &grp), "a finalized context");
    T->stopEvent(coll);
    printf("garbage bad=%d\n", bad);
    if (bad) failures++;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s <library> run|garbage|steps|reload\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    void *dl;
    load(argv[1], &dl);
    if (strcmp(argv[2], "run") == 0) {
        run();
    } else if (strcmp(argv[2], "garbage") == 0) {
        garbage();
    } else if (strcmp(argv[2], "steps") == 0) {
        /* Training-step marks through the plugin's own C exports, around a communicator's events. */
        void (*step_begin)(uint64_t) = (void (*)(uint64_t))dlsym(dl, "occlProfilerStepBegin");
        void (*step_end)(void) = (void (*)(void))dlsym(dl, "occlProfilerStepEnd");
        if (!step_begin || !step_end) FAIL("no occlProfilerStepBegin/End");
        int mask = 0;
        void *ctx = init_comm(0, &mask);
        for (uint64_t n = 1; n <= 3; n++) {
            step_begin(n);
            descr_t d = descr(T_GROUP, NULL, 0);
            stop(start(ctx, &d));
        }
        step_end();
        if (T->finalize(ctx) != 0) FAIL("finalize");
        printf("steps done\n");
    } else if (strcmp(argv[2], "reload") == 0) {
        for (int round = 0; round < 2; round++) {
            if (round) load(argv[1], &dl);
            int mask = 0;
            void *ctx = init_comm(round, &mask);
            descr_t d = descr(T_GROUP, NULL, 0);
            stop(start(ctx, &d));
            if (T->finalize(ctx) != 0) FAIL("finalize");
            if (dlclose(dl) != 0) FAIL("dlclose: %s", dlerror());
            /* Whether the dynamic linker really unmapped it (it may keep it, e.g. for TLS). */
            void *again = dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD);
            printf("round=%d closed unloaded=%d\n", round, again == NULL);
            if (again) dlclose(again);
        }
    } else {
        fprintf(stderr, "unknown scenario %s\n", argv[2]);
        return 2;
    }
    printf("%s failures=%d\n", failures ? "FAILED" : "OK", failures);
    return failures ? 1 : 0;
}
