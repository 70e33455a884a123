"""TokenConversation and the ChatClient's bookkeeping, on the tiny tokenizer with a scripted engine
(the one fake here: an InferenceClient that answers with given token ids, for the logic alone).

The bug stories: a multi-turn conversation re-tokenized differently from what was sampled;
a branch of a conversation trained twice; rewards attached to the wrong call."""

from __future__ import annotations

import pytest

from agentrl.api import NOT_SAMPLED, ChatAPI, Completion, SamplingParams, sampled_spans
from agentrl.errors import RequestRejected, RolloutError
from agentrl.rollout.chat_client import ChatClient
from agentrl.rollout.conversation import TokenConversation
from agentrl.rollout.renderer import ChatRenderer


class ScriptedEngine:
    """Answers each generate() with the next scripted reply (text, encoded, + <|end|>), version 3."""

    def __init__(self, renderer: ChatRenderer, replies: list[str]) -> None:
        self.renderer, self.replies, self.prompts = renderer, list(replies), []

    async def generate(self, input_ids, sampling: SamplingParams) -> Completion:
        self.prompts.append(list(input_ids))
        ids = self.renderer.encode(self.replies.pop(0)) + [self.renderer.eos_token_id]
        ids = ids[: sampling.max_new_tokens]
        return Completion(ids, [-0.5] * len(ids), [3] * len(ids), "stop", self.renderer.eos_token_id)


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    return ChatRenderer(tiny_model_dir)


def done(ids):
    return Completion(list(ids), [-0.25] * len(ids), [1] * len(ids), "stop")


def test_each_call_extends_the_tokens_already_sampled(renderer):
    conv = TokenConversation(renderer)
    m1 = [{"role": "user", "content": "What is 1+2?"}]
    p1 = conv.prompt(renderer.render(m1))
    sampled = renderer.encode("\\boxed{3}") + [renderer.eos_token_id]
    c1 = conv.record(p1, done(sampled))
    m2 = [*m1, {"role": "assistant", "content": "\\boxed{3}"}, {"role": "user", "content": "And 2+2?"}]
    p2 = conv.prompt(renderer.render(m2))
    assert p2.extends and p2.ids[: c1.end] == p1.ids + sampled  # earlier tokens kept as sampled
    assert renderer.decode(p2.delta_ids) == "<|user|>And 2+2?<|end|><|assistant|>"
    c2 = conv.record(p2, done(renderer.encode("\\boxed{4}")))
    [t] = conv.export("concat")
    assert t.input_ids == p2.ids + renderer.encode("\\boxed{4}")
    assert t.loss_mask == [0] * len(p1.ids) + [1] * len(sampled) + [0] * len(p2.delta_ids) + [1] * 9
    assert [v for v, m in zip(t.versions, t.loss_mask, strict=True) if not m] == [NOT_SAMPLED] * (len(t) - t.num_sampled)
    assert (c1.segment is c2.segment) and t.num_turns == 2 and t.metrics["segments_per_episode"] == 1.0


def test_edited_history_starts_a_segment_and_a_branch_trains_each_token_once(renderer):
    conv = TokenConversation(renderer)
    m1 = [{"role": "user", "content": "Hi"}]
    c1 = conv.record(conv.prompt(renderer.render(m1)), done(renderer.encode("A") + [257]))
    follow = [*m1, {"role": "assistant", "content": "A"}, {"role": "user", "content": "more"}]
    c2 = conv.record(conv.prompt(renderer.render(follow)), done(renderer.encode("B") + [257]))
    # a second continuation from c1's state: a branch, not a third turn on top of c2
    branch = [*m1, {"role": "assistant", "content": "A"}, {"role": "user", "content": "other"}]
    c3 = conv.record(conv.prompt(renderer.render(branch)), done(renderer.encode("C") + [257]))
    # the agent rewrote what the model said: nothing recorded extends, a fresh segment
    edited = [*m1, {"role": "assistant", "content": "Z"}, {"role": "user", "content": "more"}]
    c4 = conv.record(conv.prompt(renderer.render(edited)), done(renderer.encode("D") + [257]))
    assert [c.segment.index for c in (c1, c2, c3, c4)] == [0, 0, 1, 2]
    concat = conv.export("concat")
    assert len(concat) == 3 and sum(t.num_sampled for t in concat) == 2 + 2 + 2 + 2
    branch_t = concat[1]
    assert branch_t.input_ids[: c1.end] == c1.segment.ids[: c1.end] and sum(branch_t.loss_mask[: c1.end]) == 0
    assert renderer.decode(concat[2].input_ids).startswith("<|user|>Hi<|end|><|assistant|>Z<|end|>")
    individual = conv.export("individual")
    assert [t.num_sampled for t in individual] == [2, 2, 2, 2]
    assert individual[1].input_ids == c2.segment.ids[: c2.end]


