"""The tiny demo model's chat format as a tinker-cookbook renderer, and the cookbook's math_rl with it.

Runs in the SDK's environment (``make tinker`` makes ``.venv-tinker``), against ``agentrl service``.
The cookbook picks a renderer from its table of known models; the tiny model is not in it, so this
file registers one through the cookbook's own extension point (``renderers.register_renderer``):
each turn is ``<|role|>content<|end|>`` as the model's chat template writes it, and a reply ends
at ``<|end|>`` (the model's EOS, its stop token). With it the tiny model sees the arithmetic env's
questions the way it was trained to see questions. Usage::

    TINKER_BASE_URL=http://127.0.0.1:8000 TINKER_API_KEY=tml-... \\
        .venv-tinker/bin/python examples/tinker_cookbook_tiny.py model_name=$PWD/examples/tiny-model \\
        env=arithmetic loss_fn=importance_sampling max_tokens=12 max_steps=20 log_path=runs/cookbook-arith

(every ``key=value`` of ``tinker_cookbook.recipes.math_rl.train``; ``renderer_name`` is set here).
"""

from __future__ import annotations

import asyncio

import tinker
from tinker_cookbook import renderers
from tinker_cookbook.renderers.base import Message, ParseTermination, RenderContext, RenderedMessage, Renderer

NAME = "agentrl/tiny"
END = "<|end|>"


class TinyRenderer(Renderer):
    """``<|user|>question<|end|><|assistant|>answer<|end|>``: the tiny model's chat template."""

    @property
    def has_extension_property(self) -> bool:
        return True  # nothing of a turn is dropped when the conversation goes on

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        def chunk(text: str) -> tinker.types.EncodedTextChunk:
            return tinker.types.EncodedTextChunk(tokens=self.tokenizer.encode(text, add_special_tokens=False))

        return RenderedMessage(header=chunk(f"<|{message['role']}|>"),
                               output=[chunk(f"{message['content']}{END}")])

    def get_stop_sequences(self) -> list[int]:
        return [self.tokenizer.eos_token_id]

    def parse_response(self, response: list[int]) -> tuple[Message, ParseTermination]:
        ended = bool(response) and response[-1] == self.tokenizer.eos_token_id
        text = self.tokenizer.decode(response[:-1] if ended else response)
        return Message(role="assistant", content=text), (ParseTermination.STOP_SEQUENCE if ended
                                                          else ParseTermination.MALFORMED)


def register() -> str:
    """Register the renderer with the cookbook; its name."""
    renderers.register_renderer(NAME, lambda tokenizer, image_processor=None: TinyRenderer(tokenizer))
    return NAME


if __name__ == "__main__":
    import chz
    from tinker_cookbook.recipes.math_rl.train import CLIConfig, cli_main

    config = chz.entrypoint(CLIConfig)
    asyncio.run(cli_main(chz.replace(config, renderer_name=register())))
