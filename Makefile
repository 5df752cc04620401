# Tandem: two commands on a fresh machine.
#   make run   creates .venv, installs Tandem into it, starts a local group of three nodes
#   make test  installs what the tests need (dev dependencies; chromium, a Java runtime and strace
#              with apt-get when root: scripts/ensure-system-packages.sh) and runs the suite
#   make test-long  the long tier: tests marked long, the core's simulation over 20,000 seeds, the
#              group harness over 1,000 more seeds, the nightly fuzz (docs/testing.md)
#   make load  a 60 s locust run against 3 fresh nodes; make soak: the hour-long soak
#   make fuzz  the nightly hostile-input run: 1,000,000 fuzzed frames, then a live group under attack
#   make flaky runs FLAKY (pytest node ids) RUNS times under CPU stress and counts failures
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
DATA   ?= .tandem
PORT   ?= 7780
SYNC   ?= SYNC
NODES  ?= 3

.PHONY: run run-single test test-long install dev bench load soak typecheck clean pipeline-demo fuzz flaky

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.dev-installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(VENV)/.installed $@

install: $(VENV)/.installed
dev: $(VENV)/.dev-installed

run: install
	$(BIN)/tandem cluster up --nodes $(NODES) --base-port $(PORT) --data-dir $(DATA) --sync $(SYNC)

run-single: install
	$(BIN)/tandem broker start --name node1 --data-dir .tandem-single/node1 --port $(PORT) --http-port $$(( $(PORT) + 2 )) --sync $(SYNC)

# Bytecode for every source once, before the suite starts hundreds of node and CLI processes: where
# PYTHONDONTWRITEBYTECODE is set, each of them would compile the sources again (0.3 s a process).
# pytest itself runs with the variable empty, so that it keeps its rewritten test modules too.
COMPILE := $(BIN)/python -m compileall -q -j 0 broker client storage ha webconsole tests scripts >/dev/null
PYTEST  := PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest

test: dev
	@scripts/ensure-system-packages.sh
	@$(COMPILE)
	$(BIN)/python -m mypy broker client storage ha webconsole
	$(BIN)/lint-imports --no-cache
	$(PYTEST) -n 4 --dist loadgroup --durations=25 $(PYTEST_ARGS)

# the tests that have failed in CI or under load: the first ones to run when hunting a flake
FLAKY ?= tests/integration/test_partition_move.py::test_a_move_survives_kill_9_of_its_active_and_of_the_new_node_mid_copy \
	tests/integration/test_group_change.py::test_refusals_and_a_member_that_never_came_up_taken_out_again \
	tests/integration/test_group_change.py::test_add_a_fourth_node_then_drain_and_remove_a_founder_under_load \
	tests/integration/test_shared_mode.py::test_an_update_cut_by_kill_9_of_the_active_goes_on_on_the_new_one \
	tests/integration/test_restore.py::test_the_console_restores_in_the_group_and_says_what_it_did \
	tests/integration/test_restore.py::test_the_copies_two_nodes_of_the_losing_side_kept_are_restored_once \
	tests/integration/test_repartition.py::test_an_update_cut_by_kill_9_of_a_sweeping_active_ends_with_every_message_once \
	tests/integration/test_lockfile.py::test_a_holder_cut_from_the_gateway_stops_serving_and_the_other_takes_over \
	tests/integration/test_peer_auth.py::test_an_intruder_with_a_members_name_changes_nothing \
	tests/integration/test_replication.py::test_the_log_is_compacted_by_size_as_well \
	tests/integration/test_healed_node.py::test_a_node_whose_packets_were_dropped_sees_its_peers_up_soon_after_the_heal \
	tests/integration/test_availability_zones.py::test_a_node_whose_zone_loses_quorum_hands_everything_over_and_nothing_is_lost \
	tests/storage/test_recovery.py::test_the_wal_starts_over_under_a_steady_stream_of_commits \
	tests/unit/test_lockfile_driver.py::test_a_holder_that_stops_renewing_is_taken_over_and_then_fenced_by_the_epoch \
	tests/webconsole/test_ha_shared.py::test_the_passive_page_points_to_the_lock_holder_and_follows_a_takeover \
	tests/integration/test_node_process.py::test_a_node_process_is_its_own_process_either_way \
	tests/integration/test_drills.py::test_weak_policies_never_lose_silently \
	tests/integration/test_delayed_failover.py::test_delayed_messages_across_a_kill_of_their_active \
	"tests/security/test_sessions.py::test_a_console_session_ends_when_its_password_role_or_grant_changes_elsewhere[grant]" \
	tests/integration/test_upgrade.py::test_finalize_is_refused_while_a_member_runs_the_older_build \
	tests/integration/test_transactions.py::test_kill_9_or_a_cut_link_at_each_step_of_a_transaction_leaves_it_all_or_nothing \
	tests/integration/test_exchanges.py::test_fanout_topic_and_headers_through_a_kill_9_store_each_message_once_per_queue \
	"tests/integration/test_client_matrix.py::test_every_message_once_across_builds_and_a_failover[new-client-old-group]" \
	tests/integration/test_stream_failover.py::test_a_stream_keeps_every_confirmed_message_once_across_a_kill_of_its_active \
	tests/integration/test_transactions.py \
	tests/integration/test_consume_anywhere.py::test_a_member_on_an_older_build_relays_nothing_and_is_named_once \
	tests/integration/test_storage_drill.py::test_bit_flips_at_rest_are_found_and_nothing_damaged_is_delivered \
	tests/integration/test_storage_faults.py::test_a_replica_whose_term_and_vote_took_a_flipped_bit_does_not_start_and_is_replaced_empty \
	tests/broker/test_storage_faults.py::test_a_chunk_damaged_while_the_node_runs_is_never_delivered_and_stops_it
RUNS ?= 20
flaky: dev
	@$(COMPILE)
	$(BIN)/python scripts/flaky.py --runs $(RUNS) $(FLAKY)

SIM_SEEDS ?= 20000
test-long: dev
	@scripts/ensure-system-packages.sh
	@$(COMPILE)
	$(PYTEST) -n 2 --dist loadgroup --long --durations=25 $(PYTEST_ARGS)
	TANDEM_SIM_SEEDS=$(SIM_SEEDS) $(BIN)/python -m pytest -n 2 -q tests/ha/test_replica_sim.py tests/ha/test_witness.py -k random_schedules
	TANDEM_HARNESS_SEEDS=200-1199 $(BIN)/python -m pytest -n 2 -q tests/harness/test_group_schedules.py -k invariants
	$(BIN)/python -m tests.fuzz --frames 1000000

pipeline-demo: dev
	$(BIN)/python examples/pipeline_demo.py

FRAMES ?= 1000000
fuzz: dev
	$(BIN)/python -m tests.fuzz --frames $(FRAMES)

typecheck: dev
	$(BIN)/python -m mypy broker client storage ha webconsole

bench: dev
	$(BIN)/tandem bench --spawn --peer rabbitmq --peer nats
	$(BIN)/tandem bench --spawn --nodes 3 --peer rabbitmq --peer nats

load: dev
	$(BIN)/tandem load --spawn --nodes 3 --users 50 --run-time 60s --processes 2

SOAK_TIME ?= 1h
soak: dev
	$(BIN)/tandem load --profile soak --run-time $(SOAK_TIME)

clean:
	rm -rf $(VENV) .tandem .tandem-single .pytest_cache