def test_an_abandoned_call_is_taken_back_and_the_next_call_extends_what_its_caller_saw(renderer):
    """Issue 30, item 2: a call whose answer reached nobody stayed in the episode (a segment of its
    own beside the real one, an ok reward-0 trajectory). ``abandon`` takes it back exactly."""
    conv = TokenConversation(renderer)
    m1 = [{"role": "user", "content": "Hi"}]
    lost = conv.record(conv.prompt(renderer.render(m1)), done(renderer.encode("X") + [257]))
    assert conv.abandon(lost.id) and conv.segments == [] and conv.export("concat") == []  # its segment goes
    p1 = conv.prompt(renderer.render(m1))
    c1 = conv.record(p1, done(renderer.encode("A") + [257]))
    m2 = [*m1, {"role": "assistant", "content": "A"}, {"role": "user", "content": "more"}]
    gone = conv.record(conv.prompt(renderer.render(m2)), done(renderer.encode("lost") + [257]))
    conv.alias(gone.id, "resp_gone")
    assert conv.abandon(gone.id)  # in place after c1: the segment is cut back to c1's end
    assert conv.segments[0].ids == p1.ids + renderer.encode("A") + [257] and conv.calls == [c1]
    for name in (gone.id, "resp_gone"):
        with pytest.raises(RolloutError, match="no completion"):
            conv.call(name)
    # the retry extends what its caller saw, in place, with the tokens the abandoned call had
    p2 = conv.prompt(renderer.render(m2))
    c2 = conv.record(p2, done(renderer.encode("B") + [257]))
    assert c2.segment is c1.segment and c2.index == 1
    # two calls on one state at once: the first recorded in place, the second a branch; the first
    # is abandoned (its stream was cut), and the second rejoins the segment where it forked
    m3 = [*m2, {"role": "assistant", "content": "B"}, {"role": "user", "content": "again"}]
    first, second = conv.prompt(renderer.render(m3)), conv.prompt(renderer.render(m3))
    cut = conv.record(first, done(renderer.encode("cut") + [257]))
    c3 = conv.record(second, done(renderer.encode("C") + [257]))
    assert len(conv.segments) == 2 and conv.abandon(cut.id) and len(conv.segments) == 1
    conv.set_last_reward(1.0)
    [t] = conv.export("concat")
    sampled = [renderer.encode(x) + [257] for x in "ABC"]
    assert t.input_ids == second.ids + sampled[2] and t.reward == 1.0 and t.num_turns == 3
    assert [t.input_ids[s:e] for s, e in sampled_spans(t.loss_mask)] == sampled  # each trained once, as sampled
    assert t.metrics["calls_abandoned"] == 3.0 and [c.segment for c in (c1, c2, c3)] == [c1.segment] * 3
    assert conv.abandon(c3.id) and conv.export("concat")[0].input_ids == p2.ids + sampled[1]  # c3's own start
    # a call a later call extends is kept: that caller had its text
    kept = conv.record(conv.prompt(renderer.render(m3)), done(renderer.encode("D") + [257]))
    m4 = [*m3, {"role": "assistant", "content": "D"}, {"role": "user", "content": "so?"}]
    conv.record(conv.prompt(renderer.render(m4)), done(renderer.encode("E") + [257]))
    assert not conv.abandon(kept.id) and len(conv.calls) == 4


