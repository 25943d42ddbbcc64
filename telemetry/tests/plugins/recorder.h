/* Shared part of the recorder test plugins (recorder_v5.c, recorder_v1.c): per-communicator
 * contexts, event records used as handles, and a text log written at finalize.
 *
 * Environment, read in init:
 *   OCCL_TEST_PLUGIN_LOG   file prefix; without it nothing is written. The file is
 *                          <prefix>-<commId>-<rank>.log (v4+: commId in decimal) or
 *                          <prefix>-v1-<pid>-<n>.log (v1-v3 init has no comm info; n counts inits
 *                          in the process from 0).
 *   OCCL_TEST_PLUGIN_MASK  if set (decimal or 0x hex), stored into *eActivationMask by init.
 *
 * Log format: one line per callback, in call order, tokens separated by one space; every token
 * after the first is key=value with no spaces in the value, except `name=`, which is always
 * last and runs to the end of the line. Numbers are decimal (pointers too), strings are printed
 * as given ("(null)" for NULL). Lines:
 *   init v=<api> [comm=<id> nnodes=<n> nranks=<n> rank=<r>] mask=<int after init> [logfn=<0|1>] name=<commName>
 *   start type=<bit> handle=<h> parent=<h> rank=<r> <fields of the type...>
 *   state handle=<h> state=<n> <arguments...>      (args=null when the pointer was NULL)
 *   stop handle=<h>
 *   finalize events=<n> dropped=<n> bad_calls=<n>
 * Handles are small integers (1, 2, ...) per communicator; parent=0 means NULL, parent=-1 a
 * pointer that is not one of this plugin's records. handle=0 means the record limit was hit and
 * NULL was returned. bad_calls counts stop/state calls with a NULL or foreign handle (process-wide).
 *
 * Thread-safe: each context has a mutex; a line is built on the stack and appended whole. The
 * log is bounded (REC_MAX_LOG bytes, then "truncated" at the end) and so are the records
 * (REC_MAX_EVENTS per communicator, then NULL handles). */
#ifndef OCCL_TEST_RECORDER_H
#define OCCL_TEST_RECORDER_H

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#define REC_MAGIC 0x0cc1e7e5u
#define REC_MAX_EVENTS (1u << 20)
#define REC_MAX_LOG ((size_t)64 << 20)

typedef void (*rec_logger_t)(int level, unsigned long flags, const char *file, int line, const char *fmt, ...);

struct rec_ctx;

struct rec_event {
    uint32_t magic;
    unsigned long id;
    int64_t net_id; /* NetPlugin: the plugin id, to decode update payloads */
    struct rec_ctx *ctx;
    struct rec_event *next;
};

struct rec_ctx {
    pthread_mutex_t mu;
    char path[4096];
    unsigned long next_id, events, dropped;
    struct rec_event *all;
    char *buf;
    size_t len, cap;
    int truncated;
};

struct rec_line {
    char b[2048];
    size_t n;
};

static unsigned long rec_bad_calls;

__attribute__((format(printf, 2, 3))) static void rec_add(struct rec_line *l, const char *fmt, ...) {
    if (l->n >= sizeof l->b) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(l->b + l->n, sizeof l->b - l->n, fmt, ap);
    va_end(ap);
    if (k > 0) l->n += (size_t)k;
    if (l->n >= sizeof l->b) l->n = sizeof l->b - 1;
}

static const char *rec_str(const char *s) { return s ? s : "(null)"; }

static void rec_emit(struct rec_ctx *c, const struct rec_line *l) {
    pthread_mutex_lock(&c->mu);
    size_t need = l->n + 1;
    if (c->len + need > REC_MAX_LOG) {
        c->truncated = 1;
    } else {
        if (c->len + need > c->cap) {
            size_t cap = c->cap ? c->cap : 1 << 16;
            while (cap < c->len + need) cap *= 2;
            char *nb = realloc(c->buf, cap);
            if (!nb) {
                c->truncated = 1;
                pthread_mutex_unlock(&c->mu);
                return;
            }
            c->buf = nb;
            c->cap = cap;
        }
        memcpy(c->buf + c->len, l->b, l->n);
        c->buf[c->len + l->n] = '\n';
        c->len += need;
    }
    pthread_mutex_unlock(&c->mu);
}

