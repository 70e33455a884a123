"""The tinker SDK's own calls against `agentrl service`, one scenario per run; runs in .venv-tinker.

    TINKER_BASE_URL=... TINKER_API_KEY=tml-... .venv-tinker/bin/python sdk_calls.py [SCENARIO ...]

Each scenario drives the unmodified SDK (``tinker`` 0.38); the run prints one JSON line of what
each saw (all scenarios when none is named, in one process: the SDK's import is paid once);
``test_tinker_service.py`` asserts on it. Nothing of agentrl is imported here.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import tinker
from tinker import types

SEQ_A = [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51]
SEQ_B = [90, 80, 70, 60, 50, 40, 30, 20, 10, 11, 12, 13]


def datum(seq: list[int], **extra: np.ndarray) -> types.Datum:
    n = len(seq) - 1
    inputs = {"target_tokens": np.array(seq[1:], dtype=np.int64), **extra}
    if not extra:
        inputs["weights"] = np.ones(n, dtype=np.float32)
    return types.Datum(model_input=types.ModelInput.from_ints(seq[:-1]), loss_fn_inputs=inputs)


def logprobs(tc: tinker.TrainingClient, seq: list[int]) -> list[float]:
    out = tc.forward([datum(seq)], "cross_entropy").result()
    return out.loss_fn_outputs[0]["logprobs"].to_numpy().tolist()


def sft_steps(tc: tinker.TrainingClient, seq: list[int], steps: int, lr: float = 2e-2) -> list[float]:
    losses = []
    for _ in range(steps):
        fb = tc.forward_backward([datum(seq)], "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=lr)).result()
        losses.append(fb.result().metrics["loss:sum"])
    return losses


def client(sc: tinker.ServiceClient, rank: int = 4, seed: int = 0) -> tinker.TrainingClient:
    base = tinker.RestClient().get_server_capabilities().result().supported_models[0].model_name
    return sc.create_lora_training_client(base_model=base, rank=rank, seed=seed).result()


def train(sc: tinker.ServiceClient) -> dict:
    """Every training and sampling route once, and each RL loss's value against its definition."""
    caps = tinker.RestClient().get_server_capabilities().result()
    tc = client(sc)
    info = tc.get_info()
    before = logprobs(tc, SEQ_A)
    losses = sft_steps(tc, SEQ_A, 4)
    after = logprobs(tc, SEQ_A)
    n = len(SEQ_A) - 1
    rl = {}
    rng = np.random.default_rng(0)
    sampling = np.array(after, dtype=np.float32) + rng.normal(0, 0.3, n).astype(np.float32)
    adv = rng.normal(0, 1, n).astype(np.float32)
    mask = (np.arange(n) >= 3).astype(np.float32)  # gspo's ratio over the "sampled" tokens only
    for loss in ("importance_sampling", "ppo", "cispo", "gspo"):
        extra = {"sequence_ratio_mask": mask} if loss == "gspo" else {}
        d = datum(SEQ_A, logprobs=sampling, advantages=adv, **extra)
        out = tc.forward_backward([d], loss, loss_fn_config={"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}
                                  if loss != "importance_sampling" else None).result()
        rl[loss] = {"loss": out.metrics["loss:sum"], "target": out.loss_fn_outputs[0]["logprobs"].to_numpy().tolist()}
    rl["sampling"], rl["advantages"], rl["mask"] = sampling.tolist(), adv.tolist(), mask.tolist()
    tc.optim_step(types.AdamParams(learning_rate=0.0)).result()  # clears the RL gradients
    path = tc.save_weights_for_sampler("trained").result().path
    sampler = sc.create_sampling_client(model_path=path)
    prompt = types.ModelInput.from_ints(SEQ_A[:4])
    sample = sampler.sample(prompt, num_samples=3, sampling_params=types.SamplingParams(
        max_tokens=6, temperature=1.0, seed=1)).result()
    stopped = sampler.sample(prompt, num_samples=1, sampling_params=types.SamplingParams(
        max_tokens=8, temperature=0.0, stop=[SEQ_A[5]])).result()
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(SEQ_A)).result()
    base = sc.create_sampling_client(base_model=caps.supported_models[0].model_name)
    base_scored = base.compute_logprobs(types.ModelInput.from_ints(SEQ_A)).result()
    saved = tinker.RestClient().list_checkpoints(tc.model_id).result()
    return {"models": [m.model_name for m in caps.supported_models], "is_lora": info.is_lora,
            "rank": info.lora_rank, "tokenizer_id": info.model_data.tokenizer_id, "before": before, "after": after,
            "losses": losses, "rl": rl, "samples": [s.tokens for s in sample.sequences],
            "sample_logprobs": [s.logprobs for s in sample.sequences],
            "stop_reasons": [s.stop_reason for s in sample.sequences],
            "stopped": stopped.sequences[0].tokens, "scored": scored, "base_scored": base_scored,
            "saved": path, "checkpoints": [c.tinker_path for c in saved.checkpoints]}


