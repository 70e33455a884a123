"""The local dataset loader and the shipped data: formats, limits, and errors that say what to do."""

from __future__ import annotations

import gzip
import json

import pytest

from agentrl.env.datasets import data_path, load_rows
from agentrl.errors import ConfigError


def test_shipped_datasets_are_complete():
    assert len(load_rows(data_path("gsm8k_test.jsonl"))) == 1319
    assert len(load_rows(data_path("aime24_test.jsonl"))) == 30
    assert len(load_rows(data_path("amc23_test.jsonl"))) == 40
    humaneval = load_rows(data_path("HumanEval.jsonl.gz"))
    assert len(humaneval) == 164 and {"prompt", "entry_point", "test", "canonical_solution"} <= set(humaneval[0])


def test_jsonl_gz_json_and_limit(tmp_path):
    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(5)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    with gzip.open(tmp_path / "a.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    (tmp_path / "a.json").write_text(json.dumps(rows))
    for name in ("a.jsonl", "a.jsonl.gz", "a.json"):
        assert load_rows(tmp_path / name) == rows
        assert load_rows(tmp_path / name, limit=2) == rows[:2]


def test_errors_name_the_problem(tmp_path, monkeypatch):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n{oops\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: not valid JSON"):
        load_rows(bad)
    (tmp_path / "list.jsonl").write_text("[1, 2]\n")
    with pytest.raises(ConfigError, match="a JSON object per line"):
        load_rows(tmp_path / "list.jsonl")
    with pytest.raises(ConfigError, match="does not exist"):
        load_rows(tmp_path / "missing.jsonl")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ConfigError, match="unknown format"):
        load_rows(tmp_path / "x.csv")
    with pytest.raises(ConfigError, match="save_to_disk"):
        load_rows(tmp_path)
    monkeypatch.setenv("AGENTRL_DATA_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match="AGENTRL_DATA_DIR"):
        data_path("gsm8k_test.jsonl")


def test_hugging_face_folders_need_datasets(tmp_path):
    (tmp_path / "dataset_info.json").write_text("{}")
    try:
        import datasets
    except ImportError:
        with pytest.raises(ConfigError, match="pip install datasets"):
            load_rows(tmp_path)
        return
    datasets.Dataset.from_list([{"a": 1}]).save_to_disk(str(tmp_path / "saved"))
    assert load_rows(tmp_path / "saved") == [{"a": 1}]


def test_parquet_needs_pyarrow(tmp_path):
    path = tmp_path / "a.parquet"
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        path.write_bytes(b"PAR1")
        with pytest.raises(ConfigError, match="needs pyarrow"):
            load_rows(path)
        return
    pq.write_table(pa.Table.from_pylist([{"a": 1}]), path)
    assert load_rows(path) == [{"a": 1}]
    (tmp_path / "fake.parquet").write_text('{"a": 1}\n')  # issue 49: a traceback
    with pytest.raises(ConfigError, match="fake.parquet: not a readable Parquet file"):
        load_rows(tmp_path / "fake.parquet")


def test_invalid_utf8_and_deep_json_are_one_line(tmp_path):
    """Issue 49: both were tracebacks."""
    (tmp_path / "bin.jsonl").write_bytes(b'{"a": 1}\n{"b": "\xff"}\n')
    with pytest.raises(ConfigError, match="bin.jsonl: not UTF-8 text"):
        load_rows(tmp_path / "bin.jsonl")
    (tmp_path / "deep.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ConfigError, match="deep.jsonl:1: JSON nested too deeply"):
        load_rows(tmp_path / "deep.jsonl")
