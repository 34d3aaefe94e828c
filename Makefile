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
	GPUHUB_CONFIG=none bash deploy/bootstrap.sh demo

up:  ## the production hub from config.env (CONFIG=FILE for another; see deploy/config.example.env)
	bash deploy/bootstrap.sh up

roster:  ## check the roster file (GPUHUB_ROSTER) and hand it to the running hub
	bash deploy/bootstrap.sh roster

down:  ## remove the stack and user servers (PURGE=1: also volumes and secrets)
	bash deploy/bootstrap.sh down $(if $(filter 1,$(PURGE)),--purge)

images:  ## build the base, single-user and hub images (BASE_IMAGE=... for a public base)
	$(if $(BASE_IMAGE),GPUHUB_BASE_IMAGE=$(BASE_IMAGE)) bash deploy/bootstrap.sh images

status:  ## GPU machines, free and used slices, and running servers, as tables
	@bash deploy/bootstrap.sh status

join-command:  ## print the one line that adds a GPU machine to this swarm (run it there)
	@bash deploy/bootstrap.sh join-command

pause-node:  ## NODE=host: no new servers there, running ones stay (before it leaves)
	bash deploy/bootstrap.sh pause-node "$(NODE)"

resume-node:  ## NODE=host: take new servers again
	bash deploy/bootstrap.sh resume-node "$(NODE)"

image-tar:  ## save the single-user image to a file, for GPU machines that cannot pull it
	bash deploy/bootstrap.sh image-tar

gpu-check:  ## on a GPU machine: what NVML finds, the slices it would advertise, the guard's reading
	@py=python3; for p in "$${GPUHUB_VENV:-$(CURDIR)/.venv}/bin/python" /opt/gpu-jupyterhub/worker-venv/bin/python; do \
	  if [ -x "$$p" ] && "$$p" -c 'import pynvml' 2>/dev/null; then py=$$p; break; fi; \
	done; PYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" "$$py" -m worker_setup.gpu_check $(ARGS)

gpu-prove:  ## on a GPU machine: prove the GPU parts with real CUDA processes (OUT=folder for report.json; docs/gpu-proof.md)
	bash tests/gpu/prove.sh "$(or $(OUT),test-artifacts/gpu-proof)" $(ARGS)

bench-join:  ## time the join line on a fresh test-bed machine (own root fs, clean repo) until its slices are usable
	bash tests/bench/run.sh --only join

test:  ## the whole test suite: sets up its own test bed, then unit, integration and browser tests
	bash tests/run.sh

bench:  ## benchmarks against stock dockerspawner.SwarmSpawner and bare Swarm (prints figures)
	bash tests/bench/run.sh

bench-images:  ## build the real PyTorch and TensorFlow images and run check-environment in each (prints size, build and import times)
	bash tests/bench/images.sh $(ARGS)

bench-scale:  ## 500 participants on a bed of 10 GPU machines (stand-in servers), against stock SwarmSpawner (prints figures)
	bash tests/bench/scale.sh $(ARGS)

bench-faults:  ## faults with servers running (proxy, engines, hub killed, machine lost or cut off, Prometheus, full disk): time to heal, what was lost (prints figures)
	bash tests/bench/faults.sh $(ARGS)

bench-fleet:  ## a workshop day replayed twice on the bed: a fixed fleet vs the hub driving the bed's cloud, with provider failures (prints machine-hours, waits, time to the dashboard)
	bash tests/bench/fleet.sh $(ARGS)

unit:  ## unit tests and the tutorial-sync tests (real git, no Docker needed)
	bash tests/run.sh unit

mutation:  ## mutation testing (mutmut) of the broker, line, placement and inventory against their unit tests; not part of make test (~20 min on 2 cores; docs/development.md)
	bash -c '. deploy/bootstrap.sh && ensure_venv test && bash tests/hermetic.sh $$VENV/bin/python --mutmut run && $$VENV/bin/mutmut results'

lint:  ## ruff lint + format check
	bash -c '. deploy/bootstrap.sh && ensure_venv test && $$VENV/bin/ruff check . && $$VENV/bin/ruff format --check .'

labextension:  ## rebuild the JupyterLab extension gpuhub-notices from its sources (needs Node 20+; commit what it writes)
	bash images/singleuser/labextension/build.sh

docs:  ## regenerate deploy/settings.env, docs/configuration.md and the stack files' environments (from gpu_swarm_spawner/settings_table.py) and docs/options.md (from the traits)
	python3 -m deploy.reference
	bash -c '. deploy/bootstrap.sh && ensure_venv test && $$VENV/bin/python -m deploy.options'

.PHONY: help demo up roster down images status join-command pause-node resume-node image-tar gpu-check gpu-prove bench-join test bench bench-images bench-scale bench-faults bench-fleet unit mutation lint labextension docs
