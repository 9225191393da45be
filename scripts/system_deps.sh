#!/usr/bin/env bash
# The Debian packages `make demo` (demo) or `make test` (test) needs: installed when missing and this is root with
# apt-get; otherwise the one line that installs them is printed, and the make stops.
set -euo pipefail
need=()
command -v tmux > /dev/null || need+=(tmux)
command -v git > /dev/null || need+=(git)
if [ "${1:-test}" = test ]; then
  [ -x /usr/sbin/sshd ] || need+=(openssh-server)
  command -v ssh-keygen > /dev/null || need+=(openssh-client)
  command -v ip > /dev/null || need+=(iproute2)
  command -v chromium > /dev/null || need+=(chromium)
  command -v shellcheck > /dev/null || need+=(shellcheck)
  # make scale-demo and its tests: a PostgreSQL and a Redis of their own (started by the script, never as services).
  ls /usr/lib/postgresql/*/bin/initdb > /dev/null 2>&1 || need+=(postgresql)
  command -v redis-server > /dev/null || need+=(redis-server)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
    echo "installing the Debian packages the ${1:-test} needs: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${need[@]}"
  else
    echo "missing system packages: ${need[*]}; install them first:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y --no-install-recommends ${need[*]}" >&2
    exit 1
  fi
fi
# sshd refuses to start without its privilege-separation folder (the tests start their own sshd on loopback).
if [ "${1:-test}" = test ] && [ "$(id -u)" = 0 ]; then mkdir -p /run/sshd; fi
