// Internal assertions, at two levels (after mimalloc):
//   KVPOOL_CHECK(cond)   always on; for states that must never happen even under bad input,
//                        because bad input is rejected before it reaches them.
//   KVPOOL_DCHECK(cond)  on in debug and sanitizer builds (NDEBUG unset), off in release; for
//                        per-page hot-path invariants.
// A failed check prints the condition and location and aborts: it means a kvpool bug, never a
// client error (clients get a Status).
#pragma once

#include <cstdio>
#include <cstdlib>

#define KVPOOL_CHECK(cond)                                                                  \
  do {                                                                                      \
    if (!(cond)) [[unlikely]] {                                                             \
      std::fprintf(stderr, "kvpool: internal check failed: %s at %s:%d\n", #cond, __FILE__, \
                   __LINE__);                                                               \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)

#ifdef NDEBUG
#define KVPOOL_DCHECK(cond) \
  do {                      \
  } while (0)
#else
#define KVPOOL_DCHECK(cond) KVPOOL_CHECK(cond)
#endif
