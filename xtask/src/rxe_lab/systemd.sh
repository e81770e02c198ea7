# The `systemd` scenario, in the soft-RoCE guest with systemd as PID 1: what
# an operator does with pkeyfw's Debian package. Two rdma_rxe devices on a
# veth pair (as `pkeyfw lab rxe`'s, policy routing sending their traffic
# over it), the package installed with dpkg, the shipped tenants example as
# both ends' policy (stamping: both ends run pkeyfw), tenants as systemd
# slices, unmodified ibv_rc_pingpong started with systemd-run in them.
# Each `check NAME` is a test (results.sh writes its line).
set -u
. /share/results.sh
: > "$RESULTS"
# The exposure `systemd-analyze security` gives the unit the README records.
MAX_EXPOSURE=2.8

# --- the fabric --------------------------------------------------------------
# The soft-RoCE lab's pair, as the test kit sets it up for `pkeyfw lab rxe`
# (pkfw0 with pkfw_rxe0, pkfw1 with pkfw_rxe1), left in place: each end
# printed as IFACE ADDRESS DEVICE GID_INDEX.
/share/pkeyfw-lab-rxe pair > /tmp/pair.txt || exit 1
udevadm settle
# pair_end IFACE FIELD: a field (2 the address, 4 the GID index) of an end.
pair_end() { awk -v i="$1" -v f="$2" '$1 == i { print $f }' /tmp/pair.txt; }
A=$(pair_end pkfw0 2)
B=$(pair_end pkfw1 2)
GA=$(pair_end pkfw0 4)
GB=$(pair_end pkfw1 4)
echo "systemd: pkfw_rxe0 ($A) GID $GA, pkfw_rxe1 ($B) GID $GB"

# How many lines of UNIT's journal contain TEXT.
said() { journalctl -u "$1" -o cat --no-pager 2>/dev/null | grep -c -- "$2"; }
# Waits up to SECS for UNIT's journal to contain TEXT more than BEFORE times.
await() {
    for i in $(seq 1 "$4"); do
        [ "$(said "$1" "$2")" -gt "$3" ] && return 0
        sleep 1
    done
    return 1
}
# Who holds IFACE's filter, as `pkeyfw stats --json` says.
held() { pkeyfw stats "$1" --json | grep -o '"held":"[^"]*"' | cut -d'"' -f4; }
main_pid() { systemctl show -P MainPID "pkeyfw@$1"; }

# An RC pingpong, server on pkfw_rxe1 in slice $2, client on pkfw_rxe0 in
# slice $3, each a unit; whether the client completed within 20 s.
PORT=18515
pingpong() {
    PORT=$((PORT + 1))
    systemd-run --quiet --unit="srv-$1" --slice="$2" -p RuntimeMaxSec=60 \
        ibv_rc_pingpong -d pkfw_rxe1 -g "$GB" -p $PORT -n 20
    for i in $(seq 1 20); do
        ss -ltn | grep -q ":$PORT " && break
        sleep 1
    done
    systemd-run --quiet --wait --unit="cli-$1" --slice="$3" -p RuntimeMaxSec=20 \
        ibv_rc_pingpong -d pkfw_rxe0 -g "$GA" -p $PORT -n 20 $B > /dev/null 2>&1
    completed=$?
    systemctl stop "srv-$1" 2> /dev/null
    if [ $completed -ne 0 ]; then
        journalctl -u "srv-$1" -u "cli-$1" -o cat --no-pager | tail -8
    fi
    return $completed
}

# --- the package -------------------------------------------------------------
installed() {
    because "dpkg -i failed or installed no unit"
    dpkg -i /share/pkeyfw.deb && [ -x /usr/bin/pkeyfw ] && systemctl cat pkeyfw@.service > /dev/null
}
check dpkg-install installed

# --- tenants as slices, the shipped example as both ends' policy -------------
for t in a b; do
    printf '[Unit]\nDescription=Tenant %s\n' $t > /etc/systemd/system/tenant-$t.slice