/* A new context whose log goes to $OCCL_TEST_PLUGIN_LOG followed by `suffix`. */
static struct rec_ctx *rec_ctx_new(const char *suffix) {
    struct rec_ctx *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    pthread_mutex_init(&c->mu, NULL);
    const char *prefix = getenv("OCCL_TEST_PLUGIN_LOG");
    if (prefix && *prefix) snprintf(c->path, sizeof c->path, "%s%s", prefix, suffix);
    return c;
}

/* Applies $OCCL_TEST_PLUGIN_MASK to the activation mask. */
static void rec_apply_mask(int *mask) {
    const char *m = getenv("OCCL_TEST_PLUGIN_MASK");
    if (mask && m && *m) *mask = (int)strtol(m, NULL, 0);
}

static struct rec_event *rec_event_new(struct rec_ctx *c) {
    pthread_mutex_lock(&c->mu);
    struct rec_event *e = NULL;
    if (c->events >= REC_MAX_EVENTS) {
        c->dropped++;
    } else if ((e = calloc(1, sizeof *e)) != NULL) {
        e->magic = REC_MAGIC;
        e->id = ++c->next_id;
        e->ctx = c;
        e->next = c->all;
        c->all = e;
        c->events++;
    }
    pthread_mutex_unlock(&c->mu);
    return e;
}

/* The record behind a handle, or NULL (counted) if it is not one of ours. */
static struct rec_event *rec_event_of(void *h) {
    struct rec_event *e = h;
    if (!e || e->magic != REC_MAGIC) {
        __atomic_add_fetch(&rec_bad_calls, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    return e;
}

static long rec_id(const void *h) {
    const struct rec_event *e = h;
    if (!e) return 0;
    return e->magic == REC_MAGIC ? (long)e->id : -1;
}

/* NetPlugin payloads of NCCL's internal transports (version 1): socket (net type 2) and IB
 * (net type 1); the id's low 16 bits are the payload version, bits 16-31 the net type. */
__attribute__((unused)) static void rec_add_net_payload(struct rec_line *l, int64_t id, const void *data) {
    if (!data) {
        rec_add(l, " data=null");
        return;
    }
    unsigned ver = (unsigned)(id & 0xffff), net = (unsigned)((id >> 16) & 0xffff);
    const unsigned char *p = data;
    if (net == 2 && ver == 1) {
        uint8_t t;
        int fd, op;
        size_t len;
        memcpy(&t, p, 1);
        memcpy(&fd, p + 8, sizeof fd);
        memcpy(&op, p + 12, sizeof op);
        memcpy(&len, p + 16, sizeof len);
        rec_add(l, " sock_type=%u fd=%d op=%d len=%zu", t, fd, op, len);
    } else if (net == 1 && ver == 1) {
        uint8_t t;
        int dev, opcode, qp;
        uint64_t wr;
        size_t len;
        memcpy(&t, p, 1);
        memcpy(&dev, p + 8, sizeof dev);
        memcpy(&wr, p + 16, sizeof wr);
        memcpy(&opcode, p + 24, sizeof opcode);
        memcpy(&qp, p + 28, sizeof qp);
        memcpy(&len, p + 32, sizeof len);
        rec_add(l, " ib_type=%u dev=%d wr_id=%" PRIu64 " opcode=%d qp=%d len=%zu", t, dev, wr, opcode, qp, len);
    } else {
        rec_add(l, " data=set");
    }
}

static void rec_stop_line(void *h) {
    struct rec_event *e = rec_event_of(h);
    if (!e) return;
    struct rec_line l = {.n = 0};
    rec_add(&l, "stop handle=%lu", e->id);
    rec_emit(e->ctx, &l);
}

/* Writes the log, frees the context and its records. */
static void rec_finalize(struct rec_ctx *c) {
    if (!c) return;
    struct rec_line l = {.n = 0};
    rec_add(&l, "finalize events=%lu dropped=%lu bad_calls=%lu", c->events, c->dropped,
            __atomic_load_n(&rec_bad_calls, __ATOMIC_RELAXED));
    rec_emit(c, &l);
    if (c->path[0]) {
        FILE *f = fopen(c->path, "w");
        if (f) {
            if (c->len) fwrite(c->buf, 1, c->len, f);
            if (c->truncated) fputs("truncated\n", f);
            fclose(f);
        }
    }
    for (struct rec_event *e = c->all; e;) {
        struct rec_event *next = e->next;
        e->magic = 0;
        free(e);
        e = next;
    }
    free(c->buf);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

#endif
