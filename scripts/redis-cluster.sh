#!/bin/sh
# redis-cluster.sh - a throwaway 3-master Redis Cluster on 127.0.0.1 for `belfry bench redis`.
#
#   scripts/redis-cluster.sh start   start it (installs redis-server from apt when missing);
#                                    prints REDIS_CLUSTER_NODES=h:p,h:p,h:p; no-op when running
#   scripts/redis-cluster.sh stop    stop the nodes this script started (by their pid files)
#   scripts/redis-cluster.sh status  exit 0 when all nodes run, 3 when not
#   scripts/redis-cluster.sh env     print REDIS_CLUSTER_NODES=... again
#
# Environment: REDIS_CLUSTER_PORT (first port, default 7101; nodes use PORT..PORT+2 and
# the cluster bus PORT+10000..), REDIS_CLUSTER_DIR (default
# ${TMPDIR:-/tmp}/belfry-bench-redis-cluster-$REDIS_CLUSTER_PORT).
# Persistence: append-only file with fsync every second, no snapshots. Throwaway: a start
# that finds the nodes stopped wipes their data, so every run begins with an empty cluster.
set -eu

base=${REDIS_CLUSTER_PORT:-7101}
dir=${REDIS_CLUSTER_DIR:-${TMPDIR:-/tmp}/belfry-bench-redis-cluster-$base}
masters=3

say() { printf 'redis-cluster.sh: %s\n' "$*" >&2; }
fail() { say "error: $*"; exit 1; }

ports() {
    i=0
    while [ "$i" -lt "$masters" ]; do echo $((base + i)); i=$((i + 1)); done
}

# node_pid PORT: the pid in that node's pid file, if alive and a redis-server
# (a stale pid file may name a recycled pid that belongs to something else).
node_pid() {
    f=$dir/$1/redis.pid
    [ -r "$f" ] || return 0
    pid=$(cat "$f" 2>/dev/null || true)
    case "$pid" in '' | *[!0-9]*) return 0 ;; esac
    [ "$(cat "/proc/$pid/comm" 2>/dev/null || true)" = redis-server ] || return 0
    echo "$pid"
}

# Shared with redis.sh: install_if_missing.
. "$(dirname "$0")/redis-install.sh"

cli() { p=$1; shift; redis-cli -h 127.0.0.1 -p "$p" "$@"; }

all_running() {
    for p in $(ports); do [ -n "$(node_pid "$p")" ] || return 1; done
}

cluster_ok() {
    for p in $(ports); do
        info=$(cli "$p" cluster info 2>/dev/null | tr -d '\r') || return 1
        echo "$info" | grep -qx 'cluster_state:ok' || return 1
        echo "$info" | grep -qx 'cluster_slots_assigned:16384' || return 1
        echo "$info" | grep -qx "cluster_known_nodes:$masters" || return 1
    done
}

print_env() {
    nodes=""
    for p in $(ports); do nodes=${nodes:+$nodes,}127.0.0.1:$p; done
    echo "REDIS_CLUSTER_NODES=$nodes"
    pids=""
    for p in $(ports); do pids=${pids:+$pids,}$(node_pid "$p"); done
    echo "REDIS_CLUSTER_PIDS=$pids"
}

start_node() {
    p=$1
    rm -rf "${dir:?}/$p"
    mkdir -p "$dir/$p"
    cat >"$dir/$p/redis.conf" <<CONF
bind 127.0.0.1
port $p
protected-mode yes
daemonize yes
pidfile $dir/$p/redis.pid
logfile $dir/$p/redis.log
dir $dir/$p
cluster-enabled yes
cluster-config-file nodes.conf
cluster-node-timeout 5000
appendonly yes
appendfsync everysec
save ""
CONF
    redis-server "$dir/$p/redis.conf" </dev/null >/dev/null 2>&1 ||
        fail "redis-server on port $p did not start; see $dir/$p/redis.log"
    tries=0
    until [ -n "$(node_pid "$p")" ] && cli "$p" ping 2>/dev/null | grep -q PONG; do
        tries=$((tries + 1))
        [ "$tries" -le 200 ] || fail "redis-server on port $p did not answer within 20 s"
        sleep 0.1
    done
}

start() {
    install_if_missing
    mkdir -p "$dir"
    if all_running && cluster_ok; then
        print_env
        return 0
    fi
    stop
    for p in $(ports); do start_node "$p"; done
    addrs=""
    for p in $(ports); do addrs="$addrs 127.0.0.1:$p"; done
    # shellcheck disable=SC2086 # one word per node address
    redis-cli --cluster create $addrs --cluster-replicas 0 --cluster-yes \
        >"$dir/create.log" 2>&1 || { cat "$dir/create.log" >&2; stop; fail "cluster create failed"; }
    tries=0
    until cluster_ok; do
        tries=$((tries + 1))
        [ "$tries" -le 300 ] || { stop; fail "cluster not ok within 30 s"; }
        sleep 0.1
    done
    say "running on 127.0.0.1 ports $base..$((base + masters - 1)), data in $dir"
    print_env
}

stop() {
    for p in $(ports); do
        pid=$(node_pid "$p")
        [ -n "$pid" ] || { rm -f "$dir/$p/redis.pid"; continue; }
        kill -TERM "$pid" 2>/dev/null || true
        tries=0
        while [ -n "$(node_pid "$p")" ]; do
            tries=$((tries + 1))
            if [ "$tries" -gt 100 ]; then
                kill -KILL "$pid" 2>/dev/null || true
                break
            fi
            sleep 0.1
        done
        rm -f "$dir/$p/redis.pid"
        say "stopped pid $pid (port $p)"
    done
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) all_running && cluster_ok && print_env || exit 3 ;;
    env) print_env ;;
    *) sed -n '2,14s/^# \{0,1\}//p' "$0"; exit 2 ;;
esac
