# The DockerSandbox image, for machines that reach a registry. Offline, `make sandbox-image`
# (docker/build-sandbox-image.sh) builds the same image with debootstrap + docker import.
# The supervisor is not baked in: DockerSandbox passes sandboxes/supervisor.py on the command
# line, so code changes never need a rebuild.
FROM python:3.11-slim-bookworm
RUN echo "sandbox:x:10000:10000::/work:/bin/bash" >>/etc/passwd \
 && echo "sandbox:x:10000:" >>/etc/group \
 && mkdir -p /work && chmod 1777 /work
LABEL agentrl.sandbox.image=1
ENV SANDBOX_PYTHON=/usr/local/bin/python3
WORKDIR /work
CMD ["python3"]
