"""ChatClient: the ``openai`` SDK's interface over any ``InferenceClient``, every token recorded.

What it is: the in-process ``agentrl.api.ChatAPI``. Agent code written for
``openai.AsyncOpenAI`` runs unchanged against it::

    client = ChatClient(engine, "examples/tiny-model")
    r = await client.chat.completions.create(model="m", messages=messages, tools=tools, max_tokens=64)
    r.choices[0].message.tool_calls            # the SDK's own ChatCompletion type
    client.set_last_reward(1.0)
    trajectories = client.export_trajectories(style="concat")

``chat.completions.create`` takes the SDK's arguments (``messages``, ``tools``, ``tool_choice``
"auto"/"none", ``temperature``, ``top_p``, ``max_tokens``/``max_completion_tokens``, ``stop``,
``seed``, ``logprobs``, ``stream``, and ``extra_body`` for ``top_k`` and the like) and returns a
``ChatCompletion`` (or, with ``stream=True``, an async iterator of ``ChatCompletionChunk``
sent once the completion is done). ``responses.create`` answers the Responses API's basic
shape (``agentrl.rollout.responses``). Tool calls are parsed from the model's text with
``agentrl.toolcalls``. Each call goes through ``TokenConversation``: the prompt is the tokens
already sampled plus the new messages' tokens, so exported trajectories hold exactly what
the model saw and sampled, with the per-token logprobs and policy versions the engine
returned (versions change mid-completion when a weight update interrupted it).

``complete(body)`` and ``respond(body)`` are the same two calls on OpenAI JSON (what the
gateway serves over HTTP). A bad request raises ``RequestRejected`` (status 400) naming the
field; a spent token budget raises ``RolloutError``; engine failures propagate.

What it is not: n > 1, ``top_logprobs``, ``tool_choice`` "required" or a named function,
structured output (``response_format`` other than text), images or audio — each refused
with a message that says so. Safe for concurrent calls in one event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from openai import NotGiven, Omit
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response

from agentrl.api import InferenceClient, Trajectory
from agentrl.errors import Refused, RequestRejected
from agentrl.inference.chat_format import (
    answer_chunks,
    assistant_message,
    chat_request,
    keep_special_tokens,
    plain_messages,
    sampling_fields,
    token_logprobs,
    usage,
)
from agentrl.inference.validation import Bounds, parse_sampling
from agentrl.inference.wire import check_type, output_text
from agentrl.rollout.conversation import ExportStyle, TokenConversation
from agentrl.rollout.renderer import ChatRenderer
from agentrl.rollout.responses import chat_body, response_from_chat, response_id
from agentrl.toolcalls import DEFAULT_TOOL_PARSER, check_parser_names, format_hint

log = logging.getLogger(__name__)

_NO_CONTEXT_LIMIT = 1 << 31


class ChatClient:
    """An ``openai.AsyncOpenAI`` look-alike over ``engine`` that records one episode; see the module docstring.

    ``tokenizer``: a model directory, tokenizer object or ``ChatRenderer``; ``model``: the name
    answers carry; ``context_length``: prompt + completion limit, a completion budget past it
    is cut to fit (None: the server's limit applies);
    ``default_max_tokens``: the completion budget when a call gives none; ``max_tokens``: the
    episode's token budget over all segments (None: unbounded); ``timeout_s``: per call;
    ``tool_call_parser``/``reasoning_parser``: the formats the answers are read in, by SGLang's
    names (``agentrl.toolcalls``; a call written in reasoning never becomes a ``tool_call``);
    ``policy_sampling``: drop a call's temperature, top-p/top-k/min-p, penalties and logit bias
    (``SHAPING``), so each token comes from the policy's own distribution (the gateway's default,
    ``GatewayConfig.agent_sampling``).
    """

    def __init__(self, engine: InferenceClient, tokenizer: str | Path | Any, *, model: str = "agentrl",
                 context_length: int | None = None, default_max_tokens: int = 1024, max_tokens: int | None = None,
                 timeout_s: float | None = 600.0, chat_template_kwargs: Mapping[str, Any] | None = None,
                 tool_call_parser: str = DEFAULT_TOOL_PARSER, reasoning_parser: str | None = None,
                 policy_sampling: bool = False) -> None:
        check_parser_names(tool_call_parser, reasoning_parser)
        self.policy_sampling = policy_sampling
        self.tool_call_parser, self.reasoning_parser = tool_call_parser, reasoning_parser
        self.engine = engine
        self.renderer = tokenizer if isinstance(tokenizer, ChatRenderer) else ChatRenderer(
            tokenizer, chat_template_kwargs=chat_template_kwargs)
        self.conversation = TokenConversation(self.renderer, max_tokens=max_tokens)
        self.model = model
        self.context_length = context_length
        self.default_max_tokens = default_max_tokens
        self.timeout_s = timeout_s
        self.unanswered = 0  # calls recorded, then taken back because their answer could not be built
        self.chat = _Chat(self)
        self.responses = _Responses(self)

    # ------------------------------------------------------------------ OpenAI JSON

    async def complete(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """One ``/v1/chat/completions`` request body -> the ``chat.completion`` JSON (never streamed)."""
        try:
            return await self._complete(dict(body))
        except Refused as e:
            raise RequestRejected(str(e), e.status) from None

    async def respond(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """One ``/v1/responses`` request body -> the ``response`` JSON."""
        try:
            answer = await self._complete(chat_body(dict(body)))
        except Refused as e:
            raise RequestRejected(str(e), e.status) from None
        try:
            self.conversation.alias(answer["id"], response_id(answer["id"]))  # rewards may name either id
            return response_from_chat(answer, body)
        except BaseException:
            self._take_back(answer["id"])
            raise

    def _hint_format(self, content: str) -> None:
        """Say once (per parser and format) when a reply holds another family's call markers:
        the tool parser does not match the model's chat template, and its calls are lost."""
        others = format_hint(content, self.tool_call_parser)
        key = (self.tool_call_parser, tuple(others))
        if others and key not in _said_formats:
            _said_formats.add(key)
            log.warning("a reply holds the tool-call markers of %s, but tool calls are read as %s: no call was "
                        "found in it; set the tool parser that matches the model's chat template "
                        "(agentrl gateway --tool-call-parser, a run's gateway.tool_call_parser); said once",
                        " or ".join(others), self.tool_call_parser)

    def _take_back(self, call_id: str) -> None:
        """A recorded call whose answer could not be built: out of the conversation (never trained
        on), and counted in ``unanswered`` (the gateway adds it to ``calls_abandoned``)."""
        if self.conversation.abandon(call_id):
            self.unanswered += 1

    async def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        messages, tools, use_tools = chat_request(body, server="agentrl's chat client")
        keep_special_tokens(body, self.tool_call_parser, self.reasoning_parser)
        _check_unsupported(body)
        try:
            text = await self.renderer.arender(plain_messages(messages), tools)
        except Refused:
            raise
        except Exception as e:  # the template's complaint (Jinja raises anything) is the request's fault: a 400
            raise Refused(f"the chat template could not render these messages: {type(e).__name__}: "
                          f"{str(e)[:200]}") from e
        prompt = await self.conversation.aprompt(text)
        sampling, skip_special, no_stop_trim = self._sampling(body, len(prompt.ids),
                                                              self.conversation.budget(prompt))
        async with asyncio.timeout(self.timeout_s):
            completion = await self.engine.generate(prompt.ids, sampling)
        call = self.conversation.record(prompt, completion)
        try:
            return self._answer(body, call.id, prompt.ids, completion, use_tools, tools, skip_special, no_stop_trim)
        except BaseException:  # no answer goes out: the call is not data
            self._take_back(call.id)
            raise

    def _answer(self, body: dict[str, Any], call_id: str, prompt_ids: list[int], completion: Any, use_tools: bool,
                tools: Any, skip_special: bool, no_stop_trim: bool) -> dict[str, Any]:
        """The ``chat.completion`` JSON of a recorded call."""
        content = output_text(lambda ids: self.renderer.decode(ids, skip_special_tokens=skip_special),
                              completion.tokens, completion.finish_reason, completion.matched_stop, no_stop_trim)
        message, finish, matched = assistant_message(
            content, use_tools, completion.finish_reason, completion.matched_stop,
            tool_parser=self.tool_call_parser, reasoning_parser=self.reasoning_parser, tools=tools)
        if use_tools and not message.get("tool_calls"):
            self._hint_format(content)
        choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish,
                                  "matched_stop": matched}
        if body.get("logprobs"):
            decode_one = self.renderer.decode
            choice["logprobs"] = token_logprobs(lambda t: decode_one([t]), completion.tokens, completion.logprobs)
        if body.get("return_token_ids"):
            choice["prompt_token_ids"], choice["response_token_ids"] = list(prompt_ids), list(completion.tokens)
        return {"id": call_id, "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model") or self.model, "choices": [choice],
                "usage": usage(len(prompt_ids), len(completion.tokens)),
                "metadata": {"weight_version": str(completion.versions[-1]) if completion.versions else None}}

    def _sampling(self, body: dict[str, Any], prompt_len: int, budget: int | None):
        fields = sampling_fields(body, self.default_max_tokens)
        if self.policy_sampling:
            asked = {k: fields.pop(k) for k in SHAPING if k in fields}
            if any(asked[k] != v for k, v in SHAPING.items() if k in asked) and not _said["policy_sampling"]:
                _said["policy_sampling"] = True
                log.warning("an agent asked for %s; the gateway samples the policy's own distribution "
                            "(temperature 1, no filters), as the trainer recomputes it (gateway.agent_sampling: "
                            "policy); said once", asked)
        room = None if self.context_length is None else self.context_length - prompt_len
        if room is not None and room > 0 and isinstance(fields["max_new_tokens"], int) \
                and not isinstance(fields["max_new_tokens"], bool) and fields["max_new_tokens"] > room:
            fields["max_new_tokens"] = room  # cut to fit the context; a prompt that does not fit is refused
        parsed = parse_sampling(fields, prompt_len=prompt_len,
                                bounds=Bounds(context_length=self.context_length or _NO_CONTEXT_LIMIT))
        sampling = parsed["sampling"]
        if budget is not None and sampling.max_new_tokens > budget:
            sampling.max_new_tokens = budget
        return sampling, parsed["skip_special_tokens"], parsed["no_stop_trim"]

    # ------------------------------------------------------------------ rewards and export

    def set_reward(self, completion_id: str, reward: float) -> None:
        """The reward of one call, by the ``id`` of its answer."""
        self.conversation.set_reward(completion_id, reward)

    def set_last_reward(self, reward: float) -> None:
        """The reward of the latest call."""
        self.conversation.set_last_reward(reward)

    def apply_reward_discount(self, gamma: float = 1.0) -> None:
        """R_i = r_i + γ·R_{i+1}, backwards over the calls in the order they were made."""
        self.conversation.apply_reward_discount(gamma)

    def export_trajectories(self, style: ExportStyle = "concat") -> list[Trajectory]:
        """One trajectory per segment (``concat``) or per call (``individual``)."""
        return self.conversation.export(style)


