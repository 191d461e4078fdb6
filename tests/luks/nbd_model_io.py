#!/usr/bin/python3
"""NBD client for the online reencryption test: random 4 KiB writes and
reads against an export, checked against a model of the device's bytes,
until a stop file appears; then one full read compared with the model.
Prints the number of operations; writes the model to OUT.

usage: nbd_model_io.py URI INITIAL_PLAINTEXT STOP_FILE OUT
"""
import os
import random
import sys

import nbd

uri, initial, stop, out = sys.argv[1:5]
model = bytearray(open(initial, "rb").read())
h = nbd.NBD()
h.connect_uri(uri)
size = h.get_size()
assert size == len(model), (size, len(model))
rng = random.Random(1234)
ops = 0
blocks = size // 4096
while not os.path.exists(stop) or ops < 50:
    b = rng.randrange(blocks)
    off = b * 4096
    if rng.random() < 0.5:
        data = rng.randbytes(4096)
        h.pwrite(data, off)
        model[off:off + 4096] = data
    got = h.pread(4096, off)
    if got != model[off:off + 4096]:
        sys.exit(f"mismatch at {off} after {ops} operations")
    ops += 1
h.flush()
step = 1 << 20
for off in range(0, size, step):
    if h.pread(step, off) != model[off:off + step]:
        sys.exit(f"final mismatch in MiB at {off}")
h.shutdown()
open(out, "wb").write(model)
print(ops)
