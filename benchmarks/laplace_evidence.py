"""Post-hoc last-layer Laplace on a trained net: the evidence at the linearised mode against the evidence at the MAP,
and against laplace-torch on the same weights.

A user's 64-100-100-10 ReLU MLP on scikit-learn's digits (all ten classes; a seeded 80/20 split, inputs
standardised on the training rows) is trained once with plain PyTorch (Adam, weight decay; no zoo code), then:

* the zoo, ``zoo.BNN(net, member="subnetwork_laplace", family={"map_from": "net", "selection": {"strategy":
  "last_layer"}}, inference={"evidence_at": ..., "prior_structure": ...})`` at its other defaults (GGN, probit
  predictive), once per ``evidence_at``: ``linearised_mode`` (the default) and ``map``;
* laplace-torch (the optional peer, skipped when it is not installed): ``Laplace(net, "classification",
  subset_of_weights="last_layer", hessian_structure="full")``, ``fit``, then ``optimize_prior_precision(method=
  "marglik", pred_type="glm", link_approx="probit")`` at its other defaults (a scalar precision by Adam on the log
  evidence at the MAP).

Timed: the whole post-hoc fit from the trained weights (the zoo's ``BNN.fit`` in memory, as a user calls it without
``out=``, which also scores the test rows for its metrics; laplace-torch's ``fit`` plus
``optimize_prior_precision``), each run ``--repeats`` times, the median reported. One process, torch pinned to
``--threads`` threads (1 by default): the ratios are side by side in one run. Test NLL and ECE are the probit
predictive's; the zoo's rows also give the NLL of the same posterior's predictive by 1,000 draws of the linearised
logits (``link: mc``: the exact GLM predictive that probit approximates); the log evidence and prior precision are
each method's own.

    python benchmarks/laplace_evidence.py [--threads 1] [--repeats 3] [--epochs 200] [--prior-structure scalar]
                                          [--json PATH]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from sklearn.datasets import load_digits
from torch import nn

from zoo import metrics
from zoo.runs import load_checkpoint, write_json

EVIDENCE_AT = ("linearised_mode", "map")
MC_DRAWS = 1000  # draws of the linearised logits that check the zoo's closed-form predictive (nll_mc)


def digits_split(seed: int = 0) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """scikit-learn's digits, a seeded 80/20 split, inputs standardised on the training rows."""
    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    x = torch.as_tensor(x, dtype=torch.float32)
    y = torch.as_tensor(y, dtype=torch.long)
    train, test = order[:cut], order[cut:]
    mean, std = x[train].mean(0), x[train].std(0).clamp_min(1e-6)
    x = (x - mean) / std
    return (x[train], y[train]), (x[test], y[test])


def trained_net(train: tuple[torch.Tensor, torch.Tensor], epochs: int, seed: int = 0) -> nn.Module:
    """The user's net, trained with plain PyTorch: Adam (lr 1e-3, weight decay 1e-4), batches of 128."""
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(64, 100), nn.ReLU(), nn.Linear(100, 100), nn.ReLU(), nn.Linear(100, 10))
    optimiser = torch.optim.Adam(net.parameters(), lr=1e-3, weight_decay=1e-4)
    x, y = train
    generator = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for rows in torch.randperm(len(x), generator=generator).split(128):
            optimiser.zero_grad()
            nn.functional.cross_entropy(net(x[rows]), y[rows]).backward()
            optimiser.step()
    return net.eval()