def test_rewards_name_calls_and_discount_runs_backwards_over_calls(renderer):
    conv = TokenConversation(renderer)
    text = renderer.render([{"role": "user", "content": "q"}])
    calls = [conv.record(conv.prompt(text), done([65, 257])) for _ in range(3)]
    conv.set_reward(calls[0].id, 1.0)
    conv.set_last_reward(2.0)
    conv.alias(calls[1].id, "resp_x")
    conv.set_reward("resp_x", 0.5)
    conv.apply_reward_discount(0.5)
    conv.apply_reward_discount(0.5)  # from the raw rewards: applying twice changes nothing
    assert [t.reward for t in conv.export("individual")] == [1.0 + 0.5 * (0.5 + 0.5 * 2.0), 0.5 + 0.5 * 2.0, 2.0]
    with pytest.raises(RolloutError, match="no completion 'nope'"):
        conv.set_reward("nope", 1.0)
    with pytest.raises(RolloutError, match="finite"):
        conv.set_last_reward(float("nan"))
    with pytest.raises(RolloutError, match=r"\[0, 1\]"):
        conv.apply_reward_discount(1.5)


def test_a_concat_trajectory_carries_its_turns_rewards_and_sums_them(renderer):
    """Issue 48: a segment's trajectory took only its last call's return, so an env's reward for an
    earlier turn of the same stream was lost, and ``kind: turn`` had no per-turn rewards from any
    built-in workflow. Now ``turn_rewards`` are the calls' own rewards, and the trajectory's
    reward is their sum plus what the episode earns after the segment (γ·R of the next call)."""
    from agentrl.trainer.turns import per_turn_rewards

    conv = TokenConversation(renderer)
    messages = [{"role": "user", "content": "q"}]
    calls = []
    for reply in "ABC":
        calls.append(conv.record(conv.prompt(renderer.render(messages)), done(renderer.encode(reply) + [257])))
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "again"}]
    edited = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "Z"}]  # history rewritten
    calls.append(conv.record(conv.prompt(renderer.render(edited)), done(renderer.encode("D") + [257])))
    assert [c.segment.index for c in calls] == [0, 0, 0, 1]
    conv.set_reward(calls[0].id, 1.0)  # calls[1] earns nothing
    conv.set_reward(calls[2].id, 2.0)
    conv.set_last_reward(4.0)
    first, second = conv.export("concat")
    assert first.turn_rewards == [1.0, 0.0, 2.0] and second.turn_rewards == [4.0]
    assert (first.reward, second.reward) == (3.0, 4.0)  # undiscounted: the sum of the segment's turns
    conv.apply_reward_discount(0.5)
    first, second = conv.export("concat")
    # returns: R4 = 4, R3 = 2 + 0.5·4 = 4; the segment: 1 + 0 + 2, plus 0.5·R4 after it
    assert first.reward == calls[2].return_ + 1.0 == 5.0 and second.reward == 4.0
    # what the turn-level estimator reads: each turn its own reward, what comes after on the last
    assert per_turn_rewards(first.loss_mask, first.reward, first.turn_rewards) == [1.0, 0.0, 4.0]
    only_last = TokenConversation(renderer)  # the built-in envs' case: a reward on the last step only
    for m, reply in ((messages[:1], "A"), (messages[:3], "B")):  # "q" → A, then "q" / A / "again" → B
        only_last.record(only_last.prompt(renderer.render(m)), done(renderer.encode(reply) + [257]))
    only_last.set_last_reward(1.0)
    only_last.apply_reward_discount(0.5)
    assert [(t.reward, t.turn_rewards) for t in only_last.export("concat")] == [(1.0, [0.0, 1.0])]


