"""The gateway over real HTTP: ``agentrl gateway`` in front of a real ``agentrl serve`` on the
trained tiny model, driven by the unmodified ``openai`` SDK and the OpenAI Agents SDK.

The bug stories: token ids lost or wrong in capture (agent-lightning #44, #74, #326),
conversations leaking between episodes (AReaL #432), and a gateway that dies or drops data
on bad input, idle agents or a dead upstream.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from agentrl.api import TrajectoryStatus, sampled_spans
from agentrl.client.remote_engine import RemoteEngine
from agentrl.client.transport import KeepAliveTransport
from agentrl.model.arith_data import CALCULATOR_TOOL, calculate
from agentrl.process.services import ServerProcess, ServiceProcess, background_server, free_port
from agentrl.rollout.gateway import Gateway
from agentrl.rollout.gateway_config import GatewayConfig
from agentrl.rollout.gateway_routes import AnswerStream, build_app
from agentrl.rollout.renderer import ChatRenderer
from agentrl.toolcalls import parse_tool_calls

from ..serving import abandon_call, until_generating

ADMIN = "admin-key-for-tests"
READY = "agentrl gateway: ready on "
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def gateway(tiny_server, tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("gateway-out")
    cmd = [os.path.join(os.path.dirname(sys.executable), "agentrl"), "gateway", "--model", str(tiny_model_dir),
           "--upstream", tiny_server.url, "--port", "0", "--api-key", ADMIN, "--out", str(out),
           "--max-body-bytes", "65536", "--max-session-tokens", "3000", "--served-model-name", "tiny",
           "--agent-sampling", "agent"]  # the agents' own settings reach the engine (the default's test is below)
    with ServiceProcess(cmd, ready=READY) as proc:
        proc.out = out
        yield proc


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    return ChatRenderer(tiny_model_dir)


def admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN}"}


def open_session(url: str, metadata: dict | None = None) -> dict:
    r = httpx.post(f"{url}/v1/sessions", headers=admin(), json={"metadata": metadata or {}})
    assert r.status_code == 200, r.text
    return r.json()


def end_session(url: str, session: dict, **body) -> dict:
    r = httpx.post(f"{url}/v1/sessions/{session['session_id']}/end",
                   headers={"Authorization": f"Bearer {session['api_key']}"}, json={"return_trajectories": True, **body})
    assert r.status_code == 200, r.text
    return r.json()


def streamed(stream) -> dict:
    """What a streaming client assembles from the chunks: id, content, tool calls, finish, usage."""
    out: dict = {"content": "", "tool_calls": {}, "finish": None, "usage": None}
    for chunk in stream:
        out["id"] = chunk.id
        out["usage"] = chunk.usage or out["usage"]
        for choice in chunk.choices:
            out["content"] += choice.delta.content or ""
            for tc in choice.delta.tool_calls or []:
                slot = out["tool_calls"].setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
                slot["name"] += tc.function.name or ""
                slot["arguments"] += tc.function.arguments or ""
            out["finish"] = choice.finish_reason or out["finish"]
    return out


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_openai_sdk_tool_conversation_is_recorded_exactly(stream, gateway, tiny_server, renderer):
    """Three calls with the calculator through the unmodified SDK. Then: the recorded ids decode
    to what the SDK received, the loss mask covers exactly the sampled tokens, and /generate
    on the upstream, given the recorded prompt and seed, samples the same ids, logprobs, versions."""
    session = open_session(gateway.url)
    client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
    messages: list = [{"role": "user", "content": "What is 12+30+5?"}]
    received, settings = [], {"temperature": 0.7, "max_tokens": 100}
    for turn in range(3):
        seed = 1000 + turn
        if stream:
            got = streamed(client.chat.completions.create(model="tiny", messages=messages, tools=[CALCULATOR_TOOL],
                                                          seed=seed, stream=True, stream_options={"include_usage": True},
                                                          **settings))
            calls = [(c["id"], c["name"], c["arguments"]) for _, c in sorted(got["tool_calls"].items())]
            content, usage = got["content"], got["usage"].completion_tokens
        else:
            r = client.chat.completions.create(model="tiny", messages=messages, tools=[CALCULATOR_TOOL], seed=seed,
                                               **settings)
            message = r.choices[0].message
            calls = [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []]
            content, usage = message.content or "", r.usage.completion_tokens
        received.append((content, calls, usage, seed))
        messages.append({"role": "assistant", "content": content, "tool_calls": [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in calls]}
            if calls else {"role": "assistant", "content": content})
        for call_id, _, arguments in calls:
            try:
                result = calculate(json.loads(arguments)["expression"])
            except (ValueError, KeyError, TypeError) as e:
                result = f"error: {e}"
            messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
        if not calls:
            messages.append({"role": "user", "content": "Check it with the calculator."})
    assert any(calls for _, calls, _, _ in received), received  # a tool-using conversation

    ended = end_session(gateway.url, session, style="individual")
    per_call = ended["trajectories"]
    assert len(per_call) == 3
    with httpx.Client(timeout=60) as http:
        for t, (content, calls, usage, seed) in zip(per_call, received, strict=True):
            [(start, end)] = sampled_spans(t["loss_mask"])
            assert end == len(t["input_ids"]) and end - start == usage
            prompt, sampled = t["input_ids"][:start], t["input_ids"][start:end]
            text = renderer.decode(sampled, skip_special_tokens=True)
            parsed = parse_tool_calls(text)
            if calls:
                assert [(c.name, c.arguments) for c in parsed.calls] == [(n, json.loads(a)) for _, n, a in calls]
                assert parsed.content == content
            else:
                assert text == content
            g = http.post(f"{tiny_server.url}/generate", json={
                "input_ids": prompt, "return_logprob": True,
                "sampling_params": {"temperature": 0.7, "max_new_tokens": 100, "sampling_seed": seed}}).json()
            meta = g["meta_info"]
            assert g["output_ids"] == sampled
            assert t["logprobs"][start:] == pytest.approx([x[0] for x in meta["output_token_logprobs"]], abs=1e-5)
            assert set(t["versions"][start:]) == {int(meta["weight_version"])} == {0}


def test_the_openai_agents_sdk_plays_an_episode_through_the_gateway(gateway, renderer):
    """The Agents SDK, unmodified, with a function tool and its default Responses API model."""
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)

    @function_tool
    def calculator(expression: str) -> str:
        """Evaluate an integer arithmetic expression."""
        return calculate(expression)

    async def play(session: dict):
        client = openai.AsyncOpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
        agent = Agent(name="calc", tools=[calculator], model=OpenAIResponsesModel(model="tiny", openai_client=client),
                      model_settings=ModelSettings(temperature=0.0, max_tokens=100))
        return await Runner.run(agent, "What is 12+30+5?", max_turns=4)

    session = open_session(gateway.url, {"agent": "openai-agents"})
    result = asyncio.run(play(session))
    r = httpx.post(f"{gateway.url}/v1/sessions/{session['session_id']}/reward",
                   headers={"Authorization": f"Bearer {session['api_key']}"}, json={"reward": 1.0})
    assert r.status_code == 200, r.text
    [t] = end_session(gateway.url, session)["trajectories"]
    raw = [item.raw_item for item in result.new_items]
    calls = [i for i in raw if getattr(i, "type", None) == "function_call"]
    outputs = [i for i in raw if isinstance(i, dict) and i.get("type") == "function_call_output"]
    assert calls and outputs, raw  # the model called the tool and the SDK ran it
    conversation = [{"role": "user", "content": "What is 12+30+5?"},
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                        for c in calls]},
                    *[{"role": "tool", "content": o["output"]} for o in outputs],
                    {"role": "assistant", "content": result.final_output}]
    tools = [{"type": "function", "function": {"name": "calculator", "description": CALCULATOR_TOOL["function"][
        "description"], "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                                         "required": ["expression"]}}}]
    # the exact stream: the template's rendering of the whole episode, the model's tokens as sampled
    assert renderer.decode(t["input_ids"]) == renderer.render(conversation, tools, add_generation_prompt=False)
    assert t["reward"] == 1.0 and t["num_turns"] == 2 and t["metrics"]["segments_per_episode"] == 1.0
    assert len(sampled_spans(t["loss_mask"])) == 2 and t["status"] == "ok"
    lines = [json.loads(x) for x in (gateway.out / "trajectories.jsonl").read_text().splitlines()]
    mine = [x for x in lines if x["session_id"] == session["session_id"]]
    assert len(mine) == 1 and mine[0]["metadata"] == {"agent": "openai-agents"} and mine[0]["input_ids"] == t["input_ids"]


def test_200_concurrent_sessions_do_not_mix(gateway, renderer):
    """Two calls per session, all sessions at once: every trajectory holds its own question and
    its own first answer, and nothing of any other session."""
    n = 200

    async def one(http: httpx.AsyncClient, i: int) -> tuple[dict, list[str]]:
        r = await http.post("/v1/sessions", headers=admin(), json={"metadata": {"i": i}})
        session = r.json()
        auth = {"Authorization": f"Bearer {session['api_key']}"}
        messages = [{"role": "user", "content": f"What is {i}+{1000 + i}?"}]
        answers = []
        for follow in (f"Is {i} odd?", None):
            r = await http.post("/v1/chat/completions", headers=auth, json={
                "model": "tiny", "messages": messages, "max_tokens": 6, "temperature": 0})
            assert r.status_code == 200, r.text
            answers.append(r.json()["choices"][0]["message"]["content"])
            if follow:
                messages += [{"role": "assistant", "content": answers[-1]}, {"role": "user", "content": follow}]
        r = await http.post(f"/v1/sessions/{session['session_id']}/end", headers=auth,
                            json={"return_trajectories": True})
        return r.json(), answers

    async def main():
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
        async with httpx.AsyncClient(base_url=gateway.url, timeout=300, limits=limits,
                                     transport=KeepAliveTransport()) as http:
            return await asyncio.gather(*(one(http, i) for i in range(n)))

    results = asyncio.run(main())
    for i, (ended, answers) in enumerate(results):
        [t] = ended["trajectories"]  # one segment: the second call extended the first
        text = renderer.decode(t["input_ids"])
        assert text.startswith(f"<|user|>What is {i}+{1000 + i}?<|end|><|assistant|>{answers[0]}")
        assert f"Is {i} odd?" in text and text.count("What is") == 1
        (s1, e1), (s2, e2) = sampled_spans(t["loss_mask"])
        assert renderer.decode(t["input_ids"][s2:e2], skip_special_tokens=True) == answers[1]


def test_auth_and_bad_input_get_4xx_and_the_gateway_keeps_serving(gateway):
    url = gateway.url
    a, b = open_session(url), open_session(url)
    key_a = {"Authorization": f"Bearer {a['api_key']}"}
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "What is 1+2?"}], "max_tokens": 4}
    with httpx.Client(base_url=url, timeout=60) as http:
        assert http.get("/health").status_code == 200  # the one open route
        for method, path in (("post", "/v1/sessions"), ("get", "/v1/models"), ("post", "/v1/chat/completions"),
                             ("post", "/v1/responses"), ("get", "/v1/gateway/stats"),
                             ("get", f"/v1/sessions/{a['session_id']}"),
                             ("post", f"/v1/sessions/{a['session_id']}/reward"),
                             ("post", f"/v1/sessions/{a['session_id']}/end"),
                             ("post", f"/sessions/{a['session_id']}/v1/chat/completions")):
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                r = getattr(http, method)(path, headers=headers, **({"json": chat} if method == "post" else {}))
                assert r.status_code == 401, (path, r.text)
                assert r.json()["error"]["type"] == "authentication_error"
        # a session key reaches its own session only, and opens none
        assert http.post("/v1/sessions", headers=key_a, json={}).status_code == 401
        assert http.post(f"/v1/sessions/{b['session_id']}/reward", headers=key_a, json={"reward": 1}).status_code == 403
        assert http.post(f"/sessions/{b['session_id']}/v1/chat/completions", headers=key_a,
                         json=chat).status_code == 403
        # bad input: 4xx with a message, never a 500
        cases = [
            ("/v1/chat/completions", b"{not json", 400, "not valid JSON"),
            ("/v1/chat/completions", {**chat, "temperature": "hot"}, 400, "temperature must be a finite number"),
            ("/v1/chat/completions", {**chat, "messages": "hi"}, 400, "messages must be a non-empty list"),
            ("/v1/chat/completions", {**chat, "max_tokens": -1}, 400, "max_new_tokens must be an integer >= 0"),
            ("/v1/chat/completions", {**chat, "n": 3}, 400, "n=3 is not supported"),
            ("/v1/chat/completions", {**chat, "stream": "yes"}, 400, "stream must be true or false"),
            ("/v1/chat/completions", {**chat, "messages": [{"role": "user", "content": "x" * 3000}]}, 400,
             "over its budget of 3000 tokens"),
            ("/v1/chat/completions", {**chat, "padding": "y" * 70_000}, 413, "limit"),
            ("/v1/responses", {"model": "tiny", "input": "hi", "previous_response_id": "resp_1"}, 400,
             "previous_response_id is not supported"),
            (f"/v1/sessions/{a['session_id']}/reward", {"reward": "high"}, 400, "finite number"),
            (f"/v1/sessions/{a['session_id']}/reward", {"reward": 1, "completion_id": "chatcmpl-nope"}, 404,
             "no completion"),
            (f"/v1/sessions/{a['session_id']}/reward", {"reward": 1, "extra": 2}, 400, "unknown field"),
            (f"/v1/sessions/{a['session_id']}/end", {"style": "sideways"}, 400, "style must be"),
            ("/v1/sessions/sess_unknown/end", {}, 404, "no session"),
        ]
        for path, body, status, message in cases:
            headers = admin() if "unknown" in path else key_a
            r = (http.post(path, headers=headers, content=body) if isinstance(body, bytes)
                 else http.post(path, headers=headers, json=body))
            assert r.status_code == status and message in r.json()["error"]["message"], (path, r.text)
        assert http.post(f"/v1/sessions/{a['session_id']}/reward", headers=key_a,
                         json={"reward": 1}).status_code == 409  # no call yet
        # and it still serves, by key and by path with the admin key (for clients that cannot change keys)
        r = http.post("/v1/chat/completions", headers=key_a, json=chat)
        assert r.status_code == 200, r.text
        r = http.post(f"/sessions/{a['session_id']}/v1/chat/completions", headers=admin(), json=chat)
        assert r.status_code == 200, r.text
        assert http.get(f"/sessions/{a['session_id']}/v1/models", headers=admin()).json()["data"][0]["id"] == "tiny"
        done = http.post(f"/v1/sessions/{a['session_id']}/end", headers=key_a, json={}).json()
        assert done["num_trajectories"] == 2  # the same prompt twice: two samples, two segments
        assert http.post("/v1/chat/completions", headers=key_a, json=chat).status_code == 401  # ended
        assert http.get(f"/v1/sessions/{a['session_id']}", headers=admin()).json()["status"] == "ended"
        stats = http.get("/v1/gateway/stats", headers=admin()).json()
        assert stats["sessions_ended"] >= 1 and stats["open_sessions"] >= 1


async def test_backpressure_idle_sessions_and_the_episode_hook(tiny_server, tiny_model_dir, tmp_path):
    """In-process, as a training loop holds it: an admission that says no answers 429 + Retry-After; an idle
    session ends as failed data (tokens kept, counted, written, handed to the hook)."""
    delivered = []
    async with RemoteEngine(tiny_server.url) as engine:
        gw = Gateway(engine, tiny_model_dir, out=tmp_path, session_timeout_s=2.0,
                     on_episode=lambda ts, s: delivered.append((s.id, ts)))
        async with background_server(build_app(gw)) as url, httpx.AsyncClient(base_url=url, timeout=60) as http:
            gw.admission = lambda metadata: False
            r = await http.post("/v1/sessions", json={})
            assert r.status_code == 429 and r.headers["retry-after"] == "2"
            gw.admission = None
            session = (await http.post("/v1/sessions", json={"metadata": {"row": 7}})).json()
            auth = {"Authorization": f"Bearer {session['api_key']}"}
            r = await http.post("/v1/chat/completions", headers=auth, json={
                "model": "m", "messages": [{"role": "user", "content": "What is 1+2?"}], "max_tokens": 8})
            assert r.status_code == 200
            for _ in range(300):
                if delivered:
                    break
                await asyncio.sleep(0.1)
            [(sid, [t])] = delivered
            assert sid == session["session_id"] and t.status is TrajectoryStatus.TIMEOUT and t.num_sampled > 0
            assert "idle" in t.error and gw.stats["sessions_timed_out"] == 1
            assert (await http.post("/v1/chat/completions", headers=auth, json={
                "model": "m", "messages": [{"role": "user", "content": "hi"}]})).status_code == 401
            [line] = (tmp_path / "trajectories.jsonl").read_text().splitlines()
            assert json.loads(line)["status"] == "timeout" and json.loads(line)["metadata"] == {"row": 7}


async def test_interrupted_and_killed_upstreams(tiny_model_dir):
    """A weight update mid-call (versions change mid-completion, nothing lost); an upstream killed
    mid-call (re-run on the other); every upstream dead (503, the session fails as data)."""
    first, second = await asyncio.gather(*(asyncio.to_thread(ServerProcess, tiny_model_dir, "--weight-version", "0")
                                           for _ in range(2)))
    try:
        async with RemoteEngine([first.url, second.url], max_retries=1, backoff=0.05,
                                health_check_interval=0.2) as engine:
            gw = Gateway(engine, tiny_model_dir)
            async with background_server(build_app(gw)) as url, httpx.AsyncClient(base_url=url, timeout=120) as http:
                # a weight update interrupts a call: its tokens keep the version that sampled each
                session = (await http.post("/v1/sessions", json={})).json()
                auth = {"Authorization": f"Bearer {session['api_key']}"}
                long_call = {"model": "m", "messages": [{"role": "user", "content": "What is 1+2?"}],
                             "max_tokens": 800, "ignore_eos": True}
                call = asyncio.create_task(http.post("/v1/chat/completions", headers=auth, json=long_call))
                await until_generating(first.url, second.url, min_tokens=20)  # some tokens at version 0
                await engine.pause()
                await engine.update_weights(str(tiny_model_dir), 1)
                await engine.resume()
                assert (await call).status_code == 200
                [t] = (await http.post(f"/v1/sessions/{session['session_id']}/end",
                                       json={"return_trajectories": True})).json()["trajectories"]
                sampled = [v for v, m in zip(t["versions"], t["loss_mask"], strict=True) if m]
                assert len(sampled) == 800 and sampled == sorted(sampled) and set(sampled) == {0, 1}

                session = (await http.post("/v1/sessions", json={})).json()
                auth = {"Authorization": f"Bearer {session['api_key']}"}
                call = asyncio.create_task(http.post("/v1/chat/completions", headers=auth, json=long_call))
                await until_generating(first.url)  # the first server: least loaded, first in the list
                first.kill()  # mid-call (a fixed sleep let a fast server finish the call first)
                r = await call
                assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 800
                assert engine.stats["servers_lost"] == 1
                second.kill()
                r = await http.post("/v1/chat/completions", headers=auth, json={**long_call, "max_tokens": 5})
                assert r.status_code == 503 and "retry-after" in r.headers
                ended = (await http.post(f"/v1/sessions/{session['session_id']}/end", json={})).json()
                assert ended["status"] == "inference_error" and ended["num_trajectories"] == 1
                assert gw.stats["sessions_failed"] == 1
    finally:
        first.stop()
        second.stop()


async def test_the_example_agent_counts_a_refused_episode_as_lost(tiny_model_dir, tmp_path):
    """examples/gateway_agent.py against a gateway whose one upstream is gone: every call is a
    503, every episode is lost and said to be, and the agent plays on to its end (exit 0)."""
    async with RemoteEngine(f"http://127.0.0.1:{free_port()}", max_retries=0) as engine:
        gw = Gateway(engine, tiny_model_dir, out=tmp_path)
        async with background_server(build_app(gw)) as url:
            agent = await asyncio.create_subprocess_exec(
                sys.executable, str(EXAMPLES / "gateway_agent.py"), "--gateway", url, "--groups", "2",
                "--samples", "2", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(agent.communicate(), 120)
    assert agent.returncode == 0, err.decode()
    assert [json.loads(line) for line in out.decode().splitlines()] == [
        {"group": 0, "mean_reward": None, "lost": 2}, {"group": 1, "mean_reward": None, "lost": 2},
        {"groups_played": 2}]
    assert err.decode().count("episode lost: HTTP 503") == 4, err.decode()
    assert gw.stats["sessions_failed"] == 4  # what the gateway kept of them: failed data


def test_one_gateway_config_for_the_command_the_class_and_the_run(tiny_model_dir):
    """Issue 22: the gateway's settings lived in three places (Gateway's keywords, the CLI, the
    run's section) with their own defaults; now one GatewayConfig, the run's on a free port."""
    from agentrl.config import load_config
    from agentrl.run.run_config import RunConfig

    gw = Gateway(None, tiny_model_dir, GatewayConfig(max_sessions=2), session_timeout_s=2.0)
    assert (gw.config.max_sessions, gw.config.session_timeout_s, gw.config.port) == (2, 2.0, 30100)
    assert gw.model == str(tiny_model_dir)  # the served name, when none is given: --model's directory
    assert Gateway(None, tiny_model_dir, served_model_name="tiny").model == "tiny"
    with pytest.raises(ValueError, match="session_timeout_s must be > 0, got 0"):
        Gateway(None, tiny_model_dir, session_timeout_s=0)
    with pytest.raises(TypeError, match="max_sesions"):
        Gateway(None, tiny_model_dir, max_sesions=3)
    run = load_config(RunConfig, None, ["model=m", "gateway.host=0.0.0.0", "gateway.max_sessions=8"])
    assert isinstance(run.gateway, GatewayConfig)
    assert (run.gateway.host, run.gateway.port, run.gateway.max_sessions) == ("0.0.0.0", 0, 8)



@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_an_abandoned_call_is_not_training_data(stream, gateway, tiny_server, renderer):
    """Issue 30, item 2, as found: an abandoned call, then a normal one, reward 1, end gave
    ``{'num_trajectories': 2, 'rewards': [0.0, 1.0]}``, both ``ok`` with one episode id — a
    completion no client received, counted by GRPO as half the episode. Now an abandoned call
    is taken out of its session: the episode is the calls its client got, one trajectory of
    exactly the conversation the client saw, whether the abandoned call was the session's
    first (its segment goes) or followed a received one (the segment is cut back)."""
    session = open_session(gateway.url)
    key = session["api_key"]
    client = openai.OpenAI(base_url=session["base_url"], api_key=key, max_retries=0, timeout=120)
    before = httpx.get(f"{gateway.url}/v1/gateway/stats", headers=admin()).json()
    long = {"model": "tiny", "max_tokens": 400, "ignore_eos": True, "temperature": 0.7, "stream": stream}

    def generating() -> None:
        asyncio.run(until_generating(tiny_server.url))

    first = [{"role": "user", "content": "What is 1+2?"}]
    abandon_call(gateway.url, session, {**long, "messages": first}, generating)  # the session's first call
    a1 = client.chat.completions.create(model="tiny", messages=first, max_tokens=12, temperature=0)
    second = [*first, {"role": "assistant", "content": a1.choices[0].message.content},
              {"role": "user", "content": "And 3+4?"}]
    abandon_call(gateway.url, session, {**long, "messages": second}, generating)  # after a received call
    a2 = client.chat.completions.create(model="tiny", messages=second, max_tokens=12, temperature=0)
    r = httpx.post(f"{gateway.url}/v1/sessions/{session['session_id']}/reward",
                   headers={"Authorization": f"Bearer {key}"}, json={"reward": 1.0})
    assert r.status_code == 200 and r.json()["completion_id"] == a2.id, r.text

    ended = end_session(gateway.url, session)
    assert (ended["num_trajectories"], ended["rewards"]) == (1, [1.0]), ended
    [t] = ended["trajectories"]
    assert t["status"] == "ok" and t["num_turns"] == 2 and t["metrics"]["calls_abandoned"] == 2.0
    seen = [*second, {"role": "assistant", "content": a2.choices[0].message.content}]
    assert renderer.decode(t["input_ids"]) == renderer.render(seen, add_generation_prompt=False)
    spans = sampled_spans(t["loss_mask"])
    assert [e - s for s, e in spans] == [a1.usage.completion_tokens, a2.usage.completion_tokens]
    lines = [json.loads(x) for x in (gateway.out / "trajectories.jsonl").read_text().splitlines()]
    assert [x["reward"] for x in lines if x["session_id"] == session["session_id"]] == [1.0]
    after = httpx.get(f"{gateway.url}/v1/gateway/stats", headers=admin()).json()
    assert after.get("calls_abandoned", 0) - before.get("calls_abandoned", 0) == 2, after
    assert after["completions"] - before["completions"] == 2  # the answers delivered


@pytest.mark.parametrize("gone", [False, True], ids=["read", "hung-up"])
async def test_a_stream_is_delivered_only_once_its_last_event_went_out(gone):
    """The other half of an abandoned streamed call: a stream whose client hung up says it was
    not delivered, though the server took its events (uvicorn drops what comes after a
    disconnect, silently), so the gateway takes the call back."""
    chunks = [{"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "x"}}]}]
    stream, sent = AnswerStream(chunks * 3), []

    async def receive():
        if not gone:
            await asyncio.Event().wait()  # a client that stays: no disconnect comes
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await stream({"type": "http", "asgi": {"spec_version": "2.3"}}, receive, send)
    assert stream.delivered is (not gone)  # what the server did with the events then: uvicorn drops them
    assert gone or b"".join(m.get("body", b"") for m in sent).endswith(b"data: [DONE]\n\n")


async def test_a_huge_message_neither_stalls_other_sessions_nor_waits_for_its_400(tiny_server, tiny_model_dir):
    """Issue 30, item 1, as found: a session posting a ~4 MB message (under the 4 MiB body limit)
    made another session's ``max_tokens=2`` call take 6.9 s instead of 0.07 s, and got its 400
    (over its token budget) only after 7.2 s: the text was tokenized on the event loop, whole,
    before the budget was checked. A gateway with its default limits, in a process of its own."""
    cmd = [os.path.join(os.path.dirname(sys.executable), "agentrl"), "gateway", "--model", str(tiny_model_dir),
           "--upstream", tiny_server.url, "--port", "0"]
    with ServiceProcess(cmd, ready=READY) as proc:
        async with httpx.AsyncClient(base_url=proc.url, timeout=120) as http:
            big, small = [(await http.post("/v1/sessions", json={})).json() for _ in range(2)]
            call = {"model": "m", "messages": [{"role": "user", "content": "What is 1+2?"}], "max_tokens": 2}
            auth = {"Authorization": f"Bearer {small['api_key']}"}
            assert (await http.post("/v1/chat/completions", headers=auth, json=call)).status_code == 200  # warm
            huge = json.dumps({"model": "m", "messages": [{"role": "user", "content": "What is 1+2? " * 300_000}]})
            assert 3_900_000 < len(huge) < 4 << 20
            started = time.perf_counter()
            sent = asyncio.create_task(http.post("/v1/chat/completions", content=huge, headers={
                "Authorization": f"Bearer {big['api_key']}", "Content-Type": "application/json"}))
            worst = 0.0
            while not sent.done():
                t0 = time.perf_counter()
                assert (await http.post("/v1/chat/completions", headers=auth, json=call)).status_code == 200
                worst = max(worst, time.perf_counter() - t0)
            r = await sent
            took = time.perf_counter() - started
    assert r.status_code == 400 and "over its budget of 65536 tokens" in r.json()["error"]["message"], r.text
    assert took < 3.0 and worst < 2.0, (took, worst)


def test_the_session_routes_bodies_are_declared_once_for_the_parser_and_the_openapi_document(tiny_model_dir):
    """``GET /openapi.json`` describes each session route's body from the dataclass its route
    parses with (``agentrl.rollout.gateway_bodies``)."""
    from agentrl.rollout.gateway_bodies import EndSession

    doc = build_app(Gateway(None, tiny_model_dir)).openapi()
    end = doc["paths"]["/v1/sessions/{session_id}/end"]["post"]["requestBody"]["content"]["application/json"]
    props = end["schema"]["properties"]
    assert set(props) == {f for f in EndSession.__dataclass_fields__}
    assert props["discount"]["minimum"] == 0 and props["discount"]["maximum"] == 1
    assert props["style"]["enum"] == ["concat", "individual"]
    reward = doc["paths"]["/v1/sessions/{session_id}/reward"]["post"]["requestBody"]
    assert reward["required"] and reward["content"]["application/json"]["schema"]["required"] == ["reward"]


async def test_by_default_the_recorded_logprobs_are_the_policy_s_at_temperature_1(tiny_server, tiny_model_dir):
    """Issue 49: an agent sampling at 0.7 left behaviour log-probabilities of the tempered
    distribution, while the trainer recomputes at temperature 1. By default the gateway samples
    the policy's own distribution: the upstream, asked at temperature 1 with the same seed,
    samples the same ids with the same log-probabilities as were recorded."""
    gateway = Gateway(RemoteEngine(tiny_server.url), str(tiny_model_dir), GatewayConfig(), close_engine=True)
    session = gateway.open_session()
    body = {"messages": [{"role": "user", "content": "What is 12+30?"}], "temperature": 0.7, "top_p": 0.5,
            "max_tokens": 24, "seed": 5}
    try:
        await gateway.call(session, lambda chat: chat.complete(body))
        [t] = await gateway.end_session(session.id)
    finally:
        await gateway.aclose()
    [(start, end)] = sampled_spans(t.loss_mask)
    async with httpx.AsyncClient(timeout=60) as http:
        g = (await http.post(f"{tiny_server.url}/generate", json={
            "input_ids": t.input_ids[:start], "return_logprob": True,
            "sampling_params": {"temperature": 1.0, "max_new_tokens": 24, "sampling_seed": 5}})).json()
    assert g["output_ids"] == t.input_ids[start:end]
    assert t.logprobs[start:end] == pytest.approx([x[0] for x in g["meta_info"]["output_token_logprobs"]], abs=1e-5)
