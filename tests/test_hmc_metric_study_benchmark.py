"""benchmarks/hmc_metric_study.py: the whitened spectra on covariances whose answer is known, and its refusals."""

import pytest
import torch

from tests.conftest import load_benchmark
from zoo.errors import ZooInputError

study = load_benchmark("hmc_metric_study")


def condition(spectra, name):
    low, high = spectra[name]
    return high / low


def test_each_metric_whitens_exactly_the_structure_it_can_represent():
    # chain 0 and 1: diagonal covariances with the scales swapped (a permutation of two units between modes)
    swapped = torch.stack([torch.diag(torch.tensor([100.0, 1.0])), torch.diag(torch.tensor([1.0, 100.0]))]).double()
    spectra = study.whitened_spectra(swapped)
    torch.testing.assert_close(condition(spectra, "diagonal, own chain"), torch.ones(2, dtype=torch.float64))
    # pooled variances are 50.5 each: every chain keeps its whole 100:1 spread
    torch.testing.assert_close(condition(spectra, "diagonal, pooled"), torch.full((2,), 100.0, dtype=torch.float64))
    # one correlated covariance shared by the chains: only the dense metric whitens it
    correlated = torch.tensor([[1.0, 0.99], [0.99, 1.0]], dtype=torch.float64).expand(3, 2, 2)
    spectra = study.whitened_spectra(correlated)
    torch.testing.assert_close(condition(spectra, "dense, pooled"), torch.ones(3, dtype=torch.float64))
    torch.testing.assert_close(condition(spectra, "diagonal, pooled"), torch.full((3,), 1.99 / 0.01,
                                                                                  dtype=torch.float64))


def test_chain_covariances_are_each_chains_own_about_its_mean():
    z = torch.randn(3, 50, 4, dtype=torch.float64) + torch.arange(3.0, dtype=torch.float64)[:, None, None] * 10
    covariances = study.chain_covariances(z)
    for c in range(3):
        torch.testing.assert_close(covariances[c], torch.cov(z[c].T))


@pytest.mark.parametrize("argv", [["--samples", "100"], ["--chains", "0"], ["--threads", "0"]])
def test_too_few_draws_for_a_full_rank_covariance_and_bad_counts_are_refused(argv):
    with pytest.raises(ZooInputError):
        study.main(argv)
