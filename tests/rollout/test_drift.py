"""check_token_drift on three tokenizers, and the ChatClient where drift happens.

The bug stories (SkyRL #123, verl #6719, prime-rl #947/#1334): a multi-turn conversation is
re-rendered and re-tokenized for training, and the tokens differ from what was sampled —
BPE merges across the boundary of sampled and template text, or a Qwen3-style template
drops earlier <think> blocks. The ChatClient must keep what was sampled, and split
segments where the template rewrites history. The engine here is scripted (it answers
given token ids), the one fake of these unit tests; the tokenizers are real.
"""

from __future__ import annotations

import pytest

from agentrl.api import Completion
from agentrl.model.arith_data import CALCULATOR_TOOL
from agentrl.rollout.chat_client import ChatClient
from agentrl.rollout.drift import check_token_drift
from agentrl.rollout.renderer import ChatRenderer, load_tokenizer

CALL = {"id": "call_1", "type": "function",
        "function": {"name": "calculator", "arguments": '{"expression": "12+30+5"}'}}
TOOL_CONVERSATION = [
    {"role": "user", "content": "What is 12+30+5?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "47"},
    {"role": "assistant", "content": "\\boxed{47}"},
    {"role": "user", "content": "And 1+1?"},
]

# A Qwen3-style template: assistant turns before the last user message lose their <think> block.
DROP_THINK = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'assistant' -%}"
    "{%- set c = m['content'] or '' -%}"
    "{%- if loop.index0 < ns.last_user and '</think>' in c -%}{%- set c = c.split('</think>')[-1] -%}{%- endif -%}"
    "<|assistant|>{{ c }}<|end|>"
    "{%- else -%}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)
THINKING = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "<think>two and two</think>\\boxed{4}"},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "<think>three and three</think>\\boxed{6}"},
    {"role": "user", "content": "Thanks."},
]


class ScriptedEngine:
    """Answers each generate() with the next given list of token ids."""

    def __init__(self, replies: list[list[int]]) -> None:
        self.replies, self.prompts = list(replies), []

    async def generate(self, input_ids, sampling) -> Completion:
        self.prompts.append(list(input_ids))
        ids = self.replies.pop(0)
        return Completion(ids, [-1.0] * len(ids), [0] * len(ids), "stop")


@pytest.fixture(scope="module")
def bpe_tokenizer():
    """A byte-level BPE trained here (no hub) on chat-shaped text, whose merges cross the line
    between the generation prompt and the reply: 'Assistant:' + ' The' re-tokenizes as 'Assistant: The'."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    core.train_from_iterator(["User: What is 12+30?\nAssistant: The answer is 42.</s>\nUser: thanks\n"] * 50, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="</s>")
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'user' %}User: {{ m['content'] }}\n"
                         "{% else %}Assistant:{{ m['content'] }}</s>\n{% endif %}{% endfor %}"
                         "{% if add_generation_prompt %}Assistant:{% endif %}")
    return tok


def test_the_tiny_byte_tokenizer_has_no_drift(tiny_model_dir):
    report = check_token_drift(tiny_model_dir, TOOL_CONVERSATION, [CALCULATOR_TOOL])
    assert report.equal and report.first_difference is None and report.breaks == [] and report.segments == 1
    assert report.incremental_ids == report.full_ids and str(report).startswith("no drift")


def test_a_bpe_tokenizer_drifts_where_sampled_text_meets_the_template(bpe_tokenizer):
    messages = [{"role": "user", "content": "What is 12+30?"}, {"role": "assistant", "content": " The answer is 42."},
                {"role": "user", "content": "thanks"}]
    report = check_token_drift(bpe_tokenizer, messages)
    d = report.first_difference
    assert not report.equal and d is not None and report.breaks == []  # the text extends; the tokens do not
    assert report.incremental_ids[:d] == report.full_ids[:d] and report.incremental_ids[d] != report.full_ids[d]
    renderer = ChatRenderer(bpe_tokenizer)
    assert renderer.decode(report.incremental_ids) == renderer.decode(report.full_ids)  # same text
    assert renderer.decode(report.full_ids[d:d + 1]).startswith("t:")  # 'Assistan|t: ' merged across the line
    assert "drift at token" in str(report)


async def test_the_chat_client_keeps_the_bpe_tokens_as_sampled(bpe_tokenizer):
    renderer = ChatRenderer(bpe_tokenizer)
    sampled = renderer.encode(" The answer is 42.") + [renderer.eos_token_id]
    client = ChatClient(ScriptedEngine([sampled, renderer.encode(" ok") + [renderer.eos_token_id]]), renderer)
    messages = [{"role": "user", "content": "What is 12+30?"}]
    r = await client.chat.completions.create(model="m", messages=messages)
    messages += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "thanks"}]
    await client.chat.completions.create(model="m", messages=messages)
    [t] = client.export_trajectories()
    report = check_token_drift(renderer, messages, completions=[sampled])
    assert t.input_ids[: len(report.incremental_ids)] == report.incremental_ids  # what was sampled, then new text
    assert t.input_ids[: len(report.full_ids)] != report.full_ids  # not the re-tokenization


def test_a_template_that_drops_earlier_reasoning_breaks_the_conversation(tiny_model_dir):
    import copy

    tok = copy.deepcopy(load_tokenizer(tiny_model_dir))
    tok.chat_template = DROP_THINK
    report = check_token_drift(tok, THINKING)
    assert report.breaks == [3, 5] and report.segments == 3 and not report.equal
    d = report.first_difference
    renderer = ChatRenderer(tok)
    assert renderer.decode(report.incremental_ids[d:]).startswith("<think>")  # kept as sampled, dropped in full


async def test_the_chat_client_splits_segments_where_reasoning_is_dropped(tiny_model_dir):
    import copy

    tok = copy.deepcopy(load_tokenizer(tiny_model_dir))
    tok.chat_template = DROP_THINK
    renderer = ChatRenderer(tok)
    replies = [renderer.encode(m["content"]) + [renderer.eos_token_id] for m in THINKING if m["role"] == "assistant"]
    engine = ScriptedEngine([list(r) for r in replies])
    client = ChatClient(engine, renderer)
    for i in (1, 3):
        r = await client.chat.completions.create(model="m", messages=THINKING[:i])
        assert r.choices[0].message.content == THINKING[i]["content"]
    trajectories = client.export_trajectories()
    assert len(trajectories) == 2 and all(t.metrics["segments_per_episode"] == 2 for t in trajectories)
    for t, reply, prompt in zip(trajectories, replies, engine.prompts, strict=True):
        assert t.input_ids == prompt + reply and t.loss_mask == [0] * len(prompt) + [1] * len(reply)
    second_prompt = renderer.decode(engine.prompts[1])
    assert "two and two" not in second_prompt and second_prompt == renderer.render(THINKING[:3])
