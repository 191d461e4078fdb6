#!/usr/bin/python3
"""Hostile and broken NBD clients against a running udm server.

Usage: bad_input.py SOCKET CASE
Exports expected: "rw" (48 MiB, writable), "ro" (read-only), "b4k" (8 MiB,
4096-byte logical blocks). Every case asserts the protocol's answer and
then that the server still serves a fresh client. Exit status 0 = pass.
"""
import errno
import os
import socket
import struct
import sys
import threading

import nbd

SOCK = sys.argv[1]
CASE = sys.argv[2]
MiB = 1 << 20
IHAVEOPT = 0x49484156454F5054
REQ_MAGIC = 0x25609513
CMD_READ, CMD_WRITE, CMD_DISC, CMD_FLUSH, CMD_TRIM = 0, 1, 2, 3, 4
NBD_EPERM, NBD_EINVAL, NBD_ENOSPC, NBD_ENOTSUP = 1, 22, 28, 95


def handle(export="rw"):
    h = nbd.NBD()
    h.set_strict_mode(0)  # let the server, not libnbd, judge each request
    h.set_export_name(export)
    h.connect_unix(SOCK)
    return h


def expect_errno(fn, want, what):
    try:
        fn()
    except nbd.Error as e:
        assert e.errnum == want, f"{what}: got errno {e.errnum} ({e}), want {want}"
        return
    raise AssertionError(f"{what}: succeeded, want errno {want}")


