# The CNI lab's shell library: networks of bridge + pkeyfw, pods as
# network namespaces run by the test kit's CNI runtime (`cni`, as libcni
# runs a configuration list), and what the checks read back.
. /share/results.sh
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
CNI_BIN=/usr/lib/cni
CNI_CONF=/etc/cni/net.d
PKEYFW=/share/pkeyfw
RECORDS=/run/pkeyfw/cni/host
mkdir -p "$CNI_CONF"
ln -sf "$PKEYFW" "$CNI_BIN/pkeyfw"

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

# cni [--args CNI_ARGS] ADD|CHECK|DEL NET ID NETNS [IFNAME]: the network's
# plugins for a pod (ADD: the final result on stdout); `cni --help` says
# the rest (one plugin alone, GC, VERSION, the fields of a result).
cni() { /share/pkeyfw-lab-cni "$@"; }

# pod NAME: a network namespace for a pod.
pod() { ip netns add "$1" && ip -n "$1" link set lo up; }

# device NET ID: the pod's RDMA device, as its ADD's result lists it (the
# sandboxed interface before the pod's own); address NET ID: its IPv4
# address; port NET ID: its bridge port.
device() { cni result "$1" "$2" device; }
address() { cni result "$1" "$2" address; }
port() { cni result "$1" "$2" port; }

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
code() { echo "$1" | cni field code 2> /dev/null; }
# refused_with CODE TEXT: $out is an error object of CODE that says TEXT.
refused_with() { [ "$(code "$out")" = "$1" ] && echo "$out" | grep -q "$2"; }
# nothing_left: no pin, no record of bridge roce0, no RDMA device.
nothing_left() {
    [ -z "$(ls /sys/fs/bpf/pkeyfw 2> /dev/null)" ] && [ ! -e "$RECORDS/roce0.json" ] &&
        [ ! -e "$RECORDS/roce0.toml" ] && [ -z "$(rdma dev)" ]
}
