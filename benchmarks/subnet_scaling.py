"""Subnetwork Laplace cost against subnet size: Jacobian + GGN time, Cholesky time and peak memory per size D.

The classification (categorical likelihood) fit of ``zoo/inference/laplace.py`` on a ReLU MLP (784-400-400-10 by
default, built by ``zoo.nets.build_mlp``), with the pieces it uses: per chunk of rows ``zoo.curvature.LayerFactors``
(the net's outputs and, per layer, its input and the outputs' Jacobian with respect to its pre-activation), their
``jacobian`` with respect to the D subnet weights, cast to float64, and ``ggn(J, categorical_hessian_root(f))``; here
the GGN is accumulated chunk by chunk (the fit itself keeps every chunk's J and forms the GGN once: the same sum).
Then, as the fit ends, the guide's scale_tril (the Cholesky factor of the covariance) from GGN + Λ (prior precision
1) by ``precision_to_scale_tril`` (Cholesky, inverse, Cholesky). Prior tuning by the evidence
(Newton steps on the linearised model) is not timed.

No data is downloaded: N seeded standard-normal rows and uniformly random labels (the GGN does not look at the
labels). The linearisation point is the net at its seeded initialisation: the cost of the Laplace step does not
depend on whether the net was trained first. Subnets are seeded random selections (``RandomSelection``'s draw).

Each size runs in a fresh process (a multiprocessing ``forkserver`` child: forked from a server that has only
imported torch and the zoo, so no size sees another's allocations and the 3 s torch import is paid once). Its
peak memory is ``ru_maxrss`` at the end minus ``ru_maxrss`` after imports, data, net and a tiny warm-up (on CUDA:
``torch.cuda.max_memory_allocated`` above the allocation after the same setup). A last child compares, on one
chunk at the smallest size, the layer-factor Jacobian with the dense one the zoo never forms (``torch.func``:
``vmap(jacrev)`` of the outputs with respect to ALL weights, then sliced to the subnet); when the dense Jacobian of
a full chunk would exceed ``--dense-max-gib`` it is measured on fewer rows and its time and memory are scaled up
linearly in the rows.

    python benchmarks/subnet_scaling.py [--sizes 100,500,1000,2000,5000] [--rows 1000] [--chunk 256]
                                        [--widths 784,400,400,10] [--classes C] [--threads N] [--device cpu|cuda]
                                        [--dense-max-gib 4] [--json PATH]
"""

from __future__ import annotations

import argparse
import gc
import math
import multiprocessing
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import torch

from zoo.curvature import LayerFactors, ParameterLayout, ggn
from zoo.inference.laplace import precision_to_scale_tril
from zoo.likelihoods import categorical_hessian_root
from zoo.models.subnetwork import random_subset
from zoo.nets import build_mlp
from zoo.runs import write_json

MIB = 2**20
PRELOAD = ["torch", "zoo.curvature", "zoo.nets"]
DATA_NOTE = ("synthetic: {rows:,} seeded standard-normal {inputs}-dim rows with uniformly random labels of {classes} "
             "classes (no data is downloaded; the GGN does not depend on the labels)")
POINT_NOTE = ("linearised at the net's seeded initialisation (no MAP training): the cost of the Laplace step does "
              "not depend on the weights' values")


# ------------------------------------------------------------------------------------------ the child's side
def _maxrss_mib() -> float:
    """Peak resident memory of this process so far, in MiB (``ru_maxrss`` is KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (MIB if sys.platform == "darwin" else 1024)


class Clock:
    """Wall time of a block, synchronising CUDA before reading the clock."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


