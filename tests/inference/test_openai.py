"""The unmodified ``openai`` SDK against a real ``agentrl serve``: chat (with tools), completions, models."""

from __future__ import annotations

import openai
import pytest


@pytest.fixture
def sdk(server):
    with openai.OpenAI(base_url=server + "/v1", api_key="unused", timeout=60, max_retries=0) as client:
        yield client


def test_models_lists_the_served_model(sdk, untrained_model_dir):
    models = sdk.models.list().data
    assert [m.id for m in models] == [str(untrained_model_dir)]
    assert sdk.models.retrieve(str(untrained_model_dir)).id == str(untrained_model_dir)


def test_chat_completion_shape_logprobs_and_n(sdk, tokenizer):
    messages = [{"role": "user", "content": "What is 2+3?"}]
    out = sdk.chat.completions.create(model="m", messages=messages, max_tokens=8, temperature=0, logprobs=True,
                                      top_logprobs=2, n=2, extra_body={"ignore_eos": True, "return_token_ids": True})
    assert len(out.choices) == 2 and out.usage.completion_tokens == 16
    first = out.choices[0]
    assert first.finish_reason == "length" and first.message.role == "assistant"
    assert isinstance(first.message.content, str)
    # greedy samples from a point mass: logprob 0, and it is the only token with any probability
    assert len(first.logprobs.content) == 8 and all(len(t.top_logprobs) == 1 for t in first.logprobs.content)
    assert all(t.logprob == 0.0 for t in first.logprobs.content)
    ids = first.model_extra["response_token_ids"]
    assert first.message.content == tokenizer.decode(ids, skip_special_tokens=True)
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert first.model_extra["prompt_token_ids"] == tokenizer.encode(prompt, add_special_tokens=False)
    assert out.choices[1].message.content == first.message.content  # greedy twice
    assert out.to_dict()["metadata"]["weight_version"] == "default"


def test_chat_top_logprobs_when_sampling(sdk):
    out = sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=6,
                                      temperature=1.0, seed=5, logprobs=True, top_logprobs=3,
                                      extra_body={"ignore_eos": True})
    for t in out.choices[0].logprobs.content:
        tops = [x.logprob for x in t.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and t.logprob <= tops[0] < 0


def test_streamed_chat_equals_the_non_streamed_one(sdk):
    kw = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 12, "temperature": 0,
          "extra_body": {"ignore_eos": True}}
    whole = sdk.chat.completions.create(**kw).choices[0].message.content
    chunks = list(sdk.chat.completions.create(stream=True, **kw))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole
    assert chunks[-1].choices[0].finish_reason == "length"


def test_text_completion_with_logprobs(sdk):
    out = sdk.completions.create(model="m", prompt="abc", max_tokens=5, temperature=1.0, logprobs=1, seed=4,
                                 extra_body={"ignore_eos": True})
    choice = out.choices[0]
    assert choice.finish_reason == "length" and len(choice.logprobs.token_logprobs) == 5
    assert all(lp <= 0 for lp in choice.logprobs.token_logprobs)
    again = sdk.completions.create(model="m", prompt="abc", max_tokens=5, temperature=1.0, seed=4,
                                   extra_body={"ignore_eos": True})
    assert again.choices[0].text == choice.text


def test_bad_request_surfaces_as_the_sdk_error(sdk):
    with pytest.raises(openai.BadRequestError, match="max_new_tokens must be an integer >= 0"):
        sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=-1)
