#!/usr/bin/env bash
# Simulated hosts for mpi_trainer on one machine.
#
#   scripts/local_cluster.sh up N [--bandwidth RATE] [--delay TIME] [--slots S[,S...]]
#                                 [--prefix NAME] [--subnet A.B.C.0/24]
#   scripts/local_cluster.sh down [--prefix NAME]
#
# `up` creates N network namespaces (hosts NAMEh0 .. NAMEh<N-1>), each joined to the bridge
# NAMEbr by a veth pair, writes a machinefile and the launcher agent that Open MPI uses instead
# of ssh (`ip netns exec HOST unshare --uts`, so each host has its own hostname), and prints the
# mpirun command line that runs a job across them. `--bandwidth` shapes both directions of every
# host's link with a token bucket (tc tbf); `--delay` adds one-way latency with netem where the
# kernel has it. Running `up` again with the same N re-applies the shaping (change the rate
# between runs without restarting); `down` removes exactly what `up` recorded in its state
# directory, and nothing else.
#
# mpirun runs the state directory's agent.sh as root, so nobody else may write there: `up`
# creates it fresh with mktemp (an unpredictable name, mode 700) under the root-only
# /run/mpi_trainer-cluster (MPT_CLUSTER_ROOT), and every later use refuses a state directory
# it did not create (not root's, open to others, a symbolic link, or without its mark) and
# any symbolic link inside it.
#
# Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN), iproute2 and util-linux's unshare.
# Exit status: 0 done, 1 failure, 2 bad arguments, 77 missing rights or tools (tests skip on it).
set -euo pipefail

PROG="local_cluster.sh"
PREFIX="mpt"
SUBNET="10.88.0.0/24"
BANDWIDTH=""
DELAY=""
SLOTS="1"
HOSTS=""
FRESH=0  # 1 while `up` builds a new cluster: a failure then removes what it built

usage() {
    sed -n '3,6p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

die() {  # die STATUS MESSAGE
    echo "$PROG: error: $2" >&2
    exit "$1"
}

STATE_ROOT="${MPT_CLUSTER_ROOT:-/run/mpi_trainer-cluster}"
MARK=".created-by-local_cluster"  # written by `up` into the state directory it creates

check_private() {  # check_private DIR WHAT: a real directory, root's, mode 700, else refuse it
    [ ! -L "$1" ] || die 1 "$2 $1 is a symbolic link; expected a directory this script created (remove it)"
    [ -d "$1" ] || die 1 "$2 $1 is not a directory; expected a directory this script created (remove it)"
    local owner mode
    owner="$(stat -c %u "$1")" mode="$(stat -c %a "$1")"
    [ "$owner" = 0 ] && [ "$mode" = 700 ] ||
        die 1 "$2 $1 was not created by this script. Received: owner uid $owner, mode $mode; expected root's, mode 700 (remove it)"
}

state_root() {  # the directory that holds every cluster's state; created root-only on first use
    [ -e "$STATE_ROOT" ] || [ -L "$STATE_ROOT" ] || mkdir -m 700 "$STATE_ROOT" ||
        die 1 "cannot create the state root $STATE_ROOT; expected a root-only directory (set MPT_CLUSTER_ROOT)"
    check_private "$STATE_ROOT" "the state root"
}

find_state() {  # sets STATE to the prefix's state directory made by `up`, or to "" when there is none
    state_root
    local -a found=()
    local entry
    for entry in "$STATE_ROOT/$PREFIX".*; do
        [ -e "$entry" ] || [ -L "$entry" ] || continue
        found+=("$entry")
    done
    STATE=""
    [ "${#found[@]}" -le 1 ] ||
        die 1 "more than one state directory for prefix $PREFIX: ${found[*]}; expected one (remove the ones no cluster uses)"
    [ "${#found[@]}" = 1 ] || return 0
    check_private "${found[0]}" "the state directory"
    [ -f "${found[0]}/$MARK" ] && [ ! -L "${found[0]}/$MARK" ] ||
        die 1 "the state directory ${found[0]} was not created by this script (it has no $MARK); expected only directories \`up\` made (remove it)"
    STATE="${found[0]}"
    refuse_links
}

new_state() {  # a fresh state directory with an unpredictable name
    state_root
    STATE="$(mktemp -d "$STATE_ROOT/$PREFIX.XXXXXXXX")" || die 1 "cannot create a state directory in $STATE_ROOT"
    chmod 700 "$STATE"
    : > "$STATE/$MARK"
}

refuse_links() {  # nothing in the state directory is followed: a symbolic link there is refused
    local link
    link="$(find "$STATE" -mindepth 1 -type l -print -quit)"
    [ -z "$link" ] || die 1 "$link in the state directory is a symbolic link; expected only the files this script writes"
}

parse_options() {
    while [ $# -gt 0 ]; do
        case "$1" in
            --bandwidth) BANDWIDTH="${2:?--bandwidth needs a rate}"; shift 2 ;;
            --delay) DELAY="${2:?--delay needs a time}"; shift 2 ;;
            --slots) SLOTS="${2:?--slots needs a count}"; shift 2 ;;
            --prefix) PREFIX="${2:?--prefix needs a name}"; shift 2 ;;
            --subnet) SUBNET="${2:?--subnet needs A.B.C.0/24}"; shift 2 ;;
            -h|--help) usage ;;
            *) die 2 "unknown argument. Received: $1; expected --bandwidth, --delay, --slots, --prefix or --subnet" ;;
        esac
    done
    validate_options
}