class Memory:
    """Peak memory above a baseline: ``ru_maxrss`` always, and CUDA's allocator on a CUDA device."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def start(self) -> None:
        gc.collect()
        self.rss0 = _maxrss_mib()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.cuda0 = torch.cuda.memory_allocated() / MIB

    def peak(self) -> dict:
        out = {"baseline_rss_mib": self.rss0, "peak_rss_mib": _maxrss_mib() - self.rss0}
        if self.cuda:
            torch.cuda.synchronize()
            out["peak_cuda_mib"] = torch.cuda.max_memory_allocated() / MIB - self.cuda0
        out["peak_mib"] = out["peak_cuda_mib"] if self.cuda else out["peak_rss_mib"]
        return out


def _setup(job: dict) -> tuple[torch.nn.Module, ParameterLayout, torch.Tensor, torch.Tensor, torch.device]:
    """Threads, the seeded net, data and subnet of a job."""
    if job["threads"]:
        torch.set_num_threads(job["threads"])
    device = torch.device(job["device"])
    widths = job["widths"]
    torch.manual_seed(job["seed"])
    net = build_mlp(widths[0], widths[-1], widths[1:-1], "relu").to(device)
    layout = ParameterLayout(net)
    x = torch.randn(job["rows"], widths[0]).to(device)
    indices = random_subset(layout.size, job["size"], job["seed"]).to(device)  # as RandomSelection picks
    return net, layout, x, indices, device


def _posterior(curvature: torch.Tensor, clock: Clock) -> tuple[float, torch.Tensor]:
    """What ``fit_laplace`` ends with: GGN + Λ and the guide's scale_tril from it; seconds and scale_tril."""
    precision = torch.ones(len(curvature), dtype=curvature.dtype, device=curvature.device)
    t0 = clock()
    curvature.diagonal().add_(precision)
    scale_tril = precision_to_scale_tril(curvature)
    t1 = clock()
    return t1 - t0, scale_tril


def run_size(job: dict) -> dict:
    """One subnet size in this (fresh) process: Jacobian + GGN over all rows in chunks, then the posterior."""
    net, layout, x, indices, device = _setup(job)
    clock, memory = Clock(device), Memory(device)
    # a tiny warm-up (2 rows, the first few weights) so one-time library initialisation is neither timed nor counted
    warm = LayerFactors(net, layout, x[:2])
    warm_j = warm.jacobian(layout, indices[:4]).double()
    _posterior(ggn(warm_j, categorical_hessian_root(warm.f.double())), clock)
    del warm, warm_j
    memory.start()
    factors_s = jacobian_s = ggn_s = 0.0
    curvature = torch.zeros(len(indices), len(indices), dtype=torch.float64, device=device)
    stored = []
    for xc in x.split(job["chunk"]):
        t0 = clock()
        factors = LayerFactors(net, layout, xc)
        t1 = clock()
        J, f = factors.jacobian(layout, indices).double(), factors.f.double()  # as fit_laplace: f, J = linearise
        t2 = clock()
        if job["store_jacobian"]:  # fit_laplace's classification path: keep every chunk's f and J
            stored.append((f, J))
        else:
            curvature += ggn(J, categorical_hessian_root(f))
        t3 = clock()
        factors_s, jacobian_s, ggn_s = factors_s + t1 - t0, jacobian_s + t2 - t1, ggn_s + t3 - t2
        del factors, J, f
    if stored:
        t0 = clock()
        f_all, J_all = torch.cat([f for f, _ in stored]), torch.cat([J for _, J in stored])
        stored.clear()
        curvature = ggn(J_all, categorical_hessian_root(f_all))
        ggn_s += clock() - t0
    cholesky_s, scale_tril = _posterior(curvature, clock)
    row = {"size": len(indices), "factors_s": factors_s, "jacobian_s": jacobian_s, "ggn_s": ggn_s,
           "jacobian_ggn_s": factors_s + jacobian_s + ggn_s, "cholesky_s": cholesky_s, **memory.peak(),
           "ggn_mib": len(indices) ** 2 * 8 / MIB,
           "stored_jacobian_mib": job["rows"] * job["widths"][-1] * len(indices) * 8 / MIB,
           "finite": bool(torch.isfinite(scale_tril).all())}
    row["total_s"] = row["jacobian_ggn_s"] + row["cholesky_s"]
    return row


