#!/bin/bash
# 3-node NATS JetStream cluster on loopback, beside the system nats-server on 127.0.0.1:4222.
#   ./nats3.sh up     start n1..n3 (client 4301-4303, cluster 6301-6303, monitor 8301-8303),
#                     wait until JetStream has a meta leader, print NATS URLs. Idempotent.
#   ./nats3.sh down   stop the 3 servers (only the pids we started) and wipe their store dirs.
# Everything lives under /tmp/peerclusters/nats.
set -euo pipefail
# kill -0 is true for zombies too (pid 1 here reaps exited daemons late), so look at the state
alive() { local st; st=$(ps -o stat= -p "$1" 2>/dev/null) && [ -n "$st" ] && [ "${st#Z}" = "$st" ]; }

BASE=/tmp/peerclusters/nats
NATS=/usr/sbin/nats-server
NODES=(1 2 3)
CLUSTER=peerbench

conf() {
  local i=$1 d=$BASE/n$1
  mkdir -p "$d/store"
  cat > "$d/nats.conf" <<EOF
server_name: n$i
listen: 127.0.0.1:$((4300 + i))
http: 127.0.0.1:$((8300 + i))
pid_file: "$d/nats.pid"
log_file: "$d/nats.log"
jetstream {
  store_dir: "$d/store"
  max_memory_store: 1GB
  max_file_store: 10GB
}
cluster {
  name: $CLUSTER
  listen: 127.0.0.1:$((6300 + i))
  routes: [
    nats-route://127.0.0.1:6301
    nats-route://127.0.0.1:6302
    nats-route://127.0.0.1:6303
  ]
}
EOF
}

running() { local p=$BASE/n$1/nats.pid; [ -s "$p" ] && alive "$(cat "$p")"; }

up() {
  local t0=$EPOCHREALTIME
  for i in "${NODES[@]}"; do
    if running "$i"; then echo "n$i already running"; continue; fi
    conf "$i"
    "$NATS" -t -c "$BASE/n$i/nats.conf" >/dev/null 2>&1 || { "$NATS" -t -c "$BASE/n$i/nats.conf"; exit 1; }
    setsid nohup "$NATS" -c "$BASE/n$i/nats.conf" >"$BASE/n$i/stdout.log" 2>&1 </dev/null &
  done
  # ready = every node sees 2 routes and JetStream meta leader elected (/jsz?...meta_cluster.leader)
  for _ in $(seq 1 100); do
    ok=1
    for i in "${NODES[@]}"; do
      curl -sf "http://127.0.0.1:$((8300 + i))/jsz" 2>/dev/null | python3 -c \
        'import json,sys; m=json.load(sys.stdin).get("meta_cluster",{}); sys.exit(0 if m.get("leader") and m.get("cluster_size")==3 else 1)' \
        || { ok=0; break; }
    done
    [ $ok = 1 ] && break
    sleep 0.2
  done
  [ $ok = 1 ] || { echo "cluster not ready; see $BASE/n*/nats.log" >&2; exit 1; }
  python3 -c "print(f\"cluster up in {$EPOCHREALTIME - $t0:.1f}s\")"
  for i in "${NODES[@]}"; do echo "nats://127.0.0.1:$((4300 + i))"; done
}

down() {
  for i in "${NODES[@]}"; do
    local p=$BASE/n$i/nats.pid
    if running "$i"; then
      local pid; pid=$(cat "$p")
      kill "$pid"                                  # SIGTERM = graceful shutdown
      for _ in $(seq 1 50); do alive "$pid" || break; sleep 0.1; done
      alive "$pid" && kill -9 "$pid" 2>/dev/null || true
    fi
    rm -rf "$BASE/n$i"
    echo "n$i down"
  done
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
