# Test binaries, one per module; sources sit beside the code they test.
strata_tests(core_tests SRCS core/status_test.cc core/dtype_test.cc core/thread_pool_test.cc
             DEPS strata_core)