def resume(sc: tinker.ServiceClient) -> dict:
    """save_state, then load_state with the optimizer: the next step is the one the saved client took."""
    tc = client(sc)
    sft_steps(tc, SEQ_A, 2)
    saved_at = logprobs(tc, SEQ_A)
    path = tc.save_state("two-steps").result().path
    sft_steps(tc, SEQ_A, 1)
    continued = logprobs(tc, SEQ_A)
    resumed = sc.create_training_client_from_state_with_optimizer(path).result()
    loaded = logprobs(resumed, SEQ_A)
    sft_steps(resumed, SEQ_A, 1)
    tc.load_state(path).result()  # weights only, into the first client
    return {"path": path, "saved_at": saved_at, "continued": continued, "loaded": loaded,
            "resumed_step": logprobs(resumed, SEQ_A), "reloaded": logprobs(tc, SEQ_A)}


def two_clients(sc: tinker.ServiceClient) -> dict:
    """Two clients at once, each its own adapter; a third, idle, is left where it was."""
    a, b, idle = client(sc, rank=4, seed=1), client(sc, rank=8, seed=2), client(sc, rank=4, seed=3)
    b_before, idle_before = logprobs(b, SEQ_B), logprobs(idle, SEQ_A)
    futures = []
    for _ in range(3):  # interleaved: both clients' calls in flight together
        futures += [a.forward_backward([datum(SEQ_A)], "cross_entropy"),
                    b.forward_backward([datum(SEQ_B)], "cross_entropy")]
        futures += [a.optim_step(types.AdamParams(learning_rate=2e-2)),
                    b.optim_step(types.AdamParams(learning_rate=2e-2))]
    [f.result() for f in futures]
    a_sampler = a.save_weights_and_get_sampling_client(name="a")
    b_sampler = b.save_weights_and_get_sampling_client(name="b")
    both = [s.compute_logprobs(types.ModelInput.from_ints(seq)) for s, seq in  # sampled in one batch
            ((a_sampler, SEQ_A), (b_sampler, SEQ_B), (a_sampler, SEQ_B))]
    return {"a_own": logprobs(a, SEQ_A), "a_on_b": logprobs(a, SEQ_B), "b_own": logprobs(b, SEQ_B),
            "b_before": b_before, "idle_before": idle_before, "idle_after": logprobs(idle, SEQ_A),
            "sampled": [f.result() for f in both]}


def bad(sc: tinker.ServiceClient) -> dict:
    """Bad requests are refused with the SDK's error types, and the client goes on."""
    seen = {}
    tc = client(sc)
    wrong = types.Datum(model_input=types.ModelInput.from_ints(SEQ_A[:-1]),
                        loss_fn_inputs={"target_tokens": np.array(SEQ_A[1:]), "weights": np.ones(3, np.float32)})
    try:
        tc.forward_backward([wrong], "cross_entropy").result()
    except tinker.RequestFailedError as e:
        seen["shape"] = [type(e).__name__, str(e.category), str(e)]
    try:
        sc.create_lora_training_client(base_model="no/such-model", rank=4).result()
    except tinker.APIStatusError as e:
        seen["base"] = [type(e).__name__, e.status_code, str(e)]
    try:
        sc.create_sampling_client(model_path="tinker://nobody/sampler_weights/nothing").sample(
            types.ModelInput.from_ints([1, 2]), 1, types.SamplingParams(max_tokens=2)).result()
    except tinker.APIStatusError as e:
        seen["path"] = [type(e).__name__, e.status_code, str(e)]
    try:
        tinker.ServiceClient(api_key="tml-wrong-key").create_lora_training_client(base_model="x", rank=2).result()
    except tinker.APIStatusError as e:
        seen["key"] = [type(e).__name__, e.status_code, str(e)]
    seen["still_trains"] = sft_steps(tc, SEQ_A, 2)
    return seen


if __name__ == "__main__":
    scenarios = {"train": train, "resume": resume, "two_clients": two_clients, "bad": bad}  # bad last
    service = tinker.ServiceClient()
    print(json.dumps({name: scenarios[name](service) for name in sys.argv[1:] or scenarios}), flush=True)
    # after a request error the SDK's background loop keeps the interpreter from exiting (the SDK's
    # own behaviour, against any server): end here, the output written
    os._exit(0)
