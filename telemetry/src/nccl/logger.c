/* The ncclDebugLogger_t that occl hands to C profiler plugins.
 *
 * The logger is C-variadic, and stable Rust cannot define a variadic function, so this file
 * formats the message and passes the finished text to a callback that Rust installs once. Text
 * beyond the buffer is cut (NCCL's own logger also formats into a fixed buffer). */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

typedef void (*occl_nccl_log_cb)(int level, unsigned long flags, const char *file, int line, const char *msg);

static occl_nccl_log_cb log_cb;

void occl_nccl_logger_set_callback(occl_nccl_log_cb cb) {
    __atomic_store_n(&log_cb, cb, __ATOMIC_RELEASE);
}

void occl_nccl_logger(int level, unsigned long flags, const char *file, int line, const char *fmt, ...) {
    occl_nccl_log_cb cb = __atomic_load_n(&log_cb, __ATOMIC_ACQUIRE);
    if (cb == NULL || fmt == NULL) {
        return;
    }
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cb(level, flags, file, line, msg);
}
