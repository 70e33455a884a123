"""Drives ``agentrl serve`` with SGLang's frontend language, unchanged: ``gen``, ``select`` and
streaming through ``RuntimeEndpoint``. Run by ``test_sglang_frontend.py`` with the sglang wheel
on PYTHONPATH; prints one JSON line of what it saw.

``import sglang`` runs the package's ``__init__``, which sets up SGLang's *server* runtime and
imports triton and CUDA helpers; the frontend language does not need it. So the ``sglang``
package object is created without running that file, and ``sglang.lang`` — the frontend
itself — is imported and used as published.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

root = Path(importlib.util.find_spec("sglang").submodule_search_locations[0])
package = types.ModuleType("sglang")
package.__path__ = [str(root)]
sys.modules["sglang"] = package

from sglang.lang.api import function, gen, select, set_default_backend  # noqa: E402
from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint  # noqa: E402

url, api_key = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
set_default_backend(RuntimeEndpoint(url, api_key=api_key))


@function
def quiz(s, question):
    s += question
    s += gen("answer", max_tokens=8, temperature=0)
    s += "\nPick one: "
    s += select("pick", choices=["red", "green", "blue"])


state = quiz.run(question="Q: what colour is the sky?\nA:")
streamed = quiz.run(question="Q: what colour is the sky?\nA:", stream=True)
chunks = list(streamed.text_iter("answer"))
meta = state.get_meta_info("pick")
print(json.dumps({"answer": state["answer"], "pick": state["pick"], "text": state.text(),
                  "normalized_prompt_logprobs": meta["normalized_prompt_logprobs"],
                  "streamed_answer": "".join(chunks), "streamed_pick": streamed["pick"]}))
