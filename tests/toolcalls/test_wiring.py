"""The parsers where model output is read: the OpenAI answer (serve, gateway, ChatClient), the
env's tools, and the settings that choose them (``--tool-call-parser``/``--reasoning-parser``,
``gateway.*``, ``rollout.*``). The default reading is today's: ``qwen25``, no reasoning."""

from __future__ import annotations

import json

import pytest

from agentrl.api import Completion, SamplingParams
from agentrl.config import from_dict
from agentrl.env.tools import ToolBox
from agentrl.inference.chat_format import assistant_message, keep_special_tokens
from agentrl.inference.serve_config import ServeConfig
from agentrl.rollout.chat_client import ChatClient
from agentrl.rollout.gateway_config import GatewayConfig
from agentrl.rollout.renderer import ChatRenderer
from agentrl.rollout.rollout_config import RolloutConfig

CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "x"}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"key": {"type": "string"}}}}}]


def test_the_answer_carries_reasoning_and_only_the_calls_after_it():
    text = f"<think>maybe {CALL}</think>Looking it up.\n{CALL}"
    message, finish, matched = assistant_message(text, True, "stop", 7, reasoning_parser="qwen3", tools=TOOLS)
    assert message["reasoning_content"] == f"maybe {CALL}" and message["content"] == "Looking it up."
    assert [json.loads(c["function"]["arguments"]) for c in message["tool_calls"]] == [{"key": "x"}]
    assert (finish, matched) == ("tool_calls", None)
    # without tools offered, the reasoning is still split off, and no call is returned
    message, finish, _ = assistant_message(text, False, "stop", 7, reasoning_parser="qwen3")
    assert "tool_calls" not in message and message["reasoning_content"].startswith("maybe") and finish == "stop"
    # the default: today's answer, the text as it came
    message, _, _ = assistant_message("  <think>x</think> hi ", False, "stop", 7)
    assert message == {"role": "assistant", "content": "  <think>x</think> hi ", "reasoning_content": None}


def test_other_families_decode_with_their_special_tokens():
    body: dict = {}
    keep_special_tokens(body, "qwen25", None)
    assert body == {}
    keep_special_tokens(body, "kimi_k2", None)
    assert body == {"skip_special_tokens": False}
    body = {"skip_special_tokens": True}
    keep_special_tokens(body, "gpt-oss", "gpt-oss")
    assert body == {"skip_special_tokens": True}  # the request's own choice stands


class ScriptedEngine:
    def __init__(self, renderer: ChatRenderer, reply: str) -> None:
        self.renderer, self.reply = renderer, reply

    async def generate(self, input_ids, sampling: SamplingParams) -> Completion:
        ids = self.renderer.encode(self.reply) + [self.renderer.eos_token_id]
        return Completion(ids, [-0.5] * len(ids), [1] * len(ids), "stop", self.renderer.eos_token_id)


async def test_the_chat_client_reads_the_family_it_is_given(tiny_model_dir):
    renderer = ChatRenderer(tiny_model_dir)
    reply = "<think>the key is x</think><tool_call>lookup\n<arg_key>key</arg_key>\n<arg_value>x</arg_value>\n</tool_call>"
    client = ChatClient(ScriptedEngine(renderer, reply), renderer, tool_call_parser="glm45", reasoning_parser="qwen3")
    r = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}], tools=TOOLS)
    message = r.choices[0].message
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [("lookup", {"key": "x"})]
    assert message.model_extra["reasoning_content"] == "the key is x" and r.choices[0].finish_reason == "tool_calls"
    with pytest.raises(ValueError, match="known: .*glm45"):
        ChatClient(ScriptedEngine(renderer, ""), renderer, tool_call_parser="glm4")


async def test_the_toolbox_never_runs_a_call_written_in_reasoning():
    ran = []

    def lookup(key: str) -> str:
        """Look up a key."""
        ran.append(key)
        return key.upper()

    box = ToolBox([lookup], reasoning_parser="qwen3")
    turn = await box.handle(f"<think>{CALL}</think>no call")
    assert ran == [] and turn.calls == [] and turn.reasoning == CALL and turn.content == "no call"
    assert "not run" in turn.messages[0]["content"]
    box.read_as("deepseekv31", "deepseek-r1")
    turn = await box.handle('hm</think>ok<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>lookup<｜tool▁sep｜>{"key": "y"}'
                            "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    assert ran == ["y"] and turn.messages[0]["content"] == "Y" and turn.reasoning == "hm"


def test_the_settings_are_config_keys_and_flags_with_todays_defaults():
    for cls, extra in ((ServeConfig, {"model": "m"}), (GatewayConfig, {}), (RolloutConfig, {})):
        default = from_dict(cls, extra)
        assert (default.tool_call_parser, default.reasoning_parser) == ("qwen25", None)
        chosen = from_dict(cls, {**extra, "tool_call_parser": "kimi_k2", "reasoning_parser": "kimi"})
        assert (chosen.tool_call_parser, chosen.reasoning_parser) == ("kimi_k2", "kimi")


def test_a_run_hands_its_parsers_to_the_workflow(tiny_model_dir):
    from agentrl.run.run_config import RunConfig, build_workflow

    cfg = from_dict(RunConfig, {"model": str(tiny_model_dir), "rollout": {
        "dataset": "x.jsonl", "workflow": "workflows.tool_agent:ToolAgentWorkflow", "workflow_args": {
            "env_id": "agentrl/ToolUse-v0"}, "tool_call_parser": "hermes", "reasoning_parser": "qwen3"}})
    wf = build_workflow(cfg, SamplingParams(max_new_tokens=8))
    assert (wf.tool_call_parser, wf.reasoning_parser) == ("hermes", "qwen3")
