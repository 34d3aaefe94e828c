# The README's verbs. Everything that touches Docker needs root.
SHELL := /bin/bash
.DEFAULT_GOAL := help
# `make up CONFIG=FILE` (and down, status, roster, ... with the same FILE): the organizer's config
# file; default ./config.env when it exists. The demo and the tests use none.
ifdef CONFIG
export GPUHUB_CONFIG := $(CONFIG)
endif

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

demo:  ## single-machine demo hub (simulated GPU slices when there is no GPU)
	GPUHUB_CONFIG=none bash deploy/demo.sh

up:  ## the production hub from config.env (CONFIG=FILE for another; see deploy/config.example.env)
	bash deploy/up.sh

roster:  ## check the roster file (GPUHUB_ROSTER) and hand it to the running hub
	bash -c '. deploy/lib.sh && load_settings && ensure_root roster && ensure_venv \
	  && { [ -n "$$GPUHUB_ROSTER" ] || die "GPUHUB_ROSTER is empty in $$GPUHUB_CONFIG_FILE"; } \
	  && ensure_roster && log "the hub uses it from the next login on"'

down:  ## remove the stack and user servers (PURGE=1: also volumes and secrets)
	bash deploy/down.sh

images:  ## build the base, single-user and hub images (BASE_IMAGE=... for a public base)
	$(if $(BASE_IMAGE),GPUHUB_BASE_IMAGE=$(BASE_IMAGE)) bash -c \
	  '. deploy/lib.sh && load_settings && ensure_root images && ensure_engine && ensure_images'

status:  ## GPU machines, free and used slices, and running servers, as tables
	@bash -c '. deploy/lib.sh && ensure_venv test >/dev/null && $$VENV/bin/python -m gpu_swarm_spawner.status'

join-command:  ## print the one line that adds a GPU machine to this swarm (run it there)
	@bash -c '. deploy/lib.sh && load_settings && ensure_root join-command && print_join_command'

pause-node:  ## NODE=host: no new servers there, running ones stay (before it leaves)
	bash -c '. deploy/lib.sh && load_settings && ensure_root pause-node && set_node_availability "$(NODE)" pause'

resume-node:  ## NODE=host: take new servers there again
	bash -c '. deploy/lib.sh && load_settings && ensure_root resume-node && set_node_availability "$(NODE)" active'

image-tar:  ## save the single-user image to a file, for GPU machines that cannot pull it
	bash -c '. deploy/lib.sh && load_settings && ensure_root image-tar && save_image_tar'

bench-join:  ## time the join line on a fresh test-bed machine (own root fs, clean repo) until its slices are usable
	bash tests/bench/run.sh --only join

test:  ## the whole test suite: sets up its own test bed, then unit, integration and browser tests
	bash tests/run.sh

bench:  ## benchmarks against stock dockerspawner.SwarmSpawner and bare Swarm (prints figures)
	bash tests/bench/run.sh

unit:  ## unit tests and the tutorial-sync tests (real git, no Docker needed)
	bash tests/run.sh unit

lint:  ## ruff lint + format check
	bash -c '. deploy/lib.sh && ensure_venv test && $$VENV/bin/ruff check . && $$VENV/bin/ruff format --check .'

.PHONY: help demo up roster down images status join-command pause-node resume-node image-tar bench-join test bench unit lint