done
systemctl daemon-reload
systemctl start tenant-a.slice tenant-b.slice
mkdir -p /etc/pkeyfw
for i in pkfw0 pkfw1; do
    cp /usr/share/doc/pkeyfw/examples/tenants.toml /etc/pkeyfw/$i.toml
done

# --- two instances started at the same moment --------------------------------
systemctl enable --now pkeyfw@pkfw0 pkeyfw@pkfw1
both_attach() {
    because "see pkeyfw's journal below"
    await pkeyfw@pkfw0 "pkeyfw: attached to" 0 120 && await pkeyfw@pkfw1 "pkeyfw: attached to" 0 120 &&
        [ "$(held pkfw0)" = "foreground, process $(main_pid pkfw0)" ] &&
        [ "$(held pkfw1)" = "foreground, process $(main_pid pkfw1)" ]
}
check both-instances-attach both_attach || {
    journalctl -u 'pkeyfw@*' -o short-monotonic --no-pager | tail -40
    # Nothing below can work without them (the host reports the rest not run).
    exit 0
}

# --- the device's own table size, through the uverbs device the unit opens ---
reads_max_qp() {
    want=$(ibv_devinfo -v -d pkfw_rxe1 | awk '/max_qp:/ {print $2; exit}')
    [ -n "$want" ] && [ "$(said pkeyfw@pkfw1 "(pkfw_rxe1 max_qp $want)")" -gt 0 ] ||
        because "not sized for pkfw_rxe1's max_qp ${want:-?}: $(said pkeyfw@pkfw1 'max_qp') lines; $(journalctl -u pkeyfw@pkfw1 -o cat --no-pager | grep -m1 'max_qp')"
}
check unit-reads-max-qp reads_max_qp

# --- tenants ------------------------------------------------------------------
one_tenant() {
    because "tenant-a's client did not complete"
    pingpong aa tenant-a.slice tenant-a.slice
}
check one-tenant-completes one_tenant
apart_stall() {
    if pingpong ab tenant-a.slice tenant-b.slice; then
        because "tenant-b's client completed with tenant-a's server"
        return 1
    fi
    because "no violation line in journalctl -u pkeyfw@pkfw1"
    await pkeyfw@pkfw1 "drop pkey_violation" 0 10
}
check tenants-apart-stall apart_stall

# --- restart and stop: enforcement never lapses -------------------------------
# Frames to a QP no one has, sent throughout on pkfw0 past its egress
# stamper (PACKET_QDISC_BYPASS): P_Key 0x8005, which no table holds, must
# never reach pkfw1's packet taps; 0xffff (the default partition) must.
cat > /tmp/probe.pl <<'PERL'
use strict;
use Socket;
my ($from, $to) = @ARGV;
sub slurp { open(my $f, "<", shift) or die "$!"; my $v = <$f>; chomp $v; $v }
sub mac { pack("H12", join("", split(/:/, slurp("/sys/class/net/$_[0]/address")))) }
socket(my $s, 17, 3, 0) or die "AF_PACKET: $!";
setsockopt($s, 263, 20, pack("i", 1)) or die "PACKET_QDISC_BYPASS: $!";
my $dst = mac($to);
my $ll = pack("S n i S C C a8", 17, 0x0800, slurp("/sys/class/net/$from/ifindex"), 0, 0, 6, $dst);
sub frame {
    my $bth = pack("C C n N N", 0x04, 0, shift, 0x00abcdef, 0) . ("\0" x 20);
    my $udp = pack("n n n n", 49152, 4791, 8 + length($bth), 0) . $bth;
    my $ip = pack("C C n n n C C n", 0x45, 0, 20 + length($udp), 0, 0x4000, 64, 17, 0)
        . inet_aton("192.0.2.1") . inet_aton("192.0.2.2");
    my $sum = 0;
    $sum += $_ for unpack("n*", $ip);
    $sum = ($sum & 0xffff) + ($sum >> 16) while $sum > 0xffff;
    substr($ip, 10, 2) = pack("n", ~$sum & 0xffff);
    $dst . mac($from) . pack("n", 0x0800) . $ip . $udp;
}
my ($refused, $passed) = (frame(0x8005), frame(0xffff));
while (1) {
    send($s, $refused, 0, $ll) or die "send: $!";
    send($s, $passed, 0, $ll) or die "send: $!";
    select(undef, undef, undef, 0.02);
}
PERL
tcpdump -i pkfw1 -n -U -w /tmp/lapse.pcap 'udp dst port 4791 and (udp[12:4] & 0xffffff) = 0xabcdef' 2> /tmp/tcpdump.log &
TCPDUMP=$!
for i in $(seq 1 20); do grep -qs listening /tmp/tcpdump.log && break; sleep 1; done
perl /tmp/probe.pl pkfw0 pkfw1 &
PROBE=$!
sleep 2

