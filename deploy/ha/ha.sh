#!/usr/bin/env bash
# det's database as a Patroni cluster on one machine, for tests and trials of a failover:
# one etcd and NODES (2 or 3) PostgreSQL 15 servers managed by Patroni, synchronous replication
# (synchronous_mode: a commit is acknowledged once a replica holds it, so a failover loses
# nothing acknowledged), ttl 10 s, loop_wait 2 s. Everything (data, configs, logs, pid files)
# lives under DIR; README.md ("Production") shows the same layout on three hosts.
#
#   deploy/ha/ha.sh up DIR [NODES]   start etcd and the nodes, wait for a leader and a
#                                    synchronous replica, create the det database, run
#                                    `det db migrate` on it; prints the multi-host DET_DB_URL
#   deploy/ha/ha.sh down DIR         stop the nodes (Patroni stops its PostgreSQL), then etcd
#
# Ports: BASE_PORT (default 15430) + 10 / + 11: etcd's client / peer; BASE_PORT + i: node i's
# PostgreSQL, BASE_PORT + 20 + i: its Patroni REST API (i = 1..NODES). The superuser's
# password is in DIR/superuser.password. Needs: patroni, etcd (Debian: patroni, etcd-server),
# PostgreSQL 15's binaries (PG_BIN, default /usr/lib/postgresql/15/bin) and det on PATH. Run
# as root, the servers run as the postgres user (PostgreSQL refuses root).
set -euo pipefail

cmd=${1:?usage: ha.sh up|down DIR [NODES]}
dir=${2:?usage: ha.sh up|down DIR [NODES]}
nodes=${3:-2}
base=${BASE_PORT:-15430}
pg_bin=${PG_BIN:-/usr/lib/postgresql/15/bin}
etcd_port=$((base + 10))
run_as=()
# setpriv execs (runuser would fork): the pid recorded is the server's own
[ "$(id -u)" = 0 ] && run_as=(setpriv --reuid=postgres --regid=postgres --init-groups --)

node_port() { echo $((base + $1)); }

# Which etcd API Patroni keeps its leader key in. Patroni 3.0.2 (Debian bookworm's) renews the
# key through etcd's v3 API with an unconditional put once its lease has expired, trusting its
# cached view of who leads: a primary frozen past the ttl wakes, takes the key back from the
# replica promoted meanwhile, and that replica is rewound, losing what it had committed.
# Upstream made the renewal a compare-and-set after 3.0.2 (May 2023); before 3.1, a margin,
# the v2 API is used, where the renewal is a compare-and-swap on the node's own name, which
# fails once another node leads.
dcs_api() {
    local version
    version=$(patroni --version | awk '{print $2}')
    if [ "$(printf '%s\n3.1\n' "$version" | sort -V | head -1)" = 3.1 ]; then
        echo etcd3
    else
        echo etcd
    fi
}
rest_port() { echo $((base + 20 + $1)); }

url() {  # the owner's multi-host URL: libpq tries each host and keeps the primary
    local hosts="" ports=""
    for i in $(seq 1 "$nodes"); do
        hosts+="${hosts:+,}127.0.0.1"; ports+="${ports:+,}$(node_port "$i")"
    done
    echo "host=$hosts port=$ports dbname=det user=postgres password=$(cat "$dir/superuser.password") target_session_attrs=read-write"
}

wait_for() {  # wait_for SECONDS WHAT COMMAND...
    local until=$((SECONDS + $1)) what=$2; shift 2
    until "$@" >/dev/null 2>&1; do
        if [ "$SECONDS" -ge "$until" ]; then echo "ha.sh: timed out waiting for $what" >&2; exit 1; fi
        sleep 0.2
    done
}

node_config() {  # node_config I: Patroni's YAML for node I
    local i=$1 pw repl
    pw=$(cat "$dir/superuser.password"); repl=$(cat "$dir/replication.password")
    cat <<EOF
scope: det
name: node$i
restapi:
  listen: 127.0.0.1:$(rest_port "$i")
  connect_address: 127.0.0.1:$(rest_port "$i")
$(dcs_api):
  hosts: 127.0.0.1:$etcd_port
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 2
    retry_timeout: 4
    # a crashed primary is failed over at once, not restarted in place (safe: synchronous)
    master_start_timeout: 0
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    postgresql:
      use_pg_rewind: true
      parameters:
        max_connections: 300
        wal_level: replica
        hot_standby: "on"
        wal_log_hints: "on"
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 256MB
        password_encryption: scram-sha-256
        shared_preload_libraries: plpgsql
  initdb:
    - encoding: UTF8
    - locale: C.UTF-8
postgresql:
  listen: 127.0.0.1:$(node_port "$i")
  connect_address: 127.0.0.1:$(node_port "$i")
  data_dir: $dir/node$i/data
  bin_dir: $pg_bin
  pgpass: $dir/node$i/pgpass
  parameters:
    unix_socket_directories: $dir/node$i
  authentication:
    superuser:
      username: postgres
      password: "$pw"
    replication:
      username: replicator
      password: "$repl"
    rewind:
      username: postgres
      password: "$pw"
  pg_hba:
    - local all all scram-sha-256
    - host all all 127.0.0.1/32 scram-sha-256
    - host replication replicator 127.0.0.1/32 scram-sha-256
EOF
}

