"""The rollout side: how episodes turn into exact token streams, in-process and over HTTP.

    renderer.py      ChatRenderer: chat template -> text -> token ids and back, exactly
    conversation.py  TokenConversation: one episode's calls and segments, token-in token-out
    chat_client.py   ChatClient: the openai SDK's interface over an InferenceClient, recorded
    responses.py     the Responses API's basic shape mapped onto chat completions
    drift.py         check_token_drift: turn-by-turn tokens vs full re-tokenization
    gateway.py       Gateway, Session: one recorded episode per session, ended into trajectories
    gateway_config.py GatewayConfig: every setting of the gateway (its flags, a run's ``gateway``)
    gateway_bodies.py the gateway's own request bodies, declared once (parsed and described from them)
    gateway_routes.py build_app: the gateway's HTTP routes, auth and limits (``agentrl gateway``)
    external.py      episodes agents play through the gateway on their own, as groups for the trainer
    gateway_mcp.py   MCPEndpoint: a session's env tools served as an MCP server (/sessions/{id}/mcp)
    env_pool.py      EnvPool: environments built once, leased per episode
    episode.py       what every workflow shares: failures as data, sampling settings, metrics
    executor.py      RolloutExecutor: episodes in flight under the staleness bound, grouped
    lockstep.py      deterministic mode's schedule: generation in rounds, weights published between them
    rollout_config.py RolloutConfig: a run's ``rollout`` section (what the executor is given)
    eval_config.py   EvalConfig: a run's ``eval`` section; the figures read from its scores
    workflow_inputs.py what a workflow takes from the run (``run_inputs``); build_workflow
    journal.py       the episode log that replays finished generations on --resume
    record.py        EpisodeRecord: an episode's environment inputs and outputs, bounded
    recorded.py      RecordedEpisodes: a run's recorded steps as another run's batches
    seeds.py         call_seed, SeededClient: a sampling seed per call of each episode
    evaluate.py      pass@k evaluation of a workflow
    teacher.py       Teacher: a distillation teacher's server scores each batch's tokens (trainer.distill)

Workflows (the ``workflows`` package) are built on these. This package sits between the run
(``agentrl.run``) and the components (inference, env, trainer): it may import them, they never
import it.
"""

from agentrl.rollout.conversation import TokenConversation
from agentrl.rollout.env_pool import EnvPool
from agentrl.rollout.renderer import ChatRenderer, load_tokenizer

__all__ = ["ChatRenderer", "EnvPool", "TokenConversation", "load_tokenizer"]
# ChatClient, Gateway and check_token_drift import the openai SDK and FastAPI: import them from
# their modules (agentrl.rollout.chat_client, .gateway, .drift) so that workflows stay light.
