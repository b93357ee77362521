#!/bin/sh
# redis.sh - a throwaway redis-server on 127.0.0.1 for the belfry bench's Redis baseline.
#
#   scripts/redis.sh start   start it (installs redis-server from apt when missing);
#                            prints REDIS_URL=... and REDIS_PID=...; no-op when running
#   scripts/redis.sh stop    stop the server this script started (by its pid file)
#   scripts/redis.sh status  exit 0 when running, 3 when not
#
# Environment: REDIS_PORT (default 6390), REDIS_DIR (default ${TMPDIR:-/tmp}/belfry-bench-redis-$REDIS_PORT).
# Persistence: append-only file with fsync every second and no snapshots, the usual
# production setting of a Redis delay queue. Throwaway: a start that finds the server
# stopped wipes the old append-only files, so every run begins with an empty, unfragmented Redis.
set -eu

port=${REDIS_PORT:-6390}
dir=${REDIS_DIR:-${TMPDIR:-/tmp}/belfry-bench-redis-$port}
pidfile=$dir/redis.pid

say() { printf 'redis.sh: %s\n' "$*" >&2; }
fail() { say "error: $*"; exit 1; }

# running_pid: the pid in our pid file, if that process is alive and is a redis-server
# (a stale pid file may name a recycled pid that belongs to something else).
running_pid() {
    [ -r "$pidfile" ] || return 0
    pid=$(cat "$pidfile" 2>/dev/null || true)
    case "$pid" in '' | *[!0-9]*) return 0 ;; esac
    [ -r "/proc/$pid/comm" ] || return 0
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = redis-server ] || return 0
    echo "$pid"
}

# Shared with redis-cluster.sh: install_if_missing.
. "$(dirname "$0")/redis-install.sh"

ping_ok() { redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG; }

print_env() {
    echo "REDIS_URL=redis://127.0.0.1:$port"
    echo "REDIS_PID=$(running_pid)"
}

start() {
    install_if_missing
    mkdir -p "$dir"
    if [ -n "$(running_pid)" ] && ping_ok; then
        print_env
        return 0
    fi
    rm -rf "$dir/appendonlydir" "$dir"/*.aof
    cat >"$dir/redis.conf" <<CONF
bind 127.0.0.1
port $port
protected-mode yes
daemonize yes
pidfile $pidfile
logfile $dir/redis.log
dir $dir
appendonly yes
appendfsync everysec
save ""
CONF
    redis-server "$dir/redis.conf" </dev/null >/dev/null 2>&1 || fail "redis-server did not start; see $dir/redis.log"
    tries=0
    until [ -n "$(running_pid)" ] && ping_ok; do
        tries=$((tries + 1))
        [ "$tries" -le 200 ] || fail "redis-server did not answer within 20 s; see $dir/redis.log"
        sleep 0.1
    done
    say "running on 127.0.0.1:$port (pid $(running_pid)), data in $dir"
    print_env
}

stop() {
    pid=$(running_pid)
    if [ -z "$pid" ]; then
        rm -f "$pidfile"
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    tries=0
    while [ -n "$(running_pid)" ]; do
        tries=$((tries + 1))
        if [ "$tries" -gt 100 ]; then
            kill -KILL "$pid" 2>/dev/null || true
            break
        fi
        sleep 0.1
    done
    rm -f "$pidfile"
    say "stopped pid $pid"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) [ -n "$(running_pid)" ] && echo "running pid $(running_pid) on 127.0.0.1:$port" || exit 3 ;;
    *) sed -n '2,12s/^# \{0,1\}//p' "$0"; exit 2 ;;
esac
