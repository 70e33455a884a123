"""The one place where the core reaches the extension packages (DESIGN.md §2).

The core never imports ``envs``, ``sandboxes`` or ``workflows`` by name: configs and
command lines name objects by import path (``"package.module:Name"``) or by a short
alias listed here, and this module resolves them with importlib. It also loads the optional
third-party packages of extras (``import_optional``), so a missing one is one clear line
naming the extra to install.
"""

from __future__ import annotations

import importlib
from typing import Any

from agentrl.errors import ConfigError

SANDBOX_BACKENDS = {
    "local": "sandboxes.local:LocalSandbox",
    "docker": "sandboxes.docker:DockerSandbox",
    "remote": "sandboxes.remote:RemoteSandbox",
    "fleet": "sandboxes.fleet:SandboxFleet",
}
"""Short names of the sandbox backends; a URL (http://...) means the remote service, and
several URLs separated by commas a fleet of them."""

ENV_PACKAGES = ("envs",)
"""Packages whose import registers ``agentrl/...`` environments with gymnasium."""


def load_object(path: str) -> Any:
    """Import ``"package.module:Name"`` (or ``"package.module.Name"``) and return the object."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ConfigError(f"import path {path!r} must look like 'package.module:Name'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise ConfigError(f"import path {path!r}: module {module_name!r} not found ({e})") from e
    try:
        return getattr(module, attr)
    except AttributeError as e:
        names = [n for n in dir(module) if not n.startswith("_")]
        raise ConfigError(
            f"import path {path!r}: {module_name} has no {attr!r} (it has: {', '.join(names[:20])})"
        ) from e


def import_optional(module: str, *, extra: str, purpose: str) -> Any:
    """Import a package that only an extra installs; if absent, say which extra brings it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module.partition(".")[0]:
            raise
        raise ConfigError(
            f"{purpose} needs the {module.partition('.')[0]!r} package, which is not installed; "
            f"install it with: pip install 'agentrl[{extra}]'"
        ) from e


def register_envs() -> None:
    """Import the environment packages so their ``agentrl/...`` ids are registered."""
    for name in ENV_PACKAGES:
        importlib.import_module(name)


def make_sandbox(spec: Any = "local", **kwargs: Any) -> Any:
    """A sandbox from a backend name, a URL of a sandbox service (several, comma-separated: a
    fleet), an import path, or an object that already is one (returned as is)."""
    if not isinstance(spec, str):
        return spec
    if spec.startswith(("http://", "https://")):
        urls = [u.strip() for u in spec.split(",") if u.strip()]
        if len(urls) > 1:  # several services: programs are spread over them
            return load_object(SANDBOX_BACKENDS["fleet"])(urls, **kwargs)
        return load_object(SANDBOX_BACKENDS["remote"])(spec, **kwargs)
    path = SANDBOX_BACKENDS.get(spec, spec)
    if ":" not in path and "." not in path:
        raise ConfigError(
            f"sandbox {spec!r} is not one of {sorted(SANDBOX_BACKENDS)}, a URL, or an import path"
        )
    return load_object(path)(**kwargs)
