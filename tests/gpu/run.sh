#!/usr/bin/env bash
# The GPU check in one device call. On a machine with an NVIDIA GPU and driver (no Boost,
# yaml-cpp or CMake needed there) it runs, each step in a process of its own under its own
# timeout:
#   kernel-tests   the CUDA kernels against the CPU kernels, every dtype, layout, head dim, group
#                  and split (kvpool_gpu_check --tests)
#   kernel-bench   decode bandwidth next to device copy bandwidth (kvpool_gpu_check --bench)
#   pool <backend> <dtype>   kvpoold owns the pool in HBM (cuda-vmm, cuda-ipc; bf16, fp8_e4m3),
#                  worker A publishes a prompt, worker B decodes over A's pages and matches its
#                  own recomputation and the CPU kernels; kill -9 of a worker and of the daemon
#                  (kvpool_gpu_pool_check)
#   tier cuda-vmm <dtype>    an elastic pool with a host tier in pinned memory: promotion under
#                  decode, grow/shrink under held pages, their costs (kvpool_gpu_tier_check)
#
# The device call (tests/gpu/README.md): build here with `bash scripts/build-gpu.sh`, which puts
# the four binaries (~25 MiB) in build/gpu-bin, then
#   run  command="bash tests/gpu/run.sh"  carry=["build/gpu-bin"]  timeout_s=600
# Files, under $OUT (default build/gpu-out), at most 8:
#   summary.txt      the summary printed at the end (≤ 40 lines): each step PASS/FAIL/SKIP with
#                    its reason, and every FAILED line (the first 20)
#   machine.txt      nvidia-smi, glibc, which binaries were used and whether each loads
#   kernel-tests.log, kernel-bench.txt (the bandwidth table), pool-check.log, tier-check.log
#   kvpoold.log      the daemons' logs of the pool and tier checks
# Time: each step has KVPOOL_GPU_STEP_TIMEOUT seconds (default 120; normal runs take 10-20 s),
# no step starts after KVPOOL_GPU_START_DEADLINE (default 420) and every step is cut off at
# KVPOOL_GPU_DEADLINE (default 540), so the call ends inside one 10-minute command.
#
# Whether there is a GPU is decided here, from `nvidia-smi -L` (or an NVIDIA device node), never
# from a CUDA call: when a GPU is listed, a step that exits 77 ("no usable GPU") has FAILED.
# Without one, the steps skip and the check exits 0 saying so.
#
# Options:
#   --verbose    every comparison's line in the logs, and the logs on stdout as they are written
#   --rehearse   no GPU needed: the kernel matrix with the CPU kernels standing in for CUDA, the
#                pool and tier checks on fake-device and host (what CI runs; the bench is skipped)
# Binaries: $KVPOOL_GPU_BIN (a folder) if set, else build/gpu-bin, build/gpu, build/release. A
# missing kernel check is built here with nvcc from the project's sources when nvcc exists.
# KVPOOL_GPU_CHECK_ARGS (e.g. "--dtype fp8_e4m3,int8" or "--sample 4") narrows the kernel matrix;
# the summary's first line says so.
# Exit status: 0 every step passed (or skipped for want of a GPU); 1 otherwise; 2 bad usage.
set -uo pipefail
cd "$(dirname "$0")/../.."

verbose=0
rehearse=0
for arg in "$@"; do
  case "$arg" in
    --verbose) verbose=1 ;;
    --rehearse) rehearse=1 ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument '$arg' (--verbose, --rehearse, --help)" >&2; exit 2 ;;
  esac
done

# A crashing check with large pinned or device mappings must not spend the call writing a core.
ulimit -c 0
OUT=${OUT:-build/gpu-out}
mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
for f in summary.txt machine.txt kernel-tests.log kernel-bench.txt pool-check.log \
  tier-check.log kvpoold.log; do
  rm -f "${OUT:?}/$f"
done
step_timeout=${KVPOOL_GPU_STEP_TIMEOUT:-120}
start_deadline=${KVPOOL_GPU_START_DEADLINE:-420}
hard_deadline=${KVPOOL_GPU_DEADLINE:-540}
SECONDS=0

machine=$OUT/machine.txt
results=()      # "STATUS|name|detail"
failed_lines=() # FAILED lines of the steps' logs
incomplete=0

