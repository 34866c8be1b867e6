"""Does the ELBO prefer the mean-field fit that predicts worse? Its value beside the test figures, per start and budget.

On a case of the defaults suite (``benchmarks/defaults.py``: the same rows, net, loader and ``fit(loader, val=...)``
call, so the lr is chosen on the validation rows as at the defaults), a guide preset is fitted from each initial
rho (``guide.init_rho``) for each epoch budget. Each fit's objective is then measured on all the training rows: the
KL of the guide from the prior and the expected negative log-likelihood under it (``--draws`` posterior draws), whose
sum is -ELBO (lower is a better fit of the VI objective), beside the guide's median sigma and the fit's test
figures (a regression's in original target units, as the defaults page's tables). A fit with a better test NLL
and a worse -ELBO is one the objective would move away from: what the defaults page's ``twoclass`` row of the
mean-field family measures.

    OMP_NUM_THREADS=1 python benchmarks/mean_field_elbo.py --case twoclass --seeds 0-2 --epochs 20,100 \\
        --init-rho=-5,-8 [--member mean_field] [--lr-by fixed] [--size small] [--json PATH]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import parse_ranges, parse_seeds  # noqa: E402
from defaults import CASES, HELD_OUT, figures_on_test_rows, likelihood_name, loader  # noqa: E402

import zoo  # noqa: E402
from zoo.errors import ZooInputError  # noqa: E402
from zoo.exits import exit_code  # noqa: E402
from zoo.inference.elbo import LazyTraceMeanField_ELBO  # noqa: E402
from zoo.runs import write_json  # noqa: E402

MEAN_FIELD_MEMBERS = ("mean_field", "bayes_by_backprop")  # the presets whose guide is the zoo's mean-field guide


def objective(bnn: zoo.BNN, x: torch.Tensor, y: torch.Tensor, draws: int) -> dict[str, float]:
    """-ELBO of a fitted mean-field BNN on the rows ``(x, y)``: the guide's KL from the prior, each latent site's
    in closed form as the fit's own ELBO computes it (weights, and a learned noise's), plus the expected negative
    log-likelihood of all the rows under ``draws`` guide draws."""
    family, guide = bnn.family, bnn.guide
    elbo = LazyTraceMeanField_ELBO()
    with torch.no_grad():
        elbo.loss(family.model, guide, x, y)  # records each site's term: a latent's KL, and the observed log-lik
        kl = float(sum(elbo.last_terms[name].sum() for name in elbo.kl_methods))  # the latent sites' terms
        expected_nll = float(-family.log_likelihood(bnn.posterior.sample(draws), x, y).sum(-1).mean())
        sigmas = torch.cat([guide.scale(name).flatten() for name in family.latent_sites()])
    return {"kl": kl, "expected_nll": expected_nll, "neg_elbo": kl + expected_nll,
            "median_sigma": float(sigmas.median())}


def main(argv: list[str] | None = None) -> dict:
    """Fit every (seed, initial rho, epochs) cell, print the table; returns the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="twoclass", help="a case of benchmarks/defaults.py")
    parser.add_argument("--member", default="mean_field", choices=MEAN_FIELD_MEMBERS)
    parser.add_argument("--seeds", default="0-2", help="seeds, e.g. 0-2")
    parser.add_argument("--epochs", default="20,100", help="epoch budgets, e.g. 20,100")
    parser.add_argument("--init-rho", default="-5,-8", help="initial rhos, e.g. -5,-8 (write --init-rho=-5,-8)")
    parser.add_argument("--lr-by", choices=("calibration", "fixed"), default=None,
                        help="inference.lr_by (default: the member's default, calibration where val rows are given)")
    parser.add_argument("--size", choices=("full", "small"), default="full",
                        help="small: the defaults suite's 200 rows per case (the tests' run)")
    parser.add_argument("--draws", type=int, default=400, help="guide draws for the expected log-likelihood")
    parser.add_argument("--data-dir", default=None, help="the UCI sets' folder (UCI cases)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    cases = {**CASES, **HELD_OUT}
    if args.case not in cases:
        raise ZooInputError("--case", args.case, f"use one of {', '.join(sorted(cases))}")
    try:
        rhos = [float(r) for r in args.init_rho.split(",") if r.strip()]
    except ValueError:
        raise ZooInputError("--init-rho", args.init_rho, "write numbers, e.g. --init-rho=-5,-8") from None
    if not rhos:
        raise ZooInputError("--init-rho", args.init_rho, "give at least one, e.g. --init-rho=-5,-8")
    if args.draws < 1:
        raise ZooInputError("--draws", args.draws, "use a positive number of draws")
    epochs = parse_ranges(args.epochs, "--epochs", "epoch budget", "20,100")
    torch.set_num_threads(args.threads)
    case = cases[args.case]
    classify = case.task == "classification"
    figure = "test_accuracy" if classify else "test_rmse"
    rows_out = []
    for seed in parse_seeds(args.seeds):
        rows = case.rows(seed, args.size, args.data_dir)
        for rho in rhos:
            for budget in epochs:
                torch.manual_seed(seed)
                bnn = zoo.BNN(case.net(rows), member=args.member, likelihood=likelihood_name(case), seed=seed,
                              guide={"init_rho": rho}, **({"inference": {"lr_by": args.lr_by}} if args.lr_by else {}))
                bnn.fit(loader(rows, case, seed), val=(rows.x_val, rows.y_val), epochs=budget, progress=False)
                test = figures_on_test_rows(bnn, case, rows)
                row = {"seed": seed, "init_rho": rho, "init_sigma": float(F.softplus(torch.tensor(rho))),
                       "epochs": budget, **objective(bnn, rows.x_train, rows.y_train, args.draws),
                       "test_nll": test["nll"], figure: test["accuracy" if classify else "rmse"]}
                rows_out.append(row)
                print(f"seed {seed}, init_rho {rho:g}, {budget} epochs: -ELBO {row['neg_elbo']:.0f}, "
                      f"test NLL {row['test_nll']:.3f}", flush=True)
    table = Table(title=f"{args.member} on {args.case}: the ELBO's parts on the {len(rows.y_train)} training rows "
                  f"({args.draws} draws) and the test figures ({torch.get_num_threads()} thread(s))")
    for col in ("seed", "init rho", "epochs", "KL", "expected NLL", "-ELBO", "median sigma", "test NLL",
                figure.replace("_", " ")):
        table.add_column(col, justify="right")
    for r in rows_out:
        table.add_row(str(r["seed"]), f"{r['init_rho']:g}", str(r["epochs"]), f"{r['kl']:.0f}",
                      f"{r['expected_nll']:.0f}", f"{r['neg_elbo']:.0f}", f"{r['median_sigma']:.3f}",
                      f"{r['test_nll']:.3f}", f"{r[figure]:.3f}")
    Console(width=max(Console().width, 120)).print(table)
    results = {"case": args.case, "member": args.member, "lr_by": args.lr_by, "draws": args.draws,
               "threads": torch.get_num_threads(), "rows": rows_out}
    if args.json:
        write_json(Path(args.json), results)
    return results


if __name__ == "__main__":
    sys.exit(exit_code(main))
