"""The example engine (examples/two_worker_engine.py) runs and its checks pass."""

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("layout", ["layer_major"])
def test_two_worker_engine_reuses_and_matches_recompute(layout):
    script = os.path.join(os.environ["KVPOOL_SOURCE_DIR"], "examples", "two_worker_engine.py")
    out = subprocess.run([sys.executable, script, "--layout", layout], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "worker-b: prompt 56 tokens, 48 reused from the pool" in out.stdout
    assert "OK: worker-b reused" in out.stdout


def test_two_worker_engine_refuses_a_pool_of_another_geometry(daemon):
    # The module's daemon has head dim 8 and 4 tokens per page: refused at once, named.
    script = os.path.join(os.environ["KVPOOL_SOURCE_DIR"], "examples", "two_worker_engine.py")
    out = subprocess.run([sys.executable, script, "--socket", daemon.socket],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "head_dim 8 (needs 32)" in out.stderr
    assert "tokens_per_page 4 (needs 16)" in out.stderr


def test_hybrid_engine_reuses_both_groups_and_matches_recompute():
    script = os.path.join(os.environ["KVPOOL_SOURCE_DIR"], "examples", "hybrid_engine.py")
    out = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert ("worker-b: prompt 56 tokens, 48 reused from the pool (local group blocks [1, 2], "
            "global group blocks [0, 1, 2])") in out.stdout
    assert "OK: worker-b reused worker-a's prefix in both groups" in out.stdout
