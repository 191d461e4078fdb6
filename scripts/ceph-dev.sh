#!/usr/bin/env bash
# A throwaway single-node Ceph cluster for udm's RBD tests and benchmarks.
#
#   scripts/ceph-dev.sh start DIR   # 1 monitor + 1 memstore OSD on 127.0.0.1
#   scripts/ceph-dev.sh stop DIR    # stop both (by recorded pid), remove DIR
#   scripts/ceph-dev.sh deps        # only install the Debian packages
#   scripts/ceph-dev.sh qemu DIR    # qemu-img/qemu-nbd with qemu's rbd driver
#   scripts/ceph-dev.sh osd-stop DIR / osd-start DIR   # take the OSD away and back
#
# `start` installs Debian's Ceph packages if missing, then leaves
# DIR/ceph.conf (use it as CEPH_CONF, or `rbd -c DIR/ceph.conf …`, or
# `rbd:rbd/IMAGE:conf=DIR/ceph.conf` in udm) and a pool named `rbd` (size 1,
# no cephx). Ready in about a second. Everything the daemons write stays in
# DIR; every CLI call has a timeout; nothing is left behind by `stop`.
#
# Environment: STORE=memstore|bluestore (default memstore: no disk, RAM
# grows with data written; bluestore uses a 4 GiB sparse file in DIR),
# MEMSTORE_BYTES (default 4 GiB), OP_TIMEOUT (rados_osd_op_timeout and
# rados_mon_op_timeout written into ceph.conf for clients, default 30 s).
set -euo pipefail

usage() { echo "usage: $0 start DIR | stop DIR | deps | qemu DIR | osd-stop DIR | osd-start DIR" >&2; exit 2; }

