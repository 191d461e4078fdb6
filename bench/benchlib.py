"""Helpers the benchmark drivers share (imported from the script's own
directory, which Python puts first on sys.path)."""

import socket
import subprocess
import time


def sh(cmd, **kw):
    """Run a command; a failure stops the benchmark."""
    return subprocess.run(cmd, check=True, **kw)


def wait_socket(path, proc, timeout=120):
    """Wait until a server listens on the Unix socket `path`; fail early if
    its process `proc` exits first."""
    t = time.time()
    while time.time() - t < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early: {proc.args}")
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            s.close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"server did not come up: {proc.args}")
