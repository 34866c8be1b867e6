"""Pins zoo.metrics against hand computations and closed forms, and checks that zoo.plots writes PNG files."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from zoo import metrics, plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _close(got: torch.Tensor, expected: torch.Tensor, atol: float = 1e-6, rtol: float = 1e-6) -> None:
    """Elementwise closeness (numpy's; torch.testing.assert_close costs ~1 s of imports on first use)."""
    assert tuple(got.shape) == tuple(expected.shape)
    np.testing.assert_allclose(got.double().numpy(), expected.double().numpy(), atol=atol, rtol=rtol)


def _normal_logpdf(x, mu, sigma) -> np.ndarray:
    """Closed-form Normal log density: -log(sigma) - log(2 pi) / 2 - (x - mu)^2 / (2 sigma^2)."""
    x, mu, sigma = (np.asarray(a, dtype=np.float64) for a in (x, mu, sigma))
    return -np.log(sigma) - 0.5 * math.log(2 * math.pi) - (x - mu) ** 2 / (2 * sigma**2)


def _lp(probs) -> torch.Tensor:
    """Log of a probability array (zeros become -inf), as float64."""
    return torch.tensor(probs, dtype=torch.float64).log()


# Tiny 2-draw, 2-point, 2-class example used by several tests.
#   draw 1: point 0 -> [0.9, 0.1], point 1 -> [0.4, 0.6]
#   draw 2: point 0 -> [0.7, 0.3], point 1 -> [0.8, 0.2]
#   predictive (mean over draws): point 0 -> [0.8, 0.2], point 1 -> [0.6, 0.4]
#   labels y = [0, 1]
TINY = _lp([[[0.9, 0.1], [0.4, 0.6]], [[0.7, 0.3], [0.8, 0.2]]])
TINY_Y = torch.tensor([0, 1])


# ----------------------------------------------------------------------------------------------------------------------
# predictive, accuracy, NLL, Brier
# ----------------------------------------------------------------------------------------------------------------------


def test_predictive_log_probs_is_log_mean_prob():
    expected = torch.tensor([[0.8, 0.2], [0.6, 0.4]], dtype=torch.float64)
    got = metrics.predictive_log_probs(TINY)
    assert got.shape == (2, 2)
    _close(got.exp(), expected)


def test_accuracy_nll_brier_by_hand():
    # predictive argmax: point 0 -> class 0 (right), point 1 -> class 0 (wrong, label 1)  => accuracy 1/2
    assert metrics.accuracy(TINY, TINY_Y) == pytest.approx(0.5)
    # NLL = -(log 0.8 + log 0.4) / 2 = (0.223144 + 0.916291) / 2 = 0.569717
    assert metrics.nll(TINY, TINY_Y) == pytest.approx(-(math.log(0.8) + math.log(0.4)) / 2)
    assert metrics.nll(TINY, TINY_Y) == pytest.approx(0.5697171, abs=1e-6)
    # Brier: point 0: (0.8-1)^2 + 0.2^2 = 0.08; point 1: 0.6^2 + (0.4-1)^2 = 0.72; mean = 0.40
    assert metrics.brier(TINY, TINY_Y) == pytest.approx(0.40)


def test_nll_uses_mixture_not_mean_of_per_draw_nlls():
    # Mean of per-draw NLLs = -(log .9 + log .6 + log .7 + log .2) / 4 = 0.645574, which is larger (Jensen) than the
    # mixture NLL 0.569717: the two must be told apart.
    per_draw = -(math.log(0.9) + math.log(0.6) + math.log(0.7) + math.log(0.2)) / 4
    assert per_draw == pytest.approx(0.645574, abs=1e-6)
    got = metrics.nll(TINY, TINY_Y)
    assert got == pytest.approx(0.5697171, abs=1e-6)
    assert abs(got - per_draw) > 0.07
    # Sharper case: two confident draws that disagree. Each draw alone gives the true class prob 1e-6 half the time, but
    # the mixture gives ~0.5 for every point: NLL ~ log 2, while the per-draw average is ~ log(1e6) / 2.
    eps = 1e-6
    lp = _lp([[[1 - eps, eps]], [[eps, 1 - eps]]])
    assert metrics.nll(lp, torch.tensor([0])) == pytest.approx(math.log(2), abs=1e-5)


def test_classification_metrics_dict_is_plain_floats():
    out = metrics.classification_metrics(TINY.float(), TINY_Y)
    assert set(out) == {"accuracy", "nll", "ece", "brier"}
    assert all(type(v) is float for v in out.values())
    assert out["brier"] == pytest.approx(0.40, abs=1e-6)


# ----------------------------------------------------------------------------------------------------------------------
# ECE and reliability bins
# ----------------------------------------------------------------------------------------------------------------------


def test_ece_hand_example_15_bins():
    # 15 equal-width bins of width 1/15 on (0, 1]; bin k is (k/15, (k+1)/15].
    #   conf 0.95 x3 -> bin 14 (0.9333, 1.0]: correct T, T, F -> acc 2/3, mean conf 0.95, |gap| = 0.283333, weight 3/6
    #   conf 0.55 x2 -> bin 8 (0.5333, 0.6]:  correct T, F    -> acc 1/2, mean conf 0.55, |gap| = 0.05,     weight 2/6
    #   conf 0.30 x1 -> bin 4 (0.2667, 0.3333]: correct T     -> acc 1,   mean conf 0.30, |gap| = 0.70,     weight 1/6
    # ECE = 0.5 * 0.283333 + (1/3) * 0.05 + (1/6) * 0.7 = 0.141667 + 0.016667 + 0.116667 = 0.275
    conf = torch.tensor([0.95, 0.95, 0.95, 0.55, 0.55, 0.30])
    correct = torch.tensor([True, True, False, True, False, True])
    assert metrics.expected_calibration_error(conf, correct, n_bins=15) == pytest.approx(0.275, abs=1e-6)
    bins = metrics.reliability_bins(conf, correct, n_bins=15)
    assert set(bins) == {"lower", "upper", "count", "accuracy", "confidence"}
    assert bins["count"].tolist() == [0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 3]
    assert bins["accuracy"][14] == pytest.approx(2 / 3)
    assert bins["confidence"][8] == pytest.approx(0.55)
    assert np.isnan(bins["accuracy"][0]) and np.isnan(bins["confidence"][0])
    np.testing.assert_allclose(bins["lower"], np.arange(15) / 15)
    np.testing.assert_allclose(bins["upper"], np.arange(1, 16) / 15)


def test_ece_bin_edge_belongs_to_lower_bin():
    # 5 bins: (0, .2], (.2, .4], ... A confidence of exactly 0.2 belongs to the FIRST bin (its upper edge).
    #   right-closed (the convention): bin 0 = {0.2: correct}, bin 1 = {0.3: wrong}
    #     ECE = 1/2 * |1 - 0.2| + 1/2 * |0 - 0.3| = 0.4 + 0.15 = 0.55
    #   left-closed (wrong): bin 1 = {0.2, 0.3}: acc 0.5, conf 0.25 -> ECE = 0.25
    correct = torch.tensor([True, False])
    for dtype in (torch.float32, torch.float64):
        conf = torch.tensor([0.2, 0.3], dtype=dtype)
        assert metrics.expected_calibration_error(conf, correct, n_bins=5) == pytest.approx(0.55, abs=1e-6)
    # Upper edges k/15 land in bin k-1 whatever the dtype; 1.0 is in the last bin and 0.0 in the first.
    for dtype in (torch.float32, torch.float64):
        conf = torch.tensor([k / 15 for k in range(1, 16)] + [0.0], dtype=dtype)
        counts = metrics.reliability_bins(conf, torch.ones(16, dtype=torch.bool), n_bins=15)["count"]
        assert counts.tolist() == [2] + [1] * 14


def test_ece_from_log_probs_uses_top_class_of_predictive():
    # Predictive top-class confidences: point 0 -> 0.8 (right), point 1 -> 0.6 (wrong). With 10 bins they fall in
    # (0.7, 0.8] and (0.5, 0.6]: ECE = 1/2 * |1 - 0.8| + 1/2 * |0 - 0.6| = 0.1 + 0.3 = 0.4
    assert metrics.ece(TINY, TINY_Y, n_bins=10) == pytest.approx(0.4)


# ----------------------------------------------------------------------------------------------------------------------
# entropy, mutual information, OOD AUROC
# ----------------------------------------------------------------------------------------------------------------------


def test_entropy_of_uniform_is_log_c():
    for c in (2, 5, 10):
        lp = torch.full((3, 4, c), -math.log(c))
        _close(metrics.predictive_entropy(lp), torch.full((4,), math.log(c)))
        _close(metrics.expected_entropy(lp), torch.full((4,), math.log(c)))
        _close(metrics.mutual_information(lp), torch.zeros(4), atol=1e-6, rtol=0)


def test_mutual_information_zero_when_draws_agree():
    torch.manual_seed(0)
    one = torch.log_softmax(torch.randn(1, 6, 4), dim=-1)
    lp = one.expand(5, 6, 4)
    mi = metrics.mutual_information(lp)
    assert mi.shape == (6,)
    assert bool((mi >= 0).all())
    _close(mi, torch.zeros(6), atol=1e-6, rtol=0)


def test_mutual_information_log2_for_confident_disagreeing_draws():
    # Exactly one-hot draws (log 0 = -inf): predictive [.5, .5] has entropy log 2, each draw has entropy 0.
    lp = _lp([[[1.0, 0.0]], [[0.0, 1.0]]])
    assert metrics.predictive_entropy(lp).item() == pytest.approx(math.log(2))
    assert metrics.expected_entropy(lp).item() == pytest.approx(0.0)
    assert metrics.mutual_information(lp).item() == pytest.approx(math.log(2))
    # Nearly one-hot draws: MI -> log 2.
    eps = 1e-9
    lp = _lp([[[1 - eps, eps]], [[eps, 1 - eps]]])
    assert metrics.mutual_information(lp).item() == pytest.approx(math.log(2), abs=1e-6)


def test_ood_auroc_perfect_and_chance():
    confident = _lp([[[0.99, 0.01]] * 4, [[0.99, 0.01]] * 4])  # draws agree, low entropy, MI 0
    disagree = _lp([[[0.99, 0.01]] * 3, [[0.01, 0.99]] * 3])  # draws disagree: entropy log 2, MI ~ log 2
    out = metrics.ood_auroc(confident, disagree)
    assert out == {"entropy": 1.0, "mi": 1.0}
    assert all(type(v) is float for v in out.values())
    # Identical sets: every score ties -> exactly 0.5.
    same = metrics.ood_auroc(disagree, disagree)
    assert same["entropy"] == pytest.approx(0.5) and same["mi"] == pytest.approx(0.5)
    # Independent samples from one distribution: ~0.5.
    g = torch.Generator().manual_seed(0)
    a = torch.log_softmax(torch.randn(4, 400, 3, generator=g), dim=-1)
    b = torch.log_softmax(torch.randn(4, 400, 3, generator=g), dim=-1)
    rnd = metrics.ood_auroc(a, b)
    assert rnd["entropy"] == pytest.approx(0.5, abs=0.07) and rnd["mi"] == pytest.approx(0.5, abs=0.07)


# ----------------------------------------------------------------------------------------------------------------------
# regression
# ----------------------------------------------------------------------------------------------------------------------


def test_regression_single_draw_matches_closed_form_normal():
    loc = torch.tensor([[0.1, -0.5, 1.2]], dtype=torch.float64)  # standardised units, S = 1
    scale = torch.tensor([[0.3, 0.8, 1.5]], dtype=torch.float64)
    y = torch.tensor([0.0, -1.0, 2.0], dtype=torch.float64)
    y_mean, y_std = 10.0, 4.0
    out = metrics.regression_metrics(loc, scale, y, y_mean=y_mean, y_std=y_std)
    assert set(out) == {"rmse", "test_ll"} and all(type(v) is float for v in out.values())
    # Closed form in ORIGINAL units: y_o = y_mean + y_std * y ~ N(y_mean + y_std * loc, (y_std * scale)^2)
    expected_ll = _normal_logpdf(y_mean + y_std * y.numpy(), y_mean + y_std * loc[0].numpy(), y_std * scale[0].numpy())
    assert out["test_ll"] == pytest.approx(float(expected_ll.mean()), abs=1e-10)
    # ... which is the standardised log density minus log(y_std)
    std_ll = _normal_logpdf(y.numpy(), loc[0].numpy(), scale[0].numpy()).mean()
    assert out["test_ll"] == pytest.approx(std_ll - math.log(y_std), abs=1e-10)
    unit = metrics.regression_metrics(loc, scale, y)  # y_std = 1
    assert unit["test_ll"] - out["test_ll"] == pytest.approx(math.log(4.0))


def test_regression_mixture_ll_and_rmse_in_original_units():
    # S = 2 draws, scale broadcast as [S, 1].
    loc = torch.tensor([[0.0, 1.0], [2.0, 1.0]], dtype=torch.float64)
    scale = torch.tensor([[1.0], [0.5]], dtype=torch.float64)
    y = torch.tensor([0.5, 3.0], dtype=torch.float64)
    out = metrics.regression_metrics(loc, scale, y, y_mean=-3.0, y_std=2.0)
    # predictive mean (standardised) = [1.0, 1.0]; errors [-0.5, 2.0]; RMSE_std = sqrt((0.25 + 4) / 2) = 1.457738;
    # in original units x y_std = 2.915476
    assert out["rmse"] == pytest.approx(2 * math.sqrt(4.25 / 2))
    assert out["rmse"] == pytest.approx(2.915476, abs=1e-6)
    # test_ll = mean_i log(0.5 N(y_i; loc_1i, 1) + 0.5 N(y_i; loc_2i, 0.5)) - log 2
    dens = 0.5 * np.exp(_normal_logpdf(y.numpy(), loc[0].numpy(), 1.0)) + 0.5 * np.exp(
        _normal_logpdf(y.numpy(), loc[1].numpy(), 0.5)
    )
    assert out["test_ll"] == pytest.approx(float(np.log(dens).mean()) - math.log(2.0), abs=1e-10)


# ----------------------------------------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------------------------------------


def test_shape_errors_raise_value_error():
    with pytest.raises(ValueError, match=r"\[S, B, C\]"):
        metrics.predictive_log_probs(torch.zeros(3, 2))
    with pytest.raises(ValueError, match="batch size mismatch"):
        metrics.accuracy(TINY, torch.tensor([0, 1, 1]))
    with pytest.raises(ValueError, match="labels"):
        metrics.nll(TINY, torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="normalised"):
        metrics.brier(torch.randn(2, 2, 2), TINY_Y)
    with pytest.raises(ValueError, match="class count mismatch"):
        metrics.ood_auroc(TINY, torch.full((2, 3, 3), -math.log(3)))
    with pytest.raises(ValueError, match="points"):
        metrics.expected_calibration_error(torch.tensor([0.5, 0.6]), torch.tensor([True]))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        metrics.expected_calibration_error(torch.tensor([1.5]), torch.tensor([True]))
    with pytest.raises(ValueError, match="batch size mismatch"):
        metrics.regression_metrics(torch.zeros(2, 3), torch.ones(2, 1), torch.zeros(4))
    with pytest.raises(ValueError, match="broadcast"):
        metrics.regression_metrics(torch.zeros(2, 3), torch.ones(3, 1), torch.zeros(3))
    with pytest.raises(ValueError, match=r"\[S, B\]"):
        metrics.regression_metrics(torch.zeros(3), torch.ones(3), torch.zeros(3))
    with pytest.raises(ValueError, match="y_std"):
        metrics.regression_metrics(torch.zeros(2, 3), torch.ones(2, 1), torch.zeros(3), y_std=0.0)


# ----------------------------------------------------------------------------------------------------------------------
# plots
# ----------------------------------------------------------------------------------------------------------------------


def _assert_png(path, returned):
    assert returned == path
    data = path.read_bytes()
    assert len(data) > 1000 and data.startswith(PNG_MAGIC)
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temp file left behind


def test_reliability_diagram_writes_png(tmp_path):
    torch.manual_seed(0)
    lp = torch.log_softmax(2 * torch.randn(3, 50, 4), dim=-1)
    y = torch.randint(0, 4, (50,))
    path = tmp_path / "rel.png"
    _assert_png(path, plots.reliability_diagram(lp, y, path, n_bins=10, title="test"))


def test_uncertainty_band_writes_png(tmp_path):
    torch.manual_seed(0)
    x_train = torch.linspace(-1, 1, 20)
    y_train = torch.sin(3 * x_train)
    x_grid = torch.linspace(-2, 2, 50)
    loc = torch.sin(3 * x_grid) + 0.1 * torch.randn(8, 50)
    path = tmp_path / "band.png"
    _assert_png(path, plots.uncertainty_band(x_train, y_train, x_grid, loc, torch.full((8, 1), 0.2), path, "band"))


def test_pruning_curve_writes_png(tmp_path):
    path = tmp_path / "sub" / "prune.png"
    fractions = [0.0, 0.5, 0.9]
    returned = plots.pruning_curve(fractions, {"accuracy": [0.9, 0.88, 0.7], "nll": [0.3, 0.35, 0.9]}, path)
    _assert_png(path, returned)


def test_shift_curves_draws_every_member_in_its_own_style(tmp_path):
    """Fifteen members (the shift benchmark's rows) get fifteen distinct lines, drawn in that style on each panel."""
    levels = {float(k): {"accuracy": 0.9 - 0.1 * k, "nll": 0.2 + k, "ece": 0.01 * k} for k in range(6)}
    path = tmp_path / "shift.png"
    _assert_png(path, plots.shift_curves({f"member {i}": levels for i in range(15)}, path, title="t"))
    for n in (1, 10, 15, 45):
        styles = plots._distinct_styles(n)
        assert len({(s["color"], s.get("linestyle", "-"), s["marker"]) for s in styles}) == n


# ------------------------------------------------------------------------------------------------ tasks
class _FixedPosterior:
    """A posterior whose predictive at any inputs is one given set of draws (what a task reads of a posterior)."""

    def __init__(self, pred) -> None:
        self.pred = pred

    def sample(self, num_samples: int) -> dict:
        return {}

    def scoring_draws(self, num_samples: int) -> dict:
        return {}

    def predict(self, x, num_samples=None, draws=None):
        return self.pred


def test_each_task_evaluates_its_headline_metrics_from_the_posterior_predictive():
    from zoo.data.base import Dataset
    from zoo.likelihoods import PredictiveDraws
    from zoo.tasks import TASKS, task_of

    torch.manual_seed(0)
    x = torch.zeros(6, 1)
    y = torch.randn(6)
    regression = Dataset("r", "regression", x, y, x, y, y_mean=1.0, y_std=2.0)
    pred = PredictiveDraws(loc=torch.randn(4, 6), scale=torch.full((4, 1), 0.5))
    got = task_of(regression).evaluate(_FixedPosterior(pred), regression, 4)
    assert got == metrics.regression_metrics(pred.loc, pred.scale, y, 1.0, 2.0) and set(got) >= set(
        TASKS["regression"].metrics)
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    classification = Dataset("c", "classification", x, labels, x, labels, n_classes=3)
    log_probs = torch.randn(4, 6, 3).log_softmax(-1)
    got = task_of(classification).evaluate(_FixedPosterior(PredictiveDraws(log_probs=log_probs)), classification, 4)
    assert got == metrics.classification_metrics(log_probs, labels) and set(got) >= set(
        TASKS["classification"].metrics)
    with pytest.raises(Exception, match="data.task"):
        task_of("ranking")