def test_the_token_budget_refuses_a_prompt_that_does_not_fit(renderer):
    conv = TokenConversation(renderer, max_tokens=20)
    with pytest.raises(RolloutError, match="over its budget of 20 tokens"):
        conv.prompt(renderer.render([{"role": "user", "content": "x" * 30}]))
    prompt = conv.prompt(renderer.render([{"role": "user", "content": "x"}]))
    assert conv.budget(prompt) == 20 - len(prompt.ids)


async def test_chat_client_meets_the_protocol_and_answers_with_sdk_types(renderer):
    from openai.types.chat import ChatCompletion

    engine = ScriptedEngine(renderer, ['<tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}'
                                       '</tool_call>', "\\boxed{3}"])
    client = ChatClient(engine, renderer)
    assert isinstance(client, ChatAPI)
    tools = [{"type": "function", "function": {"name": "calculator", "description": "Evaluate.",
                                               "parameters": {"type": "object", "properties": {
                                                   "expression": {"type": "string"}}, "required": ["expression"]}}}]
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is 1+2?"}]}]
    r1 = await client.chat.completions.create(model="m", messages=messages, tools=tools, logprobs=True)
    assert isinstance(r1, ChatCompletion) and r1.choices[0].finish_reason == "tool_calls"
    call = r1.choices[0].message.tool_calls[0]
    assert (call.function.name, call.function.arguments) == ("calculator", '{"expression": "1+2"}')
    assert [lp.logprob for lp in r1.choices[0].logprobs.content] == [-0.5] * r1.usage.completion_tokens
    messages += [r1.choices[0].message, {"role": "tool", "tool_call_id": call.id, "content": "3"}]
    r2 = await client.chat.completions.create(model="m", messages=messages, tools=tools, max_completion_tokens=50)
    assert r2.choices[0].message.content == "\\boxed{3}" and r2.usage.completion_tokens == 10
    assert engine.prompts[1][: len(engine.prompts[0])] == engine.prompts[0]  # extended, not re-tokenized
    client.set_last_reward(1.0)
    [t] = client.export_trajectories()
    assert t.reward == 1.0 and t.num_turns == 2 and set(t.versions) == {NOT_SAMPLED, 3}
    with pytest.raises(RequestRejected, match="n=2 is not supported"):
        await client.chat.completions.create(model="m", messages=messages, n=2)
    with pytest.raises(RequestRejected, match="tool_choice 'required'"):
        await client.chat.completions.create(model="m", messages=messages, tools=tools, tool_choice="required")
    with pytest.raises(RequestRejected, match="temperature must be a finite number"):
        await client.chat.completions.create(model="m", messages=messages, temperature="hot")


class _CountingRenderer(ChatRenderer):
    """The tiny model's renderer, noting which thread tokenized how many characters."""

    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer)
        self.encoded: list[tuple[int, str]] = []

    def encode(self, text: str) -> list[int]:
        import threading

        self.encoded.append((len(text), threading.current_thread().name))
        return super().encode(text)


async def test_a_text_over_the_budget_is_refused_by_its_size_before_any_of_it_is_tokenized(tiny_model_dir):
    """Issue 30, item 1: a ~4 MB message to a gateway session (budget 65,536 tokens) was
    tokenized on the event loop for 7 s before its 400, stalling every other session. Its size
    alone now proves it cannot fit, and nothing of it is tokenized."""
    renderer = _CountingRenderer(tiny_model_dir)
    conv = TokenConversation(renderer, max_tokens=65536)
    with pytest.raises(RolloutError, match=r"adds at least \d+ \(4000000 characters\): over its budget of 65536"):
        await conv.aprompt("x" * 4_000_000)
    assert renderer.encoded == []


async def test_a_long_text_within_the_budget_is_tokenized_off_the_event_loop(tiny_model_dir):
    import threading

    renderer = _CountingRenderer(tiny_model_dir)
    conv = TokenConversation(renderer, max_tokens=65536)
    text = "What is 1+2? " * 3000  # 39,000 characters, past offload_chars
    prompt = await conv.aprompt(text)
    assert prompt.ids == renderer.encode(text)
    (size, thread), _ = renderer.encoded
    assert size == len(text) and thread != threading.main_thread().name
    short = await TokenConversation(renderer).aprompt("What is 1+2?")
    assert renderer.encoded[-1] == (len("What is 1+2?"), threading.main_thread().name) and short.ids


