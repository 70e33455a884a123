"""The Tinker API's protobuf bodies, read and written without a protobuf runtime.

What it is: the three messages the ``tinker`` SDK (0.38) exchanges as ``application/x-protobuf``
— the ``/api/v1/forward_backward`` request it sends (``read_forward_backward``), and the
``ForwardBackwardOutput`` and ``SampleResponse`` it asks ``/api/v1/retrieve_future`` for with
``Accept: application/x-protobuf`` (``forward_backward_output``, ``sample_response``). Every
other body of the API is JSON. The field numbers are the public schema's, as the SDK declares it
(``tinker/proto/tinker_public_pb2.py``; its converters ``tinker/proto/request_conv.py`` and
``response_conv.py`` show how each tensor is laid out: token ids as int32 bytes, tensors as raw
little-endian bytes of their dtype with a shape, one ``ArrayRecord`` of ``BatchedTensor``s with
byte offsets per datum for the outputs).

The wire format itself is small: a message is a run of (field number, wire type, value) with
varints (type 0), 64-bit (1), length-delimited bytes (2) and 32-bit (5) values; repeated
fields repeat; maps are repeated entries with key 1 and value 2.

What it is not: a general protobuf library (only the fields the SDK sends are read; unknown ones
are skipped, as protobuf does), nor the checks of what the values mean (``agentrl.service.learner``).
A malformed body raises ``WireError`` (a ``Refused``, 400).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentrl.errors import Refused

DTYPES = {1: np.float32, 2: np.int64, 3: np.int32}
"""The public schema's ``DType`` numbers this service reads (bfloat16, 4, never comes from the SDK)."""
FLOAT32, INT64 = 1, 2


class WireError(Refused):
    """A protobuf body that cannot be read."""

    def __init__(self, message: str) -> None:
        super().__init__(f"the protobuf body is malformed: {message}; send it as the tinker SDK does", 400)


# --------------------------------------------------------------------------- reading

def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise WireError("a varint runs past the end")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def fields(buf: bytes) -> dict[int, list[Any]]:
    """Field number -> its values in order (ints for varints and fixed widths, bytes otherwise)."""
    out: dict[int, list[Any]] = {}
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, kind = key >> 3, key & 7
        if kind == 0:
            value, i = _varint(buf, i)
        elif kind == 1:
            value, i = buf[i:i + 8], i + 8
        elif kind == 2:
            size, i = _varint(buf, i)
            value, i = buf[i:i + size], i + size
        elif kind == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise WireError(f"wire type {kind} of field {number} is not one protobuf uses")
        if i > len(buf):
            raise WireError(f"field {number} runs past the end")
        out.setdefault(number, []).append(value)
    return out


def _text(f: dict[int, list[Any]], n: int) -> str:
    return f[n][-1].decode("utf-8", "replace") if n in f else ""


def _double(raw: bytes) -> float:
    return struct.unpack("<d", raw)[0]


def read_tensor(buf: bytes) -> np.ndarray:
    """A ``Tensor`` (dense, or sparse CSR densified with 0) as a numpy array of its shape."""
    f = fields(buf)
    dtype = DTYPES.get(f.get(3, [0])[-1])
    if dtype is None:
        raise WireError(f"tensor dtype {f.get(3, [0])[-1]} is not float32 or int64")
    shape = []
    for raw in f.get(4, []):  # packed (bytes) or one varint per value
        shape += _packed_varints(raw) if isinstance(raw, bytes) else [raw]
    if 2 in f:
        csr = fields(f[2][-1])
        values = np.frombuffer(csr.get(1, [b""])[-1], dtype=dtype)
        crow = np.frombuffer(csr.get(2, [b""])[-1], dtype=np.int64)
        col = np.frombuffer(csr.get(3, [b""])[-1], dtype=np.int64)
        if len(shape) != 2 or len(crow) != shape[0] + 1 or len(col) != len(values):
            raise WireError(f"a sparse tensor's indices do not fit its shape {shape}")
        dense = np.zeros(shape, dtype=dtype)
        for row in range(shape[0]):
            dense[row, col[crow[row]:crow[row + 1]]] = values[crow[row]:crow[row + 1]]
        return dense
    data = np.frombuffer(f.get(1, [b""])[-1], dtype=dtype)
    if shape and int(np.prod(shape)) != data.size:
        raise WireError(f"a tensor of {data.size} values cannot take the shape {shape}")
    return data.reshape(shape) if shape else data


