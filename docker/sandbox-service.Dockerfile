# The sandbox service image: `agentrl sandbox serve` and nothing it does not import (no torch,
# no transformers): FastAPI, uvicorn, PyYAML, httpx and the Docker SDK, from pyproject.toml.
# Built by `make images` (docker/build-images.sh; tag agentrl-sandbox-service:latest) from the
# same staged context as docker/trainer.Dockerfile (src/ and dist/, the project's wheel).
#
# In docker-compose.yml it runs the Docker backend against the host's engine (the socket is
# mounted): every program runs in a sibling container of the sandbox image
# (agentrl-sandbox:latest, `make sandbox-image`) with no network, read-only root and the limits
# listed in sandboxes/docker.py. Whoever holds that socket controls the host's engine: the
# service is the trust boundary, and its API key (AGENTRL_SANDBOX_API_KEY) guards it.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 PATH=/opt/agentrl/bin:$PATH
RUN if ! python3 -c "import ensurepip" 2>/dev/null; then \
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            python3-venv ca-certificates >/dev/null && rm -rf /var/lib/apt/lists/*; \
    fi \
 && python3 -m venv /opt/agentrl
# CA certificates pip trusts during the build (build-images.sh stages the host's pip bundle, for
# networks whose TLS is re-signed by a proxy); PIP_CERT is a build argument, not kept in the image
COPY certs/ /tmp/certs/
ARG PIP_CERT
COPY src/pyproject.toml src/docker/requirements.py /tmp/deps/
RUN python3 /tmp/deps/requirements.py /tmp/deps/pyproject.toml --extras docker \
        --only fastapi,uvicorn,httptools,uvloop,pyyaml,httpx >/tmp/deps/requirements.txt \
 && pip install -q -r /tmp/deps/requirements.txt && rm -rf /tmp/deps
COPY dist/ /tmp/dist/
RUN pip install -q --no-deps /tmp/dist/agentrl-*.whl && rm -rf /tmp/dist
LABEL org.opencontainers.image.title="agentrl sandbox service" agentrl.image=sandbox-service
EXPOSE 8100
CMD ["agentrl", "sandbox", "serve", "--backend", "docker", "--host", "0.0.0.0", "--port", "8100"]
