"""The Posterior interface: draws shaped [S, ...], predictions from them, stored draws and masks."""

import torch

from zoo.pipeline import prepare
from zoo.posterior import GuidePosterior, MaskedPosterior, SamplePosterior

from .conftest import make_spec


def _toy_posterior():
    data, family, guide, _ = prepare(make_spec("toy", "likelihood.noise=learned"))
    return data, family, GuidePosterior(family, guide)


def test_guide_draws_have_a_leading_sample_dim_and_vary():
    data, family, posterior = _toy_posterior()
    draws = posterior.sample(7)
    sites = family.latent_sites()
    assert set(draws) == set(sites)
    for name, site in sites.items():
        assert draws[name].shape == (7, *site.shape)
    assert not torch.equal(draws["out.weight"][0], draws["out.weight"][1])
    assert (draws["noise_scale"] > 0).all()


def test_predict_matches_the_net_run_draw_by_draw():
    data, family, posterior = _toy_posterior()
    draws = posterior.sample(3)
    pred = posterior.predict(data.x_test, draws=draws, chunk_size=64)  # chunking must not change anything
    assert pred.loc.shape == (3, len(data.x_test)) and pred.scale.shape == (3, len(data.x_test))
    for s in range(3):
        weights = {n: draws[n][s] for n in family.weight_names}
        expected = family.forward(weights, data.x_test)[:, 0]
        assert torch.allclose(pred.loc[s], expected, atol=1e-6)
        assert torch.allclose(pred.scale[s], draws["noise_scale"][s].expand(len(data.x_test)))


def test_many_draws_are_predicted_in_row_chunks_that_bound_draws_times_rows(monkeypatch):
    """A grown MCMC reference has ~10^5 draws: predict scores few rows per call then (draws x rows <= the budget),
    with the same predictions as one call."""
    import zoo.posterior

    data, family, posterior = _toy_posterior()
    draws = posterior.sample(40)
    whole = posterior.predict(data.x_test, draws=draws, chunk_size=len(data.x_test))
    seen = []
    predict = family.predict
    monkeypatch.setattr(family, "predict", lambda d, x: seen.append(len(x)) or predict(d, x))
    monkeypatch.setattr(zoo.posterior, "PREDICT_DRAW_ROWS", 40 * 7)  # 7 rows per call at 40 draws
    chunked = posterior.predict(data.x_test, draws=draws)
    assert seen[:-1] == [7] * (len(seen) - 1) and sum(seen) == len(data.x_test) and 0 < seen[-1] <= 7
    assert torch.allclose(chunked.loc, whole.loc, atol=1e-6) and torch.equal(chunked.scale, whole.scale)


def _counting_predict(monkeypatch, family) -> list[int]:
    """Record the draw count of every call of ``family.predict``."""
    seen = []
    predict = family.predict
    monkeypatch.setattr(family, "predict", lambda d, x: seen.append(next(iter(d.values())).shape[0]) or predict(d, x))
    return seen


def test_draws_of_one_point_are_predicted_once_and_repeated(monkeypatch):
    """A point estimate's S draws are one point: scored with one draw, the predictions repeated S times, the same as
    scoring all S (what made the shift report of a MAP net cost as much as that of 32 different nets)."""
    data, family, guide, _ = prepare(make_spec("toy", "guide.name=delta", "likelihood.noise=learned"))
    posterior = GuidePosterior(family, guide)
    draws = posterior.sample(6)
    every = family.predict(draws, data.x_test)
    seen = _counting_predict(monkeypatch, family)
    pred = posterior.predict(data.x_test, draws=draws)
    assert seen == [1]
    assert pred.loc.shape == (6, len(data.x_test)) and torch.allclose(pred.loc, every.loc, atol=1e-6)
    assert torch.allclose(pred.scale.expand_as(pred.loc), every.scale.expand_as(every.loc))


def test_one_point_of_ensemble_members_keeps_the_draw_by_member_order(monkeypatch):
    """BatchEnsemble's draw is all K members (S draws -> S*K predictive draws, draw-major): the repeated predictions
    are in the order scoring every draw gives."""
    data, family, guide, _ = prepare(make_spec("digits", "model:={family: rank1, members: 3}",
                                               "guide:={name: batch_ensemble}", "prior:={name: normal, loc: 1.0}",
                                               "inference.local_reparam=false"))
    posterior = GuidePosterior(family, guide)
    draws = posterior.sample(4)
    every = family.predict(draws, data.x_test)
    seen = _counting_predict(monkeypatch, family)
    pred = posterior.predict(data.x_test, draws=draws)
    assert seen == [1] and pred.log_probs.shape == every.log_probs.shape == (12, len(data.x_test), 8)
    assert torch.allclose(pred.log_probs, every.log_probs, atol=1e-6)


def test_draws_that_differ_are_all_scored(monkeypatch):
    data, family, posterior = _toy_posterior()
    seen = _counting_predict(monkeypatch, family)
    posterior.predict(data.x_test, num_samples=5)
    assert seen == [5]


def test_stored_draws_are_thinned_evenly():
    data, family, posterior = _toy_posterior()
    stored = posterior.sample(10)
    thinned = SamplePosterior(family, stored).sample(4)
    index = [0, 3, 6, 9]
    for name, value in thinned.items():
        assert torch.equal(value, stored[name][index])
    assert SamplePosterior(family, stored).sample(50)["out.bias"].shape[0] == 10


def test_masked_posterior_zeroes_exactly_the_masked_weights():
    data, family, posterior = _toy_posterior()
    mask = torch.zeros_like(family.latent_sites()["out.weight"].init)
    mask[0, :3] = 1.0
    draws = MaskedPosterior(posterior, {"out.weight": mask}).sample(5)
    assert (draws["out.weight"][:, 0, 3:] == 0).all()
    assert (draws["out.weight"][:, 0, :3] != 0).all()
    assert (draws["hidden0.weight"] != 0).all()
