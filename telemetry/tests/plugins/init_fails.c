/* Test fixture (ncclProfiler_v5): init succeeds for rank 0, returns 3 (ncclInternalError) for
 * rank 1, and returns 0 with a NULL context for any other rank. Event callbacks do nothing and
 * write NULL handles. */
#include <stddef.h>
#include <stdint.h>

static int ctx_storage;

static int init(void **context, uint64_t commId, int *mask, const char *name, int nNodes, int nranks, int rank,
                void (*logfn)(int, unsigned long, const char *, int, const char *, ...)) {
    (void)commId, (void)mask, (void)name, (void)nNodes, (void)nranks, (void)logfn;
    if (rank == 1) {
        *context = &ctx_storage; /* left behind on failure, as a careless plugin might */
        return 3;
    }
    *context = rank == 0 ? &ctx_storage : NULL;
    return 0;
}

static int start(void *context, void **eHandle, void *d) {
    (void)context, (void)d;
    *eHandle = NULL;
    return 0;
}

static int stop(void *h) { return (void)h, 0; }
static int state(void *h, int s, void *a) { return (void)h, (void)s, (void)a, 0; }
static int fini(void *context) { return (void)context, 0; }


__attribute__((visibility("default"))) const struct {
    const char *name;
    int (*init)(void **, uint64_t, int *, const char *, int, int, int,
                void (*)(int, unsigned long, const char *, int, const char *, ...));
    int (*startEvent)(void *, void **, void *);
    int (*stopEvent)(void *);
    int (*recordEventState)(void *, int, void *);
    int (*finalize)(void *);
} ncclProfiler_v5 = {"occl-test-init-fails", init, start, stop, state, fini};
