# Pods started by a real container runtime through its own CNI code path:
# podman (Debian 12's 4.3, CNI network backend), containers from a root
# file system made here (no registry), on Linux 7.x. Node 1 is the guest;
# node 2 a network namespace with a bridge and a podman of its own, joined
# to node 1's bridge by a veth pair, each end the trunk port of its bridge.
. /share/lib.sh
uname -r
rdma system show | grep -q "netns exclusive" || rdma system set netns exclusive
mountpoint -q /sys/fs/cgroup || mount -t cgroup2 none /sys/fs/cgroup
CONF=/etc/podman-cni
mkdir -p /etc/containers "$CONF" /var/lib/containers /run/containers
cat > /etc/containers/containers.conf <<CONF
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "crun"
[network]
network_backend = "cni"
cni_plugin_dirs = ["$CNI_BIN"]
network_config_dir = "$CONF"
CONF
cat > /etc/containers/storage.conf <<CONF
[storage]
driver = "vfs"
graphroot = "/var/lib/containers/storage"
runroot = "/run/containers/storage"
CONF

# The containers' root: this guest's userland, hard-linked (the RDMA
# userland, iproute2 and a shell), no image, no registry.
ROOTFS=/var/lib/pod-rootfs
mkdir -p $ROOTFS
cp -al /usr $ROOTFS/usr
cp -a /etc $ROOTFS/etc
for d in bin lib lib64 sbin; do [ -L /$d ] && ln -s usr/$d $ROOTFS/$d; done
mkdir -p $ROOTFS/proc $ROOTFS/sys $ROOTFS/dev $ROOTFS/tmp $ROOTFS/run $ROOTFS/var/tmp $ROOTFS/root

# Node 1's bridge with its uplink; node 2 behind it.
ip link del roce0 2> /dev/null
ip link add roce0 type bridge && ip link set roce0 up
ip netns add node2
ip -n node2 link set lo up
ip -n node2 link add roce0 type bridge && ip -n node2 link set roce0 up
ip link add up1 type veth peer name up2 netns node2
ip link set up1 master roce0 up
ip -n node2 link set up2 master roce0 up
# The pods' networks (podman reads them from $CONF).
CNI_CONF=$CONF
net roce-full 0x8001 10 49 up1
net roce-limited 0x0001 50 99 up1
net n2-limited 0x0001 150 199 up2
net roce-plain none 100 149 "" plain0
NODE2="nsenter --net=/run/netns/node2"

# run [NODE...] NAME NETWORK: a pod (a container that sleeps), as podman
# starts it.
run() {
    $PODMAN_PREFIX podman run -d --name "$1" --network "$2" \
        --device-cgroup-rule 'c 231:* rwm' -v /dev/infiniband:/dev/infiniband \
        --ulimit memlock=-1:-1 --rootfs $ROOTFS sleep 1d > /dev/null
}
# dev NAME: the pod's RDMA device, as it sees it; addr NAME: its address.
dev() { podman exec "$1" rdma dev | awk '{print $2}' | tr -d :; }
addr() { podman exec "$1" ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1; }
# pp KIND SERVER CLIENT: ibv_KIND_pingpong between two pods.
pp() {
    local server client
    PP_PORT=$((PP_PORT + 1))
    podman exec "$2" timeout 25 "ibv_$1_pingpong" -d "$(dev "$2")" -g 1 -n 5 -p $PP_PORT \
        > /tmp/pp-server.txt 2>&1 &
    server=$!
    listening "podman exec $2" $PP_PORT
    podman exec "$3" timeout 15 "ibv_$1_pingpong" -d "$(dev "$3")" -g 1 -n 5 -p $PP_PORT "$(addr "$2")" \
        > /tmp/pp-client.txt 2>&1
    client=$?
    [ $client = 0 ] || podman exec "$2" pkill -f "ibv_$1_pingpong" 2> /dev/null
    wait $server
    server=$?
    echo "pingpong $1 $2<-$3: server $server, client $client"
    [ $client = 0 ] || head -3 /tmp/pp-client.txt
    [ $client = 0 ] && [ $server = 0 ]
}
pp_stalls() { ! pp "$@"; }
# ports N: node 1's bridge policy has N pods' ports, and loads.
ports() {
    [ "$(grep -c '^stamp = ' "$RECORDS/roce0.toml")" = "$1" ] &&
        $PKEYFW policy check --policy "$RECORDS/roce0.toml" > /dev/null
}

