#!/bin/sh
# The guest's work when systemd is PID 1 (the systemd boot), run by
# pkeyfw-guest.service: what /init does for the shell boot — load the
# modules rdma_rxe wants, mount the host's share, run /share/guest.sh and
# keep its exit status in /share/status — then power off.
for m in @MODULES@; do
    modprobe "$m" || echo "pkeyfw guest: cannot load module $m"
done
mkdir -p /share
if mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 share /share; then
    cd /share && sh /share/guest.sh
    echo $? > /share/status
    sync
else
    echo "pkeyfw guest: cannot mount the host's share over 9p"
fi
systemctl --force --no-block poweroff
