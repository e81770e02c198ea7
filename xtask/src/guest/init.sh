#!/bin/sh
# /init of the pkeyfw soft-RoCE guest: mount what a kernel-only userland
# needs, load the modules rdma_rxe wants, run the host's /share/guest.sh and
# power off. Its exit status goes to /share/status; nothing else persists.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm && mount -t devpts devpts /dev/pts
mount -t tmpfs tmp /tmp
mount -t tmpfs run /run
mount -t bpf bpf /sys/fs/bpf
for m in @MODULES@; do
    modprobe "$m" || echo "pkeyfw guest: cannot load module $m"
done
mkdir -p /share
if mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 share /share; then
    ip link set lo up
    hostname pkeyfw-guest
    cd /share && sh /share/guest.sh
    echo $? > /share/status
    sync
else
    echo "pkeyfw guest: cannot mount the host's share over 9p"
fi
echo o > /proc/sysrq-trigger
sleep 10
