#!/usr/bin/env bash
# Writes the seeds that the real tools make: fuzz/seeds/verity/ from
# `veritysetup format` and fuzz/seeds/thin_metadata/ from `thin_restore`
# (cryptsetup 2.6 and thin-provisioning-tools must be installed). The
# foreign volume seeds come from cryptsetup's upstream images (see
# README.md, `write_upstream_seeds`), the integrity and snapshot seeds from
# udm's own targets (`write_udm_seeds`). A seed is a few control bytes
# then the image, as the drivers in src/fuzzing/ read it.
set -euo pipefail
cd "$(dirname "$0")/seeds"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The sparse disk of src/fuzzing/foreign.rs: 4 head bytes, the size in
# sectors, then (sector, length, bytes) for every non-zero 512-byte run.
sparse() { # HEAD(hex, 4 bytes) IMAGE OUT
    python3 - "$@" <<'E'
import struct, sys
head, img, out = bytes.fromhex(sys.argv[1]), open(sys.argv[2], 'rb').read(), sys.argv[3]
v = bytearray(head + struct.pack('<I', len(img) // 512))
s = 0
while s < len(img) // 512:
    if not any(img[s*512:(s+1)*512]):
        s += 1
        continue
    e = s
    while e < len(img) // 512 and any(img[e*512:(e+1)*512]) and e - s < 64:
        e += 1
    v += struct.pack('<IH', s, (e - s) * 512) + img[s*512:e*512]
    s = e
open(out, 'wb').write(v)
E
}

# verity: flags, fec, data length (u16 LE sectors), data, hash image.
python3 - "$tmp" <<'E'
import sys
t = sys.argv[1]
d = bytearray((i * 7 + i // 512) % 251 for i in range(40 * 512)); d[1536:2048] = bytes(512)
open(t + '/d40x512', 'wb').write(d)
open(t + '/d8x4096', 'wb').write(bytes((i * 13 + i // 4096) % 253 for i in range(8 * 4096)))
open(t + '/d20x512', 'wb').write(bytes((i * 5) % 249 for i in range(20 * 512)))
E
vs() { veritysetup format "$@" >/dev/null; }
vs "$tmp/d40x512" "$tmp/h40x512" --data-block-size 512 --hash-block-size 512 --salt 5a5a
vs "$tmp/d8x4096" "$tmp/h8x4096" --format 0 --hash sha1
vs "$tmp/d20x512" "$tmp/h20x512" --data-block-size 512 --hash-block-size 1024 --hash sha512 --salt 0011223344
vs "$tmp/d20x512" "$tmp/hns" --data-block-size 512 --hash-block-size 512 --no-superblock --salt -
cp "$tmp/h40x512" "$tmp/hfec"
vs "$tmp/d40x512" "$tmp/hfec" --data-block-size 512 --hash-block-size 512 --salt 5a5a \
    --fec-device "$tmp/hfec" --fec-offset "$(stat -c %s "$tmp/h40x512")" --fec-roots 2
python3 - "$tmp" <<'E'
import struct, sys
t = sys.argv[1]
def seed(name, flags, d, h):
    d = open(t + '/' + d, 'rb').read(); h = open(t + '/' + h, 'rb').read()
    open('verity/' + name, 'wb').write(bytes([flags, 0]) + struct.pack('<H', len(d) // 512) + d + h)
seed('sha256_512', 0x00, 'd40x512', 'h40x512')
seed('sha256_512_zero_once', 0x0c, 'd40x512', 'h40x512')
seed('sha1_v0_4096', 0x00, 'd8x4096', 'h8x4096')
seed('sha512_salt_1024', 0x10, 'd20x512', 'h20x512')
seed('no_superblock', 0x01, 'd20x512', 'hns')
seed('fec_roots2', 0x80, 'd40x512', 'hfec')
E

# thin_metadata: ops, data blocks - 1, thin id selector, features, then
# the metadata device (4 MiB) thin_restore wrote from XML.
dev() { # ID MAPPINGS...
    echo "  <device dev_id=\"$1\" mapped_blocks=\"0\" transaction=\"0\" creation_time=\"0\" snap_time=\"1\">"
    shift
    printf '%s\n' "$@"
    echo "  </device>"
}
sb() { echo "<superblock uuid=\"\" time=\"1\" transaction=\"3\" flags=\"0\" version=\"2\" data_block_size=\"128\" nr_data_blocks=\"$1\">"; }
{
    sb 64
    dev 0 '<range_mapping origin_begin="0" data_begin="10" length="2" time="0"/>' \
        '<single_mapping origin_block="50" data_block="5" time="1"/>'
    dev 7 '<single_mapping origin_block="0" data_block="10" time="0"/>' \
        '<single_mapping origin_block="3" data_block="20" time="1"/>'
    echo "</superblock>"
} >"$tmp/two.xml"
{
    sb 64
    maps=()
    for i in $(seq 0 599); do
        maps+=("<single_mapping origin_block=\"$((i * 3))\" data_block=\"$(((i * 7) % 64))\" time=\"0\"/>")
    done
    dev 1 "${maps[@]}"
    for d in $(seq 2 30); do dev "$d" "<single_mapping origin_block=\"$d\" data_block=\"$d\" time=\"1\"/>"; done
    echo "</superblock>"
} >"$tmp/deep.xml"
{ sb 16; dev 0; echo "</superblock>"; } >"$tmp/empty.xml"
for x in two deep empty; do
    truncate -s 4M "$tmp/$x.meta"
    thin_restore -q -i "$tmp/$x.xml" -o "$tmp/$x.meta"
    thin_check -q "$tmp/$x.meta"
done
sparse 003f0000 "$tmp/two.meta" thin_metadata/two_devices
sparse 0f3f0200 "$tmp/two.meta" thin_metadata/two_devices_snap_delete
sparse 233f0100 "$tmp/deep.meta" thin_metadata/deep_btree
sparse 013f0300 "$tmp/deep.meta" thin_metadata/deep_btree_new_thin
sparse 000f0000 "$tmp/empty.meta" thin_metadata/empty_pool
sparse 053f0009 "$tmp/two.meta" thin_metadata/two_devices_read_only
