"""benchmarks/speed/dispatch.py: both call forms get the same weights (the model shape's
parameters, counted independently here) and the medians are the repeats' medians."""

import statistics

import jax
from flax import nnx


def test_dispatch_measures_both_forms_over_the_shapes_weights(tmp_path):
    from agentrl_jax.models.llama import CausalLM
    from benchmarks.speed.dispatch import main
    from benchmarks.speed.engine import model_config

    out = main(["--shape", "tiny", "--calls", "5", "--repeats", "3",
                "--json", str(tmp_path / "d.json")])
    model = CausalLM(model_config("tiny", "float32"), rngs=nnx.Rngs(0))
    assert out["weights"] == len(jax.tree.leaves(nnx.state(model))) > 0
    for key, median in out["medians"].items():
        assert median == statistics.median(r[key] for r in out["repeats"]) > 0
    assert out["call_ratio"] == out["medians"]["call_state_ms"] / out["medians"]["call_leaves_ms"]
    assert (tmp_path / "d.json").exists()