def test_completions_cut_at_the_token_budget_are_counted(renderer):
    """Each exported trajectory says how many of its conversation's calls stopped at
    max_new_tokens; a step's batch metrics turn that into rollout/truncation_rate."""
    from agentrl.run.metrics import batch_metrics

    conv = TokenConversation(renderer)
    text = renderer.render([{"role": "user", "content": "q"}])
    conv.record(conv.prompt(text), done([65, 257]))
    cut = Completion([65, 66], [-0.25] * 2, [1] * 2, "length")
    conv.record(conv.prompt(text), cut)
    trajectories = conv.export("individual")
    assert [t.metrics["calls_truncated"] for t in trajectories] == [1.0, 1.0]
    assert batch_metrics(trajectories, 1)["rollout/truncation_rate"] == 0.5
    for t in trajectories:  # a workflow that does not count calls reports no rate
        del t.metrics["calls"]
    assert "rollout/truncation_rate" not in batch_metrics(trajectories, 1)


async def test_a_call_whose_answer_cannot_be_built_is_taken_back_and_counted(renderer, monkeypatch):
    """Issue 49: the gateway recorded a reply, then failed to build its answer (the tool parser
    raised on a 1,500-deep argument): the client got a 500 and the undelivered reply was trained
    on beside the agent's retry, with ``calls_abandoned`` at 0. A call goes out or is not data."""
    from agentrl.rollout import chat_client
    from agentrl.rollout.gateway import Gateway

    def broken(*args, **kwargs):
        raise RuntimeError("the answer could not be built")

    gateway = Gateway(ScriptedEngine(renderer, ["\\boxed{3}", "\\boxed{4}"]), renderer)
    session = gateway.open_session()
    body = {"messages": [{"role": "user", "content": "1+2?"}]}
    with monkeypatch.context() as m:
        m.setattr(chat_client, "assistant_message", broken)
        with pytest.raises(RuntimeError, match="could not be built"):
            await gateway.call(session, lambda chat: chat.complete(body))
    assert session.chat.conversation.calls == [] and gateway.stats["calls_abandoned"] == 1
    answer = await gateway.call(session, lambda chat: chat.complete(body))  # the agent's retry
    [t] = await gateway.end_session(session.id)
    assert answer["choices"][0]["message"]["content"] == "\\boxed{4}" and t.num_turns == 1
    assert renderer.decode([i for i, m in zip(t.input_ids, t.loss_mask, strict=True) if m],
                           skip_special_tokens=True) == "\\boxed{4}"


class RecordingEngine(ScriptedEngine):
    def __init__(self, renderer: ChatRenderer, replies: list[str]) -> None:
        super().__init__(renderer, replies)
        self.sampling: list[SamplingParams] = []

    async def generate(self, input_ids, sampling: SamplingParams) -> Completion:
        self.sampling.append(sampling)
        return await super().generate(input_ids, sampling)