# --------------------------------------------------------------------------- the SDK's surface


class _Completions:
    def __init__(self, client: ChatClient) -> None:
        self._client = client

    async def create(self, **kwargs: Any) -> ChatCompletion | _ChunkStream:
        body = _request_body(kwargs)
        answer = await self._client.complete(body)
        if body.get("stream"):
            options = body.get("stream_options") or {}
            return _ChunkStream(answer_chunks(answer, include_usage=bool(options.get("include_usage"))))
        return ChatCompletion.model_validate(answer)


class _Chat:
    def __init__(self, client: ChatClient) -> None:
        self.completions = _Completions(client)


class _Responses:
    def __init__(self, client: ChatClient) -> None:
        self._client = client

    async def create(self, **kwargs: Any) -> Response:
        return Response.model_validate(await self._client.respond(_request_body(kwargs)))


class _ChunkStream:
    """What ``create(stream=True)`` returns: an async iterator of chunks (also an async context manager)."""

    def __init__(self, chunks: list[dict[str, Any]]) -> None:
        self._chunks = chunks

    async def __aiter__(self) -> AsyncIterator[ChatCompletionChunk]:
        for c in self._chunks:
            yield ChatCompletionChunk.model_validate(c)

    async def __aenter__(self) -> _ChunkStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def close(self) -> None:
        return None