before=$(said pkeyfw@pkfw1 "pkeyfw: attached to")
old=$(main_pid pkfw1)
systemctl restart pkeyfw@pkfw1
takes_over() {
    await pkeyfw@pkfw1 "pkeyfw: attached to" "$before" 120 &&
        [ "$(main_pid pkfw1)" != "$old" ] &&
        [ "$(held pkfw1)" = "foreground, process $(main_pid pkfw1)" ] ||
        because "pkeyfw stats pkfw1 says held by: $(held pkfw1)"
}
check restart-takes-over takes_over
old=$(main_pid pkfw1)
systemctl stop pkeyfw@pkfw1
sleep 3
leaves_filter() {
    ! systemctl -q is-active pkeyfw@pkfw1 &&
        [ "$(held pkfw1)" = "foreground, process $old gone" ] &&
        ip link show pkfw1 | grep -q xdp ||
        because "pkeyfw stats pkfw1 says held by: $(held pkfw1)"
}
check stop-leaves-the-filter leaves_filter
before=$(said pkeyfw@pkfw1 "pkeyfw: attached to")
systemctl start pkeyfw@pkfw1
await pkeyfw@pkfw1 "pkeyfw: attached to" "$before" 120
sleep 2
kill $PROBE
kill -INT $TCPDUMP
wait $TCPDUMP
refused=$(tcpdump -r /tmp/lapse.pcap -n 'udp[10:2] = 0x8005' 2> /dev/null | wc -l)
passed=$(tcpdump -r /tmp/lapse.pcap -n 'udp[10:2] = 0xffff' 2> /dev/null | wc -l)
echo "systemd: across restart, stop and start: $refused refused and $passed passed probe frames arrived"
never_lapses() {
    because "$refused refused frames arrived ($passed passed)"
    [ "$refused" -eq 0 ] && [ "$passed" -gt 0 ]
}
check enforcement-never-lapses never_lapses

# --- reload -------------------------------------------------------------------
# tenant-b joins tenant-a's partition: its client now completes.
for i in pkfw0 pkfw1; do
    sed -i 's/pkey = 0x8002/pkey = 0x8001/' /etc/pkeyfw/$i.toml
done
r0=$(said pkeyfw@pkfw0 "reloaded pkfw0")
r1=$(said pkeyfw@pkfw1 "reloaded pkfw1")
reload_applies() {
    because "tenant-b's client did not complete after the reload"
    systemctl reload pkeyfw@pkfw0 pkeyfw@pkfw1 &&
        await pkeyfw@pkfw0 "reloaded pkfw0" "$r0" 60 && await pkeyfw@pkfw1 "reloaded pkfw1" "$r1" 60 &&
        pingpong ab2 tenant-a.slice tenant-b.slice
}
check reload-applies reload_applies
# A bad policy is refused (`systemctl reload` fails) and logged with
# where it is wrong; the running one stays.
refused_before=$(said pkeyfw@pkfw1 "/etc/pkeyfw/pkfw1.toml:2:")
printf '[port]\npkeys = [0xffff, 0x8001\n' > /etc/pkeyfw/pkfw1.toml
bad_reload_refused() {
    if systemctl reload pkeyfw@pkfw1; then
        because "systemctl reload accepted a bad policy"
        return 1
    fi
    await pkeyfw@pkfw1 "/etc/pkeyfw/pkfw1.toml:2:" "$refused_before" 60 &&
        systemctl -q is-active pkeyfw@pkfw1 &&
        pingpong ab3 tenant-a.slice tenant-b.slice ||
        because "$(journalctl -u pkeyfw@pkfw1 -o cat --no-pager | tail -3)"
}
check bad-reload-refused bad_reload_refused

