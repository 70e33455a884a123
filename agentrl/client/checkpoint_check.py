"""``check_checkpoint``: refuse a broken checkpoint before a server that cannot refuse it loads it.

What it is: the client-side check of a Hugging Face checkpoint directory (``*.safetensors``)
against the one a server serves now — every tensor of the reference present with the same
shape and dtype, no unknown tensors, files not truncated, every value finite — read from
the files' headers and a memory map, without torch. ``agentrl serve`` runs the same checks
itself and keeps serving the old weights when they fail; vLLM's ``reload_weights`` has none
(a missing file ends the server), so ``RemoteEngine`` calls this before asking vLLM to load.
What it is not: a loader, or a check of what the weights compute.
"""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path

import numpy as np

from agentrl.errors import RequestRejected

log = logging.getLogger(__name__)
_unreadable: set[str] = set()

# safetensors dtype -> (numpy dtype to read it as, whether to check finiteness by exponent bits)
_DTYPES = {"F64": (np.float64, False), "F32": (np.float32, False), "F16": (np.float16, False),
           "BF16": (np.uint16, True), "I64": (np.int64, None), "I32": (np.int32, None), "I16": (np.int16, None),
           "I8": (np.int8, None), "U8": (np.uint8, None), "BOOL": (np.bool_, None)}


def read_headers(model_dir: str | Path) -> dict[str, tuple[Path, str, tuple[int, ...], int, int]]:
    """name -> (file, dtype, shape, start, end) of every tensor of the directory's safetensors."""
    model_dir = Path(model_dir)
    files = sorted(model_dir.glob("*.safetensors"))
    if not model_dir.is_dir() or not files:
        raise RequestRejected(f"checkpoint {str(model_dir)!r} has no *.safetensors files; "
                              "expected a Hugging Face model directory", 400)
    out: dict[str, tuple[Path, str, tuple[int, ...], int, int]] = {}
    for f in files:
        size = f.stat().st_size
        try:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                if n > size - 8:
                    raise ValueError(f"header of {n} bytes in a file of {size}")
                header = json.loads(fh.read(n))
        except (struct.error, ValueError) as e:
            raise RequestRejected(f"checkpoint file {str(f)!r} is not a safetensors file ({e})", 400) from None
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            start, end = (int(x) for x in meta["data_offsets"])
            if 8 + n + end > size:
                raise RequestRejected(f"checkpoint file {str(f)!r} is truncated: tensor {name!r} ends at byte "
                                      f"{8 + n + end} of {size}", 400)
            out[name] = (f, str(meta["dtype"]), tuple(int(d) for d in meta["shape"]), 8 + n + start, 8 + n + end)
    return out


def check_checkpoint(path: str | Path, reference: str | Path | None = None) -> None:
    """Raise ``RequestRejected`` (400) naming the first problem of the checkpoint at ``path``.
    A ``reference`` this process cannot read (a server on another machine) is skipped, said once."""
    new = read_headers(path)
    if reference is not None and not any(Path(reference).glob("*.safetensors")):
        if str(reference) not in _unreadable:
            _unreadable.add(str(reference))
            log.warning("the served model %r is not a directory this process can read: new checkpoints are checked "
                        "for truncation and non-finite values only, not against the served tensors", str(reference))
        reference = None
    if reference is not None:
        ref = read_headers(reference)
        missing = sorted(set(ref) - set(new))
        extra = sorted(set(new) - set(ref))
        if missing or extra:
            what = f"lacks {missing[:3]}" if missing else f"has unknown tensors {extra[:3]}"
            raise RequestRejected(f"checkpoint {str(path)!r} {what} (compared with the served {str(reference)!r})",
                                  400)
        for name, (_, dtype, shape, _, _) in new.items():
            _, rdtype, rshape, _, _ = ref[name]
            if shape != rshape or dtype != rdtype:
                raise RequestRejected(f"checkpoint {str(path)!r}: tensor {name!r} is {dtype}{list(shape)}, the "
                                      f"served model's is {rdtype}{list(rshape)}", 400)
    for name, (f, dtype, _, start, end) in new.items():
        kind = _DTYPES.get(dtype)
        if kind is None or kind[1] is None or end == start:
            continue
        values = np.memmap(f, dtype=kind[0], mode="r", offset=start, shape=((end - start) // np.dtype(kind[0]).itemsize,))
        bad = ((values & 0x7F80) == 0x7F80).any() if kind[1] else not np.isfinite(values).all()
        if bad:
            raise RequestRejected(f"checkpoint {str(path)!r}: tensor {name!r} holds non-finite values (NaN or inf)",
                                  400)
