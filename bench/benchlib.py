"""Helpers the benchmark drivers share (imported from the script's own
directory, which Python puts first on sys.path)."""

import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
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


def fio_nbd(uri, name, rw, extra=()):
    """One fio job with the nbd engine, 4 KiB at queue depth 8 unless
    `extra` says otherwise: the job's `read` or `write` section."""
    out = subprocess.run(
        ["fio", "--name=" + name, "--ioengine=nbd", "--uri=" + uri,
         "--rw=" + rw, "--bs=4k", "--iodepth=8", "--output-format=json",
         *extra], check=True, capture_output=True, text=True).stdout
    j = json.loads(out[out.index("{"):])["jobs"][0]
    return j["write" if "write" in rw else "read"]


def sparse(path, size):
    """A sparse file of `size` bytes at `path`."""
    with open(path, "wb") as f:
        f.truncate(size)
    return path


@contextlib.contextmanager
def scratch_dir(prefix, base):
    """A directory under `base` (tmpfs by default in the drivers), removed
    with everything in it afterwards, also when the benchmark fails."""
    d = tempfile.mkdtemp(prefix=prefix, dir=base)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