up() {
    mkdir -p "$dir/etcd"
    chmod 0755 "$dir"
    for f in superuser replication; do
        [ -s "$dir/$f.password" ] || (umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=' > "$dir/$f.password")
    done
    if [ ! -s "$dir/etcd.pid" ] || ! kill -0 "$(cat "$dir/etcd.pid")" 2>/dev/null; then
        etcd --name etcd1 --data-dir "$dir/etcd" \
            --listen-client-urls "http://127.0.0.1:$etcd_port" \
            --advertise-client-urls "http://127.0.0.1:$etcd_port" \
            --listen-peer-urls "http://127.0.0.1:$((etcd_port + 1))" \
            --initial-advertise-peer-urls "http://127.0.0.1:$((etcd_port + 1))" \
            --initial-cluster "etcd1=http://127.0.0.1:$((etcd_port + 1))" \
            --enable-v2=true \
            >"$dir/etcd.log" 2>&1 &
        echo $! >"$dir/etcd.pid"
    fi
    wait_for 30 etcd curl -sf "http://127.0.0.1:$etcd_port/health"
    for i in $(seq 1 "$nodes"); do
        mkdir -p "$dir/node$i"
        node_config "$i" >"$dir/node$i/patroni.yml"
        chmod 0600 "$dir/node$i/patroni.yml"
        [ ${#run_as[@]} -eq 0 ] || chown -R postgres: "$dir/node$i"
        if [ ! -s "$dir/node$i/patroni.pid" ] || ! kill -0 "$(cat "$dir/node$i/patroni.pid")" 2>/dev/null; then
            "${run_as[@]}" patroni "$dir/node$i/patroni.yml" >>"$dir/node$i/patroni.log" 2>&1 &
            echo $! >"$dir/node$i/patroni.pid"
        fi
    done
    # a leader, then every replica streaming (one of them synchronously)
    wait_for 120 "a Patroni leader" leader_port
    wait_for 180 "a synchronous replica" curl -sf "http://127.0.0.1:$(rest_port "$(replica_index)")/sync"
    local owner
    owner="host=127.0.0.1 port=$(leader_port) user=postgres password=$(cat "$dir/superuser.password")"
    psql "$owner dbname=postgres" -qAtc "SELECT 1 FROM pg_database WHERE datname = 'det'" | grep -q 1 \
        || psql "$owner dbname=postgres" -qc "CREATE DATABASE det"
    DET_DB_URL=$(url) det db migrate >&2
    # An agent's lease (2/3 of the agent timeout) must outlast a promotion: README.md, "A
    # database that survives losing its server".
    echo "ha.sh: run the reconcilers with \`det reconcile --agent-timeout 45\` for ttl 10 s" >&2
    url
}

leader_port() {  # the PostgreSQL port of the node Patroni calls leader; fails if none
    local i
    for i in $(seq 1 "$nodes"); do
        if curl -sf "http://127.0.0.1:$(rest_port "$i")/primary" -o /dev/null; then
            node_port "$i"; return 0
        fi
    done
    return 1
}

replica_index() {  # a node that is not the leader
    local i
    for i in $(seq 1 "$nodes"); do
        curl -sf "http://127.0.0.1:$(rest_port "$i")/primary" -o /dev/null || { echo "$i"; return 0; }
    done
    echo 1
}

stop_pid() {  # stop_pid FILE: SIGTERM, then wait for the process to end
    local pid
    [ -s "$1" ] || return 0
    pid=$(cat "$1")
    if kill -TERM "$pid" 2>/dev/null; then
        for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$1"
}

down() {
    local f
    for f in "$dir"/node*/patroni.pid; do  # all at once: no replica is promoted meanwhile
        [ -e "$f" ] && kill -CONT "$(cat "$f")" 2>/dev/null
        stop_pid "$f" &
    done
    wait
    for f in "$dir"/node*/data/postmaster.pid; do  # a postmaster Patroni left (it was killed)
        [ -e "$f" ] && kill -CONT "$(head -1 "$f")" 2>/dev/null
        [ -e "$f" ] && "${run_as[@]}" "$pg_bin/pg_ctl" -D "$(dirname "$f")" stop -m immediate >/dev/null 2>&1 || true
    done
    stop_pid "$dir/etcd.pid"
}

case $cmd in
    up) up ;;
    down) down ;;
    *) echo "usage: ha.sh up|down DIR [NODES]" >&2; exit 2 ;;
esac
