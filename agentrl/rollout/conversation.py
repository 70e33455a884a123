"""TokenConversation: the exact token stream of one episode, built call by call.

What it is: the bookkeeping behind ``EnvWorkflow`` and the ``ChatClient``. Each generation
call brings the whole conversation as the chat template renders it; the conversation finds
the recorded state that this text extends — the prompt and sampled text of an earlier call —
and tokenizes only the new text after it. Earlier sampled tokens are never re-tokenized: the
next prompt is *their* ids plus the new messages' ids, stop token included as sampled, so the
tokens trained on are the tokens the model saw and produced.

Segments: when the new rendering does not start with any recorded state (the agent edited
history, or the template renders history differently — a Qwen3-style template that drops
earlier ``<think>`` blocks, a tool call written with other spacing than the template's),
the call starts a new **segment** with a fresh prompt. A call that extends an earlier state
that another call already extended (a branch) gets a segment of its own whose prefix is kept
as context (loss mask 0), so no sampled token is trained twice. ``export("concat")`` gives
one trajectory per segment (tokens between calls have loss mask 0), ``export("individual")``
one per call.

Abandoned calls: ``abandon(call_id)`` undoes a call whose answer never reached its caller
(the gateway's client hung up first): its completion and the prompt tokens it added leave its
segment (a segment it started goes), so the caller's next call extends what the caller saw,
in place and with the same tokens. A call that a later call already built on is kept.

Rewards belong to calls: ``set_reward(call_id, r)``, ``set_last_reward(r)`` (the latest call),
``apply_reward_discount(γ)`` (R_i = r_i + γ·R_{i+1} backwards over the calls in the order they
were made, from the raw rewards, so applying it twice changes nothing). A concat trajectory's
``turn_rewards`` are its calls' own rewards (0.0 where unset), one per turn, and its ``reward``
is their sum plus what the episode earns after its last call (that call's return minus its own
reward: γ·R of the next call): where only a segment's last call is rewarded — every env that
scores on its last step — that is the last call's return.

What it is not: rendering (``ChatRenderer``) or generation; it is synchronous and does no I/O,
so an asyncio caller needs no lock: ``prompt`` and ``record`` each run without an await.

Main hook::

    conv = TokenConversation(renderer)
    prompt = conv.prompt(renderer.render(messages, tools))
    call = conv.record(prompt, await engine.generate(prompt.ids, sampling))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from agentrl.api import NOT_SAMPLED, Completion, Trajectory, sampled_spans
from agentrl.errors import RolloutError
from agentrl.ids import unique_hex
from agentrl.rollout.renderer import ChatRenderer

ExportStyle = Literal["concat", "individual"]


@dataclass(eq=False)
class Segment:
    """One linear token stream: ids and their loss mask, logprobs, versions, and the text they stand for."""

    index: int
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    text: str = ""
    calls: list[Call] = field(default_factory=list)
    fork: tuple[Segment, int, int] | None = None  # a branch: the segment, tokens and characters it forked at

    def extend_context(self, ids: list[int], text: str) -> None:
        self.ids += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [NOT_SAMPLED] * len(ids)
        self.text += text


@dataclass(eq=False)
class Call:
    """One recorded completion: where its tokens sit in its segment, and its reward."""

    id: str
    index: int  # order among the conversation's calls
    segment: Segment
    start: int  # first completion token in segment.ids (= the prompt's length)
    end: int  # one past its last token
    text_end: int  # len(segment.text) after it
    completion: Completion
    base: int = 0  # tokens of `segment` before this call's prompt added any
    base_text: int = 0
    reward: float | None = None
    discounted: float | None = None

    @property
    def prompt_ids(self) -> list[int]:
        return self.segment.ids[: self.start]

    @property
    def return_(self) -> float:
        """The discounted return when a discount was applied, else the raw reward (0.0 if unset)."""
        if self.discounted is not None:
            return self.discounted
        return self.reward if self.reward is not None else 0.0


@dataclass
class Prompt:
    """What to send for one call, and where its completion will be recorded."""

    ids: list[int]
    text: str
    segment: Segment | None  # the segment it extends; None: a new one
    base: int  # tokens of `segment` it builds on
    base_text: int
    delta_ids: list[int]
    delta_text: str

    @property
    def extends(self) -> bool:
        return self.segment is not None


class TokenConversation:
    """The calls and segments of one episode; see the module docstring."""

    def __init__(self, renderer: ChatRenderer, *, max_tokens: int | None = None) -> None:
        self.renderer = renderer
        self.max_tokens = max_tokens
        self.segments: list[Segment] = []
        self.calls: list[Call] = []
        self.abandoned = 0  # calls undone by ``abandon``
        self._by_id: dict[str, Call] = {}

    # ------------------------------------------------------------------ building

    @property
    def num_tokens(self) -> int:
        """Tokens recorded over all segments (what ``max_tokens`` bounds)."""
        return sum(len(s.ids) for s in self.segments)

    def prompt(self, text: str) -> Prompt:
        """The prompt ids for a call whose full rendering is ``text``: the longest recorded
        state that ``text`` starts with, plus the tokens of the rest; else ``text`` tokenized."""
        segment, base, base_text = self._match(text)
        self._check_budget(text[base_text:])
        return self._prompt(text, segment, base, base_text, self.renderer.encode(text[base_text:]))

    async def aprompt(self, text: str) -> Prompt:
        """``prompt``, with a long new text tokenized in a worker thread, and one that cannot fit
        the budget refused by its size before any of it is tokenized."""
        segment, base, base_text = self._match(text)
        self._check_budget(text[base_text:])
        return self._prompt(text, segment, base, base_text, await self.renderer.aencode(text[base_text:]))

    def _check_budget(self, delta_text: str) -> None:
        if self.max_tokens is not None and len(delta_text) > self.renderer.offload_chars:
            at_least = self.renderer.min_tokens(delta_text)
            if self.num_tokens + at_least >= self.max_tokens:
                raise RolloutError(f"this conversation holds {self.num_tokens} tokens and the next prompt adds at "
                                   f"least {at_least} ({len(delta_text)} characters): over its budget of "
                                   f"{self.max_tokens} tokens")

    def _prompt(self, text: str, segment: Segment | None, base: int, base_text: int, delta: list[int]) -> Prompt:
        if segment is None:
            prompt = Prompt(delta, text, None, 0, 0, delta, text)
        else:
            prompt = Prompt(segment.ids[:base] + delta, text, segment, base, base_text, delta, text[base_text:])
        if self.max_tokens is not None and self.num_tokens + len(prompt.delta_ids) >= self.max_tokens:
            raise RolloutError(f"this conversation holds {self.num_tokens} tokens and the next prompt adds "
                               f"{len(prompt.delta_ids)}: over its budget of {self.max_tokens} tokens")
        return prompt

    def budget(self, prompt: Prompt) -> int | None:
        """Tokens a completion of ``prompt`` may still add within ``max_tokens`` (None: no budget)."""
        if self.max_tokens is None:
            return None
        return max(0, self.max_tokens - self.num_tokens - len(prompt.delta_ids))

    def record(self, prompt: Prompt, completion: Completion) -> Call:
        """Append ``completion`` after ``prompt``: in place when its segment has not moved on
        since, else in a segment of its own (a new conversation, or a branch)."""
        seg, base, base_text = prompt.segment, prompt.base, prompt.base_text
        if (seg is not None and len(seg.ids) == base and len(seg.text) == base_text
                and any(s is seg for s in self.segments)):
            seg.extend_context(prompt.delta_ids, prompt.delta_text)
        else:  # a new conversation, or a branch: the shared prefix is context here, trained in its own segment
            fork = None if seg is None else (seg, base, base_text)
            seg, base, base_text = Segment(len(self.segments), fork=fork), 0, 0
            self.segments.append(seg)
            seg.extend_context(prompt.ids, prompt.text)  # the prompt as sent, whatever its segment became since
        start = len(seg.ids)
        seg.ids += completion.tokens
        seg.mask += [1] * len(completion.tokens)
        seg.logprobs += [float(x) for x in completion.logprobs]
        seg.versions += [int(v) for v in completion.versions]
        seg.text += self.renderer.decode(completion.tokens)
        call = Call(f"chatcmpl-{unique_hex()}", len(self.calls), seg, start, len(seg.ids), len(seg.text),
                    completion, base, base_text)
        seg.calls.append(call)
        self.calls.append(call)
        self._by_id[call.id] = call
        return call

    def abandon(self, call_id: str) -> bool:
        """Undo the call ``call_id`` as if it had never been made (its answer reached nobody): its
        completion and the prompt tokens it added leave its segment, a segment it started goes,
        and its id is forgotten; a call that branched off where it is cut back to (it came while
        the abandoned one was under way) rejoins the segment. False, and nothing changes, when a
        later call extends its completion (that caller had its text, so it stays)."""
        call = self.call(call_id)
        seg = call.segment
        if seg.calls[-1] is not call:
            return False
        if len(seg.calls) == 1:  # the call started the segment
            self.segments.remove(seg)
        else:
            del seg.ids[call.base :], seg.mask[call.base :], seg.logprobs[call.base :], seg.versions[call.base :]
            seg.text = seg.text[: call.base_text]
            seg.calls.pop()
            branch = next((s for s in self.segments if s.fork == (seg, call.base, call.base_text)), None)
            if branch is not None:
                self._rejoin(seg, branch)
        for i, s in enumerate(self.segments):
            s.index = i
        self.calls.remove(call)
        for i, c in enumerate(self.calls):
            c.index = i
        for name in [k for k, c in self._by_id.items() if c is call]:  # its id and any alias
            del self._by_id[name]
        self.abandoned += 1
        self._clear_discount()
        return True

    def _rejoin(self, seg: Segment, branch: Segment) -> None:
        """Append ``branch``, forked at ``seg``'s end, to ``seg``: its first tokens are ``seg``'s
        (copied as context), so its calls keep their positions and its sampled tokens their mask."""
        n, n_text = len(seg.ids), len(seg.text)
        seg.ids += branch.ids[n:]
        seg.mask += branch.mask[n:]
        seg.logprobs += branch.logprobs[n:]
        seg.versions += branch.versions[n:]
        seg.text += branch.text[n_text:]
        branch.calls[0].base, branch.calls[0].base_text = n, n_text
        for c in branch.calls:
            c.segment = seg
        seg.calls += branch.calls
        self.segments.remove(branch)
        for s in self.segments:
            if s.fork is not None and s.fork[0] is branch:
                s.fork = (seg, *s.fork[1:])

    def _match(self, text: str) -> tuple[Segment | None, int, int]:
        best: tuple[Segment | None, int, int] = (None, 0, 0)
        for seg in reversed(self.segments):
            if len(seg.text) > best[2] and text.startswith(seg.text):
                best = (seg, len(seg.ids), len(seg.text))
                continue
            for call in reversed(seg.calls[:-1]):
                if call.text_end > best[2] and text.startswith(seg.text[: call.text_end]):
                    best = (seg, call.end, call.text_end)
                    break
        return best

    # ------------------------------------------------------------------ rewards

    def call(self, call_id: str) -> Call:
        try:
            return self._by_id[call_id]
        except KeyError:
            raise RolloutError(f"no completion {call_id!r} in this conversation "
                               f"({len(self.calls)} completions recorded)") from None

    def alias(self, call_id: str, other_id: str) -> None:
        """Let ``other_id`` (a Responses API id) name the call ``call_id`` too."""
        self._by_id[other_id] = self.call(call_id)

    def set_reward(self, call_id: str, reward: float) -> None:
        self.call(call_id).reward = _finite(reward)
        self._clear_discount()

    def set_last_reward(self, reward: float) -> None:
        if not self.calls:
            raise RolloutError("no completion has been made yet, so there is no last one to reward")
        self.calls[-1].reward = _finite(reward)
        self._clear_discount()

    def apply_reward_discount(self, gamma: float = 1.0) -> None:
        if not 0.0 <= gamma <= 1.0:
            raise RolloutError(f"the discount must be in [0, 1], got {gamma}")
        ret = 0.0
        for call in reversed(self.calls):
            ret = (call.reward or 0.0) + gamma * ret
            call.discounted = ret

    def _clear_discount(self) -> None:
        for call in self.calls:
            call.discounted = None

    # ------------------------------------------------------------------ export

    def export(self, style: ExportStyle = "concat") -> list[Trajectory]:
        """Trajectories of every recorded call: one per segment (``concat``) or per call (``individual``)."""
        metrics = {"segments_per_episode": float(len(self.segments)), "calls": float(len(self.calls)),
                   "calls_truncated": float(sum(c.completion.finish_reason == "length" for c in self.calls))}
        if self.abandoned:
            metrics["calls_abandoned"] = float(self.abandoned)
        if style == "concat":
            return [_concat(s, metrics) for s in self.segments if s.calls]
        if style == "individual":
            out = []
            for c in self.calls:
                n, seg = c.start, c.segment
                out.append(Trajectory(seg.ids[: c.end], [0] * n + seg.mask[n : c.end],
                                      [0.0] * n + seg.logprobs[n : c.end], [NOT_SAMPLED] * n + seg.versions[n : c.end],
                                      reward=c.return_, num_turns=1, metrics=dict(metrics)))
            return out
        raise RolloutError(f"export style must be 'concat' or 'individual', got {style!r}")


def _concat(s: Segment, metrics: dict[str, float]) -> Trajectory:
    """Segment ``s`` as one trajectory: its calls' own rewards as ``turn_rewards`` (when each call
    left a run of sampled tokens of its own) and, as ``reward``, their sum plus what comes after."""
    own = [c.reward if c.reward is not None else 0.0 for c in s.calls]
    reward = s.calls[-1].return_ + sum(own[:-1])
    turns = own if len(sampled_spans(s.mask)) == len(own) else None
    return Trajectory(list(s.ids), list(s.mask), list(s.logprobs), list(s.versions), reward=reward,
                      num_turns=len(s.calls), metrics=dict(metrics), turn_rewards=turns)


def _finite(reward: float) -> float:
    try:
        r = float(reward)
    except (TypeError, ValueError):
        raise RolloutError(f"a reward must be a number, got {reward!r}") from None
    if r != r or r in (float("inf"), float("-inf")):
        raise RolloutError(f"a reward must be finite, got {reward!r}")
    return r
