# Where the plugin cannot isolate a pod, ADD refuses and leaves nothing:
# the RDMA subsystem in shared mode, then (in exclusive mode) a kernel
# whose rdma_rxe cannot be moved into a namespace (Linux 6.12).
. /share/lib.sh
uname -r
modprobe rdma_rxe
net p1-full 0x8001 10 49

pod a
out=$(cni ADD p1-full a /run/netns/a)
echo "$out"
check shared-mode-refused refused_with 100 "shares every device"
check shared-mode-leaves-nothing nothing_left
status() { out=$(echo '{"cniVersion": "1.1.0", "name": "n", "type": "pkeyfw", "pkey": "0x8001"}' | CNI_COMMAND=STATUS $PKEYFW); echo "$out"; }
status
check shared-mode-not-ready refused_with 50 "shares every device"
ip netns del a
# The mode changes only while no namespace but the host's exists.
for i in $(seq 100); do
    rdma system set netns exclusive 2> /dev/null && break
    sleep 0.2
done
rdma system show

pod a
out=$(cni ADD p1-full a /run/netns/a)
echo "$out"
check old-kernel-refused refused_with 100 "cannot be confined"
says_what_to_do() { echo "$out" | grep -q "Linux 7" && echo "$out" | grep -q "node pool"; }
check old-kernel-says-what-to-do says_what_to_do
check old-kernel-leaves-nothing nothing_left
# STATUS says so before any ADD: not ready, as in shared mode.
status
check old-kernel-not-ready refused_with 50 "cannot be confined"
echo "refused.sh done"
