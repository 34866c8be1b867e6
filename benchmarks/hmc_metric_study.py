"""Could a better static metric enlarge the many-chain HMC's step? The condition number of its draws, three ways.

    python benchmarks/hmc_metric_study.py [--chains 64] [--warmup 200] [--samples 200] [--seed 0] [--threads 1]
        [--json PATH]

Samples the toy of ``benchmarks/hmc_speed.py`` (1-50-1 tanh BNN on ``toy_gap``, sigma = 0.1) by ``inference.method:
hmc`` at its defaults (``inference.compile`` on), then takes each chain's covariance of its draws (Sigma_c, in the
sampler's unconstrained coordinates) and whitens it by three metrics a sampler could use for every chain:

* ``diagonal, pooled``: the pooled within-chain variances, what the sampler adapts;
* ``dense, pooled``: the pooled within-chain covariance (a dense mass matrix shared by the chains);
* ``diagonal, own chain``: each chain's own variances (a diagonal mass matrix per chain).

For each, the median over chains of the smallest and largest eigenvalue of the whitened Sigma_c and of their ratio,
the condition number. Leapfrog stability sets the step by the smallest, the trajectory must span the largest, so
the leapfrog steps per draw grow with the square root of the condition number; a metric that shrinks it is worth
adapting. ``ratio_to_diagonal_pooled`` is each condition number over the first one's, from the same draws.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hmc_speed  # noqa: E402 - the benchmark's toy model lives there

from zoo.errors import ZooInputError  # noqa: E402
from zoo.exits import exit_code  # noqa: E402
from zoo.inference.mcmc import MCMC  # noqa: E402
from zoo.inference.potential import Coordinates  # noqa: E402
from zoo.pipeline import prepare  # noqa: E402
from zoo.runs import write_json  # noqa: E402


def chain_covariances(z: torch.Tensor) -> torch.Tensor:
    """Each chain's sample covariance ``[C, D, D]`` of its draws ``z [C, S, D]``."""
    centred = z - z.mean(1, keepdim=True)
    return torch.einsum("csd,cse->cde", centred, centred) / (z.shape[1] - 1)


def whitened_spectra(covariances: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per metric, each chain's smallest and largest eigenvalue of its covariance in the whitened coordinates."""
    pooled = covariances.mean(0)
    eye = torch.eye(len(pooled), dtype=pooled.dtype)
    inverse_root = torch.linalg.inv(torch.linalg.cholesky(pooled + 1e-10 * eye))
    pooled_sd = pooled.diagonal().sqrt()
    own_sd = covariances.diagonal(dim1=1, dim2=2).sqrt()  # [C, D]
    whitened = {
        "diagonal, pooled": covariances / pooled_sd[:, None] / pooled_sd[None, :],
        "dense, pooled": inverse_root @ covariances @ inverse_root.T,
        "diagonal, own chain": covariances / own_sd[:, :, None] / own_sd[:, None, :],
    }
    spectra = {}
    for name, matrices in whitened.items():
        values = torch.linalg.eigvalsh(matrices)  # [C, D], ascending
        spectra[name] = (values[:, 0], values[:, -1])
    return spectra


def main(argv: list[str] | None = None) -> dict:
    """Sample the toy, print the table; returns the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chains", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    for option in ("chains", "warmup", "samples", "threads"):
        if getattr(args, option) < 1:
            raise ZooInputError(f"--{option}", getattr(args, option), "must be at least 1")
    torch.set_num_threads(args.threads)
    spec = hmc_speed.build_spec("hmc", args.chains, args.warmup, args.samples, ["inference.compile=true"])
    data, family, guide, _ = prepare(spec)
    coords = Coordinates(family)
    dimensions = coords.dim
    if args.samples <= dimensions:
        raise ZooInputError("--samples", args.samples, f"each chain's covariance of its draws needs more draws than "
                            f"the model's {dimensions} dimensions to have full rank: use --samples "
                            f"{dimensions + 50} or more")
    started = time.perf_counter()
    result = MCMC().fit(family, guide, data, spec.inference, args.seed, progress=True)
    z = torch.stack([coords.pack({k: v[c] for k, v in result.draws.items()}) for c in range(args.chains)]).double()
    spectra = whitened_spectra(chain_covariances(z))
    rows = []
    for name, (low, high) in spectra.items():
        rows.append({"metric": name, "min_eigenvalue": float(low.median()), "max_eigenvalue": float(high.median()),
                     "condition_number": float((high / low).median())})
    for row in rows:
        row["ratio_to_diagonal_pooled"] = row["condition_number"] / rows[0]["condition_number"]
    table = Table(title=f"toy 1-50-1 tanh, hmc {args.chains} x ({args.warmup} + {args.samples}), D = {z.shape[-1]}:"
                  " median over chains")
    for column in ("metric", "smallest eigenvalue", "largest eigenvalue", "condition number", "ratio to pooled diag"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    for row in rows:
        table.add_row(row["metric"], f"{row['min_eigenvalue']:.2e}", f"{row['max_eigenvalue']:.2f}",
                      f"{row['condition_number']:,.0f}", f"{row['ratio_to_diagonal_pooled']:.3f}")
    Console().print(table)
    figures = {"rows": rows, "chains": args.chains, "warmup": args.warmup, "samples": args.samples,
               "seed": args.seed, "threads": args.threads, "dimensions": int(z.shape[-1]),
               "step_size": float(result.settings["step_size"]),
               "trajectory_length": float(result.settings["trajectory_length"]),
               "seconds": time.perf_counter() - started}
    if args.json:
        write_json(Path(args.json), figures)
    return figures


if __name__ == "__main__":
    sys.exit(exit_code(main))
