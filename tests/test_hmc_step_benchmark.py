"""benchmarks/hmc_step.py, tiny: every side timed, the ratios are the medians' quotients, bad arguments refused."""

import json

import pytest

from tests.conftest import load_benchmark
from zoo.errors import ZooInputError

pytest.importorskip("blackjax", reason="the JAX side needs the bench extra: pip install -e .[bench]")
hmc_step = load_benchmark("hmc_step")


@pytest.mark.slow  # the zoo's step and JAX's, compiled and timed tiny: ~12 s alone (make test-slow)
def test_tiny_run_times_every_side_and_writes_the_ratios(tmp_path, capsys):
    out = tmp_path / "step.json"
    result = hmc_step.main(["--chains", "2,3", "--steps", "2", "--rounds", "1", "--json", str(out)])
    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(result))
    assert saved["model"] == "toy" and saved["dim"] == 151 and [r["chains"] for r in saved["rows"]] == [2, 3]
    for row in saved["rows"]:
        for side in hmc_step.SIDES:  # the toy's net is tanh: the exp floor applies
            assert row[f"{side}_us_per_step"] > 0
            assert row[f"{side}_us_per_chain_step"] == pytest.approx(row[f"{side}_us_per_step"] / row["chains"])
        step = row["zoo_step_us_per_step"]
        assert row["ratio_zoo_step_to_jax"] == pytest.approx(step / row["jax_blackjax_us_per_step"])
        assert row["ratio_zoo_step_to_gradient_alone"] == pytest.approx(step / row["zoo_gradient_us_per_step"])
        assert row["ratio_zoo_step_to_exp_floor"] == pytest.approx(step / row["exp_floor_us_per_step"])
        assert row["ratio_eager_to_compiled_step"] == pytest.approx(row["zoo_eager_us_per_step"] / step)
    printed = capsys.readouterr().out
    assert "zoo step ÷ JAX" in printed and "BlackJAX velocity_verlet" in printed


@pytest.mark.parametrize("argv", [["--chains", "0"], ["--chains", "a,b"], ["--steps", "0"], ["--rounds", "0"]])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(ZooInputError):
        hmc_step.main(argv)
