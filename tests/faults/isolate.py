#!/usr/bin/python3
"""Failing and slow legs through NBD: only the requests that touch them fail
or wait.

Usage: isolate.py SOCKET CASE EXPORT
  flakey: EXPORT is "0 .. striped 2 8 <good leg> <flakey leg, always down>";
          reads/writes of the good leg's chunks succeed, any request that
          touches the bad leg's chunks gets EIO, the connection goes on.
  delay:  EXPORT is "striped 2 8 <good leg> <leg delayed by >= 2 s>"; reads
          of the good leg finish while reads of the delayed leg are held.
  dust:   EXPORT is "dust <dev> 0 512" with blocks 8..15 bad and enabled.
Prints a one-line summary; exit status 0 = pass.
"""
import errno
import sys
import time

import nbd

SOCK, CASE, EXPORT = sys.argv[1], sys.argv[2], sys.argv[3]
CHUNK = 4096  # striped chunk of 8 sectors


def handle():
    h = nbd.NBD()
    h.set_export_name(EXPORT)
    h.connect_unix(SOCK)
    return h


def expect_eio(what, f):
    try:
        f()
    except nbd.Error as e:
        assert e.errnum == errno.EIO, f"{what}: errno {e.errnum} ({e}), expected EIO"
        return
    raise AssertionError(f"{what} succeeded on a failing leg")


def flakey():
    h = handle()
    good = eio = 0
    for round_ in range(50):
        pat = bytes([round_ % 251 + 1]) * CHUNK
        # chunk 2k is on leg 0 (good), chunk 2k+1 on leg 1 (down).
        k = round_ % 64
        h.pwrite(pat, 2 * k * CHUNK)
        assert h.pread(CHUNK, 2 * k * CHUNK) == pat
        good += 2
        expect_eio("read of the failing leg", lambda: h.pread(CHUNK, (2 * k + 1) * CHUNK))
        expect_eio("write to the failing leg", lambda: h.pwrite(pat, (2 * k + 1) * CHUNK))
        expect_eio("read across both legs", lambda: h.pread(2 * CHUNK, 2 * k * CHUNK))
        eio += 3
    # The connection is still in sync and serving.
    assert h.pread(CHUNK, 0) == bytes([1]) * CHUNK
    h.shutdown()
    # And a new client is served too.
    h = handle()
    h.pread(CHUNK, 0)
    h.shutdown()
    print(f"flakey: {good} good-leg requests ok, {eio} bad-leg requests got EIO")


def delay():
    h = handle()
    done = {}

    def record(name):
        def cb(*_):
            done[name] = time.monotonic()
            return 1  # retire the command
        return cb

    t0 = time.monotonic()
    for k in range(8):
        h.aio_pread(nbd.Buffer(CHUNK), (2 * k + 1) * CHUNK, completion=record(("slow", k)))
    for k in range(8):
        h.aio_pread(nbd.Buffer(CHUNK), 2 * k * CHUNK, completion=record(("fast", k)))
    while sum(1 for n in done if n[0] == "fast") < 8:
        h.poll(-1)
    t_fast = time.monotonic() - t0
    held = 8 - sum(1 for n in done if n[0] == "slow")
    assert held == 8, f"only {held} of the delayed reads were still held"
    while h.aio_in_flight() > 0:
        h.poll(-1)
    t_slow = max(t for n, t in done.items() if n[0] == "slow") - t0
    assert t_fast < t_slow, (t_fast, t_slow)
    h.shutdown()
    print(f"delay: 8 fast-leg reads done in {t_fast:.3f} s while 8 delayed reads "
          f"were held; those done at {t_slow:.3f} s")


def dust():
    h = handle()
    for blk in range(0, 32):
        if 8 <= blk < 16:
            expect_eio(f"read of bad block {blk}", lambda: h.pread(512, blk * 512))
        else:
            h.pread(512, blk * 512)
    # Writing a bad block takes it off the list ("remapped"), then it reads.
    h.pwrite(b"\x5a" * 512, 8 * 512)
    assert h.pread(512, 8 * 512) == b"\x5a" * 512
    expect_eio("read of bad block 9", lambda: h.pread(512, 9 * 512))
    h.shutdown()
    print("dust: bad blocks 8..15 gave EIO, a write remapped block 8")


def dropped():
    """A flakey device down with drop_writes: the write is acknowledged,
    flushed, and not stored."""
    h = handle()
    before = h.pread(CHUNK, 0)
    h.pwrite(b"\xee" * CHUNK, 0)
    h.flush()
    assert h.pread(CHUNK, 0) == before, "a dropped write was stored"
    h.shutdown()
    print("flakey drop_writes: write and flush acknowledged, nothing stored")


def kept():
    h = handle()
    h.pwrite(b"\xee" * CHUNK, 0)
    h.flush()
    assert h.pread(CHUNK, 0) == b"\xee" * CHUNK
    h.shutdown()
    print("flakey up again: writes stored")


{"flakey": flakey, "delay": delay, "dust": dust, "dropped": dropped, "kept": kept}[CASE]()
