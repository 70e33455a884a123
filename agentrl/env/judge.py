"""LLM-as-judge: a reward term that asks an OpenAI-compatible model to grade a reply by a rubric.

What it is: ``LLMJudge``, an async reward function for a ``Rubric`` term. It fills a rubric
prompt with the task and the reply, sends it to ``POST {base_url}/chat/completions`` (any URL
and key: a hosted model, the run's own ``agentrl serve``, or a second one), reads the grade from
the answer (the number it ends with — ``7``, ``Score: 7``, ``7/10``, ``\\boxed{7}`` — or the one
after ``score_pattern``; an answer that ends in words, "retry in 30 seconds", holds no grade)
and returns it divided by ``max_score``, clipped to [0, 1]. One HTTP client per event loop serves
every grade (its connections kept alive; ``aclose()`` ends it). Each request has a timeout on its
whole exchange (a judge that sends a byte a second is cut off); failed requests (connection errors,
timeouts, 5xx, 429) are retried with backoff; grades are cached by prompt (an LRU of
``cache_size``), so a group of equal replies is graded once. A judge that cannot be reached, or
whose answer holds no grade, raises ``VerifierError``: the episode is recorded as failed (data),
never scored 0 by guess.

What it is not: a verifier of facts (use the env's own checks where an answer can be checked),
nor a pairwise or reference-free preference model.

Main hook::

    judge = LLMJudge("http://127.0.0.1:30000/v1", model="judge",
                     prompt="Question: {question}\\nAnswer: {response}\\nGrade 0-10. Score:", max_score=10)
    rubric = Rubric([Reward("correct", fact("correct")), Reward("judge", judge, 0.5)])
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import re
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from agentrl.config import option
from agentrl.env.rewards import RewardInput
from agentrl.errors import VerifierError

_NUMBER = r"-?\d+(?:\.\d+)?"
_FINAL_GRADE = re.compile("(" + _NUMBER + r")(?:\s*/\s*\d+(?:\.\d+)?)?[\s.*}\])]*$")
"""The number an answer ends with (a "/10" and closing marks after it allowed): the default grade."""


@dataclass
class JudgeConfig:
    """How the judge is asked (every field can come from YAML)."""

    base_url: str = option("", help="the judge's OpenAI-compatible base URL (…/v1)")
    model: str = option("default", help="the model name sent to the judge")
    prompt: str = option("Question: {question}\nResponse: {response}\nGrade the response from 0 to 10.\nScore:",
                         help="rubric prompt; {question}, {answer}, {response} and the task's keys are filled in")
    api_key: str = option("none", help="the judge's API key")
    max_score: float = option(10.0, gt=0, help="the grade that means a reward of 1")
    score_pattern: str = option("", help="text before the grade (e.g. 'Score:'); empty: the number the answer "
                                         "ends with (an answer ending in words holds no grade)")
    max_tokens: int = option(32, ge=1, help="tokens of the judge's answer")
    timeout_s: float = option(60.0, gt=0, help="seconds for one request, the whole exchange")
    retries: int = option(2, ge=0, help="retries of a request that failed (connection, timeout, 5xx, 429)")
    backoff_s: float = option(0.5, ge=0, help="first wait between retries (doubled each time)")
    cache_size: int = option(4096, ge=0, help="grades kept by prompt (0: no cache)")


class LLMJudge:
    """An async reward function grading ``RewardInput`` by an LLM; see the module docstring.

    Args: the fields of ``JudgeConfig`` by keyword (``base_url`` first), and ``transport``: an
    ``httpx.AsyncBaseTransport`` (tests, proxies).
    """

    def __init__(self, base_url: str, *, transport: httpx.AsyncBaseTransport | None = None, **fields: Any) -> None:
        self.config = JudgeConfig(base_url=base_url, **fields)
        if not base_url.startswith(("http://", "https://")):
            raise VerifierError(f"the judge's base_url must be an http(s) URL (…/v1), got {base_url!r}")
        self.transport = transport
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = \
            weakref.WeakKeyDictionary()  # rewards may be computed on more than one loop (env threads)
        self.cache: collections.OrderedDict[str, float] = collections.OrderedDict()
        self.requests = 0  # requests sent (a measure of the cache)
        self.__name__ = "llm_judge"

    async def __call__(self, inp: RewardInput) -> float:
        prompt = self.render(inp)
        key = hashlib.sha256(prompt.encode()).hexdigest()
        if key in self.cache:
            self.cache.move_to_end(key)
            return self.cache[key]
        answer = await self._ask(prompt)
        score = self.parse(answer)
        if self.config.cache_size:
            self.cache[key] = score
            while len(self.cache) > self.config.cache_size:
                self.cache.popitem(last=False)
        return score

    def render(self, inp: RewardInput) -> str:
        values: dict[str, Any] = {k: v for k, v in inp.task.items() if isinstance(k, str)}
        values.setdefault("question", inp.task.get("question", ""))
        values.setdefault("answer", inp.task.get("answer", ""))
        values["response"] = inp.response
        try:
            return self.config.prompt.format_map(_Missing(values))
        except (ValueError, IndexError) as e:
            raise VerifierError(f"the judge's prompt is not a format string: {e}") from e

    def parse(self, answer: str) -> float:
        """The grade in ``answer`` as a reward in [0, 1]; a ``VerifierError`` when there is none."""
        if self.config.score_pattern:
            pattern = re.escape(self.config.score_pattern) + r"\s*(" + _NUMBER + ")"
            found = re.findall(pattern, answer)
        else:
            pattern, end = "the number the answer ends with", _FINAL_GRADE.search(answer)
            found = [end.group(1)] if end else []
        if not found:
            raise VerifierError(f"the judge's answer holds no grade ({pattern}): {answer[:200]!r}; ask for the grade "
                                "last in the prompt, or set score_pattern")
        return min(1.0, max(0.0, float(found[-1]) / self.config.max_score))

    async def aclose(self) -> None:
        """Close the HTTP client of the running event loop (the judge opens a new one if asked again)."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None or client.is_closed:
            client = self._clients[loop] = httpx.AsyncClient(
                timeout=self.config.timeout_s, transport=self.transport,
                headers={"Authorization": f"Bearer {self.config.api_key}"})
        return client

    async def _ask(self, prompt: str) -> str:
        cfg = self.config
        body = {"model": cfg.model, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": cfg.max_tokens, "temperature": 0.0}
        url = cfg.base_url.rstrip("/") + "/chat/completions"
        client = self._client()
        last = ""
        for attempt in range(cfg.retries + 1):
            if attempt:
                await asyncio.sleep(cfg.backoff_s * 2 ** (attempt - 1))
            self.requests += 1
            try:
                async with asyncio.timeout(cfg.timeout_s):  # httpx's timeout is per read: a drip never trips it
                    r = await client.post(url, json=body)
            except (httpx.HTTPError, TimeoutError) as e:  # connection refused, timeout: safe to retry
                last = f"{type(e).__name__}: {e}" if str(e) else f"no answer within {cfg.timeout_s:g} s"
                continue
            if r.status_code == 429 or r.status_code >= 500:
                last = f"HTTP {r.status_code}: {r.text[:200]}"
                continue
            if r.status_code != 200:
                raise VerifierError(f"the judge at {url} refused the request: HTTP {r.status_code}: {r.text[:300]}")
            try:
                return r.json()["choices"][0]["message"]["content"] or ""
            except (KeyError, IndexError, TypeError, ValueError) as e:
                raise VerifierError(f"the judge at {url} answered no chat completion: {r.text[:300]}") from e
        raise VerifierError(f"the judge at {url} failed {cfg.retries + 1} times; last: {last}")


class _Missing(dict):
    """Format values where an unknown ``{key}`` stays as written."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def judge_from(config: Mapping[str, Any]) -> LLMJudge:
    """An ``LLMJudge`` from a mapping of ``JudgeConfig``'s fields (an env's ``judge`` argument)."""
    fields = dict(config)
    base_url = fields.pop("base_url", "")
    return LLMJudge(base_url, **fields)
