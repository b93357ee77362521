# redis-install.sh - sourced by redis.sh and redis-cluster.sh: installs redis-server and
# redis-cli from apt when missing, without letting apt start a system-wide redis service.
# The sourcing script defines `say` and `fail`.

install_if_missing() {
    command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 && return 0
    say "installing redis-server from apt"
    sudo_cmd=""
    [ "$(id -u)" = 0 ] || sudo_cmd=sudo
    # Keep apt's maintainer scripts from starting a system-wide redis service.
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
            redis-server redis-tools >/dev/null || status=$?
    fi
    [ "$policy_made" = 0 ] || $sudo_cmd rm -f /usr/sbin/policy-rc.d
    [ "$status" = 0 ] || fail "apt-get install redis-server failed"
}
