"""The Tinker service's registry: sessions, training clients, sampling sessions, checkpoints and their TTL.

What it is: ``ServiceState`` — what the routes read and change. A *session* is one SDK
``ServiceClient`` (it heartbeats); a *training client* (``model_id`` = ``SESSION:train:N``, the
id the SDK itself derives) is one LoRA adapter with its optimizer in the ``Learner``; a
*sampling session* names the base model or a saved adapter. Checkpoints live under the
service's directory as ``DIR/checkpoints/<model_id>/weights/<name>`` (``save_state``: adapter +
optimizer) and ``…/sampler_weights/<name>`` (``save_weights_for_sampler``: the adapter alone),
and are named to the SDK as ``tinker://<model_id>/weights/<name>`` (the form its
``ParsedCheckpointTinkerPath`` reads); they outlive the clients and the service.

The end: a session that ends (the SDK's ``close``) or sends no heartbeat for ``ttl_s`` is
gone — its training clients' adapters and optimizers are freed (a queued job, so never under a
running call) and its sampling sessions forgotten; its checkpoints stay on disk.

What it is not: the HTTP side (``routes``), the training (``learner``) or sampling (``sampler``).
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from agentrl.errors import Refused

NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")
"""A checkpoint name: letters, digits, ``_ . -``, not starting with a dot."""
KINDS = {"weights": "weights", "sampler_weights": "sampler_weights"}


@dataclass
class Session:
    session_id: str
    last_seen: float = field(default_factory=time.monotonic)
    models: set[str] = field(default_factory=set)
    samplers: set[str] = field(default_factory=set)


@dataclass
class SamplingSession:
    """What a sampling session samples from: the base (``adapter_dir`` None) or a saved adapter."""

    sampler_id: str
    session_id: str
    model_path: str | None
    adapter_dir: Path | None


class ServiceState:
    """Sessions, clients and checkpoint paths (see the module)."""

    def __init__(self, root: str | Path, base_model: str, *, ttl_s: float = 600.0) -> None:
        self.root = Path(root)
        self.base_model = base_model
        self.ttl_s = ttl_s
        self.sessions: dict[str, Session] = {}
        self.models: dict[str, str] = {}  # model_id -> session_id
        self.samplers: dict[str, SamplingSession] = {}

    # ----------------------------------------------------------------------- sessions
    def new_session(self) -> str:
        sid = f"s{secrets.token_hex(8)}"
        self.sessions[sid] = Session(sid)
        return sid

    def session(self, sid: str) -> Session:
        s = self.sessions.get(sid) if isinstance(sid, str) else None
        if s is None:
            raise Refused(f"no session {str(sid)[:80]!r} on this service (it was never created, or it sent no "
                          f"heartbeat for {self.ttl_s:.0f} s); create a new ServiceClient", 404)
        s.last_seen = time.monotonic()
        return s

    def model_session(self, model_id: str) -> Session:
        if not isinstance(model_id, str) or model_id not in self.models:
            raise Refused(f"no training client {str(model_id)[:80]!r} on this service (never created, or its "
                          "session expired); create one with create_lora_training_client", 404)
        return self.session(self.models[model_id])

    def expired(self) -> list[Session]:
        """Sessions past their TTL, ended (their models to be freed by the caller)."""
        cutoff = time.monotonic() - self.ttl_s
        return [self.end(s.session_id) for s in list(self.sessions.values()) if s.last_seen < cutoff]

    def end(self, sid: str) -> Session:
        """Remove a session, its training clients and sampling sessions (the caller frees the models)."""
        s = self.session(sid)
        del self.sessions[sid]
        for m in s.models:
            self.models.pop(m, None)
        for sampler in s.samplers:
            self.samplers.pop(sampler, None)
        return s

    # ----------------------------------------------------------------------- checkpoints
    def checkpoint(self, model_id: str, kind: str, name: str | None) -> tuple[str, Path]:
        """(the ``tinker://`` path, the directory) of a new checkpoint of ``model_id``."""
        name = name or f"{kind}-{secrets.token_hex(6)}"
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise Refused(f"checkpoint name {str(name)[:80]!r} must be 1-128 letters, digits, '_', '.' or '-', "
                          "not starting with '.'")
        return f"tinker://{model_id}/{kind}/{name}", self.root / "checkpoints" / model_id / kind / name

    def resolve(self, path: str, kind: str | None = None) -> Path:
        """The directory of an existing checkpoint named by a ``tinker://`` path."""
        parts = path[len("tinker://"):].split("/") if isinstance(path, str) and path.startswith("tinker://") else []
        if (len(parts) != 3 or parts[1] not in KINDS or (kind and parts[1] != kind)
                or not all(NAME.fullmatch(p) for p in (parts[0].replace(":", "_"), parts[2]))):
            want = f"tinker://MODEL_ID/{kind or 'weights'}/NAME"
            raise Refused(f"{str(path)[:120]!r} is not a checkpoint path of this service; expected {want}")
        d = self.root / "checkpoints" / parts[0] / parts[1] / parts[2]
        if not d.is_dir():
            raise Refused(f"no checkpoint at {path!r} on this service; pass a path a save returned", 404)
        return d

    def list_checkpoints(self, model_id: str) -> list[dict[str, object]]:
        """The SDK's ``Checkpoint`` records of ``model_id``'s saves, oldest first."""
        out = []
        for kind, ctype in (("weights", "training"), ("sampler_weights", "sampler")):
            for d in sorted((self.root / "checkpoints" / model_id / kind).glob("*")):
                if d.is_dir() and NAME.fullmatch(d.name):
                    stat = d.stat()
                    out.append({"checkpoint_id": f"{kind}/{d.name}", "checkpoint_type": ctype,
                                "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stat.st_mtime)),
                                "tinker_path": f"tinker://{model_id}/{kind}/{d.name}",
                                "size_bytes": sum(f.stat().st_size for f in d.iterdir()), "public": False})
        return sorted(out, key=lambda c: c["time"])
