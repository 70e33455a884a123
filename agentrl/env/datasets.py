"""Dataset rows from local files: JSONL (plain or gzipped), JSON, Parquet, Hugging Face on disk.

What it is: ``load_rows(path)`` -> ``list[dict]`` (one dict per row, the ``options["task"]``
an environment's ``reset`` takes), and ``data_path(name)`` for the datasets shipped in the
repository's ``data/`` folder (GSM8K test, AIME 2024, AMC 2023, HumanEval). What it is not:
a downloader — nothing is fetched from the network, ever. Parquet needs ``pyarrow`` and a
dataset saved with ``datasets.Dataset.save_to_disk`` needs ``datasets``; both are optional,
and their absence is a clear error, not a silent fallback. ``dataset_rows(spec, seed)`` reads a
run's ``rollout.dataset``/``eval.dataset``: such a file, or the rows a ``module:function(seed)``
gives (``check_dataset`` refuses a spec that names neither, by its key).

Main hook::

    rows = load_rows(data_path("gsm8k_test.jsonl"), limit=100)
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError

DATA_ENV_VAR = "AGENTRL_DATA_DIR"
SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".parquet")


def data_dir() -> Path:
    """Where shipped datasets live: ``$AGENTRL_DATA_DIR``, else the repository's ``data/``."""
    override = os.environ.get(DATA_ENV_VAR)
    return Path(override) if override else Path(__file__).resolve().parents[2] / "data"


def data_path(name: str) -> Path:
    """The path of a shipped dataset file, checked to exist."""
    path = data_dir() / name
    if not path.exists():
        have = sorted(p.name for p in data_dir().glob("*")) if data_dir().is_dir() else []
        raise ConfigError(
            f"dataset {name!r} is not in {data_dir()} (it holds: {have or 'nothing'}); "
            f"set {DATA_ENV_VAR} to the folder that has it"
        )
    return path


def load_rows(path: str | Path, *, limit: int | None = None, split: str = "train") -> list[dict[str, Any]]:
    """All rows of a local dataset (the first ``limit`` when given).

    ``path`` is a ``.jsonl``, ``.jsonl.gz``, ``.json`` (a list of objects) or ``.parquet``
    file, or a folder written by ``datasets``' ``save_to_disk`` (``split`` picks the split
    of a DatasetDict).
    """
    path = Path(path)
    if limit is not None and limit < 0:
        raise ConfigError(f"limit must be >= 0 or None, got {limit}")
    if not path.exists():
        raise ConfigError(f"dataset {str(path)!r} does not exist; pass a local file ({', '.join(SUFFIXES)}) "
                          "or a folder saved with datasets' save_to_disk")
    if path.is_dir():
        rows = _load_hf_dir(path, split)
    elif path.name.endswith((".jsonl", ".jsonl.gz")):
        rows = _load_jsonl(path, limit)
    elif path.suffix == ".json":
        rows = _load_json(path)
    elif path.suffix == ".parquet":
        rows = _load_parquet(path)
    else:
        raise ConfigError(f"dataset {str(path)!r}: unknown format; expected one of {', '.join(SUFFIXES)} "
                          "or a save_to_disk folder")
    return rows if limit is None else rows[:limit]


def _load_jsonl(path: Path, limit: int | None) -> list[dict[str, Any]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    rows: list[dict[str, Any]] = []
    with opener(path, "rt", encoding="utf-8", errors="strict") as f:
        for lineno, line in enumerate(_utf8_lines(f, path), 1):
            if limit is not None and len(rows) >= limit:
                break
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}:{lineno}: not valid JSON ({e.msg}); each line must be one object") from e
            except RecursionError:
                raise ConfigError(f"{path}:{lineno}: JSON nested too deeply to read; each line must be one "
                                  "object") from None
            if not isinstance(row, dict):
                raise ConfigError(f"{path}:{lineno}: expected a JSON object per line, got {type(row).__name__}")
            rows.append(row)
    return rows


def _utf8_lines(f: Any, path: Path) -> Any:
    """The lines of a text file, a decoding error as one line naming the file."""
    try:
        yield from f
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start} of a block); a dataset is UTF-8 JSON") from None


def _load_json(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from e
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise ConfigError(f"{path}: a .json dataset must be a list of objects; use .jsonl for one object per line")
    return data


def _load_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ConfigError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow), "
                          "or convert the file to .jsonl") from e
    import pyarrow

    try:
        return pq.read_table(path).to_pylist()
    except (pyarrow.ArrowException, OSError) as e:  # not Parquet, or cut short
        raise ConfigError(f"{path}: not a readable Parquet file ({str(e)[:120]}); pass a Parquet file or "
                          "convert it to .jsonl") from None


def _load_hf_dir(path: Path, split: str) -> list[dict[str, Any]]:
    if not any((path / marker).exists() for marker in ("dataset_info.json", "state.json", "dataset_dict.json")):
        raise ConfigError(f"{path} is a folder but not one saved with datasets' save_to_disk; "
                          f"pass a data file ({', '.join(SUFFIXES)})")
    try:
        import datasets
    except ImportError as e:
        raise ConfigError(f"{path} was saved by Hugging Face datasets, which is not installed "
                          "(pip install datasets)") from e
    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise ConfigError(f"{path}: no split {split!r}; it has {sorted(ds)}")
        ds = ds[split]
    return [dict(r) for r in ds]


def dataset_file(spec: str) -> Path | None:
    """The file a dataset spec names — a path, or the name of a file shipped in ``data/`` —
    or None when the spec is an import path (``module:function``)."""
    if not spec.endswith(SUFFIXES):
        return None
    if Path(spec).is_file():
        return Path(spec)
    return data_path(spec)  # raises ConfigError naming what data/ holds


def dataset_rows(spec: str, seed: int) -> list[dict[str, Any]]:
    """The rows of ``rollout.dataset``/``eval.dataset``: a data file (a path, or a file shipped in
    ``data/``), or ``module:function(seed)``."""
    from agentrl.plugins import load_object

    path = dataset_file(spec)
    if path is not None:
        return list(load_rows(path))
    rows = list(load_object(spec)(seed))
    if not all(isinstance(r, dict) for r in rows):
        raise ConfigError(f"dataset {spec!r} must give dicts (one row per episode)")
    return rows


def check_dataset(key: str, spec: str) -> None:
    """Refuse a dataset spec (the config key ``key``) that is neither a data file nor an import
    path that resolves; importing it may register the environments its module provides."""
    from agentrl.plugins import load_object

    try:
        if dataset_file(spec) is None:
            load_object(spec)
    except ConfigError as e:
        raise ConfigError(f"config key {key!r}: {e}") from e
