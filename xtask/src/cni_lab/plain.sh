# The plugin run as a CNI runtime runs it (the test kit's runtime: environment
# variables, the conflist's plugins in turn, Debian's bridge and host-local
# before pkeyfw), for pods that are plain network namespaces, on Linux 7.x.
# Each check is a test of `cargo xtask test` (cni-lab::NAME).
. /share/lib.sh
uname -r
rdma system set netns exclusive
modprobe rdma_rxe

# VERSION asked in 1.0.0: answered in 1.0.0, with 0.4.0, 1.0.0 and 1.1.0.
versions() {
    local answer v
    answer=$(cni VERSION pkeyfw 1.0.0) && [ "$(echo "$answer" | head -1)" = 1.0.0 ] || return 1
    for v in 0.4.0 1.0.0 1.1.0; do
        echo "$answer" | tail -1 | tr ' ' '\n' | grep -qx "$v" || return 1
    done
}
check version versions
check status sh -c "echo '{\"cniVersion\": \"1.1.0\", \"name\": \"n\", \"type\": \"pkeyfw\", \"pkey\": \"0x8001\"}' \
    | CNI_COMMAND=STATUS $PKEYFW"

net p1-full 0x8001 10 49
net p1-limited 0x0001 50 99
net plain none 100 149
for p in a b c; do pod $p; done

# Three pods: A a full member of partition 0x0001, B and C limited ones.
started=$(now_ms)
cni ADD p1-full a /run/netns/a > /tmp/a.json && a_ok=1
measure add-first-pod-ms $(( $(now_ms) - started ))
cni ADD p1-limited b /run/netns/b > /tmp/b.json && b_ok=1
cni ADD p1-limited c /run/netns/c > /tmp/c.json && c_ok=1
check add-three [ "${a_ok:-}${b_ok:-}${c_ok:-}" = 111 ]
cat /tmp/a.json; cat "$RECORDS/roce0.toml"
A=$(device p1-full a); B=$(device p1-limited b); C=$(device p1-limited c)
IPA=$(address p1-full a); IPB=$(address p1-limited b); IPC=$(address p1-limited c)
echo "devices $A $B $C, addresses $IPA $IPB $IPC"

# The result lists the device right before the pod's interface, the last
# one with a sandbox, whose IP still points at it.
lists_device() {
    [ "$(cni field sandboxed < /tmp/a.json)" = "$A eth0" ] &&
        [ "$(cni field ip-interface < /tmp/a.json)" = eth0 ] &&
        [ "$(cni field cni-version < /tmp/a.json)" = 1.0.0 ]
}
check result-lists-device lists_device

# Each pod sees its own device, and nothing else does.
own_device_only() {
    for p in a b c; do
        seen=$(ip netns exec $p rdma dev | awk '{print $2}' | tr -d :)
        eval want=\$$(echo $p | tr a-z A-Z)
        [ "$seen" = "$want" ] || { echo "pod $p sees '$seen', expected $want"; return 1; }
        ip netns exec $p ibv_devices | grep -q "$want" || return 1
    done
    [ -z "$(rdma dev)" ] || { echo "the host sees: $(rdma dev)"; return 1; }
}
check own-device-only own_device_only

