"""mini-swe-agent 2.x, unchanged (its own venv, `make mswea`), plays a SWE-bench-format instance
through the gateway: a scripted upstream issues the gold commands as mini-swe-agent's bash tool
calls, mini-swe-agent runs them with `docker exec` in the episode's container, and the graded
diff's reward lands on the recorded trajectory."""

from __future__ import annotations

import json

from agentrl.api import Completion, SamplingParams
from agentrl.rollout.renderer import ChatRenderer
from workflows.mini_swe_agent import MiniSweAgentWorkflow

from ..envs.test_repo import harbor_dir, repo_tasks, row  # noqa: F401  (the session's task fixtures)


class ScriptedEngine:
    """Answers each generate with the next scripted reply (the last one repeats)."""

    def __init__(self, renderer: ChatRenderer, replies: list[str]) -> None:
        self.renderer, self.replies, self.calls = renderer, replies, 0

    async def generate(self, input_ids, sampling: SamplingParams) -> Completion:
        reply = self.replies[min(self.calls, len(self.replies) - 1)]
        self.calls += 1
        ids = self.renderer.encode(reply) + [self.renderer.eos_token_id]
        return Completion(ids, [-0.5] * len(ids), [1] * len(ids), "stop", self.renderer.eos_token_id)


def bash_call(command: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'bash', 'arguments': {'command': command}})}</tool_call>"


async def test_mini_swe_agent_plays_an_instance_to_a_rewarded_trajectory(row, tiny_model_dir):  # noqa: F811
    wf = MiniSweAgentWorkflow(tiny_model_dir, {"command_timeout_s": 30}, step_limit=6, timeout_s=300)
    engine = ScriptedEngine(wf.renderer, [
        "THOUGHT: apply the fix.\n" + bash_call(f"git apply <<'EOF_PATCH'\n{row['patch']}EOF_PATCH\ngit diff --stat"),
        "THOUGHT: done.\n" + bash_call("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"),
    ])
    try:
        trajectories = await wf.arun_episode(engine, row)
    finally:
        await wf.aclose()
    assert engine.calls == 2
    assert trajectories and all(t.status.value == "ok" for t in trajectories), [t.error for t in trajectories]
    assert trajectories[-1].reward == 1.0
