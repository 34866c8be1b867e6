"""The post-hoc Laplace structures benchmark runs small: it prints its table, writes the same figures (every ratio
under a key containing 'ratio'), and, with laplace-torch installed, the zoo's diagonal last-layer Laplace has
laplace-torch's evidence and prior precision on the same trained weights."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import laplace_structures  # noqa: E402


@pytest.mark.slow  # three zoo fits and five laplace-torch fits of a digits MLP: ~60 s (make test-slow)
def test_benchmark_writes_the_table_figures_and_agrees_with_the_peer(tmp_path, capsys):
    out = tmp_path / "laplace_structures.json"
    returned = laplace_structures.main(["--nets", "digits", "--epochs", "3", "--peer-timeout", "240",
                                        "--json", str(out)])
    figures = json.loads(out.read_text())
    assert figures == json.loads(json.dumps(returned))
    rows = figures["nets"]["digits"]["rows"]
    printed = capsys.readouterr().out
    assert rows["zoo diagonal_laplace"]["weights"] == 17_610 and rows["zoo last_layer_laplace"]["weights"] == 1_010
    for name in laplace_structures.ZOO_ROWS:
        row = rows[name]
        assert row["seconds"] > 0 and row["log_evidence"] < 0 and row["prior_precision"] > 0
        assert 0 < row["nll"] and 0 < row["nll_probit"] and 0 <= row["ece"] <= 1 and 0.5 < row["accuracy"] <= 1
        assert f"{row['log_evidence']:.2f}" in printed
    if not laplace_structures.peer_installed():
        pytest.skip("laplace-torch is not installed (make peer): the agreement half did not run")
    ours, peer = rows["zoo last_layer_laplace, covariance diag"], rows["laplace-torch last_layer diag"]
    assert ours["log_evidence"] == pytest.approx(peer["log_evidence"], rel=1e-3)  # one layer: one precision group
    # the evidence is flat about its optimum, which laplace-torch's 100 Adam steps approach and L-BFGS reaches
    assert ours["log_evidence"] >= peer["log_evidence"] - 1e-6 * abs(peer["log_evidence"])
    assert ours["prior_precision"] == pytest.approx(peer["prior_precision"], rel=5e-2)
    assert ours["nll_probit"] == pytest.approx(peer["nll"], rel=1e-2)
    ratio = figures["nets"]["digits"]["last_layer_diag_zoo_over_laplace_torch_time_ratio"]
    assert ratio == pytest.approx(ours["seconds"] / peer["seconds"])
