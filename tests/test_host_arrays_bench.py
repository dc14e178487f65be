"""benchmarks/speed/host_arrays.py: both layouts compute the same value from the same inputs
(checked against a sum written out here), and the reported medians are the repeats'."""

import statistics

import numpy as np


def test_both_layouts_read_the_same_inputs_and_medians_are_the_repeats(tmp_path):
    from benchmarks.speed.host_arrays import main

    out = main(["--shape", "tiny", "--rows", "4", "--chunk", "8", "--calls", "3",
                "--repeats", "3", "--json", str(tmp_path / "h.json")])
    assert set(out["settings"]) == {"alone", "busy"}
    for entry in out["settings"].values():
        m = entry["medians"]
        for layout, i, key in (("three", 0, "three_wall_ms"), ("one", 0, "one_wall_ms"),
                               ("three", 1, "three_cpu_ms"), ("one", 1, "one_cpu_ms")):
            assert m[key] == statistics.median(r[layout][i] for r in entry["repeats"]) > 0
        assert m["wall_ratio"] == m["three_wall_ms"] / m["one_wall_ms"]
    # the value each call added: slot id 0 + token [0, 0] + position [0, 0] + weight (0)
    rng = np.random.default_rng(0)
    slots = rng.integers(0, 256, 4)
    tokens = rng.integers(0, 49152, (4, 8))
    positions = rng.integers(0, 3072, (4, 8))
    per_call = float(slots[0] + tokens[0, 0] + positions[0, 0])
    assert out["per_call_value"] == {"three": per_call, "one": per_call}
    assert (tmp_path / "h.json").exists()