validate_options() {
    [[ "$PREFIX" =~ ^[a-z][a-z0-9]{0,8}$ ]] ||
        die 2 "the prefix names interfaces (at most 15 characters with suffixes). Received: --prefix=$PREFIX; expected 1-9 lowercase letters or digits, starting with a letter"
    [[ "$SUBNET" =~ ^(10|192\.168|172\.(1[6-9]|2[0-9]|3[01]))(\.[0-9]{1,3}){1,2}\.0/24$ ]] ||
        die 2 "the hosts need a private /24. Received: --subnet=$SUBNET; expected e.g. 10.88.0.0/24"
    [ -z "$BANDWIDTH" ] || [[ "$BANDWIDTH" =~ ^[0-9]+(bit|kbit|mbit|gbit)$ ]] ||
        die 2 "cannot read the rate. Received: --bandwidth=$BANDWIDTH; expected an integer with bit, kbit, mbit or gbit, e.g. 100mbit"
    [ -z "$DELAY" ] || [[ "$DELAY" =~ ^[0-9]+(us|ms|s)$ ]] ||
        die 2 "cannot read the delay. Received: --delay=$DELAY; expected an integer with us, ms or s, e.g. 5ms"
    [[ "$SLOTS" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] ||
        die 2 "slots are positive counts. Received: --slots=$SLOTS; expected one count for every host or a comma-separated list, e.g. 2,1"
}

require_rights() {
    [ "$(id -u)" = 0 ] ||
        die 77 "network namespaces, veths and tc need root (CAP_NET_ADMIN and CAP_SYS_ADMIN). Received: uid=$(id -u); expected to run as root, e.g. with sudo"
    local tool
    for tool in ip tc unshare; do
        command -v "$tool" >/dev/null || die 77 "\`$tool\` is not installed; expected iproute2 (ip, tc) and util-linux (unshare)"
    done
}

address() { echo "${SUBNET%.0/24}.$1"; }

rate_bytes_per_second() {  # 100mbit -> 12500000
    local number="${1%%[a-z]*}" unit="${1##*[0-9]}"
    case "$unit" in
        bit) echo $((number / 8)) ;;
        kbit) echo $((number * 1000 / 8)) ;;
        mbit) echo $((number * 1000000 / 8)) ;;
        gbit) echo $((number * 1000000000 / 8)) ;;
    esac
}

burst_bytes() {
    # A quarter millisecond of traffic, at least 16 KiB: small enough that the rate holds over a
    # transfer of a megabyte, large enough for the kernel's timers to keep up at 10 Gbit/s.
    local quarter_ms=$(($(rate_bytes_per_second "$1") / 4000))
    echo $((quarter_ms > 16384 ? quarter_ms : 16384))
}

record() { echo "$1 $2" >> "$STATE/created"; }  # what `down` removes, in creation order

