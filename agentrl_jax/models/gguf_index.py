"""The tensor index and scalar metadata of a GGUF file, read without materialising its arrays.

``gguf.GGUFReader`` builds a numpy view for every element of every metadata array: for a model
with a 49k-token vocabulary and 48k merges that was about half of the model's load
(docs/PERFORMANCE.md, "Model load: the GGUF header"), though the model needs none of those
strings (the tokenizer is built once and cached: ``models/tokenizer.py``). This reads the same header (GGUF v2 / v3, little-endian)
and keeps scalars, the length of each array and the tensor infos; the tensors' bytes are views
of one ``np.memmap`` that ``gguf.quants.dequantize`` turns into floats. GGUF layout
(https://github.com/ggml-org/ggml/blob/master/docs/gguf.md): magic ``GGUF``, ``uint32`` version,
``uint64`` tensor and key-value counts, the key-value pairs, the tensor infos (name, dims
innermost first, type, offset), padding to ``general.alignment`` (32), the tensor data.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import numpy as np

#: GGUF value types -> struct format of a scalar (8: string, 9: array are read apart)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32


@dataclasses.dataclass(frozen=True)
class ArrayField:
    """A metadata array, not read: its item type and length."""
    item_type: int
    length: int


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One tensor: ``shape`` innermost dimension first (GGUF order), ``data`` its raw bytes."""
    name: str
    shape: tuple[int, ...]
    tensor_type: Any  # gguf.GGMLQuantizationType
    data: np.ndarray  # uint8 view of the file


@dataclasses.dataclass(frozen=True)
class GGUFIndex:
    version: int
    metadata: dict[str, Any]  # scalars and strings as values, arrays as ArrayField
    tensors: list[TensorInfo]


class GGUFFormatError(ValueError):
    """Not a GGUF file this reader handles (see the message); ``gguf.GGUFReader`` may."""


def read_index(path: str) -> GGUFIndex:
    """The header of the GGUF file at ``path`` (module docstring)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    data = np.memmap(path, dtype=np.uint8, mode="r")
    buf = memoryview(data)
    pos = 0

    def take(fmt: str) -> Any:
        nonlocal pos
        value = struct.unpack_from(fmt, buf, pos)[0]
        pos += struct.calcsize(fmt)
        return value

    def string() -> str:
        nonlocal pos
        n = take("<Q")
        text = bytes(buf[pos:pos + n]).decode("utf-8", errors="replace")
        pos += n
        return text

    def skip_array(item_type: int, count: int) -> None:
        nonlocal pos
        if item_type == _STRING:
            for _ in range(count):
                pos += 8 + struct.unpack_from("<Q", buf, pos)[0]
        elif item_type == _ARRAY:
            for _ in range(count):
                skip_array(take("<I"), take("<Q"))
        elif item_type in _SCALARS:
            pos += count * struct.calcsize(_SCALARS[item_type])
        else:
            raise GGUFFormatError(f"{path}: unknown GGUF array item type {item_type}")

    if len(data) < 24 or bytes(buf[:4]) != _MAGIC:
        raise GGUFFormatError(f"{path}: no GGUF magic")
    pos = 4
    version = take("<I")
    if version not in (2, 3):  # 1: 32-bit counts; a byte-swapped (big-endian) file reads huge
        raise GGUFFormatError(f"{path}: GGUF version {version} (this reader: 2 or 3, "
                              "little-endian)")
    n_tensors, n_kv = take("<Q"), take("<Q")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = string()
        kind = take("<I")
        if kind == _STRING:
            metadata[key] = string()
        elif kind == _ARRAY:
            item_type, count = take("<I"), take("<Q")
            metadata[key] = ArrayField(item_type, count)
            skip_array(item_type, count)
        elif kind in _SCALARS:
            metadata[key] = take(_SCALARS[kind])
        else:
            raise GGUFFormatError(f"{path}: unknown GGUF value type {kind} (key {key!r})")
    infos = []
    for _ in range(n_tensors):
        name = string()
        dims = tuple(take("<Q") for _ in range(take("<I")))
        infos.append((name, dims, GGMLQuantizationType(take("<I")), take("<Q")))
    alignment = int(metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
    start = -(-pos // alignment) * alignment
    tensors = []
    for name, dims, kind, offset in infos:
        block, type_size = GGML_QUANT_SIZES[kind]
        elements = int(np.prod(dims)) if dims else 1
        n_bytes = elements // block * type_size
        begin = start + offset
        if begin + n_bytes > len(data):
            raise GGUFFormatError(f"{path}: tensor {name!r} runs past the end of the file")
        tensors.append(TensorInfo(name, dims, kind, data[begin:begin + n_bytes]))
    return GGUFIndex(version, metadata, tensors)