SHAPING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0,
           "presence_penalty": 0.0, "repetition_penalty": 1.0, "logit_bias": {}}
"""The sampling settings that reshape the distribution a token is drawn from, and their neutral
values: with ``policy_sampling`` an agent's are dropped, so every token is drawn from the
policy's own distribution (the one the trainer recomputes at temperature 1)."""
_said = {"policy_sampling": False}
_said_formats: set[tuple[str, tuple[str, ...]]] = set()


def _request_body(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The JSON body the SDK would send for these keyword arguments."""
    extra = kwargs.pop("extra_body", None) or {}
    for transport_only in ("extra_headers", "extra_query", "timeout"):
        kwargs.pop(transport_only, None)
    body = {k: _jsonable(v) for k, v in kwargs.items() if not isinstance(v, (NotGiven, Omit))}
    body.update(extra)
    return body


def _jsonable(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", exclude_unset=True)
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items() if not isinstance(v, (NotGiven, Omit))}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _check_unsupported(body: dict[str, Any]) -> None:
    for name, kinds, what in (("stream", (bool,), "true or false"), ("logprobs", (bool,), "true or false"),
                              ("n", (int,), "1"), ("top_logprobs", (int,), "0")):
        if body.get(name) is not None:
            check_type(name, body[name], kinds, what)
    if body.get("n") not in (None, 1):
        raise Refused(f"n={body['n']} is not supported by agentrl's chat client; make n calls instead")
    if body.get("top_logprobs"):
        raise Refused("top_logprobs is not supported by agentrl's chat client: the engine returns the "
                         "sampled token's logprob only (use logprobs=true)")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise Refused("response_format other than {\"type\": \"text\"} (structured output) is not supported "
                         "by agentrl's chat client")
