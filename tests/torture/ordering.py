#!/usr/bin/env python3
"""Ordering torture test (seed 002): several clients pipeline overlapping
writes, reads, trims-free flushes and unaligned writes against one export and
check every read against a sequential model.

Each client owns a disjoint region of the device and keeps up to QD requests
in flight on one connection. udm promises that overlapping requests take
effect in the order the device received them, so the model is updated at
*issue* time and every read must return the model's bytes as of its issue,
even though the server runs the requests on many threads. Unaligned writes
exercise the server's read-modify-write under the same ordering.

Usage: ordering.py URI RUNS CLIENTS OPS SEED
Exit 0 and print 'N passed, 0 failed' when all runs pass.
"""

import random
import sys
import threading

import nbd

QD = 16


def client(uri, idx, nclients, ops, seed, errors):
    rnd = random.Random(seed * 1000 + idx)
    h = nbd.NBD()
    h.set_strict_mode(0)
    h.connect_uri(uri)
    size = h.get_size()
    region = (size // nclients) // 4096 * 4096
    base = idx * region
    # Read the region's current contents as the model's start.
    model = bytearray(h.pread(region, base))
    pending = {}  # cookie -> (kind, offset, expected bytes or None, buffer)
    try:
        for _ in range(ops):
            while h.aio_in_flight() >= QD:
                h.poll(-1)
                reap(h, pending, base, errors)
            r = rnd.random()
            if r < 0.55:
                # Write: aligned or not, small or large, often overlapping.
                if rnd.random() < 0.3:
                    off = rnd.randrange(0, region - 1)
                    n = rnd.randrange(1, min(9000, region - off) + 1)
                else:
                    off = rnd.randrange(0, region // 4096) * 4096
                    n = min(rnd.choice([4096, 8192, 65536, 262144]), region - off)
                data = rnd.randbytes(n)
                model[off:off + n] = data
                buf = nbd.Buffer.from_bytearray(bytearray(data))
                c = h.aio_pwrite(buf, base + off)
                pending[c] = ("write", off, None, buf)
            elif r < 0.95:
                off = rnd.randrange(0, region - 1)
                n = rnd.randrange(1, min(131072, region - off) + 1)
                buf = nbd.Buffer(n)
                c = h.aio_pread(buf, base + off)
                pending[c] = ("read", off, bytes(model[off:off + n]), buf)
            else:
                c = h.aio_flush()
                pending[c] = ("flush", 0, None, None)
        while h.aio_in_flight() > 0:
            h.poll(-1)
            reap(h, pending, base, errors)
        reap(h, pending, base, errors)
        final = h.pread(region, base)
        if final != bytes(model):
            bad = next(i for i in range(region) if final[i] != model[i])
            errors.append(f"client {idx}: final contents differ from the model at byte {base + bad}")
    except Exception as e:  # a failed request or a dropped connection
        errors.append(f"client {idx}: {e}")
    finally:
        h.shutdown()


def reap(h, pending, base, errors):
    for c in list(pending):
        try:
            done = h.aio_command_completed(c)
        except nbd.Error as e:
            errors.append(f"request {pending[c][0]} at {base + pending[c][1]} failed: {e}")
            del pending[c]
            continue
        if done:
            kind, off, want, buf = pending.pop(c)
            if kind == "read":
                got = buf.to_bytearray()
                if bytes(got) != want:
                    errors.append(f"read at {base + off}+{len(want)} saw stale or torn data")


def main():
    uri, runs, nclients, ops, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    passed = failed = 0
    for run in range(runs):
        errors = []
        threads = [threading.Thread(target=client, args=(uri, i, nclients, ops, seed + run, errors))
                   for i in range(nclients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            failed += 1
            print(f"run {run}: FAILED", file=sys.stderr)
            for e in errors[:10]:
                print("  " + e, file=sys.stderr)
        else:
            passed += 1
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
