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
from typing import Optional, Sequence


class LocalDaemon:
    """A kvpoold of its own in a temporary directory; a context manager (start, then close)."""

    def __init__(self, config_yaml: str, kvpoold: Optional[str] = None,
                 extra_args: Sequence[str] = (), ready_timeout_s: float = 20.0) -> None:
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
        self.process: Optional[subprocess.Popen] = None

    def start(self) -> "LocalDaemon":
        """Starts kvpoold and waits until it serves; on failure stops it, removes the temporary
        directory and raises (RuntimeError: it exited; TimeoutError: it never became ready),
        with the daemon's log in the message."""
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(self._args, stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + self._ready_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                message = f"kvpoold exited with {self.process.returncode}:\n{self.log()}"
                self.close()
                raise RuntimeError(message)
            if "event=ready" in self.log() and self._can_connect():
                return self
            time.sleep(0.01)
        message = f"kvpoold not ready after {self._ready_timeout_s} s:\n{self.log()}"
        self.close()
        raise TimeoutError(message)

    def log(self) -> str:
        """The daemon's log so far ("" once the directory is gone)."""
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s; the directory stays (its log with it)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def close(self) -> None:
        """Stops the daemon and removes its temporary directory."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "LocalDaemon":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _can_connect(self) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            try:
                s.connect(self.socket)
                return True
            except OSError:
                return False