# --- hardening ----------------------------------------------------------------
exposure=$(systemd-analyze security pkeyfw@pkfw1.service --no-pager 2>&1 |
    sed -n 's/.*Overall exposure level for pkeyfw@pkfw1.service: \([0-9.]*\).*/\1/p')
echo "systemd: systemd-analyze security pkeyfw@pkfw1: exposure ${exposure:-?} (at most $MAX_EXPOSURE)"
low_exposure() {
    because "exposure ${exposure:-unknown}, more than $MAX_EXPOSURE"
    [ -n "$exposure" ] && awk "BEGIN { exit !($exposure <= $MAX_EXPOSURE) }"
}
check exposure low_exposure
# Under that hardening nothing was denied.
denies_nothing() {
    ! journalctl -u 'pkeyfw@*' -o cat --no-pager | grep -qi "permission denied\|operation not permitted" ||
        because "$(journalctl -u 'pkeyfw@*' -o cat --no-pager | grep -i 'denied\|not permitted' | head -3)"
}
check hardening-denies-nothing denies_nothing
# The unit's real-time priority, which no tenant's task preempts.
policy=$(chrt -p "$(systemctl show -p MainPID --value pkeyfw@pkfw1)" 2>&1 | head -1)
real_time() {
    because "pkeyfw@pkfw1: $policy"
    case "$policy" in *SCHED_FIFO*) ;; *) return 1 ;; esac
}
check runs-ahead-of-tenants real_time

# --- tenants with devices of their own, and DeviceAllow= ------------------------
# The same two slices, each given a device of its own on an uplink by the
# unit of the uplink (its own instance; a name without `-`, which an
# instance name would have to escape); a service's DeviceAllow= and the
# device guard must both allow its open: its own device opens, another's
# does not even where DeviceAllow= names it, nor its own where DeviceAllow=
# leaves it out.
systemctl stop pkeyfw@pkfw0 pkeyfw@pkfw1
pkeyfw detach pkfw0 > /dev/null
pkeyfw detach pkfw1 > /dev/null
rdma link delete pkfw_rxe0
rdma link delete pkfw_rxe1
ip netns add uplink-peer
ip link add pkfwup type veth peer name pkfwup-peer netns uplink-peer
ip link set pkfwup up
ip -n uplink-peer link set pkfwup-peer up
cat > /etc/pkeyfw/pkfwup.toml <<'POLICY'
[port]
pkeys = [0xffff, 0x8001, 0x0001]

[enforcement]
stamp = true
unknown_qp = "drop"

[[bind]]
cgroup = "/sys/fs/cgroup/tenant.slice/tenant-a.slice"
pkey = 0x8001
own_device = { name = "rxe_ta", address = "192.0.2.31/24" }

[[bind]]
cgroup = "/sys/fs/cgroup/tenant.slice/tenant-b.slice"
pkey = 0x0001
own_device = { name = "rxe_tb", address = "192.0.2.32/24" }
POLICY
systemctl start pkeyfw@pkfwup
makes_devices() {
    await pkeyfw@pkfwup "the uplink of 2 tenants' own devices" 0 120 &&
        [ -e /sys/class/infiniband/rxe_ta ] && [ -e /sys/class/infiniband/rxe_tb ] ||
        because "$(journalctl -u pkeyfw@pkfwup -o cat --no-pager | grep 'pkeyfw' | grep -v 'pkeyfw@' | tail -5)"
}
check unit-makes-tenant-devices makes_devices
udevadm settle
node() { for d in /sys/class/infiniband_verbs/uverbs*; do
    [ "$(cat "$d/ibdev")" = "$1" ] && echo "/dev/infiniband/${d##*/}"; done; }
