"""The one place where the core reaches the extension packages (DESIGN.md §2).

The core never imports ``envs``, ``sandboxes`` or ``workflows`` by name: configs and
command lines name objects by import path (``"package.module:Name"``) or by a short
alias listed here, and this module resolves them with importlib. Environments are named by
their Gymnasium id; one registered by a module of the user's is named ``"module:ns/Name-vN"``
(Gymnasium's own form: the module is imported first, and registers the id). A user's module
is looked for on the import path, then in the current directory (which children then inherit
through ``PYTHONPATH``). It also loads the optional third-party packages of extras
(``import_optional``), so a missing one is one clear line naming the extra to install.
"""

from __future__ import annotations

import collections
import difflib
import importlib
import os
import sys
import threading
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

ECOSYSTEMS = {
    "reasoning_gym/": "envs.interop.reasoning_gym_env",
    "textarena/": "envs.interop.textarena_env",
    "skyrl_gym/": "envs.interop.skyrl_gym_env",
    "openenv:": "envs.interop.openenv_env",
    "verifiers:": "envs.interop.verifiers_env",
}
"""Env-id prefixes of other ecosystems' environments and the adapter module of each. An
adapter module has ``ID_FORM`` (how its ids look), ``register(env_id) -> str`` (registers the
id with gymnasium on first use and returns the registered id) and ``listing() -> str`` (one
line for ``agentrl envs``: what is installed, or the extra to install)."""


def ecosystem_of(env_id: str) -> str | None:
    """The adapter module of an ecosystem's env id (``reasoning_gym/chain_sum``), else None."""
    return next((module for prefix, module in ECOSYSTEMS.items() if env_id.startswith(prefix)), None)


def load_object(path: str) -> Any:
    """Import ``"package.module:Name"`` (or ``"package.module.Name"``) and return the object."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ConfigError(f"import path {path!r} must look like 'package.module:Name'")
    module = import_user_module(module_name, what=f"import path {path!r}")
    try:
        return getattr(module, attr)
    except AttributeError as e:
        names = [n for n in dir(module) if not n.startswith("_")]
        raise ConfigError(
            f"import path {path!r}: {module_name} has no {attr!r} (it has: {', '.join(names[:20])})"
        ) from e


def import_user_module(name: str, *, what: str) -> Any:
    """Import ``name``: from the import path, else from the current directory, which is then
    put on ``sys.path`` and ``PYTHONPATH`` (so the run's ranks and servers import it too)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is None or not (name == e.name or name.startswith(e.name + ".")):
            raise ConfigError(f"{what}: importing {name!r} failed: {e}") from e  # one of its own imports
        here = os.getcwd()
        top = name.split(".")[0]
        there = os.path.exists(os.path.join(here, top + ".py")) or os.path.isdir(os.path.join(here, top))
        if here in sys.path or not there:
            raise ConfigError(
                f"{what}: module {name!r} not found on the import path or in the current directory "
                f"{here}; run from the directory that holds it, or add that directory to PYTHONPATH"
            ) from e
    sys.path.insert(0, here)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    return importlib.import_module(name)


def find_env(env_id: str) -> str:
    """The registered Gymnasium id that ``env_id`` names, after importing what registers it: the
    environment packages for ``agentrl/...`` ids, the user's module for ``"module:ns/Name-vN"``,
    the adapter of another ecosystem (``ECOSYSTEMS``) for its ids, which it registers on first use.
    An unknown id is a ``ConfigError`` with the closest registered id."""
    import gymnasium

    register_envs()
    adapter = ecosystem_of(env_id)
    if adapter is not None:
        if env_id in gymnasium.registry:
            return env_id
        return load_object(f"{adapter}:register")(env_id)
    module, sep, bare = env_id.partition(":")
    if sep:
        import_user_module(module, what=f"environment {env_id!r}")
        env_id = bare
    if env_id not in gymnasium.registry:
        close = difflib.get_close_matches(env_id, list(gymnasium.registry), n=1)
        hint = (f"did you mean {close[0]!r}? " if close else "") + (
            "An env of your own module is named 'module:ns/Name-vN' (the module registers it with "
            "gymnasium.register at import); `agentrl envs` lists the registered ones")
        raise ConfigError(f"no environment {env_id!r} is registered; {hint}")
    return env_id


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


SHARED_SANDBOXES: dict[str, Any] = {}
"""The sandboxes of this process by spec (``shared_sandbox``): every env of a run shares one pool."""
_shared_lock = threading.Lock()


def shared_sandbox(spec: Any) -> Any:
    """The sandbox for ``spec`` (as ``make_sandbox`` takes it), one per process: the envs of a
    run share one pool of workers or containers. A Sandbox object is returned as is."""
    if not isinstance(spec, str):
        return spec
    with _shared_lock:
        if spec not in SHARED_SANDBOXES:
            SHARED_SANDBOXES[spec] = make_sandbox(spec)
        return SHARED_SANDBOXES[spec]


def sandbox_counters() -> collections.Counter[str]:
    """The counters of this process's shared sandboxes, summed (those that keep ``counters``:
    the Docker backend counts the programs run in its containers, ``runs``); empty if none."""
    total: collections.Counter[str] = collections.Counter()
    with _shared_lock:
        for sandbox in SHARED_SANDBOXES.values():
            total.update(getattr(sandbox, "counters", {}))
    return total


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