def recvall(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise EOFError(f"server closed after {len(b)} of {n} bytes")
        b += c
    return b


def raw_connect(export=b"rw"):
    """Minimal fixed-newstyle client without structured replies."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(20)
    s.connect(SOCK)
    magic, opt, hflags = struct.unpack(">QQH", recvall(s, 18))
    assert magic == 0x4E42444D41474943 and opt == IHAVEOPT, "bad greeting"
    assert hflags & 3 == 3, f"handshake flags {hflags:#x}"
    s.sendall(struct.pack(">I", 3))
    data = struct.pack(">I", len(export)) + export + struct.pack(">H", 0)
    s.sendall(struct.pack(">QII", IHAVEOPT, 7, len(data)) + data)
    size = None
    while True:
        _, _, typ, ln = struct.unpack(">QIII", recvall(s, 20))
        payload = recvall(s, ln)
        assert not typ & 0x80000000, f"GO failed: {typ:#x} {payload!r}"
        if typ == 3 and payload[:2] == b"\0\0":
            size, _ = struct.unpack(">QH", payload[2:12])
        if typ == 1:
            return s, size


def send_req(s, cmd, flags=0, cookie=1, offset=0, length=0, payload=b""):
    s.sendall(struct.pack(">IHHQQI", REQ_MAGIC, flags, cmd, cookie, offset, length) + payload)


def simple_reply(s):
    magic, err, cookie = struct.unpack(">IIQ", recvall(s, 16))
    assert magic == 0x67446698, f"reply magic {magic:#x}"
    return err, cookie


def assert_closed(s):
    """The server hung up on this client (EOF or reset, within 10 s)."""
    s.settimeout(10)
    try:
        while True:
            if not s.recv(65536):
                return
    except ConnectionResetError:
        return


def alive():
    """A fresh client can write and read back."""
    h = handle("rw")
    pat = os.urandom(4096)
    h.pwrite(pat, 12288)
    assert h.pread(4096, 12288) == pat, "server returned wrong data"
    h.flush()
    h.shutdown()


def case_out_of_range():
    h = handle()
    size = h.get_size()
    expect_errno(lambda: h.pread(512, size), errno.EINVAL, "read at end")
    expect_errno(lambda: h.pread(1024, size - 512), errno.EINVAL, "read across end")
    expect_errno(lambda: h.pwrite(b"x" * 512, size), errno.ENOSPC, "write at end")
    expect_errno(lambda: h.pwrite(b"x" * 1024, size - 512), errno.ENOSPC, "write across end")
    expect_errno(lambda: h.trim(4096, size), errno.EINVAL, "trim past end")
    expect_errno(lambda: h.zero(4096, size), errno.ENOSPC, "zero past end")
    expect_errno(lambda: h.pread(512, (1 << 64) - 256), errno.EINVAL, "offset overflow")
    # Zero-length requests are harmless no-ops.
    assert h.pread(0, 0) == b""
    h.pwrite(b"", 0)
    # The connection is still usable.
    h.pwrite(b"y" * 512, size - 512)
    assert h.pread(512, size - 512) == b"y" * 512
    h.shutdown()


def case_oversize():
    h = handle()
    assert h.get_block_size(nbd.SIZE_MAXIMUM) == 32 * MiB
    assert len(h.pread(32 * MiB, 0)) == 32 * MiB, "a maximal read must work"
    expect_errno(lambda: h.pread(32 * MiB + 1, 0), errno.EINVAL, "read over 32 MiB")
    # A 33 MiB write: the payload is read and discarded, EINVAL, and the
    # same connection keeps working.
    expect_errno(lambda: h.pwrite(b"z" * (33 * MiB), 0), errno.EINVAL, "write over 32 MiB")
    h.pwrite(b"k" * 4096, 0)
    assert h.pread(4096, 0) == b"k" * 4096
    h.shutdown()
    # An absurd length (far past what we discard) disconnects that client only.
    s, _ = raw_connect()
    send_req(s, CMD_WRITE, length=0xFFFFFFFF)
    assert_closed(s)


def case_unknown_command_and_flags():
    s, _ = raw_connect()
    send_req(s, 42, cookie=7)
    assert simple_reply(s) == (NBD_EINVAL, 7), "unknown command"
    send_req(s, CMD_READ, flags=1 << 9, cookie=8, length=512)
    assert simple_reply(s) == (NBD_EINVAL, 8), "unknown flag on READ"
    send_req(s, CMD_READ, flags=1 << 2, cookie=9, length=512)
    assert simple_reply(s) == (NBD_EINVAL, 9), "DF without structured replies"
    send_req(s, CMD_WRITE, flags=1 << 1, cookie=10, length=512, payload=b"q" * 512)
    assert simple_reply(s) == (NBD_EINVAL, 10), "NO_HOLE on WRITE"
    send_req(s, CMD_FLUSH, cookie=11, offset=4096)
    assert simple_reply(s) == (NBD_EINVAL, 11), "FLUSH with an offset"
    # FUA is accepted on every command, even READ.
    send_req(s, CMD_READ, flags=1, cookie=12, length=512)
    assert simple_reply(s) == (0, 12)
    recvall(s, 512)
    send_req(s, CMD_DISC)
    assert_closed(s)
    # Unknown flags through libnbd as well (strict mode off).
    h = handle()
    expect_errno(lambda: h.pread(512, 0, flags=1 << 7), errno.EINVAL, "bad flag via libnbd")
    h.shutdown()


def case_unknown_option():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(20)
    s.connect(SOCK)
    recvall(s, 18)
    s.sendall(struct.pack(">I", 1))
    for opt in (99, 5, 11):  # unknown, STARTTLS, EXTENDED_HEADERS
        s.sendall(struct.pack(">QII", IHAVEOPT, opt, 3) + b"abc")
        _, o, typ, ln = struct.unpack(">QIII", recvall(s, 20))
        recvall(s, ln)
        assert o == opt and typ == 0x80000001, f"option {opt}: reply {typ:#x}"
    # LIST with data is invalid, but haggling continues.
    s.sendall(struct.pack(">QII", IHAVEOPT, 3, 1) + b"x")
    _, _, typ, ln = struct.unpack(">QIII", recvall(s, 20))
    recvall(s, ln)
    assert typ == 0x80000003, f"LIST with data: {typ:#x}"
    # GO for an unknown export: ERR_UNKNOWN, still haggling.
    data = struct.pack(">I", 4) + b"nope" + struct.pack(">H", 0)
    s.sendall(struct.pack(">QII", IHAVEOPT, 7, len(data)) + data)
    _, _, typ, ln = struct.unpack(">QIII", recvall(s, 20))
    recvall(s, ln)
    assert typ == 0x80000006, f"GO unknown export: {typ:#x}"
    # ABORT gets an ACK.
    s.sendall(struct.pack(">QII", IHAVEOPT, 2, 0))
    _, _, typ, _ = struct.unpack(">QIII", recvall(s, 20))
    assert typ == 1
    s.close()
    # Unknown client flags: the server must drop the connection.
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(SOCK)
    recvall(s, 18)
    s.sendall(struct.pack(">I", 1 << 7))
    assert_closed(s)


def case_read_only():
    h = handle("ro")
    assert h.is_read_only()
    before = h.pread(4096, 0)
    expect_errno(lambda: h.pwrite(b"w" * 4096, 0), errno.EPERM, "write to read-only")
    expect_errno(lambda: h.trim(4096, 0), errno.EPERM, "trim on read-only")
    expect_errno(lambda: h.zero(4096, 0), errno.EPERM, "zero on read-only")
    assert h.pread(4096, 0) == before, "read-only export changed"
    h.flush()
    h.shutdown()


def case_misaligned_atomic():
    """Clients write single bytes that share 4096-byte device blocks, many
    in flight at once. A non-atomic read-modify-write would lose updates."""
    nclients, rounds, per = 4, 60, 8
    base = 4096 * 3 - 100  # straddles a block boundary
    errors = []

    def client(c):
        try:
            h = handle("b4k")
            assert h.get_block_size(nbd.SIZE_MINIMUM) == 1
            assert h.get_block_size(nbd.SIZE_PREFERRED) == 4096
            for r in range(rounds):
                cookies = []
                for k in range(per):
                    off = base + (k * nclients + c) * 25
                    cookies.append(h.aio_pwrite(bytes([(r * 7 + c + k) % 251 + 1]), off))
                for x in cookies:
                    while not h.aio_command_completed(x):
                        h.poll(-1)
            h.shutdown()
        except Exception as e:  # noqa: BLE001
            errors.append(f"client {c}: {e!r}")

    ts = [threading.Thread(target=client, args=(c,)) for c in range(nclients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    h = handle("b4k")
    for c in range(nclients):
        for k in range(per):
            off = base + (k * nclients + c) * 25
            want = ((rounds - 1) * 7 + c + k) % 251 + 1
            got = h.pread(1, off)[0]
            assert got == want, f"byte at {off}: {got}, want {want} (lost update)"
    # Bytes between the written ones were never touched (still zero).
    gap = h.pread(1, base + 1)
    assert gap == b"\0", f"neighbour byte changed: {gap!r}"
    h.shutdown()


def case_garbage():
    # Garbage instead of client flags + options.
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(SOCK)
    recvall(s, 18)
    s.sendall(b"\x00\x00\x00\x01" + os.urandom(200))
    assert_closed(s)
    # Garbage instead of a request, after a good handshake.
    s, _ = raw_connect()
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + os.urandom(64))
    assert_closed(s)
    # A client that connects and says nothing, then leaves.
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(SOCK)
    s.close()


def case_vanish():
    # Disappear in the middle of a write payload.
    s, _ = raw_connect()
    send_req(s, CMD_WRITE, length=MiB, payload=b"v" * 1000)
    s.close()
    # Disappear in the middle of a request header.
    s, _ = raw_connect()
    s.sendall(struct.pack(">IHH", REQ_MAGIC, 0, CMD_READ))
    s.close()
    # Queue many reads and leave without reading any reply.
    s, _ = raw_connect()
    for i in range(64):
        send_req(s, CMD_READ, cookie=i, offset=0, length=MiB)
    s.close()
    # Leave during the handshake, mid option.
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(SOCK)
    recvall(s, 18)
    s.sendall(struct.pack(">I", 1) + struct.pack(">QII", IHAVEOPT, 7, 100) + b"ab")
    s.close()


def case_block_status():
    """base:allocation from the device's extents (memory store: zero pages)."""
    h = nbd.NBD()
    h.add_meta_context("base:allocation")
    h.set_export_name("rw")
    h.connect_unix(SOCK)
    assert h.can_meta_context("base:allocation")
    seen = []

    def cb(metacontext, offset, entries, err):
        seen.append((metacontext, offset, list(entries)))
        return 0

    # A fresh memory store reads as zeros: data (not a hole), zero flag.
    h.block_status(65536, 4096, cb)
    assert seen == [("base:allocation", 4096, [65536, 2])], seen
    # Written bytes are data; the reply splits at page granularity and
    # never runs past the request.
    h.pwrite(b"x" * 4096, 8192)
    seen.clear()
    h.block_status(65536, 4096, cb)
    assert seen == [("base:allocation", 4096, [4096, 2, 4096, 0, 57344, 2])], seen
    # REQ_ONE: a single extent.
    seen.clear()
    h.block_status(65536, 4096, cb, flags=nbd.CMD_FLAG_REQ_ONE)
    assert seen == [("base:allocation", 4096, [4096, 2])], seen
    h.shutdown()


def case_simple_replies():
    """As a kernel client: no structured replies, 512-byte-ish I/O on a
    4096-byte-block device, errors as simple replies."""
    h = nbd.NBD()
    h.set_strict_mode(0)
    h.set_request_structured_replies(False)
    h.set_export_name("b4k")
    h.connect_unix(SOCK)
    assert not h.get_structured_replies_negotiated()
    data = os.urandom(512 * 5)
    h.pwrite(data, 4096 - 1024)  # spans three device blocks, unaligned
    assert h.pread(512 * 5, 4096 - 1024) == data
    assert h.pread(512, 4096 - 1536) == b"\0" * 512, "bytes before the write changed"
    expect_errno(lambda: h.pread(512, h.get_size()), errno.EINVAL, "simple-reply read error")
    # The stream is still in sync after an errored simple-reply read.
    assert h.pread(100, 4096 - 1000) == data[24:124]
    h.zero(700, 4096 + 100)
    # Written: [3072, 5632); zeroed: [4196, 4896); read back [4096, 4996).
    want = data[1024:1124] + b"\0" * 700 + data[1824:1924]
    assert h.pread(900, 4096) == want, "write-zeroes with partial blocks"
    h.flush()
    h.shutdown()


CASES = {
    "simple_replies": case_simple_replies,
    "out_of_range": case_out_of_range,
    "oversize": case_oversize,
    "unknown_command_and_flags": case_unknown_command_and_flags,
    "unknown_option": case_unknown_option,
    "read_only": case_read_only,
    "misaligned_atomic": case_misaligned_atomic,
    "garbage": case_garbage,
    "vanish": case_vanish,
    "block_status": case_block_status,
}

CASES[CASE]()
alive()
print(f"{CASE}: ok")
