"""LocalDaemon: a private kvpoold for tests, examples and benchmarks.

Starts ``kvpoold`` ($KVPOOLD_BIN, else the one on PATH) with a config written into a fresh
temporary directory and its socket there, waits until the daemon logs ``event=ready`` and accepts
connections, and stops it (SIGTERM, then SIGKILL) on exit. Production deployments run kvpoold
under systemd instead (systemd/kvpoold.service).
"""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time


class LocalDaemon:
    def __init__(self, config_yaml, kvpoold=None, extra_args=(), ready_timeout_s=20.0):
        self.kvpoold = kvpoold or os.environ.get("KVPOOLD_BIN") or shutil.which("kvpoold")
        if not self.kvpoold:
            raise FileNotFoundError("kvpoold not found: set KVPOOLD_BIN or put it on PATH")
        self.dir = tempfile.mkdtemp(prefix="kvpool-")
        self.socket = os.path.join(self.dir, "kvpoold.sock")
        self.config = os.path.join(self.dir, "kvpoold.yaml")
        self.log_path = os.path.join(self.dir, "kvpoold.log")
        with open(self.config, "w") as f:
            f.write(config_yaml)
        self._args = [self.kvpoold, "--config", self.config, "--socket", self.socket, *extra_args]
        self._ready_timeout_s = ready_timeout_s
        self.process = None

    def start(self):
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(self._args, stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + self._ready_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"kvpoold exited with {self.process.returncode}:\n{self.log()}")
            if "event=ready" in self.log() and self._can_connect():
                return self
            time.sleep(0.01)
        self.stop()
        raise TimeoutError(f"kvpoold not ready after {self._ready_timeout_s} s:\n{self.log()}")

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def close(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def _can_connect(self):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            try:
                s.connect(self.socket)
                return True
            except OSError:
                return False
