"""The byte-level tokenizer and chat template of agentrl's tiny demo model.

What it is: a `tokenizers` tokenizer whose ids 0..255 are the 256 bytes (so any Unicode
text round-trips, and tokenizing a concatenation equals concatenating the tokenizations:
token streams stay exact across turns), plus a few special tokens and a Jinja chat
template saved in ``tokenizer_config.json``. It loads offline with
``transformers.AutoTokenizer.from_pretrained(DIR)``. What it is not: a tokenizer for real
checkpoints, which bring their own.

Rendered conversation (one line here, no newlines added between turns)::

    <|system|>SYSTEM [\n# Tools\n + one signature per tool and line]<|end|>
    <|user|>QUESTION<|end|>
    <|assistant|>TEXT<tool_call>{"name": ..., "arguments": {...}}</tool_call><|end|>
    <|tool|>RESULT<|end|>
    <|assistant|>            <- add_generation_prompt

``<|end|>`` is the end-of-turn (EOS) token the model emits to stop. A tool is rendered as
its signature, ``calculator(expression: string) - Evaluate an integer arithmetic
expression.`` (``?`` marks an optional argument), not as its JSON schema: every byte is a
token here, and the schema tripled the length of a calculator trace.
"""

from __future__ import annotations

import json
from pathlib import Path

PAD = "<pad>"
END = "<|end|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>")
SPECIAL_TOKENS = (PAD, END, *ROLE_TOKENS)
NUM_BYTES = 256
VOCAB_SIZE = NUM_BYTES + len(SPECIAL_TOKENS)

CHAT_TEMPLATE = (
    "{%- set ns = namespace(start=0) -%}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set ns.start = 1 -%}"
    "<|system|>{{ messages[0]['content'] }}"
    "{%- if tools %}{{ '\\n' }}{% endif -%}"
    "{%- elif tools -%}"
    "<|system|>"
    "{%- endif -%}"
    "{%- if tools -%}"
    "{{ '# Tools\\n' }}"
    "{%- for t in tools -%}"
    "{%- set f = t['function'] if 'function' in t else t -%}"
    "{%- set params = f.get('parameters') or {} -%}"
    "{%- set required = params.get('required') or [] -%}"
    "{{ f['name'] }}("
    "{%- for k, v in (params.get('properties') or {}).items() -%}"
    "{{ ', ' if not loop.first }}{{ k }}{{ '' if k in required else '?' }}: {{ v.get('type', 'any') }}"
    "{%- endfor -%}"
    ")"
    "{%- if f.get('description') %} - {{ f['description'] }}{% endif -%}"
    "{{ '\\n' }}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- if tools or ns.start -%}<|end|>{%- endif -%}"
    "{%- for m in messages[ns.start:] -%}"
    "{%- if m['role'] == 'assistant' -%}"
    "<|assistant|>{{ m['content'] or '' }}"
    "{%- for tc in m.get('tool_calls') or [] -%}"
    "{%- set f = tc['function'] if 'function' in tc else tc -%}"
    "<tool_call>{\"name\": {{ f['name'] | tojson }}, \"arguments\": "
    "{%- if f['arguments'] is string %} {{ f['arguments'] }}{% else %} {{ f['arguments'] | tojson }}{% endif -%}"
    "}</tool_call>"
    "{%- endfor -%}"
    "<|end|>"
    "{%- elif m['role'] == 'tool' -%}"
    "<|tool|>{{ m['content'] }}<|end|>"
    "{%- else -%}"
    "<|{{ m['role'] }}|>{{ m['content'] }}<|end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)


def bytes_to_unicode() -> dict[int, str]:
    """The reversible byte -> printable-character map that byte-level BPE uses.

    Printable Latin-1 bytes map to themselves; the rest are shifted above U+0100 so that
    every byte has a visible, non-whitespace character.
    """
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    mapping = {b: chr(b) for b in keep}
    shift = 0
    for b in range(NUM_BYTES):
        if b not in mapping:
            mapping[b] = chr(NUM_BYTES + shift)
            shift += 1
    return mapping


def build_tokenizer():
    """A `transformers.PreTrainedTokenizerFast` with byte ids 0..255 and the special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = bytes_to_unicode()
    vocab = {byte_chars[b]: b for b in range(NUM_BYTES)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        eos_token=END,
        additional_special_tokens=list(ROLE_TOKENS),
        model_max_length=1024,
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def save_tokenizer(out_dir: str | Path):
    """Build the tokenizer and write ``tokenizer.json`` + ``tokenizer_config.json`` to out_dir."""
    tok = build_tokenizer()
    tok.save_pretrained(str(out_dir))
    return tok


def special_token_ids() -> dict[str, int]:
    """Token -> id for the special tokens (they follow the 256 byte ids in order)."""
    return {t: NUM_BYTES + i for i, t in enumerate(SPECIAL_TOKENS)}


def tool_call_text(name: str, arguments: dict) -> str:
    """How one tool call is written in the model's output (the format the template renders)."""
    return f'<tool_call>{{"name": {json.dumps(name)}, "arguments": {json.dumps(arguments)}}}</tool_call>'