run() {  # run COMMAND...: a failure names the command and rolls back a cluster created by this call
    local output status=1
    if ! output=$("$@" 2>&1); then
        echo "$PROG: error: \`$*\` failed: $output" >&2
        if [[ "$output" == *"Operation not permitted"* ]]; then
            echo "$PROG: this environment does not allow network namespaces (needs CAP_NET_ADMIN and CAP_SYS_ADMIN)" >&2
            status=77
        fi
        [ "$FRESH" = 0 ] || teardown >/dev/null
        exit "$status"
    fi
}

slots_for() {  # slots_for INDEX: that host's entry of --slots (the last one repeats)
    local -a list
    IFS=, read -r -a list <<< "$SLOTS"
    local last=$((${#list[@]} - 1))
    echo "${list[$(($1 < last ? $1 : last))]}"
}

check_names_free() {
    local name
    for name in "${PREFIX}br" $(seq -f "${PREFIX}v%g" 1 "$HOSTS"); do
        ! ip link show dev "$name" >/dev/null 2>&1 ||
            die 1 "interface $name exists but is not in this script's state ($STATE); expected no leftovers: remove it with \`ip link del $name\` or choose another --prefix"
    done
    for name in $(seq -f "${PREFIX}h%g" 0 $((HOSTS - 1))); do
        ! ip netns list | grep -qw "$name" ||
            die 1 "network namespace $name exists but is not in this script's state ($STATE); expected no leftovers: remove it with \`ip netns del $name\` or choose another --prefix"
    done
}

create_bridge() {
    run ip link add "${PREFIX}br" type bridge
    record link "${PREFIX}br"
    run ip addr add "$(address 254)/24" dev "${PREFIX}br"
    run ip link set "${PREFIX}br" up
}

create_host() {  # create_host INDEX
    local host="${PREFIX}h$1" outside="${PREFIX}v$(($1 + 1))" inside="${PREFIX}p$(($1 + 1))"
    run ip netns add "$host"
    record netns "$host"
    run ip link add "$outside" type veth peer name "$inside"
    record link "$outside"
    run ip link set "$inside" netns "$host"
    run ip link set "$outside" master "${PREFIX}br" up
    run ip -n "$host" addr add "$(address $(($1 + 1)))/24" dev "$inside"
    run ip -n "$host" link set "$inside" up
    run ip -n "$host" link set lo up
}

check_netem() {
    [ -n "$DELAY" ] || return 0
    if ! tc qdisc add dev "${PREFIX}br" root netem delay "$DELAY" >/dev/null 2>&1; then
        [ "$FRESH" = 0 ] || teardown >/dev/null
        die 1 "--delay needs the kernel's netem queueing discipline (sch_netem), which this kernel ($(uname -r)) does not have. Received: --delay=$DELAY; expected no --delay here (--bandwidth uses tbf, which works without netem)"
    fi
    tc qdisc del dev "${PREFIX}br" root
}

shape_device() {  # shape_device DEVICE [ip netns exec HOST]: tbf (under netem if --delay) on DEVICE's egress
    local device="$1"; shift
    local -a tcx=("$@" tc)
    "$@" tc qdisc del dev "$device" root >/dev/null 2>&1 || true
    local parent=(root)
    if [ -n "$DELAY" ]; then
        run "${tcx[@]}" qdisc add dev "$device" root handle 1: netem delay "$DELAY"
        parent=(parent 1:)
    fi
    [ -z "$BANDWIDTH" ] || run "${tcx[@]}" qdisc add dev "$device" "${parent[@]}" handle 10: \
        tbf rate "$BANDWIDTH" burst "$(burst_bytes "$BANDWIDTH")" latency 100ms
}

shape_hosts() {
    # The outside end's egress is the traffic into a host, the inside end's the traffic out of it:
    # shaping both caps every host at RATE in each direction, as a NIC of that speed would.
    local index
    for index in $(seq 0 $((HOSTS - 1))); do
        shape_device "${PREFIX}v$((index + 1))"
        shape_device "${PREFIX}p$((index + 1))" ip netns exec "${PREFIX}h$index"
    done
}

write_files() {
    local index
    : > "$STATE/machinefile"
    for index in $(seq 0 $((HOSTS - 1))); do
        echo "${PREFIX}h$index slots=$(slots_for "$index")" >> "$STATE/machinefile"
    done
    cat > "$STATE/agent.sh" <<'AGENT'
#!/bin/sh
# Open MPI starts its daemon on HOST through this instead of ssh: agent.sh HOST COMMAND...
host="$1"; shift
exec ip netns exec "$host" unshare --uts sh -c "hostname $host; $*"
AGENT
    chmod 755 "$STATE/agent.sh"
    printf '%s\n' --machinefile "$STATE/machinefile" --prtemca plm_ssh_agent "$STATE/agent.sh" \
        --mca btl_tcp_if_include "$SUBNET" --prtemca prte_if_include "$SUBNET" > "$STATE/mpirun_args"
    {
        echo "hosts=$HOSTS"; echo "prefix=$PREFIX"; echo "subnet=$SUBNET"; echo "bandwidth=$BANDWIDTH"
        echo "burst_bytes=$([ -z "$BANDWIDTH" ] || burst_bytes "$BANDWIDTH")"; echo "delay=$DELAY"
    } > "$STATE/cluster.env"
}

print_command() {
    local total=0 index
    for index in $(seq 0 $((HOSTS - 1))); do total=$((total + $(slots_for "$index"))); done
    local shaping="unshaped"
    [ -z "$BANDWIDTH" ] || shaping="$BANDWIDTH each way per host"
    [ -z "$DELAY" ] || shaping="$shaping, $DELAY one-way delay"
    echo "$HOSTS hosts up: ${PREFIX}h0..${PREFIX}h$((HOSTS - 1)) on $SUBNET ($shaping); state in $STATE"
    echo "machinefile: $STATE/machinefile"
    echo "run a job across them with:"
    echo "  mpirun -n $total $( [ "$(id -u)" != 0 ] || echo '--allow-run-as-root ')--oversubscribe --bind-to none $(tr '\n' ' ' < "$STATE/mpirun_args")python -m mpi_trainer train configs/quickstart.toml"
    echo "remove them with: $0 down --prefix $PREFIX"
}

existing_hosts() { sed -n 's/^hosts=//p' "$STATE/cluster.env" 2>/dev/null; }

cmd_up() {
    HOSTS="${1:-}"
    [[ "$HOSTS" =~ ^[1-9][0-9]*$ ]] && [ "$HOSTS" -le 200 ] ||
        die 2 "up needs a host count. Received: up ${HOSTS:-(nothing)}; expected up N with 1 <= N <= 200"
    shift
    parse_options "$@"
    require_rights
    find_state
    if [ -n "$STATE" ] && [ -s "$STATE/created" ]; then
        [ "$(existing_hosts)" = "$HOSTS" ] ||
            die 1 "a cluster with prefix $PREFIX is already up with $(existing_hosts) hosts. Received: up $HOSTS; expected \`$0 down --prefix $PREFIX\` first"
        SUBNET="$(sed -n 's/^subnet=//p' "$STATE/cluster.env")"
    else
        check_names_free
        [ -n "$STATE" ] || new_state
        FRESH=1
        create_bridge
        local index
        for index in $(seq 0 $((HOSTS - 1))); do create_host "$index"; done
    fi
    check_netem
    shape_hosts
    write_files
    print_command
}

teardown() {  # removes what $STATE/created lists, newest first, then the state directory
    local kind name
    if [ -f "$STATE/created" ]; then
        while read -r kind name; do
            if [ "$kind" = netns ] && ip netns list | grep -qw "$name"; then
                ip netns del "$name" && echo "removed network namespace $name"
            elif [ "$kind" = link ] && ip link show dev "$name" >/dev/null 2>&1; then
                ip link del "$name" && echo "removed interface $name"
            fi
        done < <(tac "$STATE/created")
    fi
    rm -f "$STATE/created" "$STATE/machinefile" "$STATE/agent.sh" "$STATE/mpirun_args" "$STATE/cluster.env" \
        "$STATE/$MARK"
    [ ! -d "$STATE" ] || rmdir "$STATE"
}

cmd_down() {
    parse_options "$@"
    require_rights
    find_state
    if [ -z "$STATE" ]; then
        echo "no cluster with prefix $PREFIX is up (no state in $STATE_ROOT): nothing to remove"
        return 0
    fi
    teardown
}

case "${1:-}" in
    up) shift; cmd_up "$@" ;;
    down) shift; cmd_down "$@" ;;
    *) usage ;;
esac