def class_scores(probs: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """Test NLL, ECE and accuracy of class probabilities ``[B, C]``."""
    scored = metrics.classification_metrics(probs.double().clamp_min(1e-300).log()[None], y)
    return {"nll": scored["nll"], "ece": scored["ece"], "accuracy": scored["accuracy"]}


def posthoc_fit(net: nn.Module, train, test, **bnn_settings) -> tuple[dict[str, float], object]:
    """One post-hoc fit by the zoo on a copy of ``net`` (``zoo.BNN(net, **bnn_settings)``, in memory, as
    laplace-torch's is): its whole fit time, log evidence and mean prior precision, and the fitted BNN. The fit is
    then saved to a throw-away run directory (not timed) to read its record. Its prior is the evidence's, as
    laplace-torch's marginal likelihood gives its own (``precision_scale: 1``: no factor set on the rows given as
    ``val``, which choose the link).

    :returns: the figures and the BNN.
    """
    import zoo

    with tempfile.TemporaryDirectory() as out:
        bnn = zoo.BNN(copy.deepcopy(net), **bnn_settings)
        started = time.perf_counter()
        bnn.fit(train, val=test, progress=False, precision_scale=1.0)
        seconds = time.perf_counter() - started
        bnn.save(Path(out) / "run")
        record = load_checkpoint(Path(out) / "run" / "checkpoint.pt", "cpu")
    precision = record["prior_precision"]
    return {"seconds": seconds, "log_evidence": float(record["log_evidence"]),
            "prior_precision": float(statistics.fmean(precision.values()))}, bnn


def zoo_fit(net: nn.Module, train, test, evidence_at: str, prior_structure: str) -> dict[str, float]:
    """One post-hoc fit by the zoo; its time, evidence, precision and probit test scores."""
    row, bnn = posthoc_fit(net, train, test, member="subnetwork_laplace",
                           family={"family": "subnetwork", "map_from": "net", "selection": {"strategy": "last_layer"}},
                           inference={"evidence_at": evidence_at, "prior_structure": prior_structure,
                                      "link": "probit", "link_by": "fixed"})  # probit, as laplace-torch's
    probs = bnn.predict(test[0]).probs
    bnn.posterior.link = "mc"  # the same posterior's predictive by draws of the linearised logits
    torch.manual_seed(0)
    by_draws = bnn.predict(test[0], num_samples=MC_DRAWS).probs
    return {**row, **class_scores(probs, test[1]), "nll_mc": class_scores(by_draws, test[1])["nll"]}


def laplace_torch_fit(net: nn.Module, train, test) -> dict[str, float] | None:
    """One post-hoc fit by laplace-torch at its defaults (None where it is not installed)."""
    try:
        from laplace import Laplace
    except ImportError:
        return None
    model = copy.deepcopy(net)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*train), batch_size=256)
    started = time.perf_counter()
    la = Laplace(model, "classification", subset_of_weights="last_layer", hessian_structure="full")
    la.fit(loader)
    la.optimize_prior_precision(method="marglik", pred_type="glm", link_approx="probit")
    seconds = time.perf_counter() - started
    with torch.no_grad():
        probs = la(test[0], pred_type="glm", link_approx="probit")
        log_evidence = float(la.log_marginal_likelihood())
    return {"seconds": seconds, "log_evidence": log_evidence,
            "prior_precision": float(la.prior_precision.mean()), **class_scores(probs, test[1])}


def median_fit(fit, repeats: int) -> dict[str, float] | None:
    """The figures of the fit whose time is the median of ``repeats`` (all fits give the same figures)."""
    runs = [fit() for _ in range(repeats)]
    if runs[0] is None:
        return None
    return sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=200, help="epochs of the user's plain training")
    parser.add_argument("--prior-structure", default="scalar", choices=["scalar", "layer", "parameter"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.threads < 1 or args.repeats < 1 or args.epochs < 1:
        parser.error("--threads, --repeats and --epochs take a positive number")
    torch.set_num_threads(args.threads)
    train, test = digits_split()
    net = trained_net(train, args.epochs)
    rows = {f"zoo, evidence at {at}": median_fit(lambda at=at: zoo_fit(net, train, test, at, args.prior_structure),
                                                 args.repeats) for at in EVIDENCE_AT}
    peer = median_fit(lambda: laplace_torch_fit(net, train, test), args.repeats)
    if peer is not None:
        rows["laplace-torch, marglik at the MAP"] = peer
    lin, at_map = rows["zoo, evidence at linearised_mode"], rows["zoo, evidence at map"]
    result = {"threads": args.threads, "repeats": args.repeats, "epochs": args.epochs,
              "prior_structure": args.prior_structure, "net": "64-100-100-10 ReLU, last layer (1,010 weights)",
              "rows": rows, "linearised_over_map_time_ratio": lin["seconds"] / at_map["seconds"]}
    if peer is not None:
        result["zoo_map_over_laplace_torch_time_ratio"] = at_map["seconds"] / peer["seconds"]
        result["zoo_linearised_over_laplace_torch_time_ratio"] = lin["seconds"] / peer["seconds"]
    table = Table(title=f"post-hoc last-layer Laplace, digits, {args.threads} thread(s), median of {args.repeats}")
    for column in ("fit", "fit seconds", "log evidence", "prior precision", "test NLL", "NLL, 1,000 draws", "ECE",
                   "accuracy"):
        table.add_column(column, justify="left" if column == "fit" else "right")
    for name, row in rows.items():
        table.add_row(name, f"{row['seconds']:.2f}", f"{row['log_evidence']:.2f}", f"{row['prior_precision']:.3g}",
                      f"{row['nll']:.4f}", f"{row['nll_mc']:.4f}" if "nll_mc" in row else "-",
                      f"{row['ece']:.4f}", f"{row['accuracy']:.4f}")
    console = Console(width=120)
    console.print(table)
    for key, value in result.items():
        if "ratio" in key:
            console.print(f"{key}: {value:.2f}")
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