TA=$(node rxe_ta)
TB=$(node rxe_tb)
GTA=$(/share/pkeyfw-lab-rxe gid-index rxe_ta 192.0.2.31)
GTB=$(/share/pkeyfw-lab-rxe gid-index rxe_tb 192.0.2.32)
# ibv_devinfo on DEVICE as a service in SLICE allowed the nodes NODES
# (with rdma_cm); whether it opened it.
opens() {
    slice=$1 device=$2
    shift 2
    allow=""
    for n in "$@"; do allow="$allow -p DeviceAllow=$n"; done
    systemd-run --quiet --wait --slice="$slice" -p DevicePolicy=closed \
        -p DeviceAllow=/dev/infiniband/rdma_cm $allow ibv_devinfo -d "$device" > /dev/null 2>&1
}
allowed_and_guarded() {
    opens tenant-a.slice rxe_ta "$TA" && ! opens tenant-b.slice rxe_ta "$TA" &&
        ! opens tenant-a.slice rxe_ta && opens tenant-b.slice rxe_tb "$TB" ||
        because "own $TA from a: $(opens tenant-a.slice rxe_ta "$TA" && echo opened || echo refused); $TA from b allowed by DeviceAllow=: $(opens tenant-b.slice rxe_ta "$TA" && echo opened || echo refused); $TA from a, DeviceAllow= without it: $(opens tenant-a.slice rxe_ta && echo opened || echo refused)"
}
check device-allow-and-the-guard allowed_and_guarded
# A and B (a full and a limited member of 0x0001), each on its own device
# and each allowed only its own node, complete.
PORT=$((PORT + 1))
systemd-run --quiet --unit=srv-own --slice=tenant-a.slice -p RuntimeMaxSec=60 \
    -p DevicePolicy=closed -p DeviceAllow="$TA" -p DeviceAllow=/dev/infiniband/rdma_cm \
    ibv_rc_pingpong -d rxe_ta -g "$GTA" -p $PORT -n 20
for i in $(seq 1 20); do ss -ltn | grep -q ":$PORT " && break; sleep 1; done
own_complete() {
    systemd-run --quiet --wait --unit=cli-own --slice=tenant-b.slice -p RuntimeMaxSec=20 \
        -p DevicePolicy=closed -p DeviceAllow="$TB" -p DeviceAllow=/dev/infiniband/rdma_cm \
        ibv_rc_pingpong -d rxe_tb -g "$GTB" -p $PORT -n 20 192.0.2.31 > /dev/null 2>&1 ||
        because "$(journalctl -u srv-own -u cli-own -o cat --no-pager | tail -6)"
}
check own-devices-complete own_complete
systemctl stop srv-own 2> /dev/null
# A restart (SIGQUIT, then a replacing attach) keeps the devices.
before=$(said pkeyfw@pkfwup "the uplink of 2 tenants' own devices")
ifindex=$(cat /sys/class/net/rxe_ta/ifindex)
systemctl restart pkeyfw@pkfwup
keeps_devices() {
    await pkeyfw@pkfwup "the uplink of 2 tenants' own devices" "$before" 120 &&
        [ "$(cat /sys/class/net/rxe_ta/ifindex)" = "$ifindex" ] ||
        because "$(journalctl -u pkeyfw@pkfwup -o cat --no-pager | tail -5)"
}
check restart-keeps-tenant-devices keeps_devices
systemctl stop pkeyfw@pkfwup
removes_devices() {
    pkeyfw detach pkfwup > /dev/null && [ ! -e /sys/class/net/rxe_ta ] &&
        [ ! -e /sys/class/infiniband/rxe_tb ] && ! ip rule | grep -q "oif rxe_t" ||
        because "$(ip rule; ip link | grep rxe_t)"
}
check detach-removes-tenant-devices removes_devices

echo "systemd: the journal of pkeyfw@pkfw1:"
journalctl -u pkeyfw@pkfw1 -o short-monotonic --no-pager | tail -40
