# Project-wide compiler flags: warnings (errors with KVPOOL_WERROR) and the sanitizer builds
# (KVPOOL_SANITIZE: ASan + UBSan; KVPOOL_TSAN: ThreadSanitizer; KVPOOL_FUZZ: ASan + UBSan and
# libFuzzer's coverage instrumentation).
add_library(kvpool_flags INTERFACE)
target_compile_options(kvpool_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wsign-conversion
    -Wnon-virtual-dtor -Wold-style-cast -Wcast-align -Woverloaded-virtual
    -Wimplicit-fallthrough>)
target_compile_options(kvpool_flags INTERFACE
  $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion>)
if(KVPOOL_WERROR)
  target_compile_options(kvpool_flags INTERFACE $<$<COMPILE_LANGUAGE:C,CXX>:-Werror>)
endif()
# GCC 12 at -O3 raises false -Wrestrict, -Wstringop-overread and -Warray-bounds inside libstdc++'s
# std::string and std::vector code once inlined (GCC bugs 105329, 105651); they name no kvpool
# code, so Release builds keep them as warnings rather than errors.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  target_compile_options(kvpool_flags INTERFACE
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CONFIG:Release>>:-Wno-error=restrict
      -Wno-error=stringop-overread -Wno-error=array-bounds>)
endif()
if(KVPOOL_SANITIZE)
  target_compile_options(kvpool_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-sanitize-recover=all
      -fno-omit-frame-pointer>)
  target_link_options(kvpool_flags INTERFACE -fsanitize=address,undefined)
  # Debug builds keep the internal assertions (KVPOOL_DCHECK) on.
endif()
if(KVPOOL_TSAN)
  if(KVPOOL_SANITIZE OR KVPOOL_FUZZ)
    message(FATAL_ERROR "KVPOOL_TSAN cannot be combined with KVPOOL_SANITIZE or KVPOOL_FUZZ")
  endif()
  target_compile_options(kvpool_flags INTERFACE
    $<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=thread -fno-omit-frame-pointer>)
  target_link_options(kvpool_flags INTERFACE -fsanitize=thread)
  # GCC warns that TSan does not model atomic_thread_fence (-Wtsan). The one user, the stats
  # seqlock (common/stats_layout.cpp), moves every shared word with relaxed atomics, which TSan
  # never reports as a race; its fences only order those words, so nothing is hidden or invented.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(kvpool_flags INTERFACE $<$<COMPILE_LANGUAGE:C,CXX>:-Wno-tsan>)
  endif()
endif()
# The fuzz target links -fsanitize=fuzzer itself (tests/fuzz); everything it links is
# instrumented for coverage without libFuzzer's main.
if(KVPOOL_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(WARNING "KVPOOL_FUZZ needs clang (CXX=clang++); the fuzz target is not built")
  else()
    target_compile_options(kvpool_flags INTERFACE
      $<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link,address,undefined
        -fno-sanitize-recover=all -fno-omit-frame-pointer>)
    target_link_options(kvpool_flags INTERFACE -fsanitize=address,undefined)
  endif()
endif()
