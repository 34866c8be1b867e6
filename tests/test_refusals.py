"""Issue 39: input that used to end in a traceback (or ran silently wrong) is refused, naming the field and the fix.

One table: ``zoo`` command lines (run in-process through :func:`zoo.cli.main`) exit 2 with an ``error:`` paragraph,
and Python calls raise an error naming what to call instead. None prints a traceback or writes outside its --out.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.conftest import assert_fragments, refused, sandbox
from zoo.diagnostics import compare
from zoo.errors import ZooInputError
from zoo.pipeline import prepare, train
from zoo.runs import CHECKPOINT_FILE
from zoo.spec import load_spec

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
needs_two_cores = pytest.mark.skipif(CORES < 2, reason="--nproc 2 is refused first on one core")
TINY_DIGITS = {"data": {"name": "digits"}, "inference": {"num_steps": 2, "predictive_samples": 2}, "device": "cpu"}


def zoo(config: str, *args: str) -> list[str]:
    """``zoo train configs/<config>.yaml --out {out} ARGS`` on the CPU ({in}/{out}: the test's folders)."""
    return ["train", str(CONFIGS / f"{config}.yaml"), "--out", "{out}", "--no-progress", "--set", "device=cpu", *args]


def inputs(folder: Path) -> None:
    """The files the cases read: a Latin-1 CSV and a Latin-1 spec (an 'é' is byte 0xe9, not UTF-8)."""
    folder.mkdir(exist_ok=True)
    (folder / "latin1.csv").write_bytes(b"x,y\n1,2\n2,3\ncaf\xe9,4\n3,4\n")
    (folder / "latin1.yaml").write_bytes(b"# r\xe9sum\xe9\ndata: {name: toy_gap}\n")
    (folder / "digits.yaml").write_text(yaml.safe_dump(TINY_DIGITS))


CSV_DATA = 'data:={name: "file:{in}/latin1.csv", target: y, task: regression}'

CASES = [
    # 1. a net whose input size does not fit the data's images
    pytest.param(zoo("map_digits", "--set", "net:={name: lenet5}"), 2,
                 ("net.name: net 'lenet5' cannot read the 1x8x8 images of digits", "mlp, cnn, resnet, wrn",
                  "images at least 1x12x12"), {}, id="lenet5-on-8x8-digits"),
    pytest.param(zoo("map_digits", "--set", "net:={name: resnet, depth: 8, in_channels: 4}"), 2,
                 "as 4x4x4 images, but they are 1x8x8: set net.in_channels: 1", {}, id="image-net-wrong-channels"),
    # 2. a low-rank covariance beyond the latent's size (was a 40 GB allocation)
    pytest.param(zoo("auto_low_rank_mvn_toy", "--set", "guide.rank=10000"), 2,
                 ("guide.rank: got 10000; this model's latent has", "or less"), {}, id="rank-beyond-latent"),
    # 3. inf / NaN in any float setting, for every method
    pytest.param(zoo("mean_field_toy", "--set", "inference.temperature=.inf"), 2,
                 "inference.temperature: got inf; Input should be a finite number", {}, id="svi-temperature-inf"),
    pytest.param(zoo("hmc_toy", "--set", "inference.temperature=.nan"), 2,
                 "inference.temperature: got nan; Input should be a finite number", {}, id="hmc-temperature-nan"),
    pytest.param(zoo("subnet_laplace_toy", "--set", "inference.temperature=.inf"), 2,
                 "inference.temperature: got inf; Input should be a finite number", {}, id="laplace-temperature-inf"),
    pytest.param(zoo("mean_field_toy", "--set", "inference.temperature=0"), 2,
                 "inference.temperature: got 0; Input should be greater than 0", {}, id="temperature-zero"),
    pytest.param(zoo("mean_field_toy", "--set", "inference.lr=.inf"), 2, "inference.lr: got inf", {}, id="lr-inf"),
    pytest.param(zoo("mean_field_toy", "--set", "prior.scale=.inf"), 2, "prior.default.scale: got inf", {},
                 id="prior-scale-inf"),
    pytest.param(zoo("mean_field_toy", "--set", "prior.loc=.nan"), 2, "prior.default.loc: got nan", {},
                 id="prior-loc-nan"),
    pytest.param(zoo("rank1_toy", "--set", "guide.init_scale=.inf"), 2, "guide.init_scale: got inf", {},
                 id="init-scale-inf"),
    pytest.param(zoo("mean_field_toy", "--set", "likelihood.noise=.nan"), 2,
                 "likelihood.noise: got nan; Input should be a finite number, or input should be 'learned'", {},
                 id="noise-nan"),
    pytest.param(zoo("sgld_toy", "--set", "inference.burn_in_epochs=.inf"), 2, "inference.burn_in_epochs: got inf",
                 {}, id="sgld-burn-in-inf"),
    pytest.param(zoo("swag_toy", "--set", "inference.lr=.nan"), 2, "inference.lr: got nan", {}, id="swag-lr-nan"),
    pytest.param(zoo("subnet_laplace_toy", "--set", "model.map.lr=.inf"), 2, "model.map.lr: got inf", {},
                 id="map-stage-lr-inf"),
    # 4. a YAML error inside --set
    pytest.param(zoo("map_digits", "--set", "net={name: lenet5"), 2,
                 "--set net={name: lenet5: the value is not valid YAML", {}, id="set-yaml-error"),
    # 5. a mapping merges into the spec's; a refusal the merge caused names the := form
    pytest.param(zoo("map_digits", "--set", "net={name: lenet5}"), 2,
                 ("net.hidden: got [100]; unknown setting here; it belongs to: cnn, mlp",
                  "write --set net:=... to replace it"), {},
                 id="set-mapping-merges"),
    # (a config whose own prior is a scale mixture: a member's preset gives way to another prior whole)
    pytest.param(zoo("auto_normal_digits", "--set", "prior={name: cauchy}"), 2,
                 ("prior.default.pi", "write --set prior:=... to replace it"), {}, id="set-prior-merges"),
    # 6. files that are not UTF-8
    pytest.param(zoo("mean_field_toy", "--set", CSV_DATA), 2,
                 ("latin1.csv: got 'byte 0xe9 on line 4'", "a .csv must be UTF-8 text"), {}, id="latin1-csv"),
    pytest.param(["train", "{in}/latin1.yaml", "--out", "{out}"], 2, ("latin1.yaml", "is not UTF-8 text"), {},
                 id="latin1-spec"),
    # 7. a distributed timeout that is not a number of seconds
    pytest.param(zoo("mean_field_toy", "--nproc", "2"), 2, "ZOO_DIST_TIMEOUT: got 'abc'; set the environment "
                 "variable to a positive number of seconds", {"ZOO_DIST_TIMEOUT": "abc"}, id="dist-timeout-abc"),
    pytest.param(zoo("mean_field_toy", "--nproc", "2"), 2, "ZOO_DIST_TIMEOUT: got '-5'",
                 {"ZOO_DIST_TIMEOUT": "-5"}, id="dist-timeout-negative"),
    # 8. --nproc: methods that would run the whole fit in every process, counts below 1, chains not shared evenly
    *(pytest.param(zoo(config, "--nproc", "2"), 2, (f"inference.method {method} does not split its work",
                                                    "svi (each global minibatch); nuts (the chains"), {},
                   id=f"nproc-{method}")
      for config, method in (("sgld_toy", "sgld"), ("swag_toy", "swag"), ("subnet_laplace_toy", "laplace"))),
    pytest.param(zoo("mean_field_toy", "--nproc", "0"), 2, "--nproc: got 0; give 1 or more processes", {},
                 id="nproc-0"),
    pytest.param(zoo("mean_field_toy", "--nproc=-1"), 2, "--nproc: got -1; give 1 or more processes", {},
                 id="nproc-negative"),
    pytest.param(zoo("hmc_toy", "--set", "inference.num_chains=3", "--nproc", "2"), 2,
                 "inference.num_chains: got 3; the chains are shared by 2 processes", {}, id="nproc-chains-uneven",
                 marks=needs_two_cores),
    # 9. the Python API
    pytest.param(lambda folder, out: train(42, out), TypeError, ("zoo.pipeline.train(spec, out_dir)",
                                                                 "zoo.spec.load_spec"), {}, id="api-train-not-a-spec"),
    pytest.param(lambda folder, out: prepare(["data.name=digits"]), TypeError, "not list; build one with "
                 "zoo.spec.load_spec", {}, id="api-prepare-not-a-spec"),
    pytest.param(lambda folder, out: compare(folder / "ref", ["runs/x"]), TypeError, "compare(ref, *fits)", {},
                 id="api-compare-a-list-not-unpacked"),
    pytest.param(lambda folder, out: load_spec(folder / "digits.yaml", "inference.temperature=.inf"), ZooInputError,
                 "inference.temperature: got inf", {}, id="api-load-spec-inf"),
]


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("run, expected, fragments, env", CASES)
def test_bad_input_is_refused_naming_the_field_and_the_fix(run: list[str] | Callable, expected: int | type,
                                                           fragments: str | tuple[str, ...], env: dict[str, str],
                                                           tmp_path: Path, monkeypatch, capsys) -> None:
    folder, out = sandbox(tmp_path, monkeypatch)
    inputs(folder)
    monkeypatch.delenv("ZOO_DIST_TIMEOUT", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    before = _files(tmp_path)
    if callable(run):
        with pytest.raises(expected) as info:
            run(folder, out)
        message = str(info.value)
    else:
        message = refused([arg.replace("{in}", str(folder)).replace("{out}", str(out)) for arg in run], capsys,
                          (), expected)
    assert_fragments(message, fragments)
    assert {p for p in _files(tmp_path) - before if out not in p.parents} == set()
    assert not (out / CHECKPOINT_FILE).exists()


def test_train_reads_a_dict_or_a_path_through_load_spec(tmp_path: Path) -> None:
    from_dict = train(TINY_DIGITS, tmp_path / "dict", progress=False, echo=lambda line: None)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(TINY_DIGITS))
    from_path = train(tmp_path / "spec.yaml", tmp_path / "path", progress=False, echo=lambda line: None)
    assert from_dict.metrics["accuracy"] == from_path.metrics["accuracy"]
    assert load_spec(from_dict.run_dir / "spec.yaml") == load_spec(TINY_DIGITS)
