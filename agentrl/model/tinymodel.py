"""The tiny demo model: a Qwen2-architecture causal LM of about a million parameters.

What it is: the model agentrl's demo, tests and benchmarks run on a CPU, and the recipe that
builds it. ``init_tiny_model`` writes an untrained model plus the byte-level tokenizer
(``agentrl.model.tokenizer``); ``build_tiny_model`` trains one briefly on synthetic data of the demo
task family (``agentrl.model.arith_data``) so that it starts RL neither hopeless nor solved, and writes a
directory that ``transformers.AutoModelForCausalLM`` / ``AutoTokenizer`` load offline.
``evaluate_model_dir`` measures any saved model on held-out problems. What it is not: a
general SFT trainer: ``agentrl sft`` (``agentrl.run.sft``) fine-tunes any model with the RL
trainer's ``Actor``, its masks checked against ``encode_with_mask`` here.

The recipe, in short (its reasons and measured figures: ``docs/tiny_model.md``): Qwen2, hidden
128, 5 layers, MLP 3x, tied embeddings (1.02 M parameters); SFT on ``What is a+b(+c)?`` ->
``\\boxed{N}<|end|>`` and calculator-call traces from the *train* split only, loss on assistant
tokens; Muon + AdamW (``agentrl.trainer.optim.MuonAdamW``), warmup then cosine over ``schedule_steps``,
stopped at a fixed step (never wall time) on one thread, so the same config gives the same bytes.

Main hooks::

    cfg = load_config(TinyModelConfig, None, ["sft_steps=20"])
    info = build_tiny_model(cfg, "examples/tiny-model")   # also writes build_info.json
    evaluate_model_dir("examples/tiny-model", problems=1000, seed=0)
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.config import option, save_config, to_dict
from agentrl.errors import ConfigError, ModelError
from agentrl.model.arith_data import (
    CALCULATOR_TOOL,
    ArithProblem,
    calculate,
    extract_answer,
    format_answer,
    generate_problems,
)
from agentrl.model.tokenizer import END, PAD, VOCAB_SIZE, build_tokenizer, save_tokenizer, special_token_ids
from agentrl.toolcalls import parse_tool_calls

BUILD_INFO = "build_info.json"
BUILD_CONFIG = "build_config.yaml"


def tiny_config(hidden_size: int = 128, num_layers: int = 5, mlp_ratio: int = 3, max_positions: int = 1024):
    """Qwen2 config of the demo model (vocab padded to a multiple of 8)."""
    from transformers import Qwen2Config

    ids = special_token_ids()
    return Qwen2Config(
        vocab_size=(VOCAB_SIZE + 7) // 8 * 8,
        hidden_size=hidden_size,
        intermediate_size=mlp_ratio * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=ids[END],
        pad_token_id=ids[PAD],
    )


def init_tiny_model(out_dir: str | Path, seed: int = 0, **config_kwargs):
    """Write an untrained tiny model and its tokenizer to ``out_dir``; returns the model."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(**config_kwargs))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    save_tokenizer(out)
    return model


# --------------------------------------------------------------------------- config


@dataclass
class TinyModelConfig:
    """How ``agentrl model tiny`` builds the demo model. The defaults build the committed one."""

    seed: int = option(0, help="seeds the weights and the training data; same seed, same model", ge=0)
    hidden_size: int = option(128, help="model width (4 query / 2 key-value heads)", ge=16, le=1024)
    num_layers: int = option(5, help="transformer layers (5 x 128 wide, MLP 3x = 1.02 M parameters)", ge=1, le=24)
    mlp_ratio: int = option(3, help="MLP width as a multiple of hidden_size", ge=1, le=8)
    sft_steps: int = option(650, help="optimizer steps; fixed, never a time budget", ge=1)
    schedule_steps: int = option(700, help="length of the lr schedule; sft_steps may stop before its end",
                                 ge=1)
    batch_size: int = option(128, help="arithmetic sequences per step", ge=1)
    optimizer: str = option("muon", help="muon: Muon on hidden matrices + AdamW on the rest; adamw: AdamW only",
                            choices=("muon", "adamw"))
    lr: float = option(4e-3, help="peak learning rate (both optimizers)", gt=0, le=1)
    warmup: float = option(0.03, help="share of the steps spent warming the lr up linearly", ge=0, lt=1)
    min_lr_ratio: float = option(0.1, help="cosine decay ends at this share of the peak lr", ge=0, le=1)
    weight_decay: float = option(0.0, help="AdamW weight decay", ge=0)
    two_term_share: float = option(0.3, help="share of a+b problems in arithmetic batches (rest a+b+c)",
                                   ge=0, le=1)
    tool_fraction: float = option(0.1, help="share of the steps that train on calculator tool-call traces",
                                  ge=0, le=1)
    tool_batch_size: int = option(16, help="tool-call traces per tool step (they are ~13x longer)", ge=1)
    eval_problems: int = option(1000, help="held-out a+b+c problems for the final greedy accuracy", ge=1)
    eval_sample: int = option(300, help="also record the accuracy on this many (for quick re-checks)", ge=1)
    eval_tool_problems: int = option(100, help="held-out problems asked with the calculator tool", ge=0)
    eval_seed: int = option(0, help="seed of the evaluation problems", ge=0)
    eval_batch_size: int = option(250, help="prompts per generation batch at evaluation", ge=1)
    threads: int = option(1, help="torch CPU threads; the weights depend on it (same value, same bytes). "
                                  "1: a 2-thread build on a busy 2-core machine crawls", ge=1)

    def __post_init__(self) -> None:
        if self.sft_steps > self.schedule_steps:
            raise ConfigError(
                f"config key 'sft_steps': got {self.sft_steps}, expected a value <= schedule_steps "
                f"({self.schedule_steps}); raise schedule_steps too"
            )
        if self.hidden_size % 8:
            raise ConfigError(
                f"config key 'hidden_size': got {self.hidden_size}, expected a multiple of 8 "
                "(4 attention heads with an even head size)"
            )


