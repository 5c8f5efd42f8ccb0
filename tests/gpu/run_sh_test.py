"""tests/gpu/run.sh, proved without a GPU.

Stand-in binaries (a shell script under each binary's name) and a stand-in nvidia-smi on PATH
pass, fail, exit 77, hang and crash as a plan says; each test runs run.sh over them and checks its
exit status, the files under $OUT, the summary's lines and the time it took. Then the real kernel
check with the CPU kernels standing in for CUDA must fail when a kernel is made wrong by one, and
a rehearsal runs run.sh over the real binaries (CPU stand-ins, fake-device and host pools).

Run by ctest (gpu_run_sh.harness, gpu_run_sh.rehearsal), which sets KVPOOL_GPU_CHECK_BIN,
KVPOOL_TEST_KVPOOLD, KVPOOL_TEST_POOL_CHECK and KVPOOL_TEST_TIER_CHECK to the built binaries.
"""

import os
import pathlib
import re
import stat
import subprocess
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUN_SH = ROOT / "tests" / "gpu" / "run.sh"
BINARIES = ["kvpool_gpu_check", "kvpoold", "kvpool_gpu_pool_check", "kvpool_gpu_tier_check"]
ALL_STEPS = [
    "kernel-tests",
    "kernel-bench",
    "pool cuda-vmm bf16",
    "pool cuda-vmm fp8_e4m3",
    "pool cuda-ipc bf16",
    "pool cuda-ipc fp8_e4m3",
    "tier cuda-vmm bf16",
    "tier cuda-vmm fp8_e4m3",
]

# One script for every binary: the step it was asked to run follows from its arguments, and the
# plan (lines "step=pass|fail|many-fails|exit77|hang|stubborn|crash", "load:<binary>=noload")
# says what to do; stubborn hangs with SIGTERM ignored.
STAND_IN = r"""#!/usr/bin/env bash
me=$(basename "$0")
pick() {  # the plan's line "step=behaviour", else pass
  local line
  while IFS= read -r line; do
    [[ ${line%%=*} == "$1" ]] && { echo "${line#*=}"; return; }
  done <"$STANDIN_PLAN"
  echo pass
}
if [[ ${1:-} == --version ]]; then
  [[ $(pick "load:$me") == noload ]] && { echo "error while loading shared libraries" >&2; exit 127; }
  echo "$me (stand-in)"; exit 0
fi
backend="" dtype="" log="" step=""
while (($#)); do
  case "$1" in
    --tests) step=kernel-tests ;;
    --bench) step=kernel-bench ;;
    --backend) backend=$2; shift ;;
    --dtype) dtype=$2; shift ;;
    --daemon-log) log=$2; shift ;;
  esac
  shift
done
case "$me" in
  kvpool_gpu_pool_check) step="pool $backend $dtype" ;;
  kvpool_gpu_tier_check) step="tier $backend $dtype" ;;
esac
[[ -n $log ]] && echo "kvpoold stand-in log for $step" >>"$log"
echo "stand-in $me: $step"
case "$(pick "$step")" in
  pass) echo "ok     $step"; [[ $step == kernel-bench ]] && echo "bf16 1 1024 table row"; exit 0 ;;
  fail) echo "FAILED $step: max|err|=1.0"; exit 1 ;;
  many-fails) for i in $(seq 1 30); do echo "FAILED $step case $i"; done; exit 1 ;;
  exit77) echo "no usable GPU"; exit 77 ;;
  hang) sleep 1000 ;;
  stubborn) trap '' TERM; sleep 1000 ;;
  crash) kill -SEGV $$ ;;
esac
"""

NVIDIA_SMI = r"""#!/usr/bin/env bash
if [[ ${STANDIN_GPU:-0} == 1 ]]; then
  echo "GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)"
  exit 0
fi
echo "No devices were found"
exit 6
"""


