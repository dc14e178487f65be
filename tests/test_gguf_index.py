"""models/gguf_index.py against ``gguf.GGUFReader`` on the SmolLM2 GGUF the package ships and on
small files written with ``gguf.GGUFWriter``: the same scalars, array lengths, tensor names,
shapes, types and bytes; and the model loaded through it equals the one loaded through
GGUFReader."""

from __future__ import annotations

import numpy as np
import pytest

from agentrl_jax.models.gguf_index import ArrayField, GGUFFormatError, read_index
from agentrl_jax.models.pretrained import resolve_model_path


def _same_as_reader(path: str) -> None:
    import gguf

    reader = gguf.GGUFReader(path)
    index = read_index(path)
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):  # the reader's own header pseudo-fields
            continue
        got = index.metadata[key]
        if field.types and field.types[0] == gguf.GGUFValueType.ARRAY:
            assert got == ArrayField(int(field.types[1]), len(field.data)), key
        else:
            want = field.contents()
            assert got == pytest.approx(want) if isinstance(want, float) else got == want, key
    assert set(index.metadata) == {k for k in reader.fields if not k.startswith("GGUF.")}
    assert [t.name for t in index.tensors] == [t.name for t in reader.tensors]
    for mine, theirs in zip(index.tensors, reader.tensors):
        assert mine.shape == tuple(int(d) for d in theirs.shape), mine.name
        assert mine.tensor_type == theirs.tensor_type, mine.name
        assert np.array_equal(np.asarray(mine.data), np.asarray(theirs.data).view(np.uint8)
                              .reshape(-1)), mine.name


def test_the_shipped_smollm2_gguf_reads_as_gguf_reader_reads_it():
    _same_as_reader(resolve_model_path("smollm2"))


def test_a_written_file_with_every_value_kind(tmp_path):
    import gguf

    path = str(tmp_path / "t.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_uint32("x.u32", 7)
    w.add_int64("x.i64", -5)
    w.add_float32("x.f32", 0.25)
    w.add_float64("x.f64", 1e-6)
    w.add_bool("x.bool", True)
    w.add_string("x.str", "héllo")
    w.add_array("x.strs", ["a", "bb", ""])
    w.add_array("x.ints", [1, 2, 3, 4])
    w.add_uint32("general.alignment", 64)
    rng = np.random.default_rng(0)
    w.add_tensor("a.weight", rng.normal(size=(3, 5)).astype(np.float32))
    w.add_tensor("b.weight", rng.normal(size=(7,)).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _same_as_reader(path)


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGML" + bytes(60))
    with pytest.raises(GGUFFormatError, match="no GGUF magic"):
        read_index(str(path))
