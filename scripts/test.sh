#!/usr/bin/env bash
# Run every udm test on a fresh machine: install the peers the tests talk to
# (Debian packages) if any is missing, then format/lint checks and the whole
# cargo test suite (unit tests, integration tests against real tools).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

need_pkgs=()
need() { command -v "$1" >/dev/null 2>&1 || need_pkgs+=("$2"); }
need qemu-img qemu-utils
need cryptsetup cryptsetup-bin
need nbdkit nbdkit
need nbdinfo libnbd-bin
need nbdfuse nbdfuse
need fio fio
need mkfs.ext4 e2fsprogs
need mkfs.xfs xfsprogs
need xfs_repair xfsprogs
need fusermount3 fuse3
# tests/thin_interop.rs, tests/thin_crash.rs: thin_check, thin_dump, thin_ls,
# thin_restore.
need thin_check thin-provisioning-tools
# tests/mapper_dir.rs: loop devices, blkid, a private mount namespace.
need losetup mount
need blkid util-linux
need unshare util-linux
need openssl openssl
need script bsdutils
need systemd-socket-activate systemd
need systemd-analyze systemd
need jq jq
need xxd xxd
/usr/bin/python3 -c 'import nbd' 2>/dev/null || need_pkgs+=(python3-libnbd)
/usr/bin/python3 -c 'import cryptography' 2>/dev/null || need_pkgs+=(python3-cryptography)
/usr/bin/python3 -c 'import jsonschema' 2>/dev/null || need_pkgs+=(python3-jsonschema)
if ((${#need_pkgs[@]})); then
    echo "== installing test peers: ${need_pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

# Ceph for the `rbd` feature (librbd-dev, librados-dev to link; ceph-mon,
# ceph-osd, ceph-common for tests/remote_rbd.rs's throwaway clusters).
bash scripts/ceph-dev.sh deps

echo "== cargo fmt --check"
cargo fmt --check
echo "== cargo clippy"
cargo clippy --all-targets --all-features -- -D warnings
echo "== cargo test"
# A log of our own, so that runs side by side do not count each other's tests.
log=$(mktemp /tmp/udm-test.XXXXXX)
trap 'rm -f "$log"' EXIT
cargo test --all-features 2>&1 | tee "$log"
# One closing line for the whole run.
passed=$(grep -Eo 'test result: ok\. [0-9]+ passed' "$log" | awk '{s+=$4} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed' "$log" | awk '{s+=$1} END {print s+0}')
echo "${passed} passed, ${failed} failed"
