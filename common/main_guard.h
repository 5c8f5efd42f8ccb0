// guarded_main: the top of every kvpool program. It runs the program's body and turns an
// exception that escapes it (std::bad_alloc, a library's std::system_error) into one line on
// stderr, "PREFIX: WHAT", and exit status 1, so that no program ends in std::terminate.
#pragma once

#include <cstdio>
#include <exception>

namespace kvpool {

template <typename Body>
int guarded_main(const char* prefix, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", prefix, e.what());
    return 1;
  }
}

}  // namespace kvpool
