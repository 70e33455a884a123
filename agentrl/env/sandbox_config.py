"""SandboxConfig: a run's ``sandbox`` section — where code environments run their programs.

What it is: the backend spec or the sandbox services a run gives every code environment as its
``sandbox`` argument (``spec``, resolved by ``agentrl.plugins.make_sandbox``), and ``check``,
which refuses, by key, a service that is not a URL or an environment that takes no sandbox.
What it is not: the sandboxes themselves (the ``sandboxes`` package, which this core never
imports by name) or their service's settings (``sandboxes.service_config``).
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.config import option
from agentrl.errors import ConfigError


@dataclass
class SandboxConfig:
    backend: str = option("", help="sandbox of code envs: local, docker, a service URL; empty: the env's default")
    services: list[str] = option([], help="URLs of sandbox services (agentrl sandbox serve); programs are spread "
                                          "over them (the least busy first); replaces backend when given")

    def spec(self) -> str:
        """What code envs get as their ``sandbox`` argument ("" when the env's default applies);
        several services are one comma-separated spec (``agentrl.plugins.make_sandbox``)."""
        return ",".join(self.services) if self.services else self.backend

    def check(self, env_id: str | None) -> None:
        """Refuse services that are not URLs, and a sandbox for the registered env ``env_id``
        (None: the workflow names none) when its constructor takes no ``sandbox`` argument."""
        if env_id is not None and self.spec() and not takes_sandbox(env_id):
            key = "sandbox.services" if self.services else "sandbox.backend"
            raise ConfigError(f"config key {key!r}: the environment {env_id!r} takes no sandbox argument; "
                              "leave the sandbox keys empty for it (they are for code environments)")
        for url in self.services:
            if not url.startswith(("http://", "https://")):
                raise ConfigError(f"config key 'sandbox.services': {url!r} is not a URL of a sandbox service "
                                  "(http://HOST:PORT, as `agentrl sandbox serve` prints it)")


def takes_sandbox(env_id: str) -> bool:
    """Whether the registered environment's constructor takes a ``sandbox`` argument."""
    import inspect

    import gymnasium

    from agentrl.plugins import load_object

    entry = gymnasium.spec(env_id).entry_point
    make = load_object(entry) if isinstance(entry, str) else entry
    try:
        params = inspect.signature(make).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: assume it does
        return True
    return any(p.name == "sandbox" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
