"""GenerateConfig: the settings of task generation (``agentrl tasks generate``), each documented.

What it is: the config of ``envs/repo/generate.py``, in a module of its own so that the CLI
builds its flags without importing Docker or swebench. What it is not: the generator.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from agentrl.config import check_options, option


@dataclass
class GenerateConfig:
    """What ``agentrl tasks generate`` makes, from which repository, and how hard it tries."""

    repo: str = option(help="the local Python repository (a checkout or an unpacked sdist) with a pytest suite")
    out: str = option(help="folder the instances, the split and the Harbor task directories are written to")
    name: str = option("", help="the repository's name in ids and image tags; empty: the folder's name")
    seed: int = option(0, help="seeds the candidates' order and rewrites, and the held-out modules")
    max_candidates: int = option(200, help="candidate bugs tried, at most (0: every one)", ge=0)
    include: str = option("", help="only source files under these path prefixes, comma-separated (default: every one)")
    requirements: str = option("pytest==8.3.5", help="wheels installed in the image: pip specs, comma-separated")
    heldout_share: float = option(0.25, help="share of the modules (rounded up) whose bugs are held out", ge=0, le=1)
    max_fail_to_pass: int = option(50, help="drop a bug that breaks more tests than this", ge=1)
    test_timeout_s: float = option(300.0, help="limit of one run of the test suite", gt=0)
    concurrency: int = option(2, help="worker containers running candidates at once", ge=1)
    harbor: bool = option(True, help="write a Harbor task directory per instance too")

    def __post_init__(self) -> None:
        check_options(self)
        self.repo = str(Path(self.repo).resolve())
        self.name = re.sub(r"[^a-z0-9_.-]", "-", (self.name or Path(self.repo).name).lower())

    @property
    def prefixes(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.include.split(",") if p.strip())

    @property
    def pip_specs(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.requirements.split(",") if p.strip())