# The bridge's policy: each pod's port an access port of its key.
policy_ports() {
    [ "$(grep -c '^stamp = ' "$RECORDS/roce0.toml")" = "$1" ] &&
        for p in $2; do grep -q "interface = \"$p\"" "$RECORDS/roce0.toml" || return 1; done &&
        $PKEYFW policy check --policy "$RECORDS/roce0.toml" > /dev/null
}
PA=$(port p1-full a); PB=$(port p1-limited b); PC=$(port p1-limited c)
check access-ports policy_ports 3 "$PA $PB $PC"
# pinned(PORT...): each port's attachment pinned, live.
pinned() {
    for p in "$@"; do
        ls -d /sys/fs/bpf/pkeyfw/*/"$p" > /dev/null 2>&1 || { echo "no pins for $p"; return 1; }
    done
    $PKEYFW stats > /tmp/stats.txt 2>&1 || { cat /tmp/stats.txt; return 1; }
}
check ports-enforcing pinned "$PA" "$PB" "$PC"
head -40 /tmp/stats.txt

# The partition rules, with unmodified soft-RoCE in every pod.
check rc-a-b pingpong rc a "$A" b "$B" "$IPA"
check ud-a-b pingpong ud a "$A" b "$B" "$IPA"
check rc-c-a pingpong rc c "$C" a "$A" "$IPC"
check rc-b-c-stalls stalls rc b "$B" c "$C" "$IPB"
check ud-b-c-stalls stalls ud b "$B" c "$C" "$IPB"

# rdma_cm runs its connection management over QP1, which a moved rxe
# device lacks in 7.3 (docs/operations.md): rping fails, and the kernel
# says why. A kernel that makes QP1 again fails this check: say so there.
rdma_cm_fails() {
    local server refused
    ip netns exec a timeout 20 rping -s -a "$IPA" -C 1 > /tmp/rping-server.txt 2>&1 &
    server=$!
    sleep 1
    ! ip netns exec b timeout 10 rping -c -a "$IPA" -C 1 > /tmp/rping-client.txt 2>&1
    refused=$?
    kill $server 2> /dev/null
    wait $server
    cat /tmp/rping-client.txt
    [ $refused = 0 ] && dmesg | grep -q "Couldn't create ib_mad QP1"
}
check rdma-cm-needs-qp1 rdma_cm_fails

# Another pod's device: not found, and its uverbs node refused.
uverbs_of() {
    for u in /sys/class/infiniband_verbs/uverbs*; do
        [ "$(ip netns exec "$1" cat "$u/ibdev" 2> /dev/null)" = "$2" ] && basename "$u" && return
    done
}
UA=$(uverbs_of a "$A")
echo "A's device $A is /dev/infiniband/$UA"
not_found() { ! ip netns exec b ibv_rc_pingpong -d "$A" -g 1 -n 1 "$IPA"; }
check other-device-not-found not_found
uverbs_refused() {
    [ -n "$UA" ] && ip netns exec a sh -c "exec 3< /dev/infiniband/$UA" &&
        ! ip netns exec b sh -c "exec 3< /dev/infiniband/$UA"
}
check other-uverbs-refused uverbs_refused

# CHECK of pkeyfw alone: the bridge plugin's own CHECK fails once the
# bridge's MAC has changed with its ports since the ADD (bridge 1.1.1).
pkeyfw_check() { cni plugin CHECK "$1" 1 "$2" "/run/netns/$2" --prev "$(cni result "$1" "$2")"; }
check check-a pkeyfw_check p1-full a

# A network's Q_Key: every UD QP of its pods is held to it, whatever Q_Key
# their program sets (ibv_ud_pingpong's is 0x11111111); RC is not.
net p1-qkey 0x8001 150 169
net p1-qkey-other 0x8001 170 189
sed -i 's/"pkey": "0x8001"/"pkey": "0x8001", "qkey": "0x11111111"/' "$CNI_CONF/p1-qkey.conflist"
sed -i 's/"pkey": "0x8001"/"pkey": "0x8001", "qkey": "0x22222222"/' "$CNI_CONF/p1-qkey-other.conflist"
pod q
pod r
cni ADD p1-qkey q /run/netns/q > /dev/null
cni ADD p1-qkey-other r /run/netns/r > /dev/null
Q=$(device p1-qkey q); R=$(device p1-qkey-other r)
IPQ=$(address p1-qkey q); IPR=$(address p1-qkey-other r)
guarded() { pinned "$PA" && ls -d /sys/fs/bpf/pkeyfw/*/eth0 | grep -c . | grep -qx 2; }
check qkey-guards-pinned guarded
check qkey-ud-same-completes pingpong ud q "$Q" b "$B" "$IPQ"
check qkey-ud-other-stalls stalls ud r "$R" b "$B" "$IPR"
check qkey-rc-other-completes pingpong rc r "$R" b "$B" "$IPR"
check qkey-check pkeyfw_check p1-qkey-other r
cni DEL p1-qkey q /run/netns/q
cni DEL p1-qkey-other r /run/netns/r
check qkey-guards-removed sh -c "! ls -d /sys/fs/bpf/pkeyfw/*/eth0 2> /dev/null"

# A pod may narrow its key (full to limited), never leave the partition.
pod d
out=$(cni --args "IgnoreUnknown=1;PKEY=0x8002" ADD p1-full d /run/netns/d)
echo "$out"
check override-refused refused_with 7 "CNI_ARGS PKEY"
# nothing_of POD: the pod has no device, the host none, the ports are A's, B's, C's.
nothing_of() {
    [ -z "$(ip netns exec "$1" rdma dev)" ] && [ -z "$(rdma dev)" ] && policy_ports 3 "$PA $PB $PC"
}
check override-refused-leaves-nothing nothing_of d
cni --args "IgnoreUnknown=1;PKEY=0x0001" ADD p1-full d /run/netns/d > /tmp/d.json
D=$(device p1-full d); IPD=$(address p1-full d)
check override-narrows sh -c "grep -c '^stamp = 0x0001' $RECORDS/roce0.toml | grep -qx 3"
check rc-d-b-stalls stalls rc d "$D" b "$B" "$IPD"
cni DEL p1-full d /run/netns/d

