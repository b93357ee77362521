#!/bin/sh
# nats.sh - a throwaway nats-server with JetStream on 127.0.0.1, for trying the NATS sink.
#
#   scripts/nats.sh install  install nats-server from apt when missing
#   scripts/nats.sh start    start it (installs first); prints NATS_URL=... and NATS_PID=...;
#                            no-op when already running
#   scripts/nats.sh stop     stop the server this script started (by its pid file)
#   scripts/nats.sh status   exit 0 when running, 3 when not
#
# Environment: NATS_PORT (default 4232), NATS_DIR (default ${TMPDIR:-/tmp}/belfry-nats-$NATS_PORT).
# Tests do not use this script: they start their own nats-server on a free port.
set -eu

port=${NATS_PORT:-4232}
dir=${NATS_DIR:-${TMPDIR:-/tmp}/belfry-nats-$port}
pidfile=$dir/nats.pid

say() { printf 'nats.sh: %s\n' "$*" >&2; }
fail() { say "error: $*"; exit 1; }

# running_pid: the pid in our pid file, if that process is alive and is a nats-server.
running_pid() {
    [ -r "$pidfile" ] || return 0
    pid=$(cat "$pidfile" 2>/dev/null || true)
    case "$pid" in '' | *[!0-9]*) return 0 ;; esac
    [ "$(cat "/proc/$pid/comm" 2>/dev/null || true)" = nats-server ] || return 0
    echo "$pid"
}

install_if_missing() {
    command -v nats-server >/dev/null 2>&1 && return 0
    say "installing nats-server from apt"
    sudo_cmd=""
    [ "$(id -u)" = 0 ] || sudo_cmd=sudo
    # Keep apt's maintainer scripts from starting a system-wide service.
    policy_made=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' | $sudo_cmd tee /usr/sbin/policy-rc.d >/dev/null
        $sudo_cmd chmod 755 /usr/sbin/policy-rc.d
        policy_made=1
    fi
    status=0
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get -q update >/dev/null || status=$?
    if [ "$status" = 0 ]; then
        DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get -q -y install --no-install-recommends \
            nats-server >/dev/null || status=$?
    fi
    [ "$policy_made" = 0 ] || $sudo_cmd rm -f /usr/sbin/policy-rc.d
    [ "$status" = 0 ] || fail "apt-get install nats-server failed"
}


print_env() {
    echo "NATS_URL=nats://127.0.0.1:$port"
    echo "NATS_PID=$(running_pid)"
}

start() {
    install_if_missing
    mkdir -p "$dir/jetstream"
    if [ -n "$(running_pid)" ]; then
        print_env
        return 0
    fi
    rm -f "$dir/nats.log"
    # -js: JetStream on, its store in our temp dir; loopback only.
    (cd "$dir" && exec setsid nats-server -a 127.0.0.1 -p "$port" -js -sd "$dir/jetstream" \
        -P "$pidfile" -l "$dir/nats.log" </dev/null >/dev/null 2>&1) &
    tries=0
    until [ -n "$(running_pid)" ] && grep -q "Server is ready" "$dir/nats.log" 2>/dev/null; do
        tries=$((tries + 1))
        [ "$tries" -le 200 ] || fail "nats-server did not become ready within 20 s; see $dir/nats.log"
        sleep 0.1
    done
    say "running on 127.0.0.1:$port (pid $(running_pid)), JetStream store in $dir/jetstream"
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
    install) install_if_missing ;;
    start) start ;;
    stop) stop ;;
    status) [ -n "$(running_pid)" ] && echo "running pid $(running_pid) on 127.0.0.1:$port" || exit 3 ;;
    *) sed -n '2,12s/^# \{0,1\}//p' "$0"; exit 2 ;;
esac
