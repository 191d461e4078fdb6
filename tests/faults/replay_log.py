#!/usr/bin/python3
"""An independent reader of dm-log-writes logs, written from the kernel's
struct definitions (drivers/md/dm-log-writes.c: log_write_super and
log_write_entry, little-endian; one header block of `sectorsize` bytes
per entry, data after it unless the entry is a discard), to cross-check
udm's writer and `udm replay-log`.

Usage: replay_log.py LOG DEVICE
Replays every entry onto DEVICE (writes, discards as zeros) and prints
`entries flushes fua discards marks`.
"""
import struct
import sys

LOG, DEV = sys.argv[1], sys.argv[2]
FLUSH, FUA, DISCARD, MARK = 1, 2, 4, 8

with open(LOG, "rb") as log, open(DEV, "r+b") as dev:
    magic, version, nr, ss = struct.unpack("<QQQI", log.read(28))
    assert magic == 0x6A736677736872, hex(magic)
    assert version == 1 and ss in (512, 1024, 2048, 4096), (version, ss)
    pos = ss
    counts = [0, 0, 0, 0, 0]
    for _ in range(nr):
        log.seek(pos)
        block = log.read(ss)
        sector, nr_sectors, flags, data_len = struct.unpack_from("<QQQQ", block)
        counts[0] += 1
        pos += ss
        if flags & MARK:
            counts[4] += 1
            assert data_len < ss - 32
        if flags & FLUSH:
            counts[1] += 1
        if flags & FUA:
            counts[2] += 1
        if flags & DISCARD:
            counts[3] += 1
            dev.seek(sector * ss)
            dev.write(bytes(nr_sectors * ss))
            continue
        if nr_sectors:
            data = log.read(nr_sectors * ss)
            assert len(data) == nr_sectors * ss, "log ends inside an entry"
            dev.seek(sector * ss)
            dev.write(data)
            pos += nr_sectors * ss
    print(*counts)
