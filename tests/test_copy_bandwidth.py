"""The roofline benchmarks' bandwidth: measured in the same process by default, never an assumed
figure (issue 49: the docs' ratios had used an assumed 3.0 TB/s)."""

from __future__ import annotations

import argparse
import importlib

import pytest

from benchmarks.speed.copy_bandwidth import (add_bandwidth_arguments, bandwidth_arg,
                                             describe_bandwidth, resolve_bandwidth)


def test_bandwidth_arg_accepts_measure_or_a_positive_number():
    assert bandwidth_arg("measure") == "measure"
    assert bandwidth_arg("3.35e12") == 3.35e12
    for bad in ("fast", "0", "-1e12", "inf", "nan", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="--bandwidth"):
            bandwidth_arg(bad)


def test_parser_defaults_to_measure_and_rejects_bad_values(capsys):
    parser = argparse.ArgumentParser()
    add_bandwidth_arguments(parser)
    assert parser.parse_args([]).bandwidth == "measure"
    assert parser.parse_args(["--bandwidth", "4.24e12"]).bandwidth == 4.24e12
    with pytest.raises(SystemExit):
        parser.parse_args(["--bandwidth", "3.0TB"])
    assert "must be 'measure' or bytes/s" in capsys.readouterr().err


def test_a_given_bandwidth_is_used_as_given_and_says_so():
    value, note = resolve_bandwidth(3.35e12, copy_bytes=1e6)
    assert value == 3.35e12
    assert note == {"source": "given", "bandwidth_Bps": 3.35e12}
    assert "given, not measured" in describe_bandwidth(note)


def test_measure_times_a_copy_in_this_process():
    value, note = resolve_bandwidth("measure", copy_bytes=4e6)
    assert note["source"] == "measured"
    assert note["copy_bytes"] == 4_000_000
    # read + write bytes over the measured time, recomputed from the note's own fields
    assert note["jax_Bps"] == pytest.approx(2 * 4_000_000 / (note["jax_ms"] / 1e3), rel=1e-9)
    assert value == note["bandwidth_Bps"] == max(note["jax_Bps"], note.get("torch_Bps", 0.0))
    assert value > 0
    assert f"{value / 1e12:.2f} TB/s" in describe_bandwidth(note)


@pytest.mark.parametrize("module", ["benchmarks.speed.engine",
                                    "benchmarks.contenders.decode_attention",
                                    "benchmarks.contenders.decode_gemm",
                                    "benchmarks.contenders.advantages"])
def test_every_roofline_benchmark_measures_by_default(module, capsys):
    """Each script's --help states that --bandwidth defaults to a measured copy."""
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "'measure' (the default" in help_text