deps() {
    local need=()
    command -v ceph-mon >/dev/null 2>&1 || need+=(ceph-mon)
    command -v ceph-osd >/dev/null 2>&1 || need+=(ceph-osd)
    command -v rbd >/dev/null 2>&1 || need+=(ceph-common)
    [ -e /usr/include/rbd/librbd.h ] || need+=(librbd-dev)
    [ -e /usr/include/rados/librados.h ] || need+=(librados-dev)
    if ((${#need[@]})); then
        echo "== installing Ceph packages: ${need[*]}" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    fi
}

# qemu's rbd driver lives in Debian's qemu-block-extra, which must match the
# installed qemu-utils exactly. Where the installed qemu is another build
# (this machine has a newer backport without the rbd module), installing
# qemu-block-extra would replace it; instead the distribution's qemu-utils
# and qemu-block-extra of one version are unpacked into DIR, and DIR/bin
# gets qemu-img and qemu-nbd wrappers that load the modules from there.
# Prints DIR/bin.
qemu() {
    local dir ver deb tool
    dir=$(realpath -m "$1")
    if [ ! -x "$dir/bin/qemu-nbd" ]; then
        deps
        ver=$(apt-cache policy qemu-block-extra | awk '/Candidate:/ {print $2}')
        if [ -z "$ver" ] || [ "$ver" = "(none)" ]; then
            apt-get update -qq
            ver=$(apt-cache policy qemu-block-extra | awk '/Candidate:/ {print $2}')
        fi
        mkdir -p "$dir/debs" "$dir/root" "$dir/bin"
        (cd "$dir/debs" && apt-get download -qq "qemu-utils=$ver" "qemu-block-extra=$ver" 2>/dev/null)
        for deb in "$dir"/debs/*.deb; do dpkg -x "$deb" "$dir/root"; done
        for tool in qemu-img qemu-nbd; do
            printf '#!/bin/sh\nQEMU_MODULE_DIR=%s exec %s "$@"\n' \
                "$dir/root/usr/lib/x86_64-linux-gnu/qemu" "$dir/root/usr/bin/$tool" >"$dir/bin/$tool"
            chmod +x "$dir/bin/$tool"
        done
    fi
    echo "$dir/bin"
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start() {
    local dir store port fsid conf osd_uuid id
    deps
    dir=$(realpath -m "$1")
    if [ -e "$dir/pids" ]; then
        echo "$dir already holds a cluster; stop it first" >&2
        exit 1
    fi
    store=${STORE:-memstore}
    port=$(free_port)
    mkdir -p "$dir"/{mon,osd,run,log}
    conf=$dir/ceph.conf
    fsid=$(cat /proc/sys/kernel/random/uuid)
    cat >"$conf" <<EOF
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$port
mon initial members = a
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind msgr1 = false
auth cluster required = none
auth service required = none
auth client required = none
keyring = $dir/keyring
run dir = $dir/run
admin socket = $dir/run/\$name.asok
log file = $dir/log/\$name.log
mon cluster log file = $dir/log/cluster.log
pid file = $dir/run/\$name.pid
mon data = $dir/mon/\$name
osd data = $dir/osd/\$name
osd objectstore = $store
memstore device bytes = ${MEMSTORE_BYTES:-4294967296}
bluestore block path = $dir/osd/\$name.block
bluestore block size = 4294967296
bluestore block create = true
bluestore fsck on mkfs = false
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
osd pool default pg num = 8
osd pool default pgp num = 8
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon warn on insecure global id reclaim allowed = false
mon osd min up ratio = 0
mon osd min in ratio = 0
mon data avail warn = 2
mon data avail crit = 1
paxos propose interval = 0.1
osd op num shards = 2
osd op num threads per shard = 1
osd memory target = 536870912
rados osd op timeout = ${OP_TIMEOUT:-30}
rados mon op timeout = ${OP_TIMEOUT:-30}
client mount timeout = ${OP_TIMEOUT:-30}
[client]
admin socket = $dir/run/\$name.\$pid.asok
EOF
    : >"$dir/keyring"
    local C=(-c "$conf")
    w() { timeout 60 "$@"; }
    w monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$port]" "$dir/monmap" >/dev/null
    w ceph-mon "${C[@]}" --mkfs -i a --monmap "$dir/monmap"
    ceph-mon "${C[@]}" -i a -f >"$dir/log/mon.a.out" 2>&1 &
    echo $! >"$dir/pids"
    osd_uuid=$(cat /proc/sys/kernel/random/uuid)
    id=$(w ceph "${C[@]}" osd new "$osd_uuid")
    mkdir -p "$dir/osd/osd.$id"
    w ceph-osd "${C[@]}" -i "$id" --mkfs --osd-uuid "$osd_uuid" >"$dir/log/osd.mkfs.out" 2>&1
    ceph-osd "${C[@]}" -i "$id" -f >"$dir/log/osd.$id.out" 2>&1 &
    echo $! >>"$dir/pids"
    echo "$id" >"$dir/osd_id"
    w ceph "${C[@]}" osd pool create rbd 8 8 >/dev/null 2>&1
    # Blocks until the placement groups are active: the readiness wait.
    w rbd "${C[@]}" pool init rbd
    echo "ready: $conf"
}

alive() { [ -e "/proc/$1" ] && ! grep -q '^[0-9]* ([^)]*) Z' "/proc/$1/stat" 2>/dev/null; }

stop_pids() {
    local p a
    for p in "$@"; do kill -TERM "$p" 2>/dev/null || true; done
    for _ in $(seq 50); do
        a=0
        for p in "$@"; do alive "$p" && a=1; done
        [ $a = 0 ] && return 0
        sleep 0.1
    done
    for p in "$@"; do kill -KILL "$p" 2>/dev/null || true; done
}

stop() {
    local dir
    dir=$(realpath -m "$1")
    if [ -f "$dir/pids" ]; then
        mapfile -t P <"$dir/pids"
        # The OSD first: stopped after the monitor it waits ~5 s for it.
        if ((${#P[@]} > 1)); then stop_pids "${P[@]:1}"; fi
        stop_pids "${P[0]}"
    fi
    rm -rf "$dir"
}

# The OSD goes away (SIGTERM, as a crash or a reboot would take it) and
# comes back on the same data. Use STORE=bluestore for this: a memstore OSD
# keeps its objects only in memory and comes back without its PGs.
osd_stop() {
    local dir pid
    dir=$(realpath -m "$1")
    pid=$(sed -n 2p "$dir/pids")
    stop_pids "$pid"
}

osd_start() {
    local dir id
    dir=$(realpath -m "$1")
    id=$(cat "$dir/osd_id")
    ceph-osd -c "$dir/ceph.conf" -i "$id" -f >>"$dir/log/osd.$id.out" 2>&1 &
    sed -i "2s/.*/$!/" "$dir/pids"
}

case "${1:-}" in
    start) [ $# = 2 ] || usage; start "$2" ;;
    stop) [ $# = 2 ] || usage; stop "$2" ;;
    deps) deps ;;
    qemu) [ $# = 2 ] || usage; qemu "$2" ;;
    osd-stop) [ $# = 2 ] || usage; osd_stop "$2" ;;
    osd-start) [ $# = 2 ] || usage; osd_start "$2" ;;
    *) usage ;;
esac