# --------------------------------------------------------------------------- data


def arith_messages(problem: ArithProblem) -> list[dict[str, Any]]:
    """The single-turn conversation of a problem: the question, then ``\\boxed{N}``."""
    return [{"role": "user", "content": problem.question},
            {"role": "assistant", "content": format_answer(problem.answer)}]


def tool_messages(problem: ArithProblem) -> list[dict[str, Any]]:
    """A calculator trace: call ``calculator(expression)``, read the result, answer."""
    call = {"type": "function",
            "function": {"name": "calculator", "arguments": {"expression": problem.expression}}}
    return [{"role": "user", "content": problem.question},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": calculate(problem.expression)},
            {"role": "assistant", "content": format_answer(problem.answer)}]


def encode_with_mask(tok, messages: list[dict[str, Any]], tools: list[dict] | None = None):
    """Token ids of the rendered conversation and a 0/1 mask that is 1 on assistant tokens.

    Relies on the byte-level template being prefix-stable: the tokens of the first i
    messages (plus the generation prompt) are a prefix of the tokens of the whole.
    """

    def ids(msgs, gen):
        text = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=gen)
        return tok(text, add_special_tokens=False)["input_ids"]

    full = ids(messages, False)
    mask = [0] * len(full)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start, end = len(ids(messages[:i], True)), len(ids(messages[: i + 1], False))
        if full[:end] != ids(messages[: i + 1], False):
            raise ModelError("the chat template is not prefix-stable; cannot mask assistant tokens")
        mask[start:end] = [1] * (end - start)
    return full, mask


_USER_ID, _END_ID, _ASSISTANT_ID = (special_token_ids()[t] for t in ("<|user|>", END, "<|assistant|>"))


def _arith_example(problem: ArithProblem) -> tuple[list[int], list[int]]:
    # Fast path for the bulk of the data (token ids are the UTF-8 bytes, so no tokenizer call:
    # a tenth of the time); the test suite checks it equals encode_with_mask.
    prompt = [_USER_ID, *problem.question.encode(), _END_ID, _ASSISTANT_ID]
    answer = [*format_answer(problem.answer).encode(), _END_ID]
    return prompt + answer, [0] * len(prompt) + [1] * len(answer)


def _is_tool_step(step: int, fraction: float) -> bool:
    """Spreads the tool steps evenly: step i is one when floor((i+1)f) > floor(i f)."""
    return math.floor((step + 1) * fraction) > math.floor(step * fraction)