# --- the machine ------------------------------------------------------------------------------
has_gpu=0
gpu_line="no GPU: nvidia-smi not found"
if command -v nvidia-smi >/dev/null 2>&1; then
  smi=$(timeout 30 nvidia-smi -L 2>&1)
  smi_rc=$?
  if [[ $smi_rc -eq 0 ]] && grep -q '^GPU ' <<<"$smi"; then
    has_gpu=1
    gpu_line=$(grep -m1 '^GPU ' <<<"$smi")
    n=$(grep -c '^GPU ' <<<"$smi")
    ((n > 1)) && gpu_line+=" (and $((n - 1)) more)"
  else
    gpu_line="no GPU: nvidia-smi -L exited $smi_rc: $(head -c 200 <<<"$smi" | tr '\n' ' ')"
  fi
  {
    echo "== nvidia-smi -L (exit $smi_rc)"
    echo "$smi"
    timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm \
      --format=csv 2>&1
  } >>"$machine"
fi
if ((has_gpu == 0)) && [[ -e /dev/nvidiactl || -e /dev/nvidia0 ]]; then
  has_gpu=1
  gpu_line="an NVIDIA device node exists though nvidia-smi lists no GPU ($gpu_line)"
fi
if ((rehearse)); then gpu_line="rehearsal: CPU stand-ins, no GPU used ($gpu_line)"; fi
{
  echo "== $gpu_line"
  echo "== $(ldd --version 2>&1 | head -1)"
} >>"$machine"

# --- the binaries -----------------------------------------------------------------------------
# A folder of binaries, flat (build/gpu-bin) or a build tree (daemon/, tests/gpu/).
find_bin() {
  local name=$1 dir sub
  local dirs=(build/gpu-bin build/gpu build/release)
  [[ -n ${KVPOOL_GPU_BIN:-} ]] && dirs=("$KVPOOL_GPU_BIN")
  for dir in "${dirs[@]}"; do
    for sub in . daemon tests/gpu; do
      local path=$dir/$name
      [[ $sub != . ]] && path=$dir/$sub/$name
      if [[ -x $path && -f $path ]]; then
        echo "$path"
        return
      fi
    done
  done
}

# Why `bin` cannot run here ("" when it loads and answers --version within 10 s).
load_problem() {
  local bin=$1 out rc
  if command -v ldd >/dev/null 2>&1; then
    # A missing library ("libx.so => not found") or a glibc too old ("version `GLIBC_2.36' not
    # found"); a static binary ("not a dynamic executable") loads.
    out=$(ldd "$bin" 2>&1)
    if grep -qE "=> not found|version .* not found" <<<"$out"; then
      grep -m1 -E "=> not found|version .* not found" <<<"$out" | sed 's/^[[:space:]]*//'
      return
    fi
  fi
  out=$(timeout 10 "$bin" --version 2>&1)
  rc=$?
  ((rc == 0)) || echo "'$bin --version' exited $rc: $(head -c 160 <<<"$out" | tr '\n' ' ')"
}

