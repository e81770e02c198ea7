# The guest scripts' half of the results protocol (results.rs reads it):
# one line per check in /share/results, `ok NAME` or `FAILED NAME: why`,
# and `measure NAME VALUE`. Every check is a line `check NAME COMMAND...`
# of the script, which is how the host knows the checks to expect.
RESULTS=/share/results

ok() { echo "ok $1" >> "$RESULTS"; echo "== ok $1"; }
fail() { echo "FAILED $1: $2" >> "$RESULTS"; echo "== FAILED $1: $2"; }
measure() { echo "measure $1 $2" >> "$RESULTS"; echo "== measure $1 $2"; }
# check NAME COMMAND...: ok when the command succeeds, else FAILED with
# what it last gave `because`, or its command line (and a failed status).
check() {
    local name=$1
    shift
    WHY=""
    if "$@"; then ok "$name"; else fail "$name" "${WHY:-$*}"; return 1; fi
}
# because WHY...: why the running check fails, should it; fails itself, so
# that `COMMAND || because WHY` fails.
because() { WHY="$*"; return 1; }
