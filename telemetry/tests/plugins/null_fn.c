/* Test fixture (ncclProfiler_v4): the function table has a NULL recordEventState. */
#include <stddef.h>
#include <stdint.h>

static int init(void **context, int *mask, const char *name, uint64_t hash, int nNodes, int nranks, int rank,
                void (*logfn)(int, unsigned long, const char *, int, const char *, ...)) {
    (void)mask, (void)name, (void)hash, (void)nNodes, (void)nranks, (void)rank, (void)logfn;
    *context = NULL;
    return 0;
}

static int start(void *context, void **eHandle, void *d) {
    (void)context, (void)d;
    *eHandle = NULL;
    return 0;
}

static int stop(void *h) { return (void)h, 0; }
static int fini(void *context) { return (void)context, 0; }

__attribute__((visibility("default"))) const struct {
    const char *name;
    int (*init)(void **, int *, const char *, uint64_t, int, int, int,
                void (*)(int, unsigned long, const char *, int, const char *, ...));
    int (*startEvent)(void *, void **, void *);
    int (*stopEvent)(void *);
    int (*recordEventState)(void *, int, void *);
    int (*finalize)(void *);
} ncclProfiler_v4 = {"occl-test-null-fn", init, start, stop, NULL, fini};
