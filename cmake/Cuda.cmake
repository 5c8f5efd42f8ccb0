# CUDA is optional: enabled only when an nvcc is found. Everything else builds without it.
include(CheckLanguage)
if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX}
   AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
check_language(CUDA)
if(CMAKE_CUDA_COMPILER)
  enable_language(CUDA)
  set(KVPOOL_HAVE_CUDA ON)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
    # sm_90a (H100/H200) plus PTX for newer parts.
    set(CMAKE_CUDA_ARCHITECTURES 90a-real 90-virtual)
  endif()
  message(STATUS "kvpool: CUDA enabled (${CMAKE_CUDA_COMPILER}, ${CMAKE_CUDA_COMPILER_VERSION})")
else()
  set(KVPOOL_HAVE_CUDA OFF)
  message(STATUS "kvpool: no nvcc found, CUDA sources are skipped")
endif()
