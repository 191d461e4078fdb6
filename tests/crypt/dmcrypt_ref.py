#!/usr/bin/python3
"""Independent dm-crypt sector transform for udm's compatibility tests.

Written from the dm-crypt documentation (IV layouts, cc_sector/iv_large_sectors
rules, key splitting), with the block cipher work done by Python's
`cryptography` package (OpenSSL underneath), so a bug in udm's IV or sector
arithmetic cannot hide in shared code.

Needs: python3-cryptography (Debian package; `apt-get install
python3-cryptography`) for AES, and libgcrypt (libgcrypt20, called through
ctypes) for serpent and twofish, which `cryptography` lacks. Supports aes,
serpent, twofish with xts/cbc/ecb and the IV modes plain, plain64, plain64be,
essiv:sha256, benbi, null; keycount `cipher:N-...`; both spec forms.

Usage: dmcrypt_ref.py JOBS.json
JOBS.json is a list of {"op": "enc"|"dec", "spec", "key" (hex), "ss",
"large" (bool), "sector" (cc_sector of the first unit), "in", "out"}.
"""
import ctypes
import hashlib
import json
import sys

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes


def parse_spec(spec):
    if spec.startswith("capi:"):
        api = spec[5:]
        ivopts = None
        if ":" in api:
            api, ivopts = api.rsplit(":", 1)
        ivmode = None
        if "-" in api:
            api, ivmode = api.rsplit("-", 1)
        chain, rest = api.split("(", 1)
        cipher = rest.rstrip(")")
        keycount = 1
    else:
        parts = spec.split("-", 2)
        ck = parts[0]
        keycount = 1
        if ":" in ck:
            ck, kc = ck.split(":", 1)
            keycount = int(kc)
        cipher = ck
        chain = parts[1] if len(parts) > 1 else None
        rest = parts[2] if len(parts) > 2 else None
        ivmode, ivopts = (rest.split(":", 1) + [None])[:2] if rest else (None, None)
        if chain is None or (chain == "plain" and ivmode is None):
            chain, ivmode = "cbc", "plain"
    assert cipher in ("aes", "serpent", "twofish"), cipher
    return cipher, chain, ivmode, ivopts, keycount


_gcry = None


def gcry():
    global _gcry
    if _gcry is None:
        _gcry = ctypes.CDLL("libgcrypt.so.20")
        _gcry.gcry_check_version.restype = ctypes.c_char_p
        assert _gcry.gcry_check_version(None), "libgcrypt init failed"
    return _gcry


GCRY_MODE = {"ecb": 1, "cbc": 3, "xts": 13}


def gcry_algo(alg, keylen):
    if alg == "serpent":
        return {16: 304, 24: 305, 32: 306}[keylen]
    if alg == "twofish":
        return {16: 303, 32: 10}[keylen]
    raise ValueError(alg)


def gcry_unit(op, alg, chain, key, iv, data):
    g = gcry()
    hd = ctypes.c_void_p()
    half = len(key) // 2 if chain == "xts" else len(key)
    rc = g.gcry_cipher_open(ctypes.byref(hd), gcry_algo(alg, half), GCRY_MODE[chain], 0)
    assert rc == 0, f"gcry_cipher_open {alg} {chain}: {rc}"
    try:
        assert g.gcry_cipher_setkey(hd, key, len(key)) == 0, "setkey"
        if chain != "ecb":
            assert g.gcry_cipher_setiv(hd, iv, 16) == 0, "setiv"
        out = ctypes.create_string_buffer(len(data))
        f = g.gcry_cipher_encrypt if op == "enc" else g.gcry_cipher_decrypt
        assert f(hd, out, len(data), data, len(data)) == 0, "crypt"
        return out.raw
    finally:
        g.gcry_cipher_close(hd)


def iv_for(alg, ivmode, ivopts, key, s):
    if ivmode in (None, "null"):
        return bytes(16)
    if ivmode == "plain":
        return (s & 0xFFFFFFFF).to_bytes(4, "little") + bytes(12)
    if ivmode == "plain64":
        return (s & (2**64 - 1)).to_bytes(8, "little") + bytes(8)
    if ivmode == "plain64be":
        return bytes(8) + (s & (2**64 - 1)).to_bytes(8, "big")
    if ivmode == "benbi":
        return bytes(8) + (((s << 5) + 1) & (2**64 - 1)).to_bytes(8, "big")
    if ivmode == "essiv":
        assert ivopts == "sha256"
        salt = hashlib.sha256(key).digest()
        blk = (s & (2**64 - 1)).to_bytes(8, "little") + bytes(8)
        return unit("enc", alg, "ecb", salt, None, blk)
    raise ValueError(ivmode)


def unit(op, alg, chain, key, iv, data):
    if alg != "aes":
        return gcry_unit(op, alg, chain, key, iv, data)
    if chain == "xts":
        c = Cipher(algorithms.AES(key), modes.XTS(iv))
    elif chain == "cbc":
        c = Cipher(algorithms.AES(key), modes.CBC(iv))
    elif chain == "ecb":
        c = Cipher(algorithms.AES(key), modes.ECB())
    else:
        raise ValueError(chain)
    x = c.encryptor() if op == "enc" else c.decryptor()
    return x.update(data) + x.finalize()


def run(job):
    alg, chain, ivmode, ivopts, keycount = parse_spec(job["spec"])
    key = bytes.fromhex(job["key"])
    ss = job["ss"]
    step = ss // 512
    shift = step.bit_length() - 1
    sub = len(key) // keycount
    data = open(job["in"], "rb").read()
    out = bytearray()
    for k in range(len(data) // ss):
        cc = job["sector"] + k * step
        s = cc >> shift if job["large"] else cc
        tk = key[(cc % keycount) * sub:(cc % keycount + 1) * sub]
        iv = iv_for(alg, ivmode, ivopts, tk, s)
        out += unit(job["op"], alg, chain, tk, iv, data[k * ss:(k + 1) * ss])
    open(job["out"], "wb").write(out)


def main():
    jobs = json.load(open(sys.argv[1]))
    for j in jobs:
        run(j)
    print(f"{len(jobs)} jobs done")


if __name__ == "__main__":
    main()
