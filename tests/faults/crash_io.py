#!/usr/bin/python3
"""Writer and checker for the SIGKILL crash test.

Usage: crash_io.py write SOCKET EXPORT STATE SEED
       crash_io.py verify SOCKET EXPORT STATE [flushed]

The device is split into 4 KiB blocks. A block's content is a header
(magic, block number, generation) followed by bytes derived from
(block, generation), so a read tells which write it came from, and whether
it is whole.

write: writes random blocks (8 in flight, never two to one block) and sends
a FLUSH every 32 completed writes, until the server dies under it. It keeps
per block: `durable` (the newest generation acknowledged before a FLUSH
that completed), `acked` (newest acknowledged), `issued` (newest sent) and
whether a write was still in flight when the connection died. It saves all
that to STATE (JSON) and prints one line of counts.

verify: reads every block and checks, against STATE:
  - every block with a durable generation and no write in flight at the
    kill holds exactly its acknowledged generation, intact (udm keeps no
    cache of its own, so process death loses nothing acknowledged; this
    includes every write acknowledged before the last completed FLUSH);
  - a block with a write in flight at the kill holds its acknowledged or
    its in-flight generation, or is torn (an unfinished write may leave
    anything) -- counted, not failed.
With `flushed` (a device that keeps metadata in memory until a FLUSH, such
as thin, or data, such as dm-integrity's J-mode journal), a block need
only hold its durable generation or a later acknowledged one (any of
them: the device may have made some durable on its own), or read zeros
if it had no durable generation: a write acknowledged after the last
completed FLUSH may be lost.
Prints counts; exit status 0 = pass.
"""
import json
import os
import random
import struct
import sys

import nbd

MODE, SOCK, EXPORT, STATE = sys.argv[1:5]
BLOCK = 4096
MAGIC = 0x55444D43  # "UDMC"
QD = 8
FLUSH_EVERY = 32


def content(block, gen):
    head = struct.pack("<IIQ", MAGIC, block, gen)
    return head + random.Random(block * 1_000_003 + gen).randbytes(BLOCK - len(head))


def decode(block, data):
    """The generation `data` is an intact copy of, 0 for never written
    (zeros), None for anything else (torn or foreign)."""
    if data == bytes(BLOCK):
        return 0
    magic, b, gen = struct.unpack_from("<IIQ", data)
    if magic != MAGIC or b != block or gen == 0:
        return None
    return gen if data == content(block, gen) else None


def load(nblocks):
    if os.path.exists(STATE):
        with open(STATE) as f:
            return json.load(f)
    return {
        "durable": [0] * nblocks,
        "acked": [0] * nblocks,
        "issued": [0] * nblocks,
        "pending": [False] * nblocks,
        "gen": 0,
    }


def connect():
    h = nbd.NBD()
    h.set_export_name(EXPORT)
    h.connect_unix(SOCK)
    return h


def write(seed):
    try:
        h = connect()
        nblocks = h.get_size() // BLOCK
    except nbd.Error:
        # Killed before this client got in: nothing was written.
        print("writer: 0 writes acknowledged, 0 flushes completed, 0 writes in flight "
              "at the kill (the server died before the connection)")
        return
    st = load(nblocks)
    # Tell the test the writes are starting (it kills the server after a
    # random delay from here).
    open(STATE + ".ready", "w").close()
    # Blocks left with a torn in-flight write are rewritten before use:
    # their expected generation is whatever the last verify accepted.
    st["pending"] = [False] * nblocks
    rng = random.Random(seed)
    inflight = {}  # cookie -> (block, gen)
    acked_since_flush = 0
    flush_cookie = None
    flush_snapshot = None
    writes = flushes = 0
    busy = set()
    try:
        while True:
            while len(inflight) < QD:
                b = rng.randrange(nblocks)
                if b in busy:
                    continue
                st["gen"] += 1
                g = st["gen"]
                c = h.aio_pwrite(content(b, g), b * BLOCK)
                inflight[c] = (b, g)
                busy.add(b)
                st["issued"][b] = g
            if flush_cookie is None and acked_since_flush >= FLUSH_EVERY:
                # Everything acknowledged so far is covered by this flush.
                flush_snapshot = list(st["acked"])
                flush_cookie = h.aio_flush()
                acked_since_flush = 0
            h.poll(-1)
            for c in list(inflight):
                if h.aio_command_completed(c):
                    b, g = inflight.pop(c)
                    busy.discard(b)
                    st["acked"][b] = g
                    writes += 1
                    acked_since_flush += 1
            if flush_cookie is not None and h.aio_command_completed(flush_cookie):
                st["durable"] = flush_snapshot
                flush_cookie = None
                flushes += 1
    except nbd.Error:
        pass  # the server was killed
    for b, g in inflight.values():
        st["pending"][b] = True
    with open(STATE + ".tmp", "w") as f:
        json.dump(st, f)
    os.replace(STATE + ".tmp", STATE)
    print(f"writer: {writes} writes acknowledged, {flushes} flushes completed, "
          f"{len(inflight)} writes in flight at the kill")


def verify(flushed_only):
    h = connect()
    nblocks = h.get_size() // BLOCK
    st = load(nblocks)
    durable_ok = acked_ok = pending = torn = lost = 0
    bad = []
    step = 256
    for first in range(0, nblocks, step):
        n = min(step, nblocks - first)
        data = h.pread(n * BLOCK, first * BLOCK)
        for i in range(n):
            b = first + i
            got = decode(b, data[i * BLOCK:(i + 1) * BLOCK])
            if st["pending"][b]:
                pending += 1
                if got is None:
                    torn += 1
                    # What the next round expects is unknown: forget it.
                    st["acked"][b] = st["durable"][b] = st["issued"][b] = 0
                elif got != 0 and got not in (st["acked"][b], st["issued"][b]) and not (
                        flushed_only and st["durable"][b] <= got < st["acked"][b]):
                    bad.append((b, "in-flight block holds neither its acked nor its "
                                   f"in-flight generation: {got}"))
                else:
                    st["acked"][b] = st["durable"][b] = got
                continue
            want = st["acked"][b]
            if want == 0:
                continue  # never written: whatever the cipher makes of zeros
            durable = st["durable"][b]
            # Generations of one block are written one at a time, so any
            # intact one from `durable` up to `want` was acknowledged.
            if flushed_only and got != want and (got == 0 and durable == 0
                                                 or got and durable <= got < want):
                lost += 1  # acknowledged after the last FLUSH: may be lost
                st["acked"][b] = got
                continue
            if got != want:
                bad.append((b, f"holds generation {got}, acknowledged {want} "
                               f"(durable {st['durable'][b]})"))
                continue
            if want == st["durable"][b]:
                durable_ok += 1
            else:
                acked_ok += 1
    h.shutdown()
    if bad:
        for b, why in bad[:20]:
            print(f"block {b}: {why}", file=sys.stderr)
        sys.exit(f"{len(bad)} blocks lost acknowledged data")
    st["pending"] = [False] * nblocks
    st["durable"] = list(st["acked"])
    with open(STATE + ".tmp", "w") as f:
        json.dump(st, f)
    os.replace(STATE + ".tmp", STATE)
    print(f"verify: {durable_ok} blocks flushed-and-intact, {acked_ok} more acknowledged "
          f"after the last flush and intact, {pending} had a write in flight "
          f"({torn} torn)" + (f", {lost} unflushed writes lost" if flushed_only else ""))


if MODE == "write":
    write(int(sys.argv[5]))
else:
    verify(sys.argv[5:6] == ["flushed"])
