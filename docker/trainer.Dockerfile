# The agentrl image: the project installed in /opt/agentrl (a venv), for `agentrl train` (the
# trainer under torchrun) and `agentrl serve` (the CPU inference service of docker-compose.yml).
# Build it with `make images` (docker/build-images.sh), which stages the context: src/ (the
# project's files), dist/ (the project's wheel, built once on the host for both images) and
# wheels/ (the CPU torch wheel when this machine has it on disk).
#
# CPU variant (what `make images` builds, tag agentrl-trainer:cpu): torch pinned to the CPU
# build (TORCH_SPEC from wheels/, else from TORCH_INDEX_URL, PyTorch's CPU index).
#
# GPU variant (documented, not built by `make images`: it needs a CUDA machine to be useful):
#   docker build --network host -f docker/trainer.Dockerfile -t agentrl-trainer:gpu \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 \
#     --build-arg EXTRAS=plots,sglang  CONTEXT
# where CONTEXT holds src/ (e.g. `git archive HEAD | tar -x -C CONTEXT/src`), dist/ (the wheel of
# `pip wheel --no-deps -w CONTEXT/dist CONTEXT/src`) and an empty wheels/. The CUDA torch wheels bring their own CUDA libraries; the host needs the NVIDIA
# driver and the NVIDIA container toolkit. The `sglang` extra makes the same image run
# `python -m sglang.launch_server` (the `inference` service of docker-compose.yml).
#
# BASE: python:3.11-slim-bookworm where a registry answers; offline, build-images.sh passes
# agentrl-base (the debootstrap root filesystem of docker/rootfs.sh, imported).
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG EXTRAS=plots
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 PATH=/opt/agentrl/bin:$PATH \
    AGENTRL_DATA_DIR=/opt/agentrl/data

# a venv (Debian's python3 needs python3-venv for it; python:3.11-slim has it)
RUN if ! python3 -c "import ensurepip" 2>/dev/null; then \
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            python3-venv ca-certificates >/dev/null && rm -rf /var/lib/apt/lists/*; \
    fi \
 && python3 -m venv /opt/agentrl
# CA certificates pip trusts during the build (build-images.sh stages the host's pip bundle, for
# networks whose TLS is re-signed by a proxy); PIP_CERT is a build argument, not kept in the image
COPY certs/ /tmp/certs/
ARG PIP_CERT

# torch first (the largest layer, changed least often)
COPY wheels/ /tmp/wheels/
RUN if ls /tmp/wheels/torch-*.whl >/dev/null 2>&1; then pip install -q /tmp/wheels/torch-*.whl; \
    else pip install -q "$TORCH_SPEC" --index-url "$TORCH_INDEX_URL" --extra-index-url https://pypi.org/simple; fi \
 && rm -rf /tmp/wheels

# the dependencies, from pyproject.toml alone: cached while only the code changes
COPY src/pyproject.toml src/docker/requirements.py /tmp/deps/
RUN python3 /tmp/deps/requirements.py /tmp/deps/pyproject.toml --extras "$EXTRAS" >/tmp/deps/requirements.txt \
 && pip install -q -r /tmp/deps/requirements.txt && rm -rf /tmp/deps

# the project itself: its wheel (building it here would fetch a build backend for each image)
COPY src/data/ /opt/agentrl/data/
COPY dist/ /tmp/dist/
RUN pip install -q --no-deps /tmp/dist/agentrl-*.whl && rm -rf /tmp/dist \
 && useradd --create-home --uid 1000 agentrl \
 && mkdir -p /runs /workspace && chown agentrl:agentrl /runs /workspace
USER agentrl
WORKDIR /workspace
LABEL org.opencontainers.image.title="agentrl" agentrl.image=trainer
CMD ["agentrl", "--help"]
