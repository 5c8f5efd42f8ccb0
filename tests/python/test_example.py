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