# A half-failed ADD: the bridge made the port, but pkeyfw cannot attach
# to it (an operator's host attachment is pinned there): the ADD fails,
# nothing of it is left, the other pods enforce throughout, and DEL after
# it succeeds.
pod e
bridged=$(cni plugin ADD p1-limited 0 e /run/netns/e)
PE=$(echo "$bridged" | cni field port)
printf '[port]\npkeys = [0xffff]\n' > /tmp/host.toml
$PKEYFW attach "$PE" --pin --policy /tmp/host.toml
out=$(cni plugin ADD p1-limited 1 e /run/netns/e --prev "$bridged")
echo "$out"
check failed-add-refused refused_with 101 "access port"
check failed-add-leaves-nothing nothing_of e
others_enforce() { pingpong rc a "$A" b "$B" "$IPA" && stalls rc b "$B" c "$C" "$IPB"; }
check failed-add-others-enforce others_enforce
started=$(now_ms)
check del-after-failed-add cni DEL p1-limited e /run/netns/e
measure del-after-failed-add-ms $(( $(now_ms) - started ))
check del-again cni DEL p1-limited e /run/netns/e
$PKEYFW detach "$PE"

# A pod whose namespace is gone without a DEL: the next ADD takes its port
# out; its DEL then finds nothing and succeeds.
ip netns del c
sleep 1
pod f
cni ADD p1-limited f /run/netns/f > /dev/null
PF=$(port p1-limited f)
check gone-port-pruned policy_ports 3 "$PA $PB $PF"
check del-gone-netns cni DEL p1-limited c /run/netns/c
gone() { ! ls -d /sys/fs/bpf/pkeyfw/*/"$1" > /dev/null 2>&1 && ! grep -q "$1" "$RECORDS/roce0.toml"; }
check del-gone-netns-leaves-nothing gone "$PC"

# GC (CNI 1.1.0): the network's attachments the runtime does not list go.
collected() {
    cni GC p1-limited 1 --cni-version 1.1.0 --valid b/eth0 && policy_ports 2 "$PA $PB" && gone "$PF" &&
        [ -z "$(ip netns exec f rdma dev)" ]
}
check gc collected
cni plugin DEL p1-limited 0 f /run/netns/f > /dev/null

# Ten pods started together all get their ports.
for i in 0 1 2 3 4 5 6 7 8 9; do pod t$i; done
started=$(now_ms)
for i in 0 1 2 3 4 5 6 7 8 9; do
    n=p1-limited
    [ $i = 0 ] && n=p1-full
    (cni ADD $n t$i /run/netns/t$i > /tmp/t$i.json; echo $? > /tmp/t$i.status) &
done
wait
measure ten-concurrent-adds-ms $(( $(now_ms) - started ))
ten_ok() {
    for i in 0 1 2 3 4 5 6 7 8 9; do
        [ "$(cat /tmp/t$i.status)" = 0 ] || { cat /tmp/t$i.json; return 1; }
        [ "$(ip netns exec t$i rdma dev | wc -l)" = 1 ] || return 1
    done
    policy_ports 12 "$PA $PB" && pinned $(jq -r '.ports[].interface' "$RECORDS/roce0.json")
}
check ten-concurrent-adds ten_ok
T0=$(device p1-full t0); T1=$(device p1-limited t1); T2=$(device p1-limited t2)
check ten-rc-t0-t1 pingpong rc t0 "$T0" t1 "$T1" "$(address p1-full t0)"
check ten-rc-t1-t2-stalls stalls rc t1 "$T1" t2 "$T2" "$(address p1-limited t1)"
started=$(now_ms)
for i in 0 1 2 3 4 5 6 7 8 9; do
    n=p1-limited
    [ $i = 0 ] && n=p1-full
    (cni DEL $n t$i /run/netns/t$i; echo $? > /tmp/t$i.status) &
done
wait
measure ten-concurrent-dels-ms $(( $(now_ms) - started ))
ten_gone() { ! grep -vqx 0 /tmp/t?.status && policy_ports 2 "$PA $PB"; }
check ten-concurrent-dels ten_gone

# Start-up: ADD of the network with and without pkeyfw.
for net in plain p1-limited; do
    total=0
    for i in 1 2 3 4 5; do
        pod s$i
        started=$(now_ms)
        cni ADD $net s$i /run/netns/s$i > /dev/null
        total=$(( total + $(now_ms) - started ))
        cni DEL $net s$i /run/netns/s$i
        ip netns del s$i
    done
    measure "add-ms-$net" $(( total / 5 ))
done

# A device taken away: CHECK says so.
ip netns exec a rdma link delete "$A"
out=$(pkeyfw_check p1-full a)
echo "$out"
check check-detects-missing-device refused_with 102 "no device"

# The last pods go: nothing is left, no port, no pin, no device, no record.
cni DEL p1-full a /run/netns/a
cni DEL p1-limited b /run/netns/b
check last-del-leaves-nothing nothing_left
ls -R /sys/fs/bpf/pkeyfw 2> /dev/null
echo "plain.sh done"