def _dense_jacobian(net: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``∂f/∂θ [B, O, P]`` over ALL P weights, in ``parameters_to_vector`` order (per example: vmap of jacrev)."""
    from torch.func import functional_call, jacrev, vmap

    params = {name: p.detach() for name, p in net.named_parameters()}

    def one(p: dict, row: torch.Tensor) -> torch.Tensor:
        return functional_call(net, p, (row.unsqueeze(0),)).squeeze(0)

    per_tensor = vmap(jacrev(one), in_dims=(None, 0))(params, x)
    return torch.cat([per_tensor[name].flatten(2) for name in params], dim=2)


def run_dense(job: dict) -> dict:
    """One chunk at the smallest size: the layer-factor Jacobian (on the measured rows, then on the whole chunk),
    then the dense one sliced to the subnet; each warmed up on 2 rows just before its own baseline."""
    net, layout, x, indices, device = _setup(job)
    clock, memory = Clock(device), Memory(device)
    xc, chunk = x[: job["dense_rows"]], x[: job["chunk_rows"]]

    def best(fn, repeats: int) -> tuple[float, torch.Tensor]:
        times = []
        for _ in range(repeats):
            t0 = clock()
            out = fn()
            times.append(clock() - t0)
        return min(times), out

    LayerFactors(net, layout, x[:2]).jacobian(layout, indices)
    memory.start()
    factors_s, J_factors = best(lambda: LayerFactors(net, layout, xc).jacobian(layout, indices), 3)
    out = {"layer_factor_s": factors_s, **{f"layer_factor_{k}": v for k, v in memory.peak().items()}}
    out["layer_factor_chunk_s"] = best(lambda: LayerFactors(net, layout, chunk).jacobian(layout, indices), 3)[0]
    out["layer_factor_chunk_peak_mib"] = memory.peak()["peak_mib"]  # the larger of the two, i.e. the chunk's
    _dense_jacobian(net, x[:2])[:, :, indices]
    memory.start()  # from here on the peak is the dense Jacobian's
    dense_s, J_dense = best(lambda: _dense_jacobian(net, xc)[:, :, indices], 2)
    out.update({"dense_s": dense_s, **{f"dense_{k}": v for k, v in memory.peak().items()}})
    out["max_abs_difference"] = float((J_dense - J_factors).abs().max())
    out["max_abs_jacobian"] = float(J_factors.abs().max())
    return out


# ------------------------------------------------------------------------------------------ the parent's side
def in_fresh_process(fn, job: dict) -> dict:
    """``fn(job)`` in a new process: a forkserver child (spawn where there is no forkserver)."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
    else:
        context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(fn, job).result()


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def dense_plan(rows: int, chunk: int, outputs: int, parameters: int, max_gib: float) -> dict:
    """Rows of the dense measurement: the whole chunk if its full Jacobian fits ``max_gib``, else fewer rows (the
    Jacobian at a quarter of the limit, leaving room for vmap's intermediates and the concatenation)."""
    chunk_rows = min(chunk, rows)
    per_row = outputs * parameters * 4  # float32
    full = chunk_rows * per_row / 2**30
    measured = chunk_rows if full <= max_gib else max(1, min(chunk_rows, int(max_gib / 4 * 2**30 // per_row)))
    return {"chunk_rows": chunk_rows, "dense_rows": measured, "scaled": measured < chunk_rows,
            "dense_chunk_jacobian_gib": full, "dense_measured_jacobian_gib": measured * per_row / 2**30}


def fmt(value: float) -> str:
    """How the table prints every time and memory figure (three significant digits)."""
    return f"{value:.3g}"


def _exponent(a: float, b: float, size_a: int, size_b: int) -> float | None:
    return math.log(b / a) / math.log(size_b / size_a) if a > 0 and b > 0 and size_b != size_a else None


def main(argv: list[str] | None = None) -> dict:
    """Run every size (and the dense reference) in fresh processes, print the table; returns the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=_ints, default=[100, 500, 1000, 2000, 5000], help="subnet sizes D")
    parser.add_argument("--rows", type=int, default=1000, help="synthetic rows N")
    parser.add_argument("--chunk", type=int, default=256, help="rows per Jacobian chunk (LaplaceSpec.chunk_size)")
    parser.add_argument("--widths", type=_ints, default=[784, 400, 400, 10], help="MLP layer widths, input first")
    parser.add_argument("--classes", type=int, help="output classes (default: the last of --widths)")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--device", choices=["cpu", "cuda"],
                        default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dense-max-gib", type=float, default=4.0,
                        help="largest dense Jacobian of a chunk measured as is (larger: fewer rows, scaled)")
    parser.add_argument("--store-jacobian", action="store_true",
                        help="keep every chunk's J and form the GGN once, as fit_laplace does for classification")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    widths = args.widths[:-1] + [args.classes] if args.classes else args.widths
    if len(widths) < 2 or min(widths) < 1 or not args.sizes or min(args.sizes) < 1 or args.rows < 1 or args.chunk < 1:
        parser.error("--widths (at least input and output), --sizes, --rows and --chunk must be positive")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = sorted(set(args.sizes))
    parameters = ParameterLayout(build_mlp(widths[0], widths[-1], widths[1:-1], "relu")).size
    if sizes[-1] > parameters:
        parser.error(f"--sizes: the net has only {parameters:,} weights")
    job = {"widths": widths, "rows": args.rows, "chunk": args.chunk, "threads": args.threads, "device": args.device,
           "seed": args.seed, "store_jacobian": args.store_jacobian}
    results = {"widths": widths, "parameters": parameters, "rows": args.rows, "chunk_size": args.chunk,
               "classes": widths[-1], "sizes": sizes, "seed": args.seed, "device": args.device,
               "threads": args.threads or torch.get_num_threads(), "store_jacobian": args.store_jacobian,
               "data": DATA_NOTE.format(rows=args.rows, inputs=widths[0], classes=widths[-1]),
               "linearisation_point": POINT_NOTE,
               "memory": ("torch.cuda.max_memory_allocated above the allocation after setup" if args.device == "cuda"
                          else "ru_maxrss above its value after imports, data, net and a tiny warm-up"),
               "process": "one fresh process per size (a multiprocessing forkserver child; spawn where there is none)",
               "by_size": []}
    for size in sizes:
        row = in_fresh_process(run_size, {**job, "size": size})
        results["by_size"].append(row)
    first, last = results["by_size"][0], results["by_size"][-1]
    ratios = {"size_ratio": last["size"] / first["size"]}
    for key in ("jacobian_ggn_s", "factors_s", "jacobian_s", "ggn_s", "cholesky_s", "total_s", "peak_mib"):
        name = key.removesuffix("_s").removesuffix("_mib")
        ratios[f"{name}_ratio_largest_over_smallest"] = last[key] / first[key] if first[key] > 0 else None
    results["ratios"] = ratios
    results["scaling_exponents"] = {  # log(t_largest / t_second_largest) / log(D ratio): 1 linear, 2 quadratic, 3 cubic
        key: _exponent(results["by_size"][-2][key], last[key], results["by_size"][-2]["size"], last["size"])
        for key in ("jacobian_s", "ggn_s", "cholesky_s")} if len(sizes) > 1 else {}

    plan = dense_plan(args.rows, args.chunk, widths[-1], parameters, args.dense_max_gib)
    dense = in_fresh_process(run_dense, {**job, "size": sizes[0], "dense_rows": plan["dense_rows"],
                                         "chunk_rows": plan["chunk_rows"]})
    scale = plan["chunk_rows"] / plan["dense_rows"]
    rows_measured, outputs = plan["dense_rows"], widths[-1]
    dense.update(plan, size=sizes[0], dense_max_gib=args.dense_max_gib, scale_to_chunk=scale,
                 dense_chunk_s=dense["dense_s"] * scale, dense_chunk_peak_mib=dense["dense_peak_mib"] * scale,
                 # float32 tensors each side holds for the measured rows: the dense J [B, O, P]; the layer factors
                 # g [B, O, out] and h [B, in] of every layer and J [B, O, D]
                 dense_tensors_mib=rows_measured * outputs * parameters * 4 / MIB,
                 layer_factor_tensors_mib=rows_measured * (outputs * sum(widths[1:]) + sum(widths[:-1])
                                                           + outputs * sizes[0]) * 4 / MIB,
                 dense_time_ratio=dense["dense_s"] / dense["layer_factor_s"],
                 dense_chunk_time_ratio=dense["dense_s"] * scale / dense["layer_factor_chunk_s"],
                 dense_memory_ratio=(dense["dense_peak_mib"] / dense["layer_factor_peak_mib"]
                                     if dense["layer_factor_peak_mib"] > 0 else None),
                 dense_chunk_memory_ratio=(dense["dense_peak_mib"] * scale / dense["layer_factor_chunk_peak_mib"]
                                           if dense["layer_factor_chunk_peak_mib"] > 0 else None))
    dense["dense_tensor_memory_ratio"] = dense["dense_tensors_mib"] / dense["layer_factor_tensors_mib"]
    results["dense_reference"] = dense

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"subnetwork Laplace, categorical, {'-'.join(map(str, widths))} ReLU MLP ({parameters:,} "
                        f"weights), N = {args.rows:,} synthetic rows in chunks of {args.chunk}, {args.device}, "
                        f"{results['threads']} thread(s); one fresh process per size")
    for col in ("subnet size D", "Jacobian+GGN s", "Cholesky s", "total s", "peak MiB", "GGN MiB"):
        table.add_column(col, justify="right")
    for row in results["by_size"]:
        table.add_row(f"{row['size']:,}", fmt(row["jacobian_ggn_s"]), fmt(row["cholesky_s"]),
                      fmt(row["total_s"]), fmt(row["peak_mib"]), fmt(row["ggn_mib"]))
    chunk_rows = plan["chunk_rows"]
    reference = Table(title=f"one chunk, D = {sizes[0]:,}: the layer-factor Jacobian vs the dense Jacobian of all "
                            f"{parameters:,} weights (torch.func vmap(jacrev), then sliced), on {rows_measured} rows"
                            + (f"; the {chunk_rows}-row chunk's dense Jacobian would be "
                               f"{plan['dense_chunk_jacobian_gib']:.2f} GiB > {args.dense_max_gib:g} GiB, so its "
                               f"per-chunk figures are the {rows_measured}-row ones ×{scale:.3g}" if plan["scaled"]
                               else ""))
    for col in ("Jacobian", "s", "peak MiB", "tensors MiB", f"s per {chunk_rows}-row chunk", "peak MiB per chunk"):
        reference.add_column(col, justify="left" if col == "Jacobian" else "right")
    reference.add_row("layer factors", fmt(dense["layer_factor_s"]), fmt(dense["layer_factor_peak_mib"]),
                      fmt(dense["layer_factor_tensors_mib"]), fmt(dense["layer_factor_chunk_s"]),
                      fmt(dense["layer_factor_chunk_peak_mib"]))
    reference.add_row("dense, sliced", fmt(dense["dense_s"]), fmt(dense["dense_peak_mib"]),
                      fmt(dense["dense_tensors_mib"]), fmt(dense["dense_chunk_s"]), fmt(dense["dense_chunk_peak_mib"]))
    console = Console(width=max(Console().width, 130))
    console.print(results["data"] + "; " + POINT_NOTE)
    console.print(table)
    console.print(f"ratios D = {last['size']:,} ÷ D = {first['size']:,} (D ×{fmt(ratios['size_ratio'])}): "
                  + ", ".join(f"{k.replace('_ratio_largest_over_smallest', '')} ×{fmt(v)}"
                              for k, v in ratios.items() if v is not None and k != "size_ratio"))
    if results["scaling_exponents"]:
        console.print("scaling exponents between the two largest sizes (time ∝ D^k): "
                      + ", ".join(f"{k.removesuffix('_s')} {v:.2f}" for k, v in results["scaling_exponents"].items()
                                  if v is not None))
    console.print(reference)
    memory_ratio = dense["dense_memory_ratio"]
    memory_text = fmt(memory_ratio) if memory_ratio is not None else "— (layer factors: no rise)"
    console.print(f"dense ÷ layer-factor ratios on the same {rows_measured} rows: "
                  f"time ×{fmt(dense['dense_time_ratio'])}, peak memory ×{memory_text}, "
                  f"tensors ×{fmt(dense['dense_tensor_memory_ratio'])}; max |J_dense - J_factors| = "
                  f"{dense['max_abs_difference']:.2g} (max |J| {dense['max_abs_jacobian']:.2g})")
    if args.json:
        write_json(args.json, results)
    return results


if __name__ == "__main__":
    main()
