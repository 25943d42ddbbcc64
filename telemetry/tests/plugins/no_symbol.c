/* Test fixture: a shared library that exports no ncclProfiler_v* symbol. */
__attribute__((visibility("default"))) int occl_test_not_a_profiler = 1;
