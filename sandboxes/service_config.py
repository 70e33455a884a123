"""``SandboxServiceConfig``: the settings of ``agentrl sandbox serve``, declared once.

What it is: the service's own settings (where it listens, its key, admission) and the few
backend settings an operator sets from its command line, each one field; ``agentrl sandbox
serve`` generates its flags from this class, from ``BackendLimits`` (what every program runs
under) and from ``Ceilings`` (the most one request may ask for), and ``backend_options`` maps
them onto the chosen backend's config. It imports nothing heavy, so the command line can read
it to build its parser. What it is not: the backends' configs (``LocalSandboxConfig``,
``DockerSandboxConfig``) or the app (``sandboxes.service``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from agentrl.config import option


@dataclass
class SandboxServiceConfig:
    """``agentrl sandbox serve [--flag ...]``."""

    backend: Literal["local", "docker"] = option("docker", help="the backend that runs the programs")
    host: str = option("127.0.0.1", help="address to listen on")
    port: int = option(8100, ge=0, le=65535, help="port (0 picks a free one)")
    api_key: str | None = option(None, help="require this key (default: $AGENTRL_SANDBOX_API_KEY, or none)")
    insecure: bool = option(False, help="allow a non-loopback --host without an API key (anyone reaching it "
                                        "runs code)")
    max_concurrency: int = option(8, ge=1, help="executions at once (open sessions count)")
    max_queue: int = option(256, ge=0, help="requests waiting before 503")
    pool_size: int | None = option(None, ge=1, help="docker: warm containers (default: max-concurrency)")
    cgroup_parent: str = option("", help="cgroup the jails or containers nest under")
    uid_base: int = option(0, ge=0, help="first uid programs run as (local: one per jail slot; docker: one per "
                                         "container; 0 = the backend's default)")
    python: str = option("", help="local: interpreter programs run under (default: this one)")
    local_mode: Literal["auto", "root", "rootless"] = option(
        "auto", help="local: root jails, or rootless ones in bubblewrap (auto: root when root)")
    log_level: Literal["debug", "info", "warning", "error"] = option("warning", help="the server's log level")

    def backend_options(self) -> dict[str, Any]:
        """The settings of this command that are the backend's (``agentrl.plugins.make_sandbox``
        keyword arguments), besides the ``BackendLimits`` fields."""
        options: dict[str, Any] = {"cgroup_parent": self.cgroup_parent}
        if self.backend == "docker":
            options["pool_size"] = self.pool_size or self.max_concurrency
            if self.uid_base:
                options["uid"] = self.uid_base
        else:
            options.update(max_concurrency=self.max_concurrency, uid_base=self.uid_base, python=self.python,
                           mode=self.local_mode)
        return options