async def test_the_gateway_samples_the_policy_s_own_distribution_whatever_the_agent_asks(renderer, tiny_model_dir):
    """Issue 49: the gateway passed an agent's temperature (0.7) through, so the recorded
    behaviour log-probabilities were of the tempered distribution while the trainer recomputes at
    temperature 1 (behaviour weights up to 30.9). By default (``agent_sampling: policy``) every
    call samples the policy's own distribution; ``agent`` passes the agent's settings through
    (data for SFT or evaluation), and a run refuses it."""
    from agentrl.config import load_config
    from agentrl.errors import ConfigError
    from agentrl.rollout.gateway import Gateway
    from agentrl.rollout.gateway_config import GatewayConfig
    from agentrl.run.run_config import RunConfig, check_run_config

    body = {"messages": [{"role": "user", "content": "1+2?"}], "temperature": 0.7, "top_p": 0.9, "top_k": 5,
            "presence_penalty": 1.0, "logit_bias": {"5": 3}, "max_tokens": 9, "stop": ["x"], "seed": 4}
    sent = {}
    for mode in ("policy", "agent"):
        engine = RecordingEngine(renderer, ["\\boxed{3}"])
        gateway = Gateway(engine, renderer, GatewayConfig(agent_sampling=mode))
        session = gateway.open_session()
        await gateway.call(session, lambda chat: chat.complete(body))
        sent[mode] = engine.sampling[0]
    policy, agent = sent["policy"], sent["agent"]
    assert (policy.temperature, policy.top_p, policy.top_k, policy.presence_penalty, policy.logit_bias) == (
        1.0, 1.0, -1, 0.0, {})
    assert (policy.max_new_tokens, policy.stop, policy.seed) == (9, ["x"], 4)  # what does not reshape stays
    assert (agent.temperature, agent.top_p, agent.top_k, agent.logit_bias) == (0.7, 0.9, 5, {5: 3.0})
    cfg = load_config(RunConfig, None, [f"model={tiny_model_dir}", "rollout.source=gateway", "gateway.agent_sampling=agent"])
    with pytest.raises(ConfigError, match="gateway.agent_sampling"):
        check_run_config(cfg)


async def test_a_request_the_template_cannot_render_is_a_400_as_on_serve(renderer):
    """Issue 49: the gateway answered 500 where ``agentrl serve`` answers 400 for the same
    request faults — a template's UndefinedError, a conversation nested past the recursion limit."""
    from agentrl.rollout.gateway_routes import refusal

    client = ChatClient(ScriptedEngine(renderer, ["x"]), renderer)
    deep: dict = {}
    for _ in range(5000):
        deep = {"a": deep}
    for messages in ([{"role": "user", "content": "hi", "extra": deep}],
                     [{"role": "assistant", "content": "x", "tool_calls": [{"function": None}]}]):
        with pytest.raises(RequestRejected) as info:
            await client.complete({"messages": messages})  # what the gateway's route calls
        assert info.value.status_code == 400 and "could not render" in str(info.value), info.value
        assert refusal(info.value, 1).status == 400


async def test_the_episode_s_reward_reaches_every_segment_by_default(renderer):
    """Issue 49: an agent that rewrites its history (mini-swe-agent drops a reply after a format
    error) gives several trajectories, and the reward set on its last call reached only the
    last unless /end carried ``discount: 1.0``: GRPO averaged the episode's reward with zeros."""
    from agentrl.rollout.gateway import Gateway

    gateway = Gateway(ScriptedEngine(renderer, ["bad format", "\\boxed{3}"]), renderer)
    session = gateway.open_session()
    first = [{"role": "user", "content": "1+2?"}]
    await gateway.call(session, lambda chat: chat.complete({"messages": first}))
    # the agent drops the bad reply and asks again with another instruction: history rewritten
    await gateway.call(session, lambda chat: chat.complete({"messages": [{"role": "user", "content": "1+2? Box it."}]}))
    session.chat.set_last_reward(1.0)
    trajectories = await gateway.end_session(session.id)
    assert len(trajectories) == 2 and [t.reward for t in trajectories] == [1.0, 1.0]


async def test_a_parser_that_does_not_match_the_model_is_said_once(renderer, caplog):
    """Issue 49: a reply in another family's call format was silently plain content."""
    from agentrl.model.arith_data import CALCULATOR_TOOL

    reply = '<tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}</tool_call>'
    client = ChatClient(ScriptedEngine(renderer, [reply, reply]), renderer, tool_call_parser="llama3")
    body = {"messages": [{"role": "user", "content": "1+2?"}], "tools": [CALCULATOR_TOOL]}
    with caplog.at_level("WARNING"):
        for _ in range(2):
            answer = await client.complete(body)
    assert not answer["choices"][0]["message"].get("tool_calls")
    said = [r.message for r in caplog.records if "tool-call markers" in r.message]
    assert len(said) == 1 and "hermes" in said[0] and "read as llama3" in said[0]
