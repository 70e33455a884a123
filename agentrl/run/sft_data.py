"""SFT data: conversations and recorded trajectories as token ids with a loss mask.

What it is: ``load_examples(specs, renderer, ...)`` turns the ``data``/``heldout`` entries of an
``agentrl sft`` config into ``SftExample``s (token ids, a 0/1 loss mask, where they came from).
Each entry is a JSONL file, a directory of them, or ``module:function`` (called with the seed,
returning the same objects a line holds). A line is one of:

* an OpenAI chat conversation, ``{"messages": [...], "tools": [...]?}`` (assistant
  ``tool_calls``, ``tool`` messages; an assistant message with ``"weight": 0`` is context only,
  as in OpenAI's fine-tuning format). It is rendered by the rollouts' own ``ChatRenderer`` and
  recorded through ``TokenConversation`` exactly as a rollout records it: each assistant
  message is a "completion" after its generation prompt — its text up to and including the
  end-of-turn token — so the mask is 1 on what the model would sample and 0 on system, user and
  tool tokens and on the generation prompts. A template that rewrites history gives several
  examples (segments), as it gives several trajectories in a rollout.
* a trajectory, ``Trajectory.to_dict()`` plus anything else (or only ``input_ids`` and
  ``loss_mask``, for data tokenized elsewhere): the gateway's
  ``trajectories.jsonl``, a run's ``RUN_DIR/trajectories/step_*.jsonl``. Its recorded ids and
  loss mask are used as they are (never re-tokenized); failed ones and, with ``min_reward``,
  those rewarded less are dropped and counted.
* an ``agentrl eval`` record (``eval.jsonl``, written with ``--samples N``): its samples are
  trajectories as above. (``agentrl eval --curate`` writes dataset rows, which hold no tokens.)
* a line of a run's episode log (``RUN_DIR/rollout/episodes.jsonl``, ``agentrl.rollout.journal``):
  an ``episode`` event's trajectories as above; a ``call`` event (a generation of an episode
  that had not finished) is skipped and counted, a ``forget`` event ignored. The log holds the
  episodes not yet trained on: each checkpoint compacts the others away.

Anything else is a ``ConfigError`` naming ``file:line`` and what was expected. The first token
of an example is never a loss token (nothing predicts it). What it is not: batching or the loss
(``agentrl.run.sft``). Main hook: ``load_examples(["data.jsonl"], ChatRenderer(model_dir))``.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.api import NOT_SAMPLED, Completion, Trajectory, TrajectoryStatus
from agentrl.errors import AgentRLError, ConfigError
from agentrl.rollout.conversation import TokenConversation
from agentrl.rollout.renderer import ChatRenderer
from agentrl.toolcalls.output import tool_names

ROLES = ("system", "user", "assistant", "tool", "developer")
TRAJECTORY_FIELDS = tuple(f.name for f in dataclasses.fields(Trajectory))
EPISODE_LOG_KINDS = ("episode", "call", "forget")  # the events of agentrl.rollout.journal.EpisodeLog


@dataclass
class SftExample:
    """One training sequence: ``input_ids`` and a 0/1 ``loss_mask`` of the same length."""

    input_ids: list[int]
    loss_mask: list[int]
    source: str  # "file:line" (or "module:function[i]"), for messages about it

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass
class SftRecord:
    """The examples of one line (one conversation, one trajectory, one eval problem's samples)."""

    source: str
    examples: list[SftExample]


@dataclass
class SftData:
    """What ``load_examples`` read: the records kept, and what was dropped and why."""

    records: list[SftRecord]
    dropped: Counter = field(default_factory=Counter)

    @property
    def examples(self) -> list[SftExample]:
        return [e for r in self.records for e in r.examples]


# --------------------------------------------------------------------------- conversations


def conversation_examples(renderer: ChatRenderer, messages: Sequence[Mapping[str, Any]],
                          tools: Sequence[Mapping[str, Any]] | None = None) -> list[SftExample]:
    """The examples of one conversation, masked as a rollout masks sampled tokens (module
    docstring). Raises ``ConfigError`` (without a location; the caller adds it)."""
    conv = TokenConversation(renderer)
    eos = renderer.eos_token_id
    messages = [dict(m) for m in messages]
    for i, m in enumerate(messages):
        if m["role"] != "assistant" or m.get("weight", 1) == 0:
            continue
        if i == 0:
            raise ConfigError("message 0 is an assistant message: it has no prompt to answer "
                              "(start with a system or user message)")
        prompt_text = _render(renderer, messages[:i], tools, True)
        turn_text = _render(renderer, messages[: i + 1], tools, False)
        if not turn_text.startswith(prompt_text):
            raise ConfigError(f"message {i}: the chat template does not render this assistant message as a "
                              "continuation of its generation prompt, so which tokens the model samples is unknown")
        ids = renderer.encode(turn_text[len(prompt_text):])
        if eos is not None and eos in ids:  # the model stops at its end-of-turn token; what follows is context
            ids = ids[: ids.index(eos) + 1]
        prompt = conv.prompt(prompt_text)
        conv.record(prompt, Completion(ids, [0.0] * len(ids), [0] * len(ids), "stop"))
    return [SftExample(list(t.input_ids), list(t.loss_mask), "") for t in conv.export("concat")]


def _render(renderer: ChatRenderer, messages: list[dict[str, Any]], tools: Any, gen: bool) -> str:
    try:
        return renderer.render(messages, tools, add_generation_prompt=gen)
    except Exception as e:  # the template's own complaint (Jinja raises anything)
        raise ConfigError(f"the chat template cannot render messages 0..{len(messages) - 1}: "
                          f"{type(e).__name__}: {e}".replace("\n", " ")) from e


def _check_messages(obj: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Validate an OpenAI conversation; returns (messages, tools). ``ConfigError`` without location."""
    messages, tools = obj["messages"], obj.get("tools")
    if not isinstance(messages, list) or not messages:
        raise ConfigError(f"'messages' must be a non-empty list of messages, got {_short(messages)}")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise ConfigError(f"'tools' must be a list of OpenAI tool objects, got {_short(tools)}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ConfigError(f"message {i} must be an object with 'role' and 'content', got {_short(m)}")
        role = m.get("role")
        if role not in ROLES:
            raise ConfigError(f"message {i}: 'role' must be one of {list(ROLES)}, got {_short(role)}")
        m = dict(m)
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts: only text can be rendered
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise ConfigError(f"message {i}: content parts must be text parts "
                                  f"({{\"type\": \"text\", \"text\": ...}}), got {_short(content)}")
            m["content"] = "".join(p["text"] for p in content)
        elif not (isinstance(content, str) or (content is None and role == "assistant")):
            raise ConfigError(f"message {i}: 'content' must be a string (null only for an assistant message "
                              f"with tool_calls), got {_short(content)}")
        calls = m.get("tool_calls")
        if calls is not None:
            if role != "assistant" or not isinstance(calls, list):
                raise ConfigError(f"message {i}: 'tool_calls' must be a list, on an assistant message")
            for j, c in enumerate(calls):
                f = c.get("function") if isinstance(c, dict) else None
                if not (isinstance(f, dict) and isinstance(f.get("name"), str)
                        and isinstance(f.get("arguments"), (str, dict))):
                    raise ConfigError(f"message {i}: tool_calls[{j}] must be {{\"type\": \"function\", \"function\": "
                                      f"{{\"name\": str, \"arguments\": str}}}}, got {_short(c)}")
                _check_call(i, j, f, tools)
        if m.get("weight", 1) not in (0, 1) or isinstance(m.get("weight"), bool):
            raise ConfigError(f"message {i}: 'weight' must be 0 or 1, got {_short(m.get('weight'))}")
        out.append(m)
    if not any(m["role"] == "assistant" and m.get("weight", 1) == 1 for m in out):
        raise ConfigError("the conversation has no assistant message to train on")
    return out, tools


def _check_call(i: int, j: int, function: dict[str, Any], tools: list[dict[str, Any]] | None) -> None:
    """A call to a tool the conversation offers (when it lists tools), with a JSON object as arguments."""
    offered = tool_names(tools)
    if offered is not None and function["name"] not in offered:
        raise ConfigError(f"message {i}: tool_calls[{j}] calls {_short(function['name'])}, which the conversation's "
                          f"tools do not offer ({sorted(offered)}); training on it teaches calls that cannot run")
    args = function["arguments"]
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            raise ConfigError(f"message {i}: tool_calls[{j}].function.arguments is not JSON: "
                              f"{_short(function['arguments'])}") from None
    if not isinstance(args, dict):
        raise ConfigError(f"message {i}: tool_calls[{j}].function.arguments must be a JSON object, got {_short(args)}")


# --------------------------------------------------------------------------- trajectories


def _trajectory(obj: Mapping[str, Any]) -> Trajectory:
    fields = {k: obj[k] for k in TRAJECTORY_FIELDS if k in obj}
    mask = fields.get("loss_mask")
    if isinstance(mask, list):  # pre-tokenized data may bring only input_ids and loss_mask
        fields.setdefault("logprobs", [0.0] * len(mask))
        fields.setdefault("versions", [0 if m == 1 else NOT_SAMPLED for m in mask])
    try:
        return Trajectory.from_dict(fields)
    except (AgentRLError, TypeError, ValueError) as e:
        raise ConfigError(f"not a valid trajectory: {e}") from e


def _trajectory_list(items: Any, name: str, min_reward: float | None, dropped: Counter) -> list[SftExample]:
    """The kept examples of a list of trajectory objects (eval samples, an episode's trajectories)."""
    if not isinstance(items, list):
        raise ConfigError(f"{name!r} must be a list of trajectory objects, got {_short(items)}")
    out = []
    for j, item in enumerate(items):
        if not isinstance(item, dict):
            raise ConfigError(f"{name}[{j}]: expected a trajectory object, got {type(item).__name__}")
        try:
            t = _trajectory(item)
        except ConfigError as e:
            raise ConfigError(f"{name}[{j}]: {e}") from e
        if _keep(t, min_reward, dropped):
            out.append(SftExample(list(t.input_ids), list(t.loss_mask), ""))
    return out


def _keep(t: Trajectory, min_reward: float | None, dropped: Counter) -> bool:
    if t.status is not TrajectoryStatus.OK:
        dropped[f"failed_{t.status.value}"] += 1
        return False
    if min_reward is not None and t.reward < min_reward:
        dropped["below_min_reward"] += 1
        return False
    return True


# --------------------------------------------------------------------------- records


def record_examples(obj: Any, renderer: ChatRenderer, *, min_reward: float | None,
                    dropped: Counter) -> list[SftExample]:
    """The examples of one line's object; ``ConfigError`` (without location) if it is none of
    the kinds of the module docstring."""
    if not isinstance(obj, dict):
        raise ConfigError(f"expected a JSON object, got {type(obj).__name__}")
    if "input_ids" in obj:
        t = _trajectory(obj)
        return [SftExample(list(t.input_ids), list(t.loss_mask), "")] if _keep(t, min_reward, dropped) else []
    if "messages" in obj:
        return conversation_examples(renderer, *_check_messages(obj))
    if "samples" in obj and isinstance(obj["samples"], list):
        return _trajectory_list(obj["samples"], "samples", min_reward, dropped)
    if "key" in obj and obj.get("kind") in EPISODE_LOG_KINDS:
        if obj["kind"] == "episode":
            return _trajectory_list(obj.get("trajectories"), "trajectories", min_reward, dropped)
        if obj["kind"] == "call":
            dropped["unfinished_episode_calls"] += 1
        return []
    if "successes" in obj and "row" in obj:
        raise ConfigError("an `agentrl eval` record without samples holds no tokens; rerun `agentrl eval` "
                          "with --samples N to keep N episodes' tokens per problem")
    raise ConfigError(
        'expected an OpenAI conversation {"messages": [...], "tools": [...]?}, a trajectory '
        '{"input_ids", "loss_mask", "logprobs", "versions", ...}, an `agentrl eval` record with "samples" '
        'or an episode-log event {"kind": "episode", "key", "trajectories"}; '
        f"got the keys {sorted(obj)[:8]} (an `agentrl eval --curate` file holds dataset rows, not tokens)")


TOO_LONG = object()
"""What ``_lines`` yields for a line too long to fit ``max_tokens`` whatever its tokens (never parsed)."""
JSON_ESCAPE = 6
"""The most bytes JSON writes for one byte of text (``\\u0001``)."""


def _lines(spec: str, seed: int, max_bytes: int | None = None) -> Iterator[tuple[str, Any]]:
    """(location, parsed object) of every line of a spec (a file, a directory, module:function);
    a line longer than ``max_bytes`` is ``TOO_LONG`` (not read into memory as text, not parsed)."""
    path = Path(spec)
    if path.is_dir():
        files = sorted(path.glob("*.jsonl"))
        if not files:
            raise ConfigError(f"data {spec!r}: the directory holds no *.jsonl file")
    elif path.is_file():
        files = [path]
    elif ":" in spec and not spec.endswith(".jsonl"):
        from agentrl.plugins import load_object

        rows = load_object(spec)(seed)
        for i, row in enumerate(rows):
            yield f"{spec}[{i}]", row
        return
    else:
        raise ConfigError(f"data {spec!r} does not exist; give a JSONL file, a directory of them, "
                          "or module:function")
    for f in files:
        with f.open("rb") as fh:
            for lineno, raw in enumerate(iter(lambda: fh.readline(max_bytes + 1 if max_bytes else -1), b""), 1):
                if max_bytes is not None and len(raw) > max_bytes:
                    while raw and not raw.endswith(b"\n"):  # the rest of the line, a block at a time
                        raw = fh.readline(1 << 20)
                    yield f"{f}:{lineno}", TOO_LONG
                    continue
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise ConfigError(f"{f}:{lineno}: not UTF-8 text (byte {e.start}); expected one JSON object "
                                      "per line") from None
                if not line.strip():
                    continue
                try:
                    yield f"{f}:{lineno}", json.loads(line)
                except json.JSONDecodeError as e:
                    raise ConfigError(f"{f}:{lineno}: not valid JSON ({e.msg}); expected one object per line") from e
                except RecursionError:
                    raise ConfigError(f"{f}:{lineno}: JSON nested too deeply to read; expected one object per "
                                      "line") from None


def load_examples(specs: Iterable[str], renderer: ChatRenderer, *, seed: int = 0,
                  min_reward: float | None = None, max_tokens: int | None = None,
                  vocab_size: int | None = None) -> SftData:
    """Every record of ``specs``; see the module docstring. Examples longer than ``max_tokens``
    (a line too long to fit it whatever its tokens is not even parsed) and examples without a
    loss token are dropped and counted. A token id outside ``vocab_size`` (default: the
    tokenizer's size) is refused by location."""
    data = SftData([])
    vocab = vocab_size or len(renderer.tokenizer)
    max_bytes = None if max_tokens is None else max_tokens * renderer.bytes_per_token * JSON_ESCAPE
    for spec in specs:
        for where, obj in _lines(spec, seed, max_bytes):
            if obj is TOO_LONG:
                data.dropped["over_max_tokens"] += 1
                continue
            try:
                examples = record_examples(obj, renderer, min_reward=min_reward, dropped=data.dropped)
            except ConfigError as e:
                raise ConfigError(f"{where}: {e}") from e
            kept = []
            for e in examples:
                e.source = where
                if e.input_ids and max(e.input_ids) >= vocab:
                    raise ConfigError(f"{where}: token id {max(e.input_ids)} is outside the model's vocabulary "
                                      f"({vocab} ids); these tokens come from another model")
                if e.loss_mask:
                    e.loss_mask[0] = 0  # nothing predicts the first token
                if max_tokens is not None and len(e.input_ids) > max_tokens:
                    data.dropped["over_max_tokens"] += 1
                elif e.num_loss_tokens == 0:
                    data.dropped["no_loss_tokens"] += 1
                else:
                    kept.append(e)
            if kept:
                data.records.append(SftRecord(where, kept))
    return data


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."
