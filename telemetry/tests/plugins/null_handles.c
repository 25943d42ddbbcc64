/* Test fixture (ncclProfiler_v6): startEvent always writes a NULL handle. Counts its calls and
 * writes them at finalize to $OCCL_TEST_PLUGIN_LOG-nullh-<commId>-<rank>.log as one line:
 *   starts=<n> with_parent=<n> stops=<n> states=<n> stops_null=<n> states_null=<n>
 * A correct host never calls stop or recordEventState for a NULL handle, and every parentObj it
 * passes is NULL (the parents' handles were NULL). */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

struct ctx {
    char path[4096];
};

static unsigned long starts, with_parent, stops, states, stops_null, states_null;

static int init(void **context, uint64_t commId, int *mask, const char *name, int nNodes, int nranks, int rank,
                void (*logfn)(int, unsigned long, const char *, int, const char *, ...)) {
    (void)name, (void)nNodes, (void)nranks, (void)logfn;
    struct ctx *c = calloc(1, sizeof *c);
    const char *prefix = getenv("OCCL_TEST_PLUGIN_LOG");
    if (c && prefix) snprintf(c->path, sizeof c->path, "%s-nullh-%" PRIu64 "-%d.log", prefix, commId, rank);
    const char *m = getenv("OCCL_TEST_PLUGIN_MASK");
    if (m && *m) *mask = (int)strtol(m, NULL, 0);
    *context = c;
    return 0;
}

static int start(void *context, void **eHandle, void *d) {
    (void)context;
    void *parent = *(void **)((char *)d + 8);
    __atomic_add_fetch(&starts, 1, __ATOMIC_RELAXED);
    if (parent) __atomic_add_fetch(&with_parent, 1, __ATOMIC_RELAXED);
    *eHandle = NULL;
    return 0;
}

static int stop(void *h) {
    __atomic_add_fetch(h ? &stops : &stops_null, 1, __ATOMIC_RELAXED);
    return 0;
}

static int state(void *h, int s, void *a) {
    (void)s, (void)a;
    __atomic_add_fetch(h ? &states : &states_null, 1, __ATOMIC_RELAXED);
    return 0;
}

static int fini(void *context) {
    struct ctx *c = context;
    if (c && c->path[0]) {
        FILE *f = fopen(c->path, "w");
        if (f) {
            fprintf(f, "starts=%lu with_parent=%lu stops=%lu states=%lu stops_null=%lu states_null=%lu\n", starts,
                    with_parent, stops, states, stops_null, states_null);
            fclose(f);
        }
    }
    free(c);
    return 0;
}

__attribute__((visibility("default"))) const struct {
    const char *name;
    int (*init)(void **, uint64_t, int *, const char *, int, int, int,
                void (*)(int, unsigned long, const char *, int, const char *, ...));
    int (*startEvent)(void *, void **, void *);
    int (*stopEvent)(void *);
    int (*recordEventState)(void *, int, void *);
    int (*finalize)(void *);
} ncclProfiler_v6 = {"occl-test-null-handles", init, start, stop, state, fini};