def _packed_varints(raw: bytes) -> list[int]:
    values, i = [], 0
    while i < len(raw):
        v, i = _varint(raw, i)
        values.append(v)
    return values


@dataclass
class Datum:
    """One training example: its input tokens and its named loss inputs (numpy arrays)."""

    tokens: list[int]
    inputs: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class ForwardBackward:
    """A ``ForwardBackwardRequest`` as the SDK sends it."""

    model_id: str
    seq_id: int
    data: list[Datum]
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    forward_only: bool


def read_forward_backward(body: bytes) -> ForwardBackward:
    f = fields(body)
    data = []
    for raw in f.get(3, []):
        d = fields(raw)
        tokens: list[int] = []
        for chunk in d.get(1, []):
            c = fields(chunk)
            if 1 not in c:
                raise WireError("a model input chunk is not encoded text (images and audio are not served here)")
            tokens += np.frombuffer(fields(c[1][-1]).get(1, [b""])[-1], dtype=np.int32).tolist()
        inputs = {}
        for entry in d.get(2, []):
            e = fields(entry)
            inputs[_text(e, 1)] = read_tensor(e.get(2, [b""])[-1])
        data.append(Datum(tokens, inputs))
    config: dict[str, float | str] = {}
    for entry in f.get(5, []):  # the legacy map of numbers
        e = fields(entry)
        config[_text(e, 1)] = _double(e[2][-1]) if 2 in e else 0.0
    for entry in f.get(7, []):  # v2: numbers or text; preferred when set
        e = fields(entry)
        v = fields(e.get(2, [b""])[-1])
        config[_text(e, 1)] = _text(v, 2) if 2 in v else (_double(v[1][-1]) if 1 in v else 0.0)
    return ForwardBackward(model_id=_text(f, 1), seq_id=f.get(2, [0])[-1], data=data, loss_fn=_text(f, 4),
                           loss_fn_config=config, forward_only=bool(f.get(6, [0])[-1]))


# --------------------------------------------------------------------------- writing

def _put_varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def put(number: int, value: bytes | str | int | float) -> bytes:
    """One field: bytes and text length-delimited, ints as varints, floats as doubles."""
    if isinstance(value, float):
        return _put_varint(number << 3 | 1) + struct.pack("<d", value)
    if isinstance(value, int):
        return _put_varint(number << 3) + _put_varint(value)
    raw = value.encode() if isinstance(value, str) else value
    return _put_varint(number << 3 | 2) + _put_varint(len(raw)) + raw


def forward_backward_output(outputs: list[dict[str, np.ndarray]], metrics: dict[str, float]) -> bytes:
    """A ``ForwardBackwardOutput``: one ``ArrayRecord`` whose fields are ``BatchedTensor``s of
    every datum's 1-D array back to back, with byte offsets; then the metrics map."""
    record = put(1, "ArrayRecord") + put(3, len(outputs))
    for name in (outputs[0] if outputs else {}):
        arrays = [np.ascontiguousarray(o[name]) for o in outputs]
        dtype = FLOAT32 if arrays[0].dtype.kind == "f" else INT64
        arrays = [a.astype(np.float32 if dtype == FLOAT32 else np.int64).reshape(-1) for a in arrays]
        offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype(np.int64)
        batched = put(1, b"".join(a.tobytes() for a in arrays)) + put(2, offsets.tobytes()) + put(3, dtype)
        record += put(2, put(1, name) + put(2, batched))
    body = put(1, "ArrayRecord") + (put(2, record) if outputs else b"")
    for key, value in metrics.items():
        body += put(3, put(1, key) + put(2, float(value)))
    return body


@dataclass
class Sequence:
    """One sampled sequence: its tokens, their log-probabilities, and why it stopped."""

    tokens: list[int]
    logprobs: list[float] | None
    stop_reason: str  # "stop" | "length"


def sample_response(sequences: list[Sequence], prompt_logprobs: list[float | None] | None) -> bytes:
    """A ``SampleResponse``; a prompt position without a log-probability is written as NaN,
    which the SDK reads back as None."""
    body = b""
    for s in sequences:
        seq = put(1, 1 if s.stop_reason == "length" else 0) + put(2, np.asarray(s.tokens, np.int32).tobytes())
        if s.logprobs is not None:
            seq += put(3, np.asarray(s.logprobs, np.float32).tobytes())
        body += put(1, seq)
    if prompt_logprobs is not None:
        values = [float("nan") if v is None else v for v in prompt_logprobs]
        body += put(2, np.asarray(values, np.float32).tobytes())
    return body
