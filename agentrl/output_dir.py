"""Output directories: where a command may write, and how it replaces its own earlier output.

What it is: ``claim_output_dir(out, inputs=..., force=...)`` — the one check every command with
an ``--out`` runs before it writes (``agentrl model merge``, ``agentrl replay``). A command owns
only what it made, so the target is refused when it is:

- empty (``--out ''``) or an existing file;
- one of the command's inputs, a parent of one (a run directory, ``runs/``), or inside one (the
  adapter it reads, the base model it merges into);
- a non-empty directory, unless the user passed ``--force``.

``replace_dir(tmp, out)`` puts a finished output (built in ``staging_dir(out)``, a fresh sibling)
in place of ``out``; it removes ``out`` only after ``claim_output_dir`` allowed it.

What it is not: a lock (two commands writing the same target at once race), nor a guard for
the run directory of ``agentrl train`` (``agentrl.run.run_lock``).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from agentrl.errors import ConfigError


def _is_within(path: Path, other: Path) -> bool:
    return path == other or other in path.parents


def claim_output_dir(out: str | Path, *, inputs: Iterable[str | Path] = (), force: bool = False,
                     flag: str = "--out") -> Path:
    """``out`` as a ``Path`` once it may be written (see the module doc); raises ``ConfigError``
    naming ``flag`` and what to do otherwise. ``inputs`` are the paths the command reads."""
    if not str(out).strip():
        raise ConfigError(f"{flag} is empty; give the directory to write, e.g. {flag} merged/")
    target = Path(out)
    resolved = target.resolve()
    for source in inputs:
        src = Path(source).resolve()
        if _is_within(src, resolved):
            what = "is" if src == resolved else "holds"
            raise ConfigError(f"{flag} {str(out)!r} {what} the input {str(source)!r}; writing there would "
                              "destroy it: give a new directory")
        if _is_within(resolved, src):
            raise ConfigError(f"{flag} {str(out)!r} lies inside the input {str(source)!r}; give a directory "
                              "outside it")
    if target.exists() and not target.is_dir():
        raise ConfigError(f"{flag} {str(out)!r} is a file, not a directory; give a directory")
    if target.is_dir() and any(target.iterdir()) and not force:
        raise ConfigError(f"{flag} {str(out)!r} exists and is not empty; give a new directory, or pass --force "
                          "to replace what is there")
    return target


def staging_dir(out: Path) -> Path:
    """A fresh, empty directory beside ``out`` (same file system, so ``replace_dir`` is a rename)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))


def replace_dir(tmp: Path, out: Path) -> Path:
    """Move the finished ``tmp`` to ``out``, removing what ``claim_output_dir`` let it replace."""
    if out.is_dir():
        shutil.rmtree(out)
    tmp.rename(out)
    return out
