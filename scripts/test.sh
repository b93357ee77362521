#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what the tests need, then runs every test.
#
#   scripts/test.sh            # everything
#   scripts/test.sh -p belfry-store   # extra arguments go to `cargo test`
#
# Tests start their own servers (belfry, HTTP receivers, redis-server) on 127.0.0.1 and stop
# exactly what they started.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '==> %s\n' "$*"; }

# redis-server is needed by the Redis baseline tests. Install it from Debian if it is missing;
# never start the packaged system service.
if ! command -v redis-server >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        say "installing redis-server (apt)"
        policy=/usr/sbin/policy-rc.d
        made_policy=0
        if [ ! -e "$policy" ]; then
            printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
        fi
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
        [ "$made_policy" = 1 ] && rm -f "$policy"
    else
        say "redis-server is missing and cannot be installed here (need root + apt); tests that need it will fail"
    fi
fi

say "cargo $(cargo --version | cut -d' ' -f2), $(nproc) cores"
say "building and running all tests"
cargo test --workspace --locked "$@"
