#!/usr/bin/env bash
# Installs every Debian package that kvpool's build, tests and benchmarks need.
# Idempotent: when everything is present it only checks; otherwise it runs apt-get update once
# and installs what is missing. CUDA is not a Debian package here: the build uses nvcc when it
# finds one (PATH, CUDACXX or /usr/local/cuda) and skips the CUDA sources otherwise.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libssl-dev            # SHA-256 for the block hash chain
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev    # trace parsing (kvpool-replay)
  libcli11-dev          # command-line parsing
  libboost-dev          # Asio (daemon event loop), Interprocess (host shared memory)
  libyaml-cpp-dev       # kvpoold configuration
  clang libclang-rt-14-dev  # the fuzz tree: libFuzzer and clang's sanitizer runtimes
  libzmq3-dev libmsgpack-cxx-dev  # KV events for routers: ZeroMQ PUB, msgpack batches
  python3-dev pybind11-dev libdlpack-dev  # the Python module (DLPack: zero-copy tensors)
  python3-pytest python3-numpy python3-torch python3-zmq python3-msgpack  # its tests, example
  python3-cbor2  # the reference for vLLM's block hash (sha256 over canonical CBOR) in tests
  libhiredis-dev libxxhash-dev  # the remote tier: Redis Cluster client, page checksums
  redis-server redis-tools      # its tests and benchmarks start their own cluster on loopback
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then sudo=(sudo); fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
