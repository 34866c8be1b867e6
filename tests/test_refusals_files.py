"""Issue 56: every user-input failure a clear refusal, and nothing the user wrote is replaced.

One table, as in ``tests/test_refusals.py``: ``zoo`` command lines (run in-process through :func:`zoo.cli.main`)
exit 2 with an ``error:`` message, and Python calls raise :class:`~zoo.errors.ZooInputError`, each naming the field
(or file), what was given and the fix. None prints a traceback, writes outside its --out or changes the user's files.
The cases read a few tiny runs trained once for the module ({runs}) and the files each test makes ({in}).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import zoo
from tests.conftest import assert_fragments, refused, sandbox
from zoo.bnn import resumed_spec
from zoo.cli import main
from zoo.errors import ZooInputError
from zoo.runs import CHECKPOINT_FILE, METRICS_FILE, POINT_ESTIMATE_FILE, carries_mark
from zoo.spec import load_spec

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
CPU = ["--no-progress", "--set", "device=cpu"]
TINY_SVI = [*CPU, "--set", "inference.num_steps=2", "--set", "inference.predictive_samples=2"]
RUNS = {  # the runs the cases read: (config, settings)
    "mf": ("mean_field_toy", TINY_SVI),
    "map": ("map_digits", TINY_SVI),
    "hmc": ("hmc_toy", [*CPU, "--set", "inference.num_chains=2", "--set", "inference.warmup_steps=2", "--set",
                        "inference.num_samples=3", "--set", "inference.predictive_samples=2", "--set",
                        "inference.compile=false"]),
    "swag": ("swag_toy", [*CPU, "--set", "inference.epochs=2", "--set", "inference.pretrain_epochs=1", "--set",
                          "inference.rank=2", "--set", "inference.collect_every=1", "--set",
                          "inference.predictive_samples=2"]),
}


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(1, 4), nn.Tanh(), nn.Linear(4, 1))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """The tiny runs, plus copies of the mean-field run with a truncated metrics.json / checkpoint."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("runs")
    for name, (config, settings) in RUNS.items():
        code = main(["train", str(CONFIGS / f"{config}.yaml"), "--out", str(root / name), *settings])
        assert code in (0, 3), name  # 3: the tiny HMC run's chains fail the convergence checks
    for name, file in (("mf_metrics", METRICS_FILE), ("mf_checkpoint", CHECKPOINT_FILE)):
        shutil.copytree(root / "mf", root / name, ignore=shutil.ignore_patterns(".zoo-run.lock"))
        whole = (root / name / file).read_bytes()
        (root / name / file).write_bytes(whole[:len(whole) // 3])
    return root


def inputs(folder: Path) -> None:
    """The user's files the cases read (or must leave alone)."""
    folder.mkdir(exist_ok=True)
    (folder / "plots").mkdir()
    (folder / "plots" / "compare.png").write_bytes(b"\x89PNG\r\n\x1a\nthe user's own figure")
    (folder / "user.json").write_text('{"mine": true}\n')
    (folder / "list.yaml").write_text("- data\n- net\n")
    state = net().state_dict()
    torch.save(state, folder / "good.pt")
    whole = (folder / "good.pt").read_bytes()
    (folder / "truncated.pt").write_bytes(whole[:len(whole) // 2])
    (folder / "empty.pt").write_bytes(b"")
    (folder / "text.pt").write_text("not weights\n")
    torch.save(torch.zeros(3), folder / "tensor.pt")
    torch.save([torch.zeros(3)], folder / "list.pt")
    torch.save(net(), folder / "module.pt")
    (folder / "corrupt.safetensors").write_bytes(b"garbage, not safetensors")
    save_file(state, str(folder / "good.safetensors"))
    whole = (folder / "good.safetensors").read_bytes()
    (folder / "truncated.safetensors").write_bytes(whole[:-10])
    (folder / "not_a_run").mkdir()
    labels = np.zeros(5, np.int64)
    for name, write in (("pickled", lambda p: np.save(p, np.array([{"x": 1}] * 5, dtype=object), allow_pickle=True)),
                        ("dumped", lambda p: np.zeros((5, 8, 8), np.uint8).dump(p)),
                        ("floats", lambda p: np.save(p, np.zeros((5, 8, 8), np.float32)))):
        (folder / f"shift_{name}").mkdir()
        write(folder / f"shift_{name}" / "contrast.npy")
        np.save(folder / f"shift_{name}" / "labels.npy", labels)
    (folder / "shift_mnist" / "fog").mkdir(parents=True)
    np.save(folder / "shift_mnist" / "fog" / "test_images.npy", np.zeros((6, 8, 8), np.uint8))
    np.save(folder / "shift_mnist" / "fog" / "test_labels.npy", np.zeros(4, np.uint8))


def train(config: str, *args: str, out: str = "{out}") -> list[str]:
    """``zoo train configs/<config>.yaml --out OUT`` with tiny settings on the CPU, then ``args``."""
    return ["train", str(CONFIGS / f"{config}.yaml"), "--out", out, *TINY_SVI, *args]


def compare(*args: str) -> list[str]:
    return ["compare", "{runs}/hmc", "{runs}/mf", "--samples", "2", "--allow-unconverged", *args]


def weights(name: str) -> Callable:
    return lambda folder, out, runs: zoo.BNN(net(), weights=folder / name)


def resume_with(override: str) -> Callable:
    def run(folder: Path, out: Path, runs: Path) -> None:
        saved = load_spec(runs / "mf" / "spec.yaml")
        resumed_spec(load_spec(runs / "mf" / "spec.yaml", override), saved, runs / "mf")
    return run


SAFETENSORS_FIX = "save one with safetensors.torch.save_file(net.state_dict(), path)"
TORCH_FIX = "torch.save(net.state_dict(), path)"
SHIFT_HOLDS = "a shift file holds uint8 images [N, H, W] or [N, H, W, C] with pixel values 0..255"
PRUNE_FIX = "prune a run of inference.method: svi with guide.name: mean_field"

CASES = [
    # 3. zoo compare never replaces a compare.png or --json file it did not write (the default --out is the cwd)
    pytest.param(compare("--out", "{in}/plots"), 2,
                 ("--out: got '{in}/plots/compare.png'", "exists and was not written by zoo compare",
                  "choose another --out folder"), id="compare-user-png"),
    pytest.param(compare("--out", "{out}", "--json", "{in}/user.json"), 2,
                 ("--json: got '{in}/user.json'", "exists and was not written by zoo compare",
                  "give a new file name for --json"), id="compare-user-json"),
    pytest.param(compare("--out", "{out}", "--json", "{in}/plots"), 2,
                 ("--json: got '{in}/plots'", "is a directory"), id="compare-json-is-a-directory"),
    # 12-14 and other broken weights: a clear refusal naming the file and how to save one
    pytest.param(weights("corrupt.safetensors"), ZooInputError,
                 ("weights: got '{in}/corrupt.safetensors'; is not a readable .safetensors file", SAFETENSORS_FIX),
                 id="weights-corrupt-safetensors"),
    pytest.param(weights("truncated.safetensors"), ZooInputError, "is not a readable .safetensors file",
                 id="weights-truncated-safetensors"),
    pytest.param(weights("empty.pt"), ZooInputError, ("'{in}/empty.pt'; is empty (0 bytes)", TORCH_FIX),
                 id="weights-empty-pt"),
    pytest.param(lambda folder, out, runs: zoo.BNN(net(), weights=5), ZooInputError,
                 ("weights: got 'int'; give trained weights as a state dict", "the path (str or pathlib.Path)"),
                 id="weights-int"),
    pytest.param(weights("truncated.pt"), ZooInputError,
                 ("cannot be read as a torch file", "it is truncated or not written by torch.save", TORCH_FIX),
                 id="weights-truncated-pt"),
    pytest.param(weights("text.pt"), ZooInputError, ("'{in}/text.pt'; is not a file torch.save writes", TORCH_FIX),
                 id="weights-text-named-pt"),
    pytest.param(weights("tensor.pt"), ZooInputError, "holds a Tensor, not a state dict", id="weights-tensor-pt"),
    pytest.param(weights("list.pt"), ZooInputError, "holds a list, not a state dict", id="weights-list-pt"),
    pytest.param(weights("module.pt"), ZooInputError, ("holds Python objects besides tensors", TORCH_FIX),
                 id="weights-pickled-module"),
    pytest.param(weights("not_a_run"), ZooInputError,
                 f"is a directory without {POINT_ESTIMATE_FILE}, so not a finished zoo run", id="weights-not-a-run"),
    # 21. a seed numpy cannot take
    pytest.param(train("mean_field_toy", "--set", "seed=100000000000000000000000"), 2,
                 "seed: got 100000000000000000000000; a seed is a whole number from 0 to 4294967294",
                 id="seed-too-large"),
    # 22. prior scales whose KL / log-density overflow the run's dtype
    pytest.param(train("mean_field_toy", "--set", "prior.scale=1e-30"), 2,
                 ("prior.default.scale: got 1e-30; the smallest scale a float32 run allows is 1.6e-16",
                  "(or dtype: float64, down to 5.0e-147)"), id="prior-scale-tiny"),
    pytest.param(train("mean_field_toy", "--set", "prior:={name: scale_mixture, sigma2: 1.0e-20}"), 2,
                 "prior.default.sigma2: got 1e-20; the smallest sigma2 a float32 run allows", id="mixture-sigma2-tiny"),
    pytest.param(train("mean_field_toy", "--set", "prior.sites={'*.bias': {name: cauchy, scale: 1.0e-17}}"), 2,
                 "prior.sites.*.bias.scale: got 1e-17", id="site-prior-scale-tiny"),
    pytest.param(train("mean_field_toy", "--set", "prior.scale=1e-200", "--set", "dtype=float64"), 2,
                 "the smallest scale a float64 run allows is 5.0e-147", id="prior-scale-tiny-float64"),
    # 23. shift files that are not arrays of pixel values
    pytest.param(["eval", "{runs}/map", "--shift", "{in}/shift_pickled", "--samples", "2"], 2,
                 ("--shift: got '{in}/shift_pickled/contrast.npy'; holds an array of pickled Python objects",
                  SHIFT_HOLDS), id="shift-pickled-objects"),
    pytest.param(["eval", "{runs}/map", "--shift", "{in}/shift_dumped", "--samples", "2"], 2,
                 ("is not a .npy file but a pickle of Python objects", SHIFT_HOLDS), id="shift-dumped-pickle"),
    pytest.param(["eval", "{runs}/map", "--shift", "{in}/shift_floats", "--samples", "2"], 2,
                 ("holds an array of float32", "(images * 255).round().astype(np.uint8)"), id="shift-float-images"),
    pytest.param(["eval", "{runs}/map", "--shift", "{in}/shift_mnist", "--samples", "2"], 2,
                 "6 images for 4 labels", id="shift-mnist-c-counts-differ"),
    # 25. pruning names what the run's posterior is
    pytest.param(["prune", "{runs}/swag"], 2, ("zoo prune: got 'SWAG'", "low-rank covariance", PRUNE_FIX),
                 id="prune-swag"),
    pytest.param(["prune", "{runs}/hmc"], 2, ("zoo prune: got 'stored draws'", "an MCMC or SG-MCMC run", PRUNE_FIX),
                 id="prune-hmc"),
    pytest.param(["prune", "{runs}/map"], 2, ("zoo prune: got 'DeltaGuide'", "point estimate", PRUNE_FIX),
                 id="prune-map"),
    # 26. a resume with another spec names every field that differs
    pytest.param(train("mean_field_toy", "--set", "inference.lr=0.02", "--set", "prior.scale=2", "--resume",
                       out="{runs}/mf"), 2,
                 ("the spec differs from the run's spec.yaml in 2 field(s)", "prior.default.scale: 1.0 in the run, "
                  "2.0 given", "inference.lr: 0.01 in the run, 0.02 given"), id="resume-spec-differs"),
    pytest.param(resume_with("inference.lr=0.02"), ZooInputError, "inference.lr: 0.01 in the run, 0.02 given",
                 id="api-resumed-spec-differs"),
    pytest.param(resume_with("guide.name=delta"), ZooInputError,
                 ("in 1 field(s): guide.name: 'mean_field' in the run, 'delta' given",), id="resume-other-guide"),
    # more broken files
    pytest.param(["train", "{in}/list.yaml", "--out", "{out}"], 2,
                 "spec: got '{in}/list.yaml'; the top level must be a mapping of sections", id="spec-is-a-list"),
    pytest.param(["compare", "{runs}/hmc", "{runs}/mf_metrics", "--samples", "2", "--allow-unconverged", "--out",
                  "{out}"], 2, ("RUN: got '{runs}/mf_metrics'; its metrics.json cannot be read as JSON",
                                "restore it"), id="compare-truncated-metrics"),
    pytest.param(["eval", "{runs}/mf_checkpoint", "--samples", "2"], 2,
                 "checkpoint.pt is unreadable", id="eval-truncated-checkpoint"),
]


def _files(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("run, expected, fragments", CASES)
def test_bad_files_are_refused_naming_the_file_and_the_fix(run: list[str] | Callable, expected: int | type,
                                                          fragments: str | tuple[str, ...], runs: Path,
                                                          tmp_path: Path, monkeypatch, capsys) -> None:
    folder, out = sandbox(tmp_path, monkeypatch)
    inputs(folder)
    before = _files(tmp_path)

    def filled(text: str) -> str:
        return text.replace("{in}", str(folder)).replace("{out}", str(out)).replace("{runs}", str(runs))

    if callable(run):
        with pytest.raises(expected) as info:
            run(folder, out, runs)
        message = str(info.value)
    else:
        message = refused([filled(arg) for arg in run], capsys, (), expected)
    assert_fragments(message, tuple(map(filled, (fragments,) if isinstance(fragments, str) else fragments)))
    after = _files(tmp_path)
    assert {p for p in set(after) - set(before) if out not in p.parents} == set()
    assert {p for p in before if after.get(p) != before[p]} == set()  # the user's files are untouched
    assert not (out / CHECKPOINT_FILE).exists()


def test_compare_replaces_only_its_own_files(runs: Path, tmp_path: Path, monkeypatch) -> None:
    """What zoo compare wrote, it may write again: its plot carries its mark, its JSON is its rows."""
    monkeypatch.chdir(tmp_path)
    argv = ["compare", str(runs / "hmc"), str(runs / "mf"), "--samples", "2", "--allow-unconverged", "--out",
            str(tmp_path / "plots"), "--json", str(tmp_path / "rows.json")]
    assert main(argv) == 0
    assert carries_mark(tmp_path / "plots" / "compare.png", "written by zoo compare")
    assert main(argv) == 0  # its own files are replaced
    assert main(argv[:-4]) == 0 and (tmp_path / "compare.png").is_file()  # the default --out: the cwd


def test_prior_scale_at_the_smallest_allowed_trains(tmp_path: Path) -> None:
    """The smallest scale the refusal names does train in float32 (its KL stays finite)."""
    assert main(train("mean_field_toy", "--set", "prior.scale=1.6e-16", out=str(tmp_path / "run"))) == 0
    assert load_spec(tmp_path / "run" / "spec.yaml").prior.default.scale == 1.6e-16


def test_fit_reads_a_dict_with_a_name_as_the_data_section(tmp_path: Path) -> None:
    bnn = zoo.BNN("mlp", member="map").fit({"name": "toy_gap"}, out=tmp_path / "run", progress=False, num_steps=2,
                                          predictive_samples=2)
    assert bnn.spec.data.name == "toy_gap" and "rmse" in bnn.metrics
    with pytest.raises(ZooInputError, match="data.n_train"):  # the data union's own validation
        zoo.BNN("mlp", member="map").fit({"name": "toy_gap", "n_train": -1}, num_steps=2)


def test_weights_that_fit_still_load(tmp_path: Path) -> None:
    source = net()
    torch.save({"state_dict": source.state_dict()}, tmp_path / "wrapped.pt")
    save_file(source.state_dict(), str(tmp_path / "w.safetensors"))
    for path in (tmp_path / "wrapped.pt", tmp_path / "w.safetensors"):
        target = net()
        zoo.BNN(target, weights=path)
        assert all(torch.equal(a, b) for a, b in zip(target.state_dict().values(), source.state_dict().values(),
                                                              strict=True))
    assert os.path.getsize(tmp_path / "wrapped.pt") > 0
