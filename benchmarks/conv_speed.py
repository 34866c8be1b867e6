"""Each family's SVI step on a CIFAR ResNet-20 against the deterministic net's step, like for like, and the
mean-field step against bayesian-torch's ``dnn_to_bnn`` conversion of the same net, estimator for estimator.

Every zoo side is exactly the step training runs (``zoo.inference.svi.SVIStep`` on the family and guide that
``zoo.pipeline.build`` makes from a spec, Adam from ``make_optimizer``). The deterministic side is the plain
ResNet-20 (the same ``zoo.nets`` module: BatchNorm, 1x1 shortcuts) in plain PyTorch: forward, cross-entropy,
backward, the same Adam, on the rows the family's step computes on: B rows, or K x B for rank-1 and the deep
ensemble (K members each see the B rows). bayesian-torch's side converts that net with ``dnn_to_bnn`` (mean-field
Gaussian, the same N(0, 1) prior and softplus scale) and trains it as its README does (cross-entropy + KL / N);
its ``Reparameterization`` layers draw one weight sample per forward pass, as the zoo's mean-field guide does, and
its ``Flipout`` layers decorrelate examples, as the zoo's local reparameterisation does.

Data: synthetic CIFAR-shaped rows (3 x 32 x 32, 10 classes; the timing does not depend on the pixels). Timings
alternate between the two sides of each row in rounds, so machine noise hits both alike; the ratio is the median
of the per-round ratios. Targets: rank-1 (K = 4) <= 1.3 x the deterministic step on K x B rows;
mean-field <= 1.0 x bayesian-torch with the same estimator.

    python benchmarks/conv_speed.py [--depth 20] [--batch 128] [--members 4] [--rounds 5] [--steps 3]
                                    [--warmup 2] [--threads 1] [--rows 1024] [--modes eager,compiled]
                                    [--families LABEL,...] [--precision float32|bf16] [--json PATH]

Every row also gives images per second (B over the zoo's step) and the ratio per image seen: the zoo's step against
the plain loop on the same B images (for rank-1 and the ensembles, whose K members each see every image, this is
the K x B comparison's ratio times about K). ``--precision bf16`` runs every side's forward under ``torch.autocast``
in bfloat16 (the zoo's ``inference.autocast: bf16``; eager only; no bayesian-torch row).

``--modes compiled`` compares like with like again: the zoo step with ``inference.compile: true`` against the
deterministic loss under ``torch.compile`` (every minibatch size compiled before timing).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table
from timing import batches, optimiser_step, time_side_by_side  # noqa: E402 - sibling module of this script

from zoo.data.base import make_dataset
from zoo.errors import ZooInputError
from zoo.inference.elbo import ELBOS
from zoo.inference.svi import AUTOCAST_DTYPES, SVIStep, make_optimizer
from zoo.models import FAMILIES as FAMILY_SECTIONS  # noqa: E402
from zoo.nets import build_net
from zoo.pipeline import build
from zoo.runs import write_json
from zoo.spec import SVISpec, load_spec, net_section

RANK1_TARGET, BAYESIAN_TORCH_TARGET = 1.3, 1.0
PRIOR_ONE = {"name": "normal", "loc": 1.0, "scale": 1.0}  # rank-1 factors: centred at 1
# (row label, model/guide/prior/inference overrides, members each example runs through, bayesian-torch estimator)
FAMILIES = [
    ("MAP", {"model": {"family": "all_weights"}, "guide": {"name": "delta"}}, 1, None),
    ("mean-field (weight sample)", {"model": {"family": "all_weights"}, "guide": {"name": "mean_field"}}, 1,
     "Reparameterization"),
    ("mean-field (local reparam.)", {"model": {"family": "all_weights"}, "guide": {"name": "mean_field"},
                                     "inference": {"local_reparam": True}}, 1, "Flipout"),
    ("MC dropout", {"model": {"family": "all_weights"}, "guide": {"name": "dropout"}}, 1, None),
    ("rank-1 (mixture guide)", {"model": {"family": "rank1"}, "guide": {"name": "mixture"}, "prior": PRIOR_ONE},
     "K", None),
    ("BatchEnsemble", {"model": {"family": "rank1"}, "guide": {"name": "batch_ensemble"}, "prior": PRIOR_ONE},
     "K", None),
    ("deep ensemble", {"model": {"family": "deep_ensemble"}, "guide": {"name": "delta"}}, "K", None),
]


ADAM = SVISpec(lr=1e-3)  # every side's optimiser: make_optimizer's Adam at the zoo's default learning rate


def plain_resnet(depth: int) -> torch.nn.Module:
    """The zoo's CIFAR ResNet-``depth`` for 3x32x32 rows and 10 classes, as every side of the comparison builds it."""
    return build_net(net_section(name="resnet", depth=depth, in_channels=3), 3 * 32 * 32, 10)


