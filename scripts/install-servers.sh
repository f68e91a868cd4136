#!/usr/bin/env bash
# Installs the real servers the tests start (redis-server, ZooKeeper, MariaDB,
# PostgreSQL) from Debian's packages, where they are missing. The tests start their own
# instances on free loopback ports; nothing here starts a system service.
set -euo pipefail

# PostgreSQL's server and tools live in /usr/lib/postgresql/<version>/bin, off PATH
has_postgresql() {
  local bin
  for bin in /usr/lib/postgresql/*/bin; do
    [ -x "$bin/postgres" ] && [ -x "$bin/initdb" ] && [ -x "$bin/psql" ] && return 0
  done
  return 1
}

missing=()
command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ] || missing+=(redis-server)
[ -f /usr/share/java/zookeeper.jar ] || missing+=(zookeeper)
command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || missing+=(mariadb-server)
# the package also makes the `postgres` user, which runs the server when we are root
# (PostgreSQL refuses root); a cluster of its own on 5432, if apt starts one (the
# policy below asks it not to), is left alone: nothing here uses it
has_postgresql && getent passwd postgres >/dev/null || missing+=(postgresql)
# the topologies of scripts/servers also use redis-cli and mariadb-dump (each a dependency of
# its server's package, so only missing where the server came from elsewhere)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v mariadb-dump >/dev/null 2>&1 || missing+=(mariadb-client)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing ${missing[*]} with apt-get" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
# keep package scripts from starting system services: the tests run their own
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
  $sudo chmod +x /usr/sbin/policy-rc.d
  trap '$sudo rm -f /usr/sbin/policy-rc.d' EXIT
fi
$sudo apt-get update -qq
$sudo apt-get install -y -qq "${missing[@]}" >/dev/null