def training_batch(cfg: TinyModelConfig, tok, step: int):
    """(input_ids, labels) of one step, from the train split only; a pure function of (cfg, step)."""
    import torch

    seed = cfg.seed * 1_000_003 + step
    if _is_tool_step(step, cfg.tool_fraction):
        problems = generate_problems(cfg.tool_batch_size, seed, num_terms=(2, 3), split="train")
        examples = [encode_with_mask(tok, tool_messages(p), [CALCULATOR_TOOL]) for p in problems]
    else:
        n2 = round(cfg.batch_size * cfg.two_term_share)
        problems = (generate_problems(n2, seed, num_terms=(2,), split="train")
                    + generate_problems(cfg.batch_size - n2, seed, num_terms=(3,), split="train"))
        examples = [_arith_example(p) for p in problems]
    width = max(len(ids) for ids, _ in examples)
    pad = tok.pad_token_id
    input_ids = torch.full((len(examples), width), pad, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    for row, (ids, mask) in enumerate(examples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(ids)] = torch.tensor([t if m else -100 for t, m in zip(ids, mask, strict=True)])
    return input_ids, labels


# --------------------------------------------------------------------------- build


def lr_at(cfg: TinyModelConfig, step: int) -> float:
    """Linear warmup, then cosine decay to ``min_lr_ratio`` over ``schedule_steps`` steps.

    The schedule does not depend on ``sft_steps``: a build that stops at step k has exactly
    the weights that a longer build had at step k.
    """
    from agentrl.trainer.optim import warmup_cosine

    return warmup_cosine(step, peak=cfg.lr, warmup_steps=max(1, round(cfg.warmup * cfg.schedule_steps)),
                         total_steps=cfg.schedule_steps, min_ratio=cfg.min_lr_ratio)


def sft_train(cfg: TinyModelConfig, tok, *, progress: bool = True, on_step=None):
    """Train from scratch for ``cfg.sft_steps``; returns (model, per-step losses).

    ``on_step(step, model)``, if given, runs after each optimizer step (it must leave the
    model's weights alone); the build itself does not use it.
    """
    import torch
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from transformers import AutoModelForCausalLM

    from agentrl.trainer.optim import MuonAdamW

    start = time.perf_counter()
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    model = AutoModelForCausalLM.from_config(tiny_config(cfg.hidden_size, cfg.num_layers, cfg.mlp_ratio))
    model.train()
    make = MuonAdamW if cfg.optimizer == "muon" else lambda m, **kw: torch.optim.AdamW(m.parameters(), **kw)
    optim = make(model, lr=cfg.lr, betas=(0.9, 0.99), weight_decay=cfg.weight_decay)
    columns = (TextColumn("sft"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("loss {task.fields[loss]:.3f}"))
    losses: list[float] = []
    with Progress(*columns, disable=not progress, transient=False) as bar:
        task = bar.add_task("sft", total=cfg.sft_steps, loss=float("nan"))
        for step in range(cfg.sft_steps):
            input_ids, labels = training_batch(cfg, tok, step)
            logits = model(input_ids=input_ids).logits  # right padding: pads sit after every real token
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1), ignore_index=-100)
            for group in optim.param_groups:
                group["lr"] = lr_at(cfg, step)
            optim.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optim.step()
            losses.append(loss.item())
            recent = sum(losses[-20:]) / len(losses[-20:])
            bar.update(task, advance=1, loss=recent)
            if progress and not bar.console.is_terminal and (step + 1) % max(1, cfg.sft_steps // 10) == 0:
                # No live bar in a log file: a plain line every tenth of the run instead.
                bar.console.print(f"sft step {step + 1}/{cfg.sft_steps} loss {recent:.3f} "
                                  f"{time.perf_counter() - start:.0f} s")
            if on_step is not None:
                on_step(step, model)
    return model, losses


def build_tiny_model(cfg: TinyModelConfig, out_dir: str | Path, *, progress: bool = True) -> dict[str, Any]:
    """Train the demo model per ``cfg``, save it to ``out_dir``, evaluate it; returns build info."""
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own bar only
    start, cpu_start = time.perf_counter(), time.process_time()
    tok = build_tokenizer()
    model, losses = sft_train(cfg, tok, progress=progress)
    train_seconds = time.perf_counter() - start
    train_cpu_seconds = time.process_time() - cpu_start

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.eval()
    model.save_pretrained(str(out))
    save_tokenizer(out)
    save_config(cfg, out / BUILD_CONFIG)

    metrics = evaluate(model, tok, problems=cfg.eval_problems, sample=cfg.eval_sample,
                       tool_problems=cfg.eval_tool_problems, seed=cfg.eval_seed,
                       batch_size=cfg.eval_batch_size)
    info = {
        **metrics,
        "parameters": sum(p.numel() for p in model.parameters()),
        "final_loss": sum(losses[-20:]) / len(losses[-20:]),
        "train_seconds": round(train_seconds, 1),
        "train_cpu_seconds": round(train_cpu_seconds, 1),  # all threads; wall time on a shared machine varies
        "steps_per_second": round(cfg.sft_steps / train_seconds, 3),
        "seconds": round(time.perf_counter() - start, 1),
        "torch": torch.__version__,
        "config": to_dict(cfg),
    }
    (out / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n")
    return info


# --------------------------------------------------------------------------- evaluation


def load_model(model_dir: str | Path):
    """(model, tokenizer) from a saved directory, offline; a clear ModelError if it is not one."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one line per figure on the console, no loading bars
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise ModelError(f"{str(path)!r} is not a model directory (no config.json); "
                         "build one with `agentrl model tiny --out DIR`")
    from safetensors import SafetensorError

    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, SafetensorError) as e:
        raise ModelError(f"cannot load the model in {str(path)!r}: {e}".replace("\n", " ")) from e
    model.eval()
    return model, tok


def greedy_complete(model, tok, prompts: list[list[int]], max_new_tokens: int, batch_size: int = 250) -> list[str]:
    """Greedy completions (special tokens dropped) of token-id prompts, in fixed-order batches."""
    import torch

    end_id = tok.convert_tokens_to_ids(END)
    outs: list[str] = []
    with torch.inference_mode():
        for i in range(0, len(prompts), batch_size):
            chunk = prompts[i : i + batch_size]
            width = max(len(p) for p in chunk)
            ids = torch.full((len(chunk), width), tok.pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, p in enumerate(chunk):  # left padding, so every prompt ends at the last column
                ids[row, width - len(p):] = torch.tensor(p)
                mask[row, width - len(p):] = 1
            gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                 do_sample=False, eos_token_id=end_id, pad_token_id=tok.pad_token_id)
            outs += tok.batch_decode(gen[:, width:], skip_special_tokens=True)
    return outs


def _prompt_ids(tok, messages, tools=None) -> list[int]:
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def arith_correct(model, tok, problems: list[ArithProblem], batch_size: int = 250) -> list[bool]:
    """Per problem: whether the greedy answer's last ``\\boxed{}`` is the right integer."""
    prompts = [_prompt_ids(tok, [{"role": "user", "content": p.question}]) for p in problems]
    texts = greedy_complete(model, tok, prompts, max_new_tokens=16, batch_size=batch_size)
    return [extract_answer(t) == p.answer for p, t in zip(problems, texts, strict=True)]


def arith_accuracy(model, tok, problems: list[ArithProblem], batch_size: int = 250) -> float:
    """Share of problems whose greedy answer's last ``\\boxed{}`` is the right integer."""
    return sum(arith_correct(model, tok, problems, batch_size)) / max(1, len(problems))


def tool_metrics(model, tok, problems: list[ArithProblem], batch_size: int = 250) -> dict[str, float]:
    """With the calculator offered: the share of well-formed calculator calls, of calls with the
    problem's exact expression, and of right final answers after running the model's own call."""
    if not problems:
        return {}
    user = [[{"role": "user", "content": p.question}] for p in problems]
    firsts = greedy_complete(model, tok, [_prompt_ids(tok, u, [CALCULATOR_TOOL]) for u in user], 96, batch_size)
    well_formed, exact, followups = 0, 0, []
    for p, u, text in zip(problems, user, firsts, strict=True):
        calls = parse_tool_calls(text).calls
        expr = calls[0].arguments.get("expression") if len(calls) == 1 else None
        if not (len(calls) == 1 and calls[0].name == "calculator" and isinstance(expr, str)):
            continue
        well_formed += 1
        exact += expr == p.expression
        try:
            result = calculate(expr)
        except ValueError as e:
            result = f"error: {e}"
        call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expr}}}
        convo = u + [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": result}]
        followups.append((p, _prompt_ids(tok, convo, [CALCULATOR_TOOL])))
    finals = greedy_complete(model, tok, [ids for _, ids in followups], 16, batch_size) if followups else []
    right = sum(extract_answer(t) == p.answer for (p, _), t in zip(followups, finals, strict=True))
    n = len(problems)
    return {"tool_call_rate": well_formed / n, "tool_expression_rate": exact / n, "tool_accuracy": right / n}


def evaluate(model, tok, *, problems: int, seed: int = 0, sample: int | None = None,
             tool_problems: int = 0, batch_size: int = 250) -> dict[str, Any]:
    """Greedy accuracy on a+b+c of the evaluation pool (the headline), a+b, and with the calculator tool."""
    held = generate_problems(problems, seed)
    correct = arith_correct(model, tok, held, batch_size)
    info: dict[str, Any] = {"accuracy": sum(correct) / max(1, problems), "eval_problems": problems, "eval_seed": seed}
    if sample is not None:  # the first `sample` of the same generations (batching may flip a float tie)
        info["sample_problems"] = min(sample, problems)
        info["sample_accuracy"] = sum(correct[:sample]) / max(1, info["sample_problems"])
    info["accuracy_two_terms"] = arith_accuracy(model, tok, generate_problems(
        min(problems, 500), seed, num_terms=(2,)), batch_size)
    info.update(tool_metrics(model, tok, generate_problems(tool_problems, seed + 1), batch_size))
    return info


def evaluate_model_dir(model_dir: str | Path, *, problems: int = 1000, seed: int = 0,
                       tool_problems: int = 0, threads: int = 2) -> dict[str, Any]:
    """Load a saved model and evaluate it (see ``evaluate``)."""
    import torch

    torch.set_num_threads(threads)
    model, tok = load_model(model_dir)
    return evaluate(model, tok, problems=problems, seed=seed, tool_problems=tool_problems)