def _write_exec(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


class Harness:
    def __init__(self, tmp):
        self.tmp = tmp
        self.bin = tmp / "bin"
        self.path_dir = tmp / "path"
        self.out = tmp / "out"
        self.plan = tmp / "plan.json"
        self.bin.mkdir()
        self.path_dir.mkdir()
        for name in BINARIES:
            _write_exec(self.bin / name, STAND_IN)
        _write_exec(self.path_dir / "nvidia-smi", NVIDIA_SMI)

    def run(self, plan=None, gpu=True, args=(), timeout=None, start_deadline=None, deadline=None,
            bin_dir=None):
        self.plan.write_text("".join(f"{k}={v}\n" for k, v in (plan or {}).items()))
        env = dict(os.environ)
        env["PATH"] = f"{self.path_dir}:{env['PATH']}"
        env["OUT"] = str(self.out)
        env["KVPOOL_GPU_BIN"] = str(bin_dir or self.bin)
        env["STANDIN_PLAN"] = str(self.plan)
        env["STANDIN_GPU"] = "1" if gpu else "0"
        for key, value in (("KVPOOL_GPU_STEP_TIMEOUT", timeout),
                           ("KVPOOL_GPU_START_DEADLINE", start_deadline),
                           ("KVPOOL_GPU_DEADLINE", deadline)):
            if value is not None:
                env[key] = str(value)
        t0 = time.monotonic()
        p = subprocess.run(["bash", str(RUN_SH), *args], env=env, capture_output=True, text=True,
                           timeout=600, stdin=subprocess.DEVNULL)
        self.elapsed = time.monotonic() - t0
        self.stdout = p.stdout
        return p.returncode

    def summary(self):
        return (self.out / "summary.txt").read_text().splitlines()

    def status(self):
        """step -> (STATUS, detail) from the summary's step lines."""
        result = {}
        for line in self.summary():
            m = re.match(r"^(PASS|FAIL|SKIP) (.{26}) (.*)$", line)
            if m:
                result[m.group(2).strip()] = (m.group(1), m.group(3))
        return result


@pytest.fixture
def h(tmp_path):
    return Harness(tmp_path)


def check_files_and_summary(h):
    files = sorted(p.name for p in h.out.iterdir())
    assert len(files) <= 8, files
    assert "summary.txt" in files and "machine.txt" in files
    lines = h.summary()
    assert len(lines) <= 40, lines
    assert lines[-1].startswith("GPU CHECK: ")
    # The summary is also the end of what run.sh prints (the part a device call reads back).
    assert h.stdout.rstrip().endswith(lines[-1])
    return files


def test_every_step_passes(h):
    assert h.run() == 0
    files = check_files_and_summary(h)
    assert files == sorted(["summary.txt", "machine.txt", "kernel-tests.log", "kernel-bench.txt",
                            "pool-check.log", "tier-check.log", "kvpoold.log"])
    status = h.status()
    assert list(status) == ALL_STEPS
    assert all(s == "PASS" for s, _ in status.values()), status
    assert re.match(r"GPU CHECK: PASS \(8 passed, 0 failed, 0 skipped\)", h.summary()[-1])
    assert "bf16 1 1024 table row" in (h.out / "kernel-bench.txt").read_text()
    assert "NVIDIA H200" in h.summary()[0]
    daemon_log = (h.out / "kvpoold.log").read_text()
    for step in ALL_STEPS[2:]:
        assert f"kvpoold stand-in log for {step}" in daemon_log
    machine = (h.out / "machine.txt").read_text()
    for name in BINARIES:
        assert f"== {name}: {h.bin}" in machine


def test_a_failed_step_fails_the_run_and_its_failed_lines_reach_the_summary(h):
    assert h.run({"pool cuda-ipc bf16": "fail"}) == 1
    check_files_and_summary(h)
    status = h.status()
    assert status["pool cuda-ipc bf16"] == ("FAIL", "exit 1")
    assert sum(s == "PASS" for s, _ in status.values()) == 7
    assert "   pool cuda-ipc bf16: FAILED pool cuda-ipc bf16: max|err|=1.0" in h.summary()
    assert h.summary()[-1].startswith("GPU CHECK: FAIL (7 passed, 1 failed, 0 skipped)")


def test_exit_77_beside_a_gpu_is_a_failure(h):
    assert h.run({"kernel-tests": "exit77", "pool cuda-vmm bf16": "exit77"}) == 1
    status = h.status()
    assert status["kernel-tests"][0] == "FAIL"
    assert "77" in status["kernel-tests"][1] and "has one" in status["kernel-tests"][1]
    assert status["pool cuda-vmm bf16"][0] == "FAIL"


def test_exit_77_without_a_gpu_skips_and_the_run_passes(h):
    plan = {step: "exit77" for step in ALL_STEPS}
    assert h.run(plan, gpu=False) == 0
    check_files_and_summary(h)
    status = h.status()
    assert all(v == ("SKIP", "no GPU here") for v in status.values()), status
    assert h.summary()[-1].startswith("GPU CHECK: SKIPPED (0 passed, 0 failed, 8 skipped)")
    assert "No devices were found" in h.summary()[0]


def test_a_hung_step_is_cut_off_and_the_others_still_run(h):
    assert h.run({"kernel-tests": "hang", "tier cuda-vmm bf16": "hang"}, timeout=2) == 1
    status = h.status()
    assert status["kernel-tests"] == ("FAIL", "timed out after 2 s")
    assert status["tier cuda-vmm bf16"] == ("FAIL", "timed out after 2 s")
    assert sum(s == "PASS" for s, _ in status.values()) == 6
    # Two cut-off steps of 2 s; the rest are quick. No stand-in may outlive the run.
    assert h.elapsed < 30, h.elapsed
    assert _no_stand_in_left(), "a hung stand-in was left running"


def _no_stand_in_left():
    for _ in range(50):
        left = subprocess.run(["pgrep", "-f", "sleep 1000"], capture_output=True, text=True)
        if left.stdout.strip() == "":
            return True
        time.sleep(0.1)
    return False


def test_a_step_that_ignores_sigterm_is_killed(h):
    assert h.run({"pool cuda-vmm bf16": "stubborn"}, timeout=2) == 1
    assert h.status()["pool cuda-vmm bf16"] == ("FAIL", "timed out after 2 s")
    assert h.elapsed >= 7  # 2 s, then SIGKILL 5 s after the SIGTERM it ignored
    assert _no_stand_in_left()


def test_stopping_run_sh_stops_the_running_step(h):
    h.plan.write_text("kernel-tests=hang\n")
    env = dict(os.environ, PATH=f"{h.path_dir}:{os.environ['PATH']}", OUT=str(h.out),
               KVPOOL_GPU_BIN=str(h.bin), STANDIN_PLAN=str(h.plan), STANDIN_GPU="1")
    p = subprocess.Popen(["bash", str(RUN_SH)], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and subprocess.run(
            ["pgrep", "-f", "sleep 1000"], capture_output=True).returncode != 0:
        time.sleep(0.1)
    p.terminate()
    assert p.wait(timeout=20) == 143
    assert _no_stand_in_left(), "the step outlived run.sh"


def test_exit_77_in_a_rehearsal_is_a_failure(h):
    plan = {step: "exit77" for step in ALL_STEPS}
    plan.update({"pool fake-device bf16": "exit77", "pool host bf16": "exit77"})
    assert h.run(plan, gpu=False, args=["--rehearse"]) == 1
    status = h.status()
    assert status["kernel-tests"][0] == "FAIL" and "rehearsal" in status["kernel-tests"][1]
    assert status["pool fake-device bf16"][0] == "FAIL"
    assert h.summary()[-1].startswith("GPU CHECK: FAIL")


def test_a_narrowed_kernel_matrix_is_said(h, monkeypatch):
    monkeypatch.setenv("KVPOOL_GPU_CHECK_ARGS", "--dtype int8")
    assert h.run() == 0
    assert "kernel matrix narrowed: --dtype int8" in h.summary()[0]


def test_a_crash_is_reported_with_its_signal(h):
    assert h.run({"pool cuda-vmm fp8_e4m3": "crash"}) == 1
    assert h.status()["pool cuda-vmm fp8_e4m3"] == ("FAIL", "crashed: signal 11 (SEGV)")


def test_no_step_starts_after_the_start_deadline_and_the_run_ends_in_time(h):
    plan = {step: "hang" for step in ALL_STEPS}
    assert h.run(plan, timeout=2, start_deadline=4, deadline=6) == 1
    status = h.status()
    # Steps that started were cut off; from the first one that did not start, none did.
    assert list(status) == ALL_STEPS
    started = [step for step in ALL_STEPS if status[step][0] == "FAIL"]
    assert started == ALL_STEPS[:len(started)] and 1 <= len(started) <= 3, status
    assert all(re.fullmatch(r"timed out after [12] s", status[s][1]) for s in started), status
    for step in ALL_STEPS[len(started):]:
        assert status[step][0] == "SKIP" and "start deadline" in status[step][1], status
    assert "-- incomplete: steps left unstarted at the start deadline" in h.summary()
    assert h.elapsed < 20, h.elapsed


def test_the_hard_deadline_shortens_a_steps_timeout(h):
    assert h.run({"kernel-tests": "hang"}, timeout=60, deadline=3) == 1
    # What is left of the 3 s once the machine and binaries are checked.
    assert re.fullmatch(r"timed out after [123] s", h.status()["kernel-tests"][1])
    assert h.elapsed < 20, h.elapsed


def test_a_binary_that_does_not_load_fails_its_steps_with_the_reason(h):
    assert h.run({"load:kvpool_gpu_tier_check": "noload"}) == 1
    status = h.status()
    for step in ("tier cuda-vmm bf16", "tier cuda-vmm fp8_e4m3"):
        assert status[step] == ("FAIL", "kvpool_gpu_tier_check is missing or does not load "
                                        "(machine.txt)")
    assert sum(s == "PASS" for s, _ in status.values()) == 6
    machine = (h.out / "machine.txt").read_text()
    assert re.search(r"kvpool_gpu_tier_check: .*does not load: .*--version' exited 127", machine)


def test_missing_binaries_without_a_gpu_skip(h, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    env_path = os.environ["PATH"]
    # No nvcc either (it may be in /usr/local/bin or /usr/local/cuda/bin): nothing is built here.
    os.environ["PATH"] = "/usr/bin:/bin"
    try:
        assert h.run(gpu=False, bin_dir=empty) == 0
    finally:
        os.environ["PATH"] = env_path
    assert all(s == "SKIP" for s, _ in h.status().values())


def test_the_summary_keeps_twenty_failed_lines(h):
    assert h.run({"kernel-tests": "many-fails", "pool cuda-vmm bf16": "many-fails"}) == 1
    check_files_and_summary(h)
    lines = h.summary()
    failed = [line for line in lines if line.startswith("   ") and "FAILED" in line]
    assert len(failed) == 20
    assert "   ... 40 more in the logs" in lines
    log = (h.out / "kernel-tests.log").read_text()
    assert log.count("FAILED kernel-tests case") == 30


def test_bad_usage(h):
    assert h.run(args=["--bogus"]) == 2


# The real kernel check, with the CPU kernels standing in for CUDA -------------------------------

def _gpu_check_bin():
    path = os.environ.get("KVPOOL_GPU_CHECK_BIN")
    if not path:
        pytest.skip("KVPOOL_GPU_CHECK_BIN is not set (ctest sets it)")
    return path


@pytest.mark.parametrize("kernel", ["decode", "extend", "append", "copy", "convert"])
def test_an_injected_off_by_one_fails_the_kernel_matrix(kernel):
    # A share of the matrix (KVPOOL_GPU_CHECK_SHARE, e.g. "--dtype fp16") shows the fault; the
    # whole matrix runs without one in gpu_check.cpu_stand_in.
    share = os.environ.get("KVPOOL_GPU_CHECK_SHARE", "--dtype fp16").split()
    p = subprocess.run([_gpu_check_bin(), "--tests", "--stand-in", "cpu", *share,
                        "--inject-fault", kernel], capture_output=True, text=True, timeout=600)
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    failed = [line for line in p.stdout.splitlines() if line.startswith("FAILED")]
    assert failed, p.stdout[-2000:]
    # Only the broken kernel's comparisons fail (copy's check starts from the CPU's bytes, so a
    # wrong append leaves it alone).
    assert all(line.split()[1] == kernel for line in failed), failed[:5]
    assert re.search(r"^GPU TESTS FAILED: \d+ of \d+ comparisons$", p.stdout, re.M)


def test_the_stand_in_usage_errors():
    check = _gpu_check_bin()
    assert subprocess.run([check, "--bench", "--stand-in", "cpu"],
                          capture_output=True).returncode == 2
    assert subprocess.run([check, "--inject-fault", "decode"], capture_output=True).returncode == 2
    assert subprocess.run([check, "--tests", "--stand-in", "cpu", "--inject-fault", "bogus"],
                          capture_output=True).returncode == 2


# A rehearsal over the real binaries --------------------------------------------------------------

def test_rehearsal_over_the_real_binaries(h, tmp_path):
    real = {
        "kvpool_gpu_check": os.environ.get("KVPOOL_GPU_CHECK_BIN"),
        "kvpoold": os.environ.get("KVPOOL_TEST_KVPOOLD"),
        "kvpool_gpu_pool_check": os.environ.get("KVPOOL_TEST_POOL_CHECK"),
        "kvpool_gpu_tier_check": os.environ.get("KVPOOL_TEST_TIER_CHECK"),
    }
    if not all(real.values()):
        pytest.skip("the real binaries' paths are not set (ctest sets them)")
    links = tmp_path / "real"
    links.mkdir()
    for name, target in real.items():
        (links / name).symlink_to(target)
    os.environ.setdefault("KVPOOL_GPU_CHECK_ARGS",
                          os.environ.get("KVPOOL_GPU_CHECK_SHARE", "--dtype fp16"))
    rc = h.run(gpu=False, args=["--rehearse"], bin_dir=links)
    lines = h.summary()
    assert rc == 0, "\n".join(lines)
    check_files_and_summary(h)
    status = h.status()
    assert status["kernel-tests"][0] == "PASS"
    assert status["kernel-bench"] == ("SKIP", "rehearsal: the bench needs a GPU")
    for step in ("pool fake-device bf16", "pool fake-device fp8_e4m3", "pool host bf16",
                 "pool host fp8_e4m3", "tier fake-device bf16", "tier fake-device fp8_e4m3"):
        assert status[step][0] == "PASS", (step, lines)
    assert lines[-1].startswith("GPU CHECK: PASS (7 passed, 0 failed, 1 skipped)")
    assert re.search(r"^GPU TESTS PASSED: \d+ comparisons$",
                     (h.out / "kernel-tests.log").read_text(), re.M)
    daemon_log = (h.out / "kvpoold.log").read_text()
    assert "== pool check fake-device bf16" in daemon_log and "event=ready" in daemon_log
