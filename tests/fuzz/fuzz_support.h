// What the fuzz targets share: a check that aborts (so libFuzzer reports the input) when a
// property the daemon relies on does not hold.
#ifndef REPLAYD_TESTS_FUZZ_FUZZ_SUPPORT_H_
#define REPLAYD_TESTS_FUZZ_FUZZ_SUPPORT_H_

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(condition)                                                             \
  do {                                                                                    \
    if (!(condition)) {                                                                   \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, __LINE__, #condition); \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)

#endif  // REPLAYD_TESTS_FUZZ_FUZZ_SUPPORT_H_
