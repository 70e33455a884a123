"""The bodies of ``agentrl serve``'s control routes, declared once: each route parses its body
with ``agentrl.http_edge.parse_body`` (SGLang's rules: unknown keys ignored, null is the
default) and ``GET /openapi.json`` describes it with ``body_schema``, both from these
dataclasses. Field names and defaults are SGLang 0.5.23's (``managers/io_struct.py``).
What it is not: the generation bodies (``openapi`` and ``validation``: one prompt or a batch,
rules across fields) or the weight-broadcast routes' (``weight_sync``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agentrl.api import MEMORY_TAGS
from agentrl.config import option
from agentrl.errors import Refused


@dataclass
class PauseGeneration:
    """``POST /pause_generation``."""

    mode: Literal["abort", "retract", "in_place"] = option(
        "abort", help="abort: running requests come back with finish reason abort; retract: back to the "
                      "queue; in_place: frozen where they are")


@dataclass
class AbortRequest:
    """``POST /abort_request``."""

    rid: str = option("", help="the request to abort")
    abort_all: bool = option(False, help="abort every request")


@dataclass
class UpdateWeightsFromDisk:
    """``POST /update_weights_from_disk``."""

    model_path: str = option(help="the directory of an HF checkpoint to load, or of a LoRA adapter to merge "
                                  "into the base weights (agentrl serve)")
    weight_version: str | None = option(None, help="the version the new weights serve as (default: unchanged)")
    abort_all_requests: bool = option(False, help="abort the running requests first")
    flush_cache: bool = option(True, help="empty the prefix cache (agentrl serve always does)")
    load_format: str | None = option(None, help="accepted for SGLang's clients; the checkpoint's own is used")
    agentrl_stage_only: bool = option(False, help="ours, not SGLang's: load and check the checkpoint (or LoRA "
                                                  "adapter) into a staging copy while generation goes on; the next "
                                                  "update of the same model_path swaps it in without reading it again")


@dataclass
class MemoryOccupation:
    """``POST /release_memory_occupation`` and ``/resume_memory_occupation``."""

    tags: list[str] | None = option(None, help=f"what to free or occupy again, of {', '.join(MEMORY_TAGS)}; "
                                               "null or empty: all")

    def chosen(self) -> set[str]:
        unknown = [t for t in self.tags or () if t not in MEMORY_TAGS]
        if unknown:
            raise Refused(f"unknown memory tag(s) {unknown}: expected some of {list(MEMORY_TAGS)}, or none for all")
        return set(self.tags or MEMORY_TAGS)


@dataclass
class UpdateWeightVersion:
    """``POST /update_weight_version``."""

    new_version: str = option(help="the version the served weights are labelled with from now on")
    abort_all_requests: bool = option(True, help="abort the running requests first")


@dataclass
class LoadLoraAdapter:
    """``POST /load_lora_adapter``."""

    lora_name: str = option(help="the name requests select the adapter by (lora_path, or model \"base:name\")")
    lora_path: str = option(help="the directory of a peft LoRA adapter (adapter_config.json + "
                                 "adapter_model.safetensors)")
    pinned: bool = option(False, help="accepted for SGLang's clients; agentrl serve never evicts an adapter")
    lora_id: str | None = option(None, help="accepted for SGLang's clients; the name identifies the adapter")


@dataclass
class UnloadLoraAdapter:
    """``POST /unload_lora_adapter``."""

    lora_name: str = option(help="the adapter to unload; requests already running with it finish with it")
    lora_id: str | None = option(None, help="accepted for SGLang's clients; the name identifies the adapter")