started=$(now_ms)
run a roce-full
measure podman-first-pod-ms $(( $(now_ms) - started ))
run b roce-limited
run c roce-limited
three() { for p in a b c; do [ -n "$(dev $p)" ] || return 1; done && ports 3; }
check podman-three-pods three
cat "$RECORDS/roce0.toml"
only_own() {
    for p in a b c; do
        [ "$(podman exec $p ibv_devices | grep -c pkfw)" = 1 ] || return 1
    done
    [ -z "$(rdma dev)" ]
}
check podman-own-device-only only_own
check podman-rc-a-b pp rc a b
check podman-ud-a-b pp ud a b
check podman-rc-b-c-stalls pp_stalls rc b c
check podman-ud-b-c-stalls pp_stalls ud b c
# The metrics name each port's pod (podman passes the container's name as
# K8S_POD_NAME, and no namespace).
$PKEYFW metrics --listen 127.0.0.1:9435 > /tmp/metrics.log 2>&1 &
metrics=$!
sleep 3
scraped() {
    curl -s http://127.0.0.1:9435/metrics > /tmp/metrics.txt &&
        for p in a b c; do
            grep -q "^pkeyfw_cni_port_info{.*pod=\"$p\"" /tmp/metrics.txt || return 1
        done
}
check podman-metrics-name-pods scraped
grep pkeyfw_cni_port_info /tmp/metrics.txt
kill $metrics
A=$(dev a)
UA=""
for u in /sys/class/infiniband_verbs/uverbs*; do
    [ "$(podman exec a cat "$u/ibdev" 2> /dev/null)" = "$A" ] && UA=$(basename "$u")
done
other_refused() {
    ! podman exec b ibv_rc_pingpong -d "$A" -g 1 -n 1 "$(addr a)" &&
        [ -n "$UA" ] && podman exec a sh -c "exec 3< /dev/infiniband/$UA" &&
        ! podman exec b sh -c "exec 3< /dev/infiniband/$UA"
}
check podman-other-device-refused other_refused

# A pod deleted: its port and its device go.
PB=$(jq -r '.ports[] | select(.pod == "b") | .interface' "$RECORDS/roce0.json")
B=$(dev b)
started=$(now_ms)
podman rm -f -t 0 b > /dev/null
measure podman-rm-ms $(( $(now_ms) - started ))
removed() {
    ports 2 && ! grep -q "$PB" "$RECORDS/roce0.toml" && ! ls -d /sys/fs/bpf/pkeyfw/*/"$PB" 2> /dev/null &&
        ! rdma dev | grep -q "$B"
}
check podman-rm-removes-port-and-device removed

# Ten pods started together.
started=$(now_ms)
for i in 0 1 2 3 4 5 6 7 8 9; do
    n=roce-limited
    [ $i = 0 ] && n=roce-full
    (run t$i $n; echo $? > /tmp/t$i.status) &
done
wait
measure podman-ten-concurrent-ms $(( $(now_ms) - started ))
ten() {
    for i in 0 1 2 3 4 5 6 7 8 9; do
        [ "$(cat /tmp/t$i.status)" = 0 ] && [ -n "$(dev t$i)" ] || return 1
    done
    ports 12
}
check podman-ten-together ten
check podman-ten-rc-t0-t1 pp rc t0 t1
check podman-ten-rc-t1-t2-stalls pp_stalls rc t1 t2
podman rm -f -t 0 t0 t1 t2 t3 t4 t5 t6 t7 t8 t9 > /dev/null
check podman-ten-removed ports 2

# Node 2: a pod behind the trunk.
PODMAN_PREFIX=$NODE2
run b2 n2-limited
run c2 n2-limited
PODMAN_PREFIX=""
check podman-node2-pods sh -c "[ -n \"\$(podman exec b2 rdma dev)\" ] && [ -n \"\$(podman exec c2 rdma dev)\" ]"
ls /run/pkeyfw/cni/
check podman-rc-a-b2-across-nodes pp rc a b2
check podman-ud-a-b2-across-nodes pp ud a b2
run b roce-limited
check podman-rc-b-c2-across-nodes-stalls pp_stalls rc b c2

# Start-up with and without pkeyfw.
for n in roce-plain roce-limited; do
    total=0
    for i in 1 2 3; do
        started=$(now_ms)
        run s$i $n
        total=$(( total + $(now_ms) - started ))
        podman rm -f -t 0 s$i > /dev/null
    done
    measure "podman-start-ms-$n" $(( total / 3 ))
done

podman rm -f -t 0 a b c > /dev/null
$NODE2 podman rm -f -t 0 b2 c2 > /dev/null
check podman-all-removed sh -c "[ ! -e $RECORDS/roce0.json ] && [ -z \"\$(ls /sys/fs/bpf/pkeyfw 2> /dev/null)\" ] && [ -z \"\$(rdma dev)\" ]"
ls -R /sys/fs/bpf/pkeyfw 2> /dev/null
echo "podman.sh done"