def synthetic_cifar(rows: int, seed: int = 0):
    """CIFAR-shaped rows (3,072 features, channel-major) and labels, standardised like any data set."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(rows, 3 * 32 * 32, generator=gen).numpy() * 255
    y = torch.randint(0, 10, (rows,), generator=gen).numpy()
    return make_dataset("synthetic CIFAR", "classification", x, y, x[:16], y[:16], n_classes=10)


def zoo_step(overrides: dict, data, depth: int, batch: int, members: int, compile: bool = False
             ) -> Callable[[], float]:
    """The zoo's SVI step for one family on ResNet-``depth``, built from a spec as ``zoo train`` builds it
    (``inference.compile`` set to ``compile``)."""
    raw = {"data": {"name": "digits"},  # not read: the family and guide are built on `data` below
           "net": {"name": "resnet", "depth": depth, "in_channels": 3}, "device": data.device.type, "seed": 0,
           **overrides}
    if "members" in FAMILY_SECTIONS[raw["model"]["family"]].model_fields:  # an ensemble family: K members
        raw["model"] = {**raw["model"], "members": members}
    raw["inference"] = {"batch_size": batch, "lr": ADAM.lr, "compile": compile, **overrides.get("inference", {})}
    spec = load_spec(raw)
    family, guide = build(spec, data)
    optimizer = make_optimizer(list(guide.parameters()) + family.point_parameters(), spec.inference)
    step = SVIStep(family.model, guide, ELBOS[spec.inference.elbo](1), optimizer,
                   local_reparam=spec.inference.local_reparam, compile=spec.inference.compile,
                   autocast=AUTOCAST_DTYPES[spec.inference.autocast])
    order = batches(data.n_train, batch, seed=1, device=data.device)

    def run() -> torch.Tensor:  # the step reads its loss on the host, as the baselines' steps do
        return step(data.x_train, data.y_train, next(order))

    run.svi_step = step  # main() checks that a compiled row really ran compiled
    return run


def deterministic_step(data, depth: int, batch: int, tiles: int, compile: bool = False,
                       autocast: torch.dtype | None = None) -> Callable[[], float]:
    """The plain ResNet on the minibatch tiled ``tiles`` times: forward, cross-entropy, backward, Adam (the loss
    under ``torch.compile`` when ``compile``; its forward under ``torch.autocast`` to ``autocast`` when given), on
    the data's device."""
    net = plain_resnet(depth).to(data.device)
    optimizer = make_optimizer(list(net.parameters()), ADAM)
    order = batches(data.n_train, batch, seed=1, device=data.device)

    def loss(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        if autocast is None:
            return F.cross_entropy(net(xb), yb)
        with torch.autocast(xb.device.type, autocast):
            out = net(xb)
        return F.cross_entropy(out.float(), yb)

    loss_fn = torch.compile(loss, dynamic=False) if compile else loss

    def step() -> float:
        idx = next(order)
        xb, yb = data.x_train.index_select(0, idx), data.y_train.index_select(0, idx)
        return optimiser_step(loss_fn(xb.repeat(tiles, 1), yb.repeat(tiles)), optimizer)

    return step


def bayesian_torch_step(data, depth: int, batch: int, estimator: str) -> Callable[[], float] | None:
    """bayesian-torch's mean-field conversion of the same ResNet, trained as its README shows; None without it."""
    try:
        from bayesian_torch.models.dnn_to_bnn import dnn_to_bnn, get_kl_loss
    except Exception:  # not installed, or a torch it does not import with
        return None
    net = plain_resnet(depth)
    dnn_to_bnn(net, {"prior_mu": 0.0, "prior_sigma": 1.0, "posterior_mu_init": 0.0, "posterior_rho_init": -3.0,
                     "type": estimator, "moped_enable": False})
    optimizer = make_optimizer(list(net.parameters()), ADAM)
    order = batches(data.n_train, batch, seed=1)

    def step() -> float:
        idx = next(order)
        out = net(data.x_train.index_select(0, idx))
        loss = F.cross_entropy(out, data.y_train.index_select(0, idx)) + get_kl_loss(net) / data.n_train
        return optimiser_step(loss, optimizer)

    return step


def compare(a: Callable[[], float], b: Callable[[], float], args: argparse.Namespace, warmup: int) -> dict:
    """Median ms per step of each side (alternating rounds) and the median of the per-round ratios a / b."""
    ta, tb = time_side_by_side(a, b, args.rounds, args.steps, warmup)
    ratios = [x / y for x, y in zip(ta, tb, strict=True)]
    return {"ms_per_step": statistics.median(ta) / 1e3, "peer_ms_per_step": statistics.median(tb) / 1e3,
            "ratio": statistics.median(ratios), "ratios": ratios}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=20, help="ResNet depth 6n + 2 (default 20)")
    parser.add_argument("--batch", type=int, default=128, help="minibatch rows B")
    parser.add_argument("--members", type=int, default=4, help="K for rank-1 and the deep ensemble")
    parser.add_argument("--rows", type=int, default=1024, help="synthetic training rows")
    parser.add_argument("--rounds", type=int, default=5, help="alternating timed rounds")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per round and side")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps of each side first")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--families", help="comma-separated row labels to run (default: all)")
    parser.add_argument("--modes", default="eager", help="comma-separated: eager, compiled (the zoo step with "
                        "inference.compile against the deterministic loss under torch.compile; no bayesian-torch)")
    parser.add_argument("--precision", choices=("float32", "bf16"), default="float32", help="bf16: every side's "
                        "forward under torch.autocast (the zoo's inference.autocast: bf16); eager only")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if min(args.batch, args.members, args.rows, args.rounds, args.steps, args.threads) < 1 or args.warmup < 0:
        parser.error("--batch, --members, --rows, --rounds, --steps and --threads must be positive")
    wanted = FAMILIES if not args.families else [f for f in FAMILIES if f[0] in args.families.split(",")]
    if not wanted:
        parser.error(f"--families names none of: {', '.join(f[0] for f in FAMILIES)}")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"eager", "compiled"}:
        parser.error(f"--modes takes eager and/or compiled, not {args.modes!r}")
    autocast = AUTOCAST_DTYPES["bf16"] if args.precision == "bf16" else None
    if autocast is not None and "compiled" in modes:
        parser.error("--precision bf16 runs eagerly (the zoo refuses autocast with compile): use --modes eager")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    data = synthetic_cifar(args.rows)
    k, b = args.members, args.batch
    results = {"depth": args.depth, "batch_size": b, "members": k, "threads": args.threads, "rounds": args.rounds,
               "precision": args.precision,
               "steps_per_round": args.steps, "modes": modes, "torch": torch.__version__, "rows": {}}
    table = Table(title=f"SVI step on ResNet-{args.depth} (3x32x32, B = {b}, K = {k}, {args.threads} thread(s)); "
                        "ratio = median of per-round ratios, lower is better", title_justify="left")
    for col in ("family", "mode", "ms/step", "images/s", "deterministic ms/step (rows)", "ratio",
                "per image seen (vs B rows)", "bayesian-torch ms/step", "ratio vs bayesian-torch", "target"):
        table.add_column(col, justify="left" if col in ("family", "mode") else "right")
    for label, overrides, per_example, estimator in wanted:
        tiles = k if per_example == "K" else 1
        row = results["rows"][label] = {"deterministic_rows": tiles * b}
        for mode in modes:
            compiled = mode == "compiled"
            if autocast is not None:
                overrides = {**overrides, "inference": {**overrides.get("inference", {}), "autocast": "bf16"}}
            try:
                zoo = zoo_step(overrides, data, args.depth, b, k, compile=compiled)
            except ZooInputError as err:  # the zoo refuses this mode for this family (e.g. compiled rank-1)
                row[mode] = {"refused": str(err)}
                table.add_row(label, mode, "refused", "-", "-", "-", "-", "-", "-", str(err).split(": ", 1)[-1][:60])
                continue
            warmup = args.warmup + (args.rows // b + 2 if compiled else 0)  # every batch size compiled first
            fig = row[mode] = {"versus_deterministic": compare(
                zoo, deterministic_step(data, args.depth, b, tiles, compile=compiled, autocast=autocast), args,
                warmup)}
            # per image seen: against the plain loop on the B images themselves (each member sees every one)
            fig["per_image"] = (compare(zoo, deterministic_step(data, args.depth, b, 1, compile=compiled,
                                                                autocast=autocast), args, args.warmup)
                                if tiles > 1 else fig["versus_deterministic"])
            fig["images_per_s"] = b / fig["versus_deterministic"]["ms_per_step"] * 1e3
            if compiled and not zoo.svi_step.compiled:
                raise SystemExit(f"{label}: compiling the zoo step failed (see the warning above), so the compiled "
                                 "row would time the eager step; run with --modes eager")
            with_peer = estimator and not compiled and autocast is None
            peer = bayesian_torch_step(data, args.depth, b, estimator) if with_peer else None
            if peer is not None:
                fig["versus_bayesian_torch"] = {**compare(zoo, peer, args, args.warmup), "estimator": estimator}
            elif with_peer:
                fig["versus_bayesian_torch"] = {"skipped": "bayesian-torch is not installed (pip install "
                                                           "'pyro-bnn-zoo[vision-bench]' in the vision venv)"}
            det, bt, target = fig["versus_deterministic"], fig.get("versus_bayesian_torch", {}), ""
            if label.startswith("rank-1"):
                fig["rank1_ratio_within_target"] = det["ratio"] <= RANK1_TARGET
                target = f"<= {RANK1_TARGET}: {'yes' if det['ratio'] <= RANK1_TARGET else 'no'}"
            if "ratio" in bt:
                fig["bayesian_torch_ratio_within_target"] = bt["ratio"] <= BAYESIAN_TORCH_TARGET
                target = f"<= {BAYESIAN_TORCH_TARGET} ({estimator}): {'yes' if bt['ratio'] <= 1.0 else 'no'}"
            table.add_row(label, mode, f"{det['ms_per_step']:.0f}", f"{fig['images_per_s']:.0f}",
                          f"{det['peer_ms_per_step']:.0f} ({tiles * b})", f"{det['ratio']:.2f}",
                          f"{fig['per_image']['ratio']:.2f}", f"{bt['peer_ms_per_step']:.0f}" if "ratio" in bt else "-",
                          f"{bt['ratio']:.2f}" if "ratio" in bt else ("not installed" if bt else "-"), target)
    Console(width=max(Console().width, 200)).print(table)
    if args.json:
        write_json(args.json, results)
    return results


if __name__ == "__main__":
    main()
