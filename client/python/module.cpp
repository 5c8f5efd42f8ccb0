// kvpool._kvpool: the compiled part of the Python package `kvpool` (client/python/kvpool).
// See bindings.h for ownership, errors and threads; each bind_* lives in its own file.

#include "client/python/bindings.h"

PYBIND11_MODULE(_kvpool, m) {
  m.doc() = "kvpool's worker client: attach to kvpoold, share KV-cache pages, view them zero-copy";
  kvpool::python::bind_errors(m);
  kvpool::python::bind_hashing(m);
  kvpool::python::bind_vllm_hashing(m);
  kvpool::python::bind_connection(m);
  kvpool::python::bind_memory(m);
  kvpool::python::bind_sequence_cache(m);
  kvpool::python::bind_mixed_sequence(m);
  kvpool::python::bind_events(m);
  kvpool::python::bind_bench_hooks(m);
}
