"""The gateway's own request bodies, declared once: its routes parse them
(``agentrl.http_edge.parse_body``) and its OpenAPI document describes them (``body_schema``)
from these dataclasses. What it is not: the OpenAI bodies the gateway forwards
(``agentrl.inference.chat_format`` reads those, as ``agentrl serve`` does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from agentrl.config import option


@dataclass
class OpenSession:
    """``POST /v1/sessions``."""

    metadata: dict[str, Any] | None = option(None, help="kept with the episode (e.g. {\"group\": ..., \"row\": ...})")


@dataclass
class SetReward:
    """``POST /v1/sessions/{id}/reward``."""

    reward: float = option(help="the reward, a finite number")
    completion_id: str | None = option(None, help="the call it rewards (default: the session's last)")


@dataclass
class EndSession:
    """``POST /v1/sessions/{id}/end``."""

    discount: float | None = option(None, ge=0, le=1, help="γ for the returns over the session's calls "
                                                           "(default: the gateway's, 1)")
    style: Literal["concat", "individual"] = option("concat", help="one trajectory of the whole session, or "
                                                                   "one per call")
    return_trajectories: bool = option(False, help="answer with the trajectories too")


@dataclass
class Step:
    """``POST /v1/sessions/{id}/step``."""

    completion_id: str | None = option(None, help="the call whose reply steps the env (default: the last)")
