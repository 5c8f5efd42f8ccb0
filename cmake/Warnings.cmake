# Project-wide compiler flags: warnings (errors with KVPOOL_WERROR) and the sanitizer build.
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
if(KVPOOL_SANITIZE)
  target_compile_options(kvpool_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-sanitize-recover=all
      -fno-omit-frame-pointer>)
  target_link_options(kvpool_flags INTERFACE -fsanitize=address,undefined)
  # Debug builds keep the internal assertions (KVPOOL_DCHECK) on.
endif()
