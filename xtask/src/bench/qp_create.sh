#!/bin/sh
# The cost pkeyfw's QP-creation probe adds to ibv_create_qp, in the
# soft-RoCE guest: 300 UD QPs per run, three runs each without pkeyfw, with
# a pinned attachment whose 64 [[bind]] rules all miss (the longest match),
# and with one whose first rule binds every QP (the match, a stats slot and
# the QP-table entry). Prints "CASE: N µs" lines; `bound` must be 900.
set -e
ip link add pk0 type veth peer name pk1
ip link set pk0 up
ip link set pk1 up
rdma link add rx0 type rxe netdev pk0
{
    printf '[port]\npkeys = [0xffff, 0x8001]\n'
    for i in $(seq 1 64); do printf '[[bind]]\nuid = %d\npkey = 0x8001\n' $((5000 + i)); done
} > /tmp/miss.toml
printf '[port]\npkeys = [0xffff, 0x8001]\n[[bind]]\nuid = 0\npkey = 0x8001\n' > /tmp/hit.toml
runs() {
    for r in 1 2 3; do ./pkeyfw-lab-verbs --device rx0 --create 300; done |
        sed 's/.*: \([0-9.]*\) µs.*/\1/' | sort -n | sed -n 2p | sed "s/^/$1: /; s/$/ µs/"
}
runs "no pkeyfw"
./pkeyfw attach pk0 --pin --policy /tmp/miss.toml > /dev/null 2>&1
runs "64 rules, none matches"
./pkeyfw reload pk0 --policy /tmp/hit.toml > /dev/null 2>&1
runs "the first rule binds"
./pkeyfw stats pk0 | grep -E '^ +bound '
./pkeyfw detach pk0 > /dev/null
