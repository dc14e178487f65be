"""Reading safetensors files without trusting them: the header is parsed and checked here
before any tensor data is touched, and tensors are read with ``os.pread`` (no memory map, so a
file truncated while loading is an error, not a ``SIGBUS``; the GIL is released while reading).

The format (https://huggingface.co/docs/safetensors): 8 bytes little-endian ``N``, then ``N``
bytes of JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``,
then the data; offsets count from the end of the header. Checked here, from the header alone:
``N <= MAX_HEADER_BYTES`` and ``8 + N <= file size``; every dtype known; every shape a list of
non-negative integers; ``end - begin == prod(shape) * itemsize(dtype)``; every range inside the
file; no two ranges overlapping.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
import threading
from typing import Any

import numpy as np

from agentrl_jax.models.checkpoint_files import read_exactly, read_into
from agentrl_jax.models.weights import CheckpointError, LoadCancelled

#: header bytes at most: the format allows 100 MB; a real model's header is about 150 bytes per
#: tensor (a 1000-layer single file: ~2 MB), so a much larger one is refused unread
MAX_HEADER_BYTES = 16 * 1024**2
#: tensors are read in pieces of at most this many bytes, checking the cancel flag between them
READ_PIECE_BYTES = 256 * 1024**2

#: safetensors dtype -> bytes per element (the format's whole-byte types)
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
               "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
               "I64": 8, "U64": 8, "F64": 8, "C64": 8}
#: dtypes a weight may be stored in (little-endian), and their NumPy types
WEIGHT_DTYPES = ("F16", "BF16", "F32", "F64")
#: the smallest bytes per parameter of a weight dtype (the parameter-count check)
MIN_WEIGHT_BYTES = min(DTYPE_BYTES[d] for d in WEIGHT_DTYPES)


def _numpy_dtype(dtype: str) -> np.dtype:
    if dtype == "BF16":
        from jax.numpy import bfloat16
        return np.dtype(bfloat16)
    return np.dtype({"F16": "<f2", "F32": "<f4", "F64": "<f8"}[dtype])


@dataclasses.dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors file: ``dtype``, ``shape``, and its absolute byte range
    ``[start, end)`` in ``path``."""

    path: str
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def _entry(path: str, name: str, info: Any, data_start: int, file_size: int) -> TensorEntry:
    where = f"{path}: tensor {name!r}"
    if not isinstance(info, dict):
        raise CheckpointError(f"{where}: header entry must be an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in DTYPE_BYTES:
        raise CheckpointError(f"{where}: unknown dtype {dtype!r} (known: "
                              f"{', '.join(DTYPE_BYTES)})")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise CheckpointError(f"{where}: shape must be a list of non-negative integers, "
                              f"got {shape!r}")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(type(o) is int and o >= 0 for o in offsets) or offsets[0] > offsets[1]):
        raise CheckpointError(f"{where}: data_offsets must be [begin, end] with "
                              f"0 <= begin <= end, got {offsets!r}")
    declared = math.prod(shape) * DTYPE_BYTES[dtype]
    if offsets[1] - offsets[0] != declared:
        raise CheckpointError(f"{where}: shape {shape} of {dtype} is {declared} bytes, but its "
                              f"data_offsets {offsets} span {offsets[1] - offsets[0]}")
    start, end = data_start + offsets[0], data_start + offsets[1]
    if end > file_size:
        raise CheckpointError(f"{where}: data ends at byte {end}, past the end of the file "
                              f"({file_size} bytes)")
    return TensorEntry(path, name, dtype, tuple(shape), start, end)


def read_header(fd: int, file_size: int, path: str) -> dict[str, TensorEntry]:
    """The tensors of the safetensors file open as ``fd`` (``file_size`` bytes), from its
    header alone (see the module docstring for what is checked); ``CheckpointError`` naming
    ``path`` and the defect otherwise. Reads at most ``8 + MAX_HEADER_BYTES`` bytes."""
    if file_size < 8:
        raise CheckpointError(f"{path}: not a safetensors file ({file_size} bytes)")
    (length,) = struct.unpack("<Q", read_exactly(fd, 8, 0, path))
    if length > MAX_HEADER_BYTES:
        raise CheckpointError(f"{path}: header of {length} bytes is larger than the "
                              f"{MAX_HEADER_BYTES} this loader accepts")
    if 8 + length > file_size:
        raise CheckpointError(f"{path}: header of {length} bytes does not fit in the file "
                              f"({file_size} bytes)")
    try:
        header = json.loads(read_exactly(fd, length, 8, path))
    except (ValueError, RecursionError) as e:
        raise CheckpointError(f"{path}: header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header must be a JSON object")
    header.pop("__metadata__", None)
    entries = {name: _entry(path, name, info, 8 + length, file_size)
               for name, info in header.items()}
    previous: TensorEntry | None = None
    for entry in sorted(entries.values(), key=lambda e: (e.start, e.end)):
        if previous is not None and entry.start < previous.end and entry.nbytes:
            raise CheckpointError(f"{path}: tensors {previous.name!r} and {entry.name!r} "
                                  "overlap in the file")
        if entry.nbytes:
            previous = entry
    return entries


def read_tensor(fd: int, entry: TensorEntry, cancel: threading.Event | None = None
                ) -> np.ndarray:
    """The array of ``entry`` (a weight dtype) from ``fd``, read in pieces of at most
    ``READ_PIECE_BYTES``; ``LoadCancelled`` once ``cancel`` is set."""
    if entry.dtype not in WEIGHT_DTYPES:
        raise CheckpointError(f"{entry.path}: tensor {entry.name!r} is {entry.dtype}; weights "
                              f"must be one of {', '.join(WEIGHT_DTYPES)}")
    out = np.empty(entry.nbytes, np.uint8)
    for begin in range(0, entry.nbytes, READ_PIECE_BYTES):
        if cancel is not None and cancel.is_set():
            raise LoadCancelled(f"{entry.path}: loading was cancelled")
        size = min(READ_PIECE_BYTES, entry.nbytes - begin)
        read_into(fd, memoryview(out)[begin:begin + size], entry.start + begin, entry.path)
    return out.view(_numpy_dtype(entry.dtype)).reshape(entry.shape)
