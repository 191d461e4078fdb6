#!/usr/bin/python3
"""Recover the volume key of a LUKS1 image from its passphrase, independently
of udm (PBKDF2 from Python's hashlib, key-material decryption through
dmcrypt_ref.py, i.e. Python `cryptography` or libgcrypt), so udm's crypt
target can be checked against images written by qemu-img's luks driver.

Usage: luks1_key.py IMAGE PASSPHRASE_FILE
Prints: "<cipher-name>-<cipher-mode> <volume key hex> <payload offset sectors>"
"""
import hashlib
import os
import struct
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dmcrypt_ref  # noqa: E402


def cstr(b):
    return b.split(b"\0", 1)[0].decode()


def diffuse(block, hash_name):
    h = hashlib.new(hash_name)
    ds = h.digest_size
    out = b""
    for i in range(0, len(block), ds):
        chunk = block[i:i + ds]
        out += hashlib.new(hash_name, struct.pack(">I", i // ds) + chunk).digest()[:len(chunk)]
    return out


def af_merge(material, key_bytes, stripes, hash_name):
    d = bytes(key_bytes)
    for k in range(stripes - 1):
        s = material[k * key_bytes:(k + 1) * key_bytes]
        d = diffuse(bytes(a ^ b for a, b in zip(d, s)), hash_name)
    last = material[(stripes - 1) * key_bytes:stripes * key_bytes]
    return bytes(a ^ b for a, b in zip(d, last))


def main():
    img, pwfile = sys.argv[1], sys.argv[2]
    pw = open(pwfile, "rb").read()
    hdr = open(img, "rb").read(1024)
    assert hdr[:6] == b"LUKS\xba\xbe", "not a LUKS image"
    assert struct.unpack(">H", hdr[6:8])[0] == 1, "not LUKS1"
    cipher, mode, hash_name = cstr(hdr[8:40]), cstr(hdr[40:72]), cstr(hdr[72:104])
    payload, key_bytes = struct.unpack(">II", hdr[104:112])
    mk_digest, mk_salt = hdr[112:132], hdr[132:164]
    (mk_iter,) = struct.unpack(">I", hdr[164:168])
    spec = f"{cipher}-{mode}"
    with open(img, "rb") as f:
        for slot in range(8):
            off = 208 + 48 * slot
            active, iters = struct.unpack(">II", hdr[off:off + 8])
            salt = hdr[off + 8:off + 40]
            km_off, stripes = struct.unpack(">II", hdr[off + 40:off + 48])
            if active != 0x00AC71F3:
                continue
            slot_key = hashlib.pbkdf2_hmac(hash_name, pw, salt, iters, key_bytes)
            n = key_bytes * stripes
            size = (n + 511) // 512 * 512
            f.seek(km_off * 512)
            enc = f.read(size)
            with tempfile.TemporaryDirectory() as d:
                src, dst = os.path.join(d, "in"), os.path.join(d, "out")
                open(src, "wb").write(enc)
                dmcrypt_ref.run({"op": "dec", "spec": spec, "key": slot_key.hex(), "ss": 512,
                                 "large": False, "sector": 0, "in": src, "out": dst})
                material = open(dst, "rb").read()[:n]
            mk = af_merge(material, key_bytes, stripes, hash_name)
            if hashlib.pbkdf2_hmac(hash_name, mk, mk_salt, mk_iter, 20) == mk_digest:
                print(spec, mk.hex(), payload)
                return
    sys.exit("no key slot opens with this passphrase")


if __name__ == "__main__":
    main()
