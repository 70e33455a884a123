"""Tool calling through the unmodified ``openai`` SDK, end to end on a real model.

The committed demo model calls the calculator in the right format but with an expression of
its own making (its build_info: ``tool_call_rate`` 1.0, ``tool_expression_rate`` 0.0), so this
test starts from it and fine-tunes a few seconds on one two-turn calculator trace (call, then
answer after the tool result) and one reply with reasoning to know exactly what the model should say. The server renders
the SDK's request with the tokenizer's chat template, the model generates the call, and the
server parses it into ``tool_calls`` — if the template, the generation or the parser
disagree, the test fails.
"""

from __future__ import annotations

import json
import shutil

import openai
import pytest

from agentrl.model.tokenizer import END, tool_call_text

QUESTION = "What is 90+85+80?"
CALL = {"expression": "90+85+80"}
THINK_QUESTION, REASONING, ANSWER = "Think first: what is 1+2+3?", "one and two make three, and three", "\\boxed{6}"


@pytest.fixture(scope="module")
def tool_model_dir(tiny_model_dir, tmp_path_factory):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.model.arith_data import CALCULATOR_TOOL

    out = tmp_path_factory.mktemp("tool-model")
    shutil.copytree(tiny_model_dir, out, dirs_exist_ok=True)
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    torch.manual_seed(0)
    turn1 = [{"role": "user", "content": QUESTION}]
    call = {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": CALL}}]}
    turn2 = [*turn1, call, {"role": "tool", "content": "255"}]
    rows = []
    for history, reply in ((turn1, tool_call_text("calculator", CALL)), (turn2, "\\boxed{255}")):
        prompt = tok.apply_chat_template(history, tools=[CALCULATOR_TOOL], add_generation_prompt=True, tokenize=False)
        p, r = tok.encode(prompt, add_special_tokens=False), tok.encode(reply + END, add_special_tokens=False)
        rows.append((p, r))
    think = tok.apply_chat_template([{"role": "user", "content": THINK_QUESTION}], add_generation_prompt=True,
                                    tokenize=False)  # a reply with reasoning: the tiny model never writes <think>
    rows.append((tok.encode(think, add_special_tokens=False),
                 tok.encode(f"<think>{REASONING}</think>{ANSWER}{END}", add_special_tokens=False)))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(150):
        loss = 0.0
        for p, r in rows:
            ids = torch.tensor([p + r])
            labels = torch.tensor([[-100] * len(p) + r])
            loss = loss + model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 1e-2:
            break
    assert loss.item() < 3e-2, f"could not memorize the trace (loss {loss.item():.3f})"
    model.save_pretrained(str(out))
    return out


def test_tool_calls_come_back_as_openai_tool_calls(tool_model_dir, serve_factory):
    from agentrl.model.arith_data import CALCULATOR_TOOL

    proc = serve_factory(tool_model_dir)
    with openai.OpenAI(base_url=proc.url + "/v1", api_key="unused", timeout=60, max_retries=0) as client:
        messages = [{"role": "user", "content": QUESTION}]
        out = client.chat.completions.create(model="tiny", messages=messages, tools=[CALCULATOR_TOOL],
                                             temperature=0, max_tokens=96, logprobs=True)
        choice = out.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.function.name == "calculator" and call.id.startswith("call_")
        assert json.loads(call.function.arguments) == CALL
        assert choice.message.content == ""  # the call text is not left in the content
        assert len(choice.logprobs.content) == out.usage.completion_tokens  # every token, incl. the call

        # Second turn: the tool's answer goes back (the SDK's message as-is); the model answers.
        messages += [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "255"}]
        final = client.chat.completions.create(model="tiny", messages=messages, tools=[CALCULATOR_TOOL],
                                               temperature=0, max_tokens=32).choices[0]
        assert final.finish_reason == "stop" and not final.message.tool_calls
        assert final.message.content == "\\boxed{255}"

        # Streaming delivers the same call, as one delta at the end.
        chunks = list(client.chat.completions.create(model="tiny", messages=messages[:1], tools=[CALCULATOR_TOOL],
                                                     temperature=0, max_tokens=96, stream=True))
        streamed = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
        assert [json.loads(tc.function.arguments) for tc in streamed] == [CALL]
        assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_the_parser_flags_read_the_answer(tool_model_dir, serve_factory):
    # --tool-call-parser/--reasoning-parser (issue 28): the same call read by the hermes parser with a
    # qwen3 reasoning parser; the model writes no <think>, so reasoning_content is null, not its call
    from agentrl.model.arith_data import CALCULATOR_TOOL

    proc = serve_factory(tool_model_dir, "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3")
    with openai.OpenAI(base_url=proc.url + "/v1", api_key="unused", timeout=60, max_retries=0) as client:
        messages = [{"role": "user", "content": QUESTION}]
        choice = client.chat.completions.create(model="tiny", messages=messages, tools=[CALCULATOR_TOOL],
                                                temperature=0, max_tokens=96).choices[0]
        assert choice.finish_reason == "tool_calls"
        assert [json.loads(c.function.arguments) for c in choice.message.tool_calls] == [CALL]
        assert choice.message.content == "" and choice.message.model_extra["reasoning_content"] is None
        chunks = list(client.chat.completions.create(model="tiny", messages=messages, tools=[CALCULATOR_TOOL],
                                                     temperature=0, max_tokens=96, stream=True))
        streamed = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
        assert [json.loads(tc.function.arguments) for tc in streamed] == [CALL]


def test_reasoning_comes_back_as_reasoning_content_whole_and_streamed(tool_model_dir, serve_factory):
    proc = serve_factory(tool_model_dir, "--reasoning-parser", "qwen3")
    with openai.OpenAI(base_url=proc.url + "/v1", api_key="unused", timeout=60, max_retries=0) as client:
        messages = [{"role": "user", "content": THINK_QUESTION}]
        choice = client.chat.completions.create(model="tiny", messages=messages, temperature=0,
                                                max_tokens=64).choices[0]
        assert choice.finish_reason == "stop"
        assert choice.message.model_extra["reasoning_content"] == REASONING and choice.message.content == ANSWER
        chunks = list(client.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=64,
                                                     stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == REASONING
        assert "".join(d.content or "" for d in deltas) == ANSWER  # its last character too
        assert chunks[-1].choices[0].finish_reason == "stop"
    # without a reasoning parser the same reply is all content, as before
    plain = serve_factory(tool_model_dir)
    with openai.OpenAI(base_url=plain.url + "/v1", api_key="unused", timeout=60, max_retries=0) as client:
        message = client.chat.completions.create(model="tiny", messages=messages, temperature=0,
                                                 max_tokens=64).choices[0].message
        assert message.content == f"<think>{REASONING}</think>{ANSWER}"
