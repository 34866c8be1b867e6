"""The GPU check: one command that runs the CUDA tests and the GPU benchmarks and writes one report.

Made for the first GPU a run gets: ``make gpu-check`` (``DEVICE=cuda``, the full sizes) runs, on that device,

* **tests**: ``tests/test_cuda.py`` (every family trains and predicts on the device, HMC and NUTS, bf16 autocast,
  the loss read-back, rows kept in host memory), its pass/fail counts;
* **SVI step**: the zoo's mean-field SVI step eager and compiled (``inference.compile: true``; on a GPU captured as
  a CUDA graph, its draws passed in) against the same maths hand-written in PyTorch, eager and under
  ``torch.compile`` (``benchmarks/compiled_step.py``'s four sides), and the zoo's step under ``inference.autocast:
  bf16`` against float32, timed in alternating rounds, the device synchronised at each block's ends;
* **DataLoader**: ``zoo.BNN.fit``'s step reading a ``DataLoader`` against tensors already on the device
  (``benchmarks/dataloader_speed.py``'s cases);
* **leapfrog step**: one leapfrog step of the many-chain HMC on the 1-50-1 toy (the potential's value and gradient
  for every chain, and the position and momentum updates) with the potential run eagerly against
  ``inference.compile: true``, side by side, at 64, 512 and 4,096 chains;
* **ResNet**: each member's SVI step on a CIFAR ResNet-20 (MAP, mean-field, rank-1 and BatchEnsemble with K = 4;
  ``benchmarks/conv_speed.py``'s sides), float32 and bf16 autocast, against the plain deterministic loop on the same
  128 images: images per second and the ratio per image seen;
* **HMC**: the zoo's many-chain HMC on the toy at its defaults with ``inference.compile: true`` (full size: the
  first H200 run measured the eager step at about 5 ms, which puts 64 chains x (200 + 200) draws past 10 minutes),
  at 64, 512 and 4,096 chains: min bulk ESS of f at five inputs per second of sampling, R-hat, divergences
  (``benchmarks/hmc_speed.py``'s zoo side; the tiny size runs eagerly and caps trajectories at 32 leapfrog steps);
* **collectives**: a one-rank process group on the device's backend (NCCL on CUDA, gloo on the CPU) and the
  collectives ``--nproc`` runs use (all-reduce, all-gather, broadcast, object gather), checked for their values,
  the all-reduce timed.

A section that fails is reported with its error and the others still run; the exit code is 1 when any failed. The
report is rewritten (atomically) after every case, so a run cut off by a lease or a timeout keeps what it measured;
``--budget-s`` stops starting new cases once that many seconds have passed (the rest are listed as not run; at full
size 450 s by default: the plan, ``PLAN_MINUTES``, is 8 minutes in all). The report opens with one summary table:
each section's status and seconds against its planned minutes, and every ratio it measured.
``DEVICE=cpu`` (``--device cpu --size tiny``) runs the same sections at tiny sizes on the CPU: how CI keeps this
script working where no GPU is. Figures from a CPU run are a smoke test, not a benchmark.

    python benchmarks/gpu_check.py [--device cuda|cpu] [--size full|tiny] [--out DIR] [--threads N] [--budget-s S]

writes ``DIR/gpu_check.json`` (every ratio under a key containing ``ratio``) and ``DIR/gpu_check.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compiled_step import NETS, data_for, hand_svi_step, ratio, time_rounds, zoo_svi_step  # noqa: E402 - sibling modules of this script
from conv_speed import FAMILIES as CONV_FAMILIES  # noqa: E402
from conv_speed import deterministic_step, synthetic_cifar  # noqa: E402
from conv_speed import zoo_step as conv_zoo_step  # noqa: E402
from dataloader_speed import BATCH as LOADER_BATCH  # noqa: E402
from dataloader_speed import cases as loader_cases  # noqa: E402
from dataloader_speed import seconds_per_step  # noqa: E402
from hmc_speed import TOY, build_spec, run_zoo  # noqa: E402
from timing import time_side_by_side  # noqa: E402

import zoo.pipeline  # noqa: E402
from zoo.errors import ZooInputError  # noqa: E402
from zoo.inference.potential import Potential  # noqa: E402
from zoo.runs import write_json, write_text  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# per size: what each section runs (tiny: a smoke test of every path in a few minutes on a CPU)
SIZES = {
    "full": {"svi_rounds": 10, "svi_steps": 50,
             "svi_warmup": 20, "compiled_nets": ("digits", "784"), "resnet_depth": 20, "resnet_rows": 1024,
             "resnet_rounds": 5, "resnet_steps": 10,
             "loader_cases": ("digits 64-100-10 MLP", "digits conv net (1x8x8)"), "loader_rounds": 10,
             "loader_steps": 60, "leapfrog_chains": (64, 512, 4096), "leapfrog_rounds": 10,
             "leapfrog_steps": 50, "hmc_chains": (64, 512, 4096), "hmc_warmup": 200, "hmc_samples": 200,
             "hmc_set": ("inference.compile=true",), "collective_floats": 2**22, "collective_reps": 50},
    "tiny": {"svi_rounds": 3, "svi_steps": 10, "svi_warmup": 3,
             "compiled_nets": ("digits",), "resnet_depth": 8, "resnet_rows": 64, "resnet_rounds": 2, "resnet_steps": 1,
             "loader_cases": ("digits 64-100-10 MLP",), "loader_rounds": 2, "loader_steps": 10,
             "leapfrog_chains": (8,), "leapfrog_rounds": 2, "leapfrog_steps": 5,
             "hmc_chains": (4, 8), "hmc_warmup": 30, "hmc_samples": 30,
             "hmc_set": ("inference.max_leapfrog_steps=32",),  # 30 warm-up steps leave trajectories at the cap
             "collective_floats": 2**12, "collective_reps": 5},
}


def synchroniser(device: torch.device) -> Callable[[], None]:
    """What waits for the device's queued work (nothing on the CPU)."""
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def device_name(device: torch.device) -> str:
    """The device in words: the GPU's name, or the CPU's."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


# ------------------------------------------------------------------------------------------------ sections
# Each section yields (case, figures) pairs; the report is written after each one.
Rows = Iterator[tuple[str, dict]]


def run_tests(device: torch.device, size: dict) -> Rows:
    """``tests/test_cuda.py`` on ``device`` (``ZOO_TEST_DEVICE``), in a process of its own: its pytest counts."""
    started = time.perf_counter()
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_cuda.py"],
                          cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "ZOO_TEST_DEVICE": device.type, "PYTHONPATH": path})
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", done.stdout)}
    row = {"exit_code": done.returncode, "seconds": time.perf_counter() - started, **counts}
    if done.returncode != 0:
        raise RuntimeError(f"tests/test_cuda.py exited {done.returncode} ({counts}):\n{done.stdout[-3000:]}")
    yield "tests/test_cuda.py", row


def run_svi(device: torch.device, size: dict) -> Rows:
    """The zoo's SVI step eager and compiled (on a GPU: captured as a CUDA graph) against the hand-written step eager
    and compiled, and the zoo's step under ``inference.autocast: bf16``, in alternating rounds
    (``benchmarks/compiled_step.py``'s sides)."""
    sync = synchroniser(device)
    for key in size["compiled_nets"]:
        case = NETS[key]
        data = data_for(case, 1024, device.type)
        sides = {"zoo": zoo_svi_step(case, data, False), "zoo_compiled": zoo_svi_step(case, data, True),
                 "hand": hand_svi_step(case, data, False), "hand_compiled": hand_svi_step(case, data, True),
                 "zoo_bf16": zoo_svi_step(case, data, False, autocast="bf16")}
        time_rounds(sides, size["svi_warmup"], 1, sync)  # every minibatch size traced and compiled (and captured)
        times = time_rounds(sides, size["svi_rounds"], size["svi_steps"], sync)
        if not sides["zoo_compiled"].compiled():
            raise RuntimeError("compiling the zoo's SVI step failed (see the warning above): the compiled row is eager")
        yield case["label"], {
            **{f"{name}_us_per_step": statistics.median(t) for name, t in times.items()},
            "zoo_to_hand_ratio": ratio(times, "zoo", "hand"),
            "compiled_to_eager_ratio": ratio(times, "zoo_compiled", "zoo"),
            "compiled_to_hand_compiled_ratio": ratio(times, "zoo_compiled", "hand_compiled"),
            "bf16_to_fp32_ratio": ratio(times, "zoo_bf16", "zoo")}


RESNET_FAMILIES = ("MAP", "mean-field (weight sample)", "rank-1 (mixture guide)", "BatchEnsemble")


def run_resnet(device: torch.device, size: dict) -> Rows:
    """Each member's SVI step on a CIFAR ResNet (``benchmarks/conv_speed.py``'s sides, B = 128, K = 4) against the
    plain deterministic loop on the same B images, float32 and bf16 autocast: images per second and the ratio per
    image seen (the goal on a GPU: rank-1 <= 1.5x, mean-field <= 2x)."""
    sync, depth, batch, members = synchroniser(device), size["resnet_depth"], 128, 4
    data = synthetic_cifar(size["resnet_rows"]).to(device.type)
    overrides = {label: o for label, o, _, _ in CONV_FAMILIES}
    for precision in ("float32", "bf16"):
        autocast = torch.bfloat16 if precision == "bf16" else None
        plain = deterministic_step(data, depth, batch, 1, autocast=autocast)
        for label in RESNET_FAMILIES:
            extra = {"inference": {**overrides[label].get("inference", {}), "autocast": "bf16"}} if autocast else {}
            try:
                zoo = conv_zoo_step({**overrides[label], **extra}, data, depth, batch, members)
            except ZooInputError as err:  # a family autocast does not reach
                yield f"{label}, {precision}", {"refused": str(err)}
                continue
            zoo_us, plain_us = time_side_by_side(zoo, plain, size["resnet_rounds"], size["resnet_steps"], warmup=2,
                                                 sync=sync)
            yield f"{label}, {precision}", {
                "images_per_s": batch / statistics.median(zoo_us) * 1e6,
                "deterministic_images_per_s": batch / statistics.median(plain_us) * 1e6,
                "per_image_ratio": statistics.median(z / p for z, p in zip(zoo_us, plain_us, strict=True))}


def run_loader(device: torch.device, size: dict) -> Rows:
    """``zoo.BNN.fit`` reading a ``DataLoader`` against tensors on the device, side by side, per case."""
    every = loader_cases()
    for name in size["loader_cases"]:
        make_net, x, y, rows = every[name]

        def loader(rows=rows, x=x, y=y) -> torch.utils.data.DataLoader:
            return torch.utils.data.DataLoader(rows(x, y), batch_size=LOADER_BATCH, shuffle=True)

        seconds_per_step(make_net, (x, y), 5, device.type)  # warm-up of both paths
        seconds_per_step(make_net, loader(), 5, device.type)
        in_memory, streamed = [], []
        for _ in range(size["loader_rounds"]):
            in_memory.append(seconds_per_step(make_net, (x, y), size["loader_steps"], device.type))
            streamed.append(seconds_per_step(make_net, loader(), size["loader_steps"], device.type))
        yield name, {"in_memory_us_per_step": statistics.median(in_memory) * 1e6,
                     "dataloader_us_per_step": statistics.median(streamed) * 1e6,
                     "dataloader_ratio": statistics.median(s / m for s, m in zip(streamed, in_memory, strict=True))}


def leapfrog_step(potential: Potential, chains: int, seed: int = 0) -> Callable[[], None]:
    """One leapfrog step (full momentum kick, position drift, the potential's value and gradient) for ``chains``
    chains from random points near the prior's centre, repeated in place on every call."""
    gen = torch.Generator(device=potential.log_joint.x.device).manual_seed(seed)
    shape = (chains, potential.coords.dim)
    like = {"generator": gen, "device": gen.device, "dtype": potential.log_joint.x.dtype}
    z, momentum, eps = 0.1 * torch.randn(shape, **like), torch.randn(shape, **like), 1e-3
    _, grad = potential.value_and_grad(z)

    def step() -> None:
        nonlocal z, momentum, grad
        momentum = momentum - eps * grad
        z = z + eps * momentum
        _, grad = potential.value_and_grad(z)

    return step


def run_leapfrog(device: torch.device, size: dict) -> Rows:
    """The many-chain leapfrog step with the potential run eagerly and compiled, side by side, per chain count."""
    spec = build_spec("hmc", 4, 1, 1, [f"device={device.type}"], TOY)
    data, family, _, _ = zoo.pipeline.prepare(spec)
    eager, compiled = Potential(family, data), Potential(family, data, compile=True)
    for chains in size["leapfrog_chains"]:
        eager_us, compiled_us = time_side_by_side(leapfrog_step(eager, chains), leapfrog_step(compiled, chains),
                                                  size["leapfrog_rounds"], size["leapfrog_steps"], warmup=3,
                                                  sync=synchroniser(device))
        if not compiled.compiled:
            raise RuntimeError("compiling the potential failed (see the warning above): only the eager step ran")
        yield f"{chains} chains", {
            "chains": chains, "eager_us_per_step": statistics.median(eager_us),
            "compiled_us_per_step": statistics.median(compiled_us),
            "compiled_to_eager_ratio": statistics.median(c / e for c, e in zip(compiled_us, eager_us, strict=True)),
            "eager_ns_per_chain_step": statistics.median(eager_us) * 1e3 / chains}


def run_hmc(device: torch.device, size: dict) -> Rows:
    """The zoo's many-chain HMC on the toy at its defaults (tiny: trajectories capped), at each chain count: min
    ESS/s, R-hat, divergences."""
    args = argparse.Namespace(warmup=size["hmc_warmup"], samples=size["hmc_samples"], seed=0, data_dir=None,
                              zoo_set=[f"device={device.type}", *size["hmc_set"]])
    for chains in size["hmc_chains"]:
        row = run_zoo("hmc", chains, args, TOY)
        yield f"{chains} chains", {key: row[key] for key in ("chains", "warmup", "samples", "seconds", "min_ess",
                                                             "min_ess_per_s", "rhat_max", "divergences",
                                                             "leapfrog_steps_per_draw")}


def free_port() -> int:
    """A TCP port free on this host (for the one-rank group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_collectives(device: torch.device, size: dict) -> Rows:
    """A one-rank process group on the device's backend, the collectives of ``--nproc`` runs checked and timed."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        values = torch.arange(size["collective_floats"], dtype=torch.float32, device=device)
        reduced = values.clone()
        dist.all_reduce(reduced)
        parts = [torch.empty_like(values)]
        dist.all_gather(parts, values)
        copied = values.clone()
        dist.broadcast(copied, src=0)
        objects: list[object] = [None]
        dist.all_gather_object(objects, {"rank": 0})
        if not (torch.equal(reduced, values) and torch.equal(parts[0], values) and torch.equal(copied, values)
                and objects == [{"rank": 0}]):
            raise RuntimeError(f"a one-rank {backend} collective changed its values")
        sync = synchroniser(device)
        sync()
        started = time.perf_counter()
        for _ in range(size["collective_reps"]):
            dist.all_reduce(reduced)
        sync()
        seconds = (time.perf_counter() - started) / size["collective_reps"]
    finally:
        dist.destroy_process_group()
    yield f"one-rank {backend}", {"backend": backend, "floats": size["collective_floats"],
                                  "all_reduce_us": seconds * 1e6,
                                  "all_reduce_gb_per_s": values.numel() * 4 / seconds / 1e9}


# in the order they run: the costliest (HMC at thousands of chains) last, so a short lease measures the rest first
SECTIONS: dict[str, Callable[[torch.device, dict], Rows]] = {
    "tests": run_tests, "svi": run_svi, "dataloader": run_loader, "collectives": run_collectives,
    "leapfrog": run_leapfrog, "resnet": run_resnet, "hmc": run_hmc}
# the full-size plan on an H100/H200: expected minutes per section, 8 in all (the first H200 run's where it measured
# them: the 14 CUDA tests of then in 40 s, now 18 with four compiled ones; the SVI and DataLoader rows ~1 min each
# before compiled sides; the rest estimated from this machine's compile times and the step counts above)
PLAN_MINUTES = {"tests": 2.0, "svi": 1.5, "dataloader": 0.5, "collectives": 0.1, "leapfrog": 1.0, "resnet": 1.4,
                "hmc": 1.5}
FULL_BUDGET_S = 450  # no new case starts after 7.5 minutes at full size (a lease can end at any time after)


# ------------------------------------------------------------------------------------------------ report
def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return "" if value is None else str(value)


def markdown(report: dict) -> str:
    """The report as Markdown: the machine, then a table per section (or its error)."""
    lines = [f"# GPU check: {report['device_name']}", "",
             f"`{report['command']}` on {report['date']}: torch {report['torch']}, CUDA {report['cuda']}, "
             f"size {report['size']}, {report['threads']} CPU thread(s).", "", "## Summary", "", summary(report), ""]
    for name, section in report["sections"].items():
        lines += [f"## {name}", ""]
        rows = section["figures"]
        if rows:
            keys = list(dict.fromkeys(k for row in rows.values() for k in row))
            lines += ["| case | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
            lines += [f"| {case} | " + " | ".join(_cell(row.get(k)) for k in keys) + " |" for case, row in rows.items()]
            lines += [""]
        if "error" in section:
            lines += ["**failed**:", "", "```", section["error"].strip(), "```", ""]
        if section.get("stopped"):
            lines += [f"**{section['stopped']}**", ""]
        lines += [f"{section['seconds']:.0f} s", ""]
    if report.get("not_run"):
        lines += [f"Not run (the {report['budget_s']:.0f} s budget was spent): {', '.join(report['not_run'])}.", ""]
    return "\n".join(lines)


def summary(report: dict) -> str:
    """One table over the sections: status, seconds against the plan, and every ratio each measured."""
    lines = ["| section | status | seconds | plan (full size) | ratios |", "|---|---|---|---|---|"]
    for name in SECTIONS:
        section = report["sections"].get(name)
        if section is None:
            status = "not run" if name in report.get("not_run", ()) else "not asked for"
            lines.append(f"| {name} | {status} | | {PLAN_MINUTES[name] * 60:.0f} s | |")
            continue
        ratios = "; ".join(f"{case}: {k.replace('_ratio', '').replace('ratio_', '')} {_cell(v)}"
                           for case, row in section["figures"].items() for k, v in row.items() if "ratio" in k)
        status = "failed" if "error" in section else ("cut short" if section.get("stopped") else "passed")
        lines.append(f"| {name} | {status} | {section['seconds']:.0f} | {PLAN_MINUTES[name] * 60:.0f} s | {ratios} |")
    return "\n".join(lines)


def write_report(report: dict, out: Path) -> str:
    """The report's JSON and Markdown, each written atomically; the Markdown returned."""
    report["failed"] = [name for name, section in report["sections"].items() if "error" in section]
    write_json(out / "gpu_check.json", report)
    text = markdown(report)
    write_text(out / "gpu_check.md", text)
    return text


def main(argv: list[str] | None = None) -> int:
    """Run every section on the device, write the JSON and Markdown report; 1 when a section failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="where everything runs")
    parser.add_argument("--size", choices=tuple(SIZES), help="full (default on CUDA) or tiny (default on the CPU)")
    parser.add_argument("--out", default="build/gpu-check", help="the report's folder")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"sections to run, of: {', '.join(SECTIONS)}")
    parser.add_argument("--budget-s", type=float, help="start no new case after this many seconds (default at full "
                        f"size: {FULL_BUDGET_S}, what a short lease leaves; none at tiny size)")
    args = parser.parse_args(argv)
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown or not only:
        raise ZooInputError("--only", args.only, f"name sections of: {', '.join(SECTIONS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ZooInputError("--device", "cuda", "no CUDA device is visible here: on a machine without a GPU run "
                            "make gpu-check DEVICE=cpu (a smoke test at tiny sizes)")
    if args.threads < 1:
        raise ZooInputError("--threads", args.threads, "give 1 or more")
    if args.budget_s is not None and args.budget_s <= 0:
        raise ZooInputError("--budget-s", args.budget_s, "give a positive number of seconds, or leave it out")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    size_name = args.size or ("full" if device.type == "cuda" else "tiny")
    if args.budget_s is None and size_name == "full":
        args.budget_s = FULL_BUDGET_S
    report = {"device": device.type, "device_name": device_name(device), "size": size_name,
              "torch": torch.__version__, "cuda": torch.version.cuda, "threads": args.threads,
              "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "command": "python benchmarks/gpu_check.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "budget_s": args.budget_s, "sections": {}, "not_run": []}
    out, began = Path(args.out), time.perf_counter()

    def spent() -> bool:
        return args.budget_s is not None and time.perf_counter() - began > args.budget_s

    for name in only:
        if spent():
            report["not_run"].append(name)
            continue
        print(f"gpu check: {name} ...", flush=True)
        started = time.perf_counter()
        section = report["sections"][name] = {"figures": {}, "seconds": 0.0}
        try:
            rows = SECTIONS[name](device, SIZES[size_name])
            for case, figures in rows:
                section["figures"][case] = figures
                section["seconds"] = time.perf_counter() - started
                print(f"  {case}: " + ", ".join(f"{k} {_cell(v)}" for k, v in figures.items()), flush=True)
                write_report(report, out)
                if spent():
                    section["stopped"] = f"the {args.budget_s:.0f} s budget was spent after {case}: no further case run"
                    rows.close()
                    break
        except Exception:  # noqa: BLE001 - every section is reported, a failed one with its traceback
            section["error"] = traceback.format_exc(limit=8)
        section["seconds"] = time.perf_counter() - started
        write_report(report, out)
    text = write_report(report, out)
    print(text)
    print(summary(report))
    print(f"written: {out / 'gpu_check.json'}, {out / 'gpu_check.md'}")
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    from zoo.exits import exit_code

    sys.exit(exit_code(main))
