# The CNI lab's shell library: a CNI runtime as the specification's section
# 3 runs a network configuration list (each plugin in turn with the one
# before's result for ADD and CHECK, in reverse with the ADD's result for
# DEL, and DEL after a failed ADD), networks of bridge + pkeyfw, pods as
# network namespaces, and the checks the host reads back (`ok NAME`,
# `FAILED NAME: why`, `measure NAME VALUE`).
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
CNI_BIN=/usr/lib/cni
CNI_CONF=/etc/cni/net.d
CACHE=/var/lib/cni-lab
RESULTS=/share/results
PKEYFW=/share/pkeyfw
RECORDS=/run/pkeyfw/cni/host
mkdir -p "$CNI_CONF" "$CACHE"
ln -sf "$PKEYFW" "$CNI_BIN/pkeyfw"

ok() { echo "ok $1" >> "$RESULTS"; echo "== ok $1"; }
fail() { echo "FAILED $1: $2" >> "$RESULTS"; echo "== FAILED $1: $2"; }
measure() { echo "measure $1 $2" >> "$RESULTS"; echo "== measure $1 $2"; }
# check NAME COMMAND...: ok when the command succeeds.
check() {
    local name=$1
    shift
    if "$@"; then ok "$name"; else fail "$name" "$*"; fi
}
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# net NAME PKEY FIRST LAST [TRUNK] [BRIDGE]: a network of bridge (host-local
# addresses FIRST to LAST of 10.77.0.0/24) and pkeyfw with PKEY; PKEY
# "none" leaves pkeyfw out.
net() {
    local pkeyfw=""
    if [ "$2" != none ]; then
        pkeyfw=", {\"type\": \"pkeyfw\", \"pkey\": \"$2\"${5:+, \"trunk\": \"$5\"}}"
    fi
    cat > "$CNI_CONF/$1.conflist" <<NET
{"cniVersion": "1.0.0", "name": "$1", "plugins": [
  {"type": "bridge", "bridge": "${6:-roce0}", "ipam": {"type": "host-local",
   "ranges": [[{"subnet": "10.77.0.0/24", "rangeStart": "10.77.0.$3", "rangeEnd": "10.77.0.$4"}]]}}$pkeyfw]}
NET
}

# plugin NET INDEX PREV: the request configuration of the network's plugin
# INDEX, with PREV (JSON, or null) as prevResult.
plugin() {
    jq -c --argjson i "$2" --argjson prev "$3" \
        '.plugins[$i] + {cniVersion: .cniVersion, name: .name}
         + (if $prev == null then {} else {prevResult: $prev} end)' "$CNI_CONF/$1.conflist"
}

# invoke CMD NET INDEX PREV ID NETNS IFNAME: runs one plugin; its stdout.
invoke() {
    local conf type
    conf=$(plugin "$2" "$3" "$4")
    type=$(echo "$conf" | jq -r .type)
    echo "$conf" | CNI_COMMAND=$1 CNI_CONTAINERID=$5 CNI_NETNS=$6 CNI_IFNAME=$7 \
        CNI_ARGS="${CNI_LAB_ARGS:-}" CNI_PATH=$CNI_BIN "$CNI_BIN/$type"
}

# cni CMD NET ID NETNS [IFNAME]: the network's plugins for CMD (ADD: the
# final result on stdout, cached for CHECK and DEL; a failed ADD is
# followed by DEL, as a runtime does).
cni() {
    local cmd=$1 n=$2 id=$3 ns=$4 ifname=${5:-eth0} cache count prev out i
    cache="$CACHE/$n-$id-$ifname.json"
    count=$(jq '.plugins | length' "$CNI_CONF/$n.conflist")
    case $cmd in
        ADD)
            prev=null
            for i in $(seq 0 $((count - 1))); do
                if ! out=$(invoke ADD "$n" "$i" "$prev" "$id" "$ns" "$ifname"); then
                    echo "$out"
                    cni DEL "$n" "$id" "$ns" "$ifname" > /dev/null
                    return 1
                fi
                prev=$out
            done
            echo "$prev" > "$cache"
            echo "$prev"
            ;;
        CHECK)
            prev=$(cat "$cache")
            for i in $(seq 0 $((count - 1))); do
                invoke CHECK "$n" "$i" "$prev" "$id" "$ns" "$ifname" || return 1
            done
            ;;
        DEL)
            prev=$(cat "$cache" 2> /dev/null || echo null)
            for i in $(seq $((count - 1)) -1 0); do
                invoke DEL "$n" "$i" "$prev" "$id" "$ns" "$ifname" || return 1
            done
            rm -f "$cache"
            ;;
    esac
}

# pod NAME: a network namespace for a pod.
pod() { ip netns add "$1" && ip -n "$1" link set lo up; }

# device NET ID: the pod's RDMA device, as its ADD's result lists it (the
# sandboxed interface before the pod's own).
device() {
    jq -r '[.interfaces[] | select(.sandbox != null)] | .[-2].name' "$CACHE/$1-$2-eth0.json"
}
# address NET ID: the pod's IPv4 address.
address() { jq -r '.ips[0].address' "$CACHE/$1-$2-eth0.json" | cut -d/ -f1; }
# port NET ID: the pod's bridge port, from the ADD's result.
port() {
    jq -r '[.interfaces[] | select(.sandbox == null)] | .[1].name' "$CACHE/$1-$2-eth0.json"
}

# listening EXEC PORT: waits (up to 20 s) until a server listens on TCP
# PORT where EXEC runs commands (ibv_*_pingpong's servers exchange QP
# numbers over TCP first: a client that comes too early is refused).
listening() {
    local i
    for i in $(seq 100); do
        $1 ss -ltn 2> /dev/null | grep -q ":$2 " && return 0
        sleep 0.2
    done
    return 1
}

PP_PORT=18600
# pingpong KIND SERVER_NS SERVER_DEV CLIENT_NS CLIENT_DEV SERVER_IP:
# ibv_KIND_pingpong between two pods; succeeds when both ends complete.
pingpong() {
    local server client
    PP_PORT=$((PP_PORT + 1))
    ip netns exec "$2" timeout 25 "ibv_$1_pingpong" -d "$3" -g 1 -n 5 -p $PP_PORT \
        > /tmp/pp-server.txt 2>&1 &
    server=$!
    listening "ip netns exec $2" $PP_PORT
    ip netns exec "$4" timeout 15 "ibv_$1_pingpong" -d "$5" -g 1 -n 5 -p $PP_PORT "$6" \
        > /tmp/pp-client.txt 2>&1
    client=$?
    [ $client = 0 ] || kill $server 2> /dev/null
    wait $server
    server=$?
    echo "pingpong $1 $2<-$4: server $server, client $client"
    [ $client = 0 ] || head -3 /tmp/pp-client.txt
    [ $client = 0 ] && [ $server = 0 ]
}
stalls() { ! pingpong "$@"; }

# code JSON: the CNI error code in a plugin's output.
code() { echo "$1" | jq -r '.code // empty' 2> /dev/null; }
# refused_with CODE TEXT: $out is an error object of CODE that says TEXT.
refused_with() { [ "$(code "$out")" = "$1" ] && echo "$out" | grep -q "$2"; }
# nothing_left: no pin, no record of bridge roce0, no RDMA device.
nothing_left() {
    [ -z "$(ls /sys/fs/bpf/pkeyfw 2> /dev/null)" ] && [ ! -e "$RECORDS/roce0.json" ] &&
        [ ! -e "$RECORDS/roce0.toml" ] && [ -z "$(rdma dev)" ]
}
