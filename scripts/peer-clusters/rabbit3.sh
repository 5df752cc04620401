#!/bin/bash
# 3-node RabbitMQ cluster on loopback, beside the system node rabbit@localhost (5672/25672).
#   ./rabbit3.sh up      start rmq1..3@localhost (AMQP 5701-5703, dist 25701-25703), cluster them,
#                        print AMQP URLs. Idempotent: running nodes are left alone.
#   ./rabbit3.sh down    stop the 3 nodes and wipe their state (next `up` is a fresh cluster).
#   ./rabbit3.sh status  cluster_status as seen from rmq1.
# Everything lives under /tmp/peerclusters/rabbit. Uses its own Erlang cookie (HOME=$BASE/home)
# and its own env file, so /etc/rabbitmq and /var/lib/rabbitmq are never read or written.
set -euo pipefail
# kill -0 is true for zombies too (pid 1 here reaps exited daemons late), so look at the state
alive() { local st; st=$(ps -o stat= -p "$1" 2>/dev/null) && [ -n "$st" ] && [ "${st#Z}" = "$st" ]; }

BASE=/tmp/peerclusters/rabbit
RMQ_BIN=/usr/lib/rabbitmq/bin          # NOT /usr/sbin/* : those wrappers `su rabbitmq` and reset HOME
NODES=(1 2 3)
AMQP_PORT() { echo $((5700 + $1)); }
DIST_PORT() { echo $((25700 + $1)); }
NODENAME() { echo "rmq$1@localhost"; }

export HOME=$BASE/home                  # -> $HOME/.erlang.cookie (shared by the 3 nodes + rabbitmqctl)
export RABBITMQ_CONF_ENV_FILE=$BASE/rabbitmq-env.conf   # keep /etc/rabbitmq/rabbitmq-env.conf out
export RABBITMQ_ENABLED_PLUGINS_FILE=$BASE/enabled_plugins
export ERL_EPMD_ADDRESS=127.0.0.1       # shares the system epmd on 127.0.0.1:4369 (never stopped here)
unset ERL_FLAGS RABBITMQ_NODENAME RABBITMQ_NODE_PORT || true

ctl() { local n=$1; shift; "$RMQ_BIN/rabbitmqctl" -n "$(NODENAME "$n")" -q "$@"; }

prepare() {
  mkdir -p "$HOME"
  if [ ! -s "$HOME/.erlang.cookie" ]; then
    printf 'PEERCLUSTERSBENCHCOOKIE' > "$HOME/.erlang.cookie"   # own cookie, shared by rmq1-3 only (not the system node's)
    chmod 400 "$HOME/.erlang.cookie"                            # erlang refuses group/other-readable cookies
  fi
  : > "$RABBITMQ_CONF_ENV_FILE"
  echo '[].' > "$RABBITMQ_ENABLED_PLUGINS_FILE"   # no management/prometheus -> no port 15672/15692 clash
  for i in "${NODES[@]}"; do
    local d=$BASE/rmq$i
    mkdir -p "$d/mnesia" "$d/log"
    cat > "$d/rabbitmq.conf" <<EOF
listeners.tcp.local = 127.0.0.1:$(AMQP_PORT "$i")
loopback_users.guest = true
disk_free_limit.absolute = 50MB
vm_memory_high_watermark.relative = 0.15
cluster_partition_handling = pause_minority
log.console = false
log.file.level = info
EOF
  done
}

start_node() {
  local i=$1 d=$BASE/rmq$i
  if ctl "$i" ping >/dev/null 2>&1; then echo "rmq$i already running"; return 0; fi
  (
    export RABBITMQ_NODENAME=$(NODENAME "$i")
    export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
    export RABBITMQ_NODE_PORT=$(AMQP_PORT "$i")
    export RABBITMQ_DIST_PORT=$(DIST_PORT "$i")
    export RABBITMQ_CONFIG_FILE=$d/rabbitmq.conf
    export RABBITMQ_ADVANCED_CONFIG_FILE=$d/advanced.config   # does not exist: fine
    export RABBITMQ_MNESIA_BASE=$d/mnesia
    export RABBITMQ_LOG_BASE=$d/log
    export RABBITMQ_PID_FILE=$d/pid
    export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
    cd "$d"
    setsid nohup "$RMQ_BIN/rabbitmq-server" > "$d/log/stdout.log" 2>&1 < /dev/null &
  )
}

up() {
  local t0=$SECONDS
  prepare
  for i in "${NODES[@]}"; do start_node "$i"; done
  for i in "${NODES[@]}"; do
    # waits for the pid file, then for the node to boot
    for _ in $(seq 1 120); do [ -s "$BASE/rmq$i/pid" ] && break; sleep 0.5; done
    "$RMQ_BIN/rabbitmqctl" -n "$(NODENAME "$i")" -q wait --timeout 120 "$BASE/rmq$i/pid" >/dev/null
    ctl "$i" await_startup --timeout 120
  done
  echo "nodes booted after $((SECONDS - t0))s"
  local seed; seed=$(NODENAME 1)
  for i in 2 3; do
    if ctl 1 cluster_status --formatter json | grep -q "\"$(NODENAME "$i")\""; then
      echo "rmq$i already in cluster"; continue
    fi
    # join prints harmless feature-flag / tracked-connection warnings on stderr -> join.log
    { ctl "$i" stop_app && ctl "$i" reset && ctl "$i" join_cluster "$seed" && ctl "$i" start_app \
        && ctl "$i" await_startup --timeout 120; } >>"$BASE/join.log" 2>&1 \
      || { echo "join of rmq$i failed, see $BASE/join.log" >&2; tail -20 "$BASE/join.log" >&2; exit 1; }
  done
  echo "cluster up in $((SECONDS - t0))s:"
  ctl 1 cluster_status --formatter json | python3 -c \
    'import json,sys; s=json.load(sys.stdin); print("  running_nodes:", s["running_nodes"])'
  for i in "${NODES[@]}"; do echo "amqp://guest:guest@127.0.0.1:$(AMQP_PORT "$i")/"; done
}

down() {
  for i in "${NODES[@]}"; do
    local d=$BASE/rmq$i
    if ctl "$i" ping >/dev/null 2>&1; then
      ctl "$i" shutdown --timeout 60 >/dev/null 2>&1 || ctl "$i" stop >/dev/null 2>&1 || true
    fi
    # belt and braces: kill only the beam whose pid file we own
    if [ -s "$d/pid" ] && alive "$(cat "$d/pid")"; then
      local pid; pid=$(cat "$d/pid"); kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do alive "$pid" || break; sleep 0.1; done
      alive "$pid" && kill -9 "$pid" 2>/dev/null || true
    fi
    rm -rf "$d"
    echo "rmq$i down"
  done
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) ctl 1 cluster_status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