# kernel_check built here with nvcc from the project's sources, one translation unit per process.
build_kernel_check() {
  local out=${TMPDIR:-/tmp}/kvpool_gpu_check.build obj pids=() objs=() src
  mkdir -p "$out"
  local flags=(-std=c++20 -O3 --expt-relaxed-constexpr -I. -DKVPOOL_GPU_CHECK_CUDA=1
    -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=compute_90)
  local srcs=(tests/gpu/kernel_check_main.cpp tests/gpu/kernel_check.cpp tests/gpu/cuda_target.cu
    kernels/cuda/decode.cu kernels/cuda/extend.cu kernels/cuda/append_kv.cu
    kernels/cuda/copy_pages.cu kernels/cpu/*.cpp common/geometry.cpp common/status.cpp)
  for src in "${srcs[@]}"; do
    obj=$out/$(echo "$src" | tr / _).o
    nvcc "${flags[@]}" -x "$([[ $src == *.cu ]] && echo cu || echo c++)" -c "$src" -o "$obj" >&2 &
    pids+=($!)
    objs+=("$obj")
  done
  for pid in "${pids[@]}"; do
    if ! wait "$pid"; then
      kill "${pids[@]}" 2>/dev/null
      return 1
    fi
  done
  nvcc "${flags[@]}" "${objs[@]}" -o "$out/kvpool_gpu_check" -lpthread >&2 || return 1
  echo "$out/kvpool_gpu_check"
}

declare -A bins
missing=()
for name in kvpool_gpu_check kvpoold kvpool_gpu_pool_check kvpool_gpu_tier_check; do
  bins[$name]=$(find_bin "$name")
  if [[ -z ${bins[$name]} && $name == kvpool_gpu_check ]] && ((!rehearse)) &&
    command -v nvcc >/dev/null 2>&1; then
    echo "== building kvpool_gpu_check with $(command -v nvcc)" >>"$OUT/kernel-tests.log"
    bins[$name]=$(timeout "$step_timeout" bash -c "$(declare -f build_kernel_check); \
      build_kernel_check" 2>>"$OUT/kernel-tests.log")
  fi
  if [[ -z ${bins[$name]} ]]; then
    missing+=("$name")
    echo "== $name: not found (run scripts/build-gpu.sh on the build machine and carry" \
      "build/gpu-bin)" >>"$machine"
    continue
  fi
  problem=$(load_problem "${bins[$name]}")
  echo "== $name: ${bins[$name]}${problem:+: does not load: $problem}" >>"$machine"
  if [[ -n $problem ]]; then
    bins[$name]=""
    missing+=("$name ($problem)")
  fi
done

# --- the steps --------------------------------------------------------------------------------
step_pid=""
trap '[[ -n $step_pid ]] && kill -TERM "$step_pid" 2>/dev/null; exit 143' TERM
# (TERM for both: a background job of a script ignores INT.)
trap '[[ -n $step_pid ]] && kill -TERM "$step_pid" 2>/dev/null; exit 130' INT
record() {  # STATUS name detail
  results+=("$1|$2|$3")
  printf '%-4s %-26s %s\n' "$1" "$2" "$3"
}

# run_step NAME LOG CMD...: runs CMD under the step's timeout, output appended to LOG.
run_step() {
  local name=$1 log=$2
  shift 2
  local now=$SECONDS
  if ((now >= start_deadline)); then
    incomplete=1
    record SKIP "$name" "not started: past the ${start_deadline} s start deadline (at ${now} s)"
    return
  fi
  local limit=$step_timeout
  ((hard_deadline - now < limit)) && limit=$((hard_deadline - now))
  ((limit < 1)) && limit=1
  local before=0
  [[ -f $log ]] && before=$(wc -l <"$log")
  echo "== $name: $* (timeout ${limit} s)" >>"$log"
  local rc
  # timeout runs the step in a process group of its own (kvpoold and workers included) and
  # passes a TERM or INT on to it: if run.sh itself is stopped, so is the step.
  if ((verbose)); then
    timeout -k 5 "$limit" "$@" > >(tee -a "$log") 2>&1 &
  else
    timeout -k 5 "$limit" "$@" >>"$log" 2>&1 &
  fi
  step_pid=$!
  wait "$step_pid"
  rc=$?
  step_pid=""
  local took=$((SECONDS - now))
  echo "== $name: exit $rc after ${took} s" >>"$log"
  local line
  while IFS= read -r line; do
    failed_lines+=("$name: $line")
  done < <(tail -n "+$((before + 1))" "$log" | grep -a 'FAILED' | grep -av '^== ')
  if ((rc == 0)); then
    record PASS "$name" "${took} s"
  elif ((rc == 124 || rc == 137 && took >= limit)); then
    record FAIL "$name" "timed out after ${limit} s"
  elif ((rc == 77)); then
    if ((rehearse)); then
      record FAIL "$name" "exit 77 ('no usable GPU') in a rehearsal, which needs none"
    elif ((has_gpu)); then
      record FAIL "$name" "exit 77 ('no usable GPU') although this machine has one"
    else
      record SKIP "$name" "no GPU here"
    fi
  elif ((rc > 128)); then
    record FAIL "$name" "crashed: signal $((rc - 128)) ($(kill -l $((rc - 128)) 2>/dev/null))"
  else
    record FAIL "$name" "exit $rc"
  fi
}

# needs NAME STEP...: true when binary NAME is there; else records the steps as failed.
needs() {
  local name=$1 step
  shift
  [[ -n ${bins[$name]} ]] && return 0
  for step in "$@"; do
    if ((has_gpu || rehearse)); then
      record FAIL "$step" "$name is missing or does not load (machine.txt)"
    else
      record SKIP "$step" "no GPU here, and $name is missing"
    fi
  done
  return 1
}

check=${bins[kvpool_gpu_check]}
kverbose=()
((verbose)) && kverbose=(--verbose)
if [[ -n ${KVPOOL_GPU_CHECK_ARGS:-} ]]; then
  read -r -a extra <<<"$KVPOOL_GPU_CHECK_ARGS"
  kverbose+=("${extra[@]}")
  gpu_line+="; kernel matrix narrowed: $KVPOOL_GPU_CHECK_ARGS (KVPOOL_GPU_CHECK_ARGS)"
  echo "== kernel matrix narrowed: $KVPOOL_GPU_CHECK_ARGS (KVPOOL_GPU_CHECK_ARGS)" >>"$machine"
fi
if ((rehearse)); then
  needs kvpool_gpu_check kernel-tests &&
    run_step kernel-tests "$OUT/kernel-tests.log" "$check" --tests --stand-in cpu "${kverbose[@]}"
  record SKIP kernel-bench "rehearsal: the bench needs a GPU"
  vmm=fake-device
  ipc=host
else
  needs kvpool_gpu_check kernel-tests kernel-bench && {
    run_step kernel-tests "$OUT/kernel-tests.log" "$check" --tests "${kverbose[@]}"
    run_step kernel-bench "$OUT/kernel-bench.txt" "$check" --bench
  }
  vmm=cuda-vmm
  ipc=cuda-ipc
fi

daemon=${bins[kvpoold]}
pool_steps=()
for backend in "$vmm" "$ipc"; do
  for dtype in bf16 fp8_e4m3; do pool_steps+=("pool $backend $dtype"); done
done
if needs kvpoold "${pool_steps[@]}" "tier $vmm bf16" "tier $vmm fp8_e4m3"; then
  if needs kvpool_gpu_pool_check "${pool_steps[@]}"; then
    for backend in "$vmm" "$ipc"; do
      for dtype in bf16 fp8_e4m3; do
        run_step "pool $backend $dtype" "$OUT/pool-check.log" "${bins[kvpool_gpu_pool_check]}" \
          --kvpoold "$daemon" --backend "$backend" --dtype "$dtype" \
          --daemon-log "$OUT/kvpoold.log"
      done
    done
  fi
  if needs kvpool_gpu_tier_check "tier $vmm bf16" "tier $vmm fp8_e4m3"; then
    for dtype in bf16 fp8_e4m3; do
      run_step "tier $vmm $dtype" "$OUT/tier-check.log" "${bins[kvpool_gpu_tier_check]}" \
        --kvpoold "$daemon" --backend "$vmm" --dtype "$dtype" --daemon-log "$OUT/kvpoold.log"
    done
  fi
fi

# --- the summary ------------------------------------------------------------------------------
passed=0 failed=0 skipped=0
for r in "${results[@]}"; do
  case "${r%%|*}" in
    PASS) passed=$((passed + 1)) ;;
    FAIL) failed=$((failed + 1)) ;;
    SKIP) skipped=$((skipped + 1)) ;;
  esac
done
if ((failed > 0 || incomplete)); then
  verdict=FAIL
elif ((passed == 0)) && ((!rehearse)); then
  verdict=SKIPPED
elif ((passed == 0)); then
  verdict=FAIL
else
  verdict=PASS
fi
{
  echo "== kvpool GPU check: $gpu_line"
  for r in "${results[@]}"; do
    IFS='|' read -r st name detail <<<"$r"
    printf '%-4s %-26s %s\n' "$st" "$name" "$detail"
  done
  if ((${#failed_lines[@]} > 0)); then
    echo "-- FAILED lines (${#failed_lines[@]}):"
    printf '   %s\n' "${failed_lines[@]:0:20}" | cut -c1-200
    ((${#failed_lines[@]} > 20)) && echo "   ... $((${#failed_lines[@]} - 20)) more in the logs"
  fi
  ((incomplete)) && echo "-- incomplete: steps left unstarted at the start deadline"
  echo "GPU CHECK: $verdict ($passed passed, $failed failed, $skipped skipped) in ${SECONDS} s;" \
    "files in $OUT"
} >"$OUT/summary.txt"
echo
cat "$OUT/summary.txt"
[[ $verdict == FAIL ]] && exit 1
exit 0
