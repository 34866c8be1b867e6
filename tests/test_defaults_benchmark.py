"""benchmarks/defaults.py at its small size: the plain net and members scored alike, the bar, resuming from the
cells file, and bad options."""

from __future__ import annotations

import json
import math

import pytest
import torch

import zoo
from tests.conftest import load_benchmark
from zoo.errors import ZooInputError

defaults = load_benchmark("defaults")


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("defaults")
    argv = ["--size", "small", "--cases", "twoclass,toy", "--members", "map,mean_field,swag,sgld", "--seeds", "0",
            "--cells", str(out / "cells.jsonl"), "--json", str(out / "defaults.json")]
    return out, argv, defaults.main(argv)


def test_every_case_has_the_plain_net_and_each_member_scored_on_the_same_rows(small_run):
    out, _, report = small_run
    assert set(report["cases"]) == {"twoclass", "toy"}
    for name, case in report["cases"].items():
        assert list(case["members"]) == ["plain net", "map", "mean_field", "swag", "sgld"]
        first = "accuracy" if case["task"] == "classification" else "rmse"
        for member, row in case["members"].items():
            assert "error" not in row, (name, member, row)
            assert row[first] > 0 and row["nll"] == row["nll"] and row["seeds"] == 1
            assert row["fit_time_ratio"] > 0
            if member != "plain net":
                assert isinstance(row["meets_bar"], bool)
        assert case["plain_lr"][0] in defaults.PLAIN_LRS
    assert json.loads((out / "defaults.json").read_text())["cases"].keys() == report["cases"].keys()
    lines = (out / "cells.jsonl").read_text().splitlines()
    assert len(lines) == 2 * 5  # one line per finished cell


def test_a_rerun_reads_the_finished_cells_instead_of_fitting_again(small_run, monkeypatch):
    out, argv, report = small_run

    def refit(*args, **kwargs):
        raise AssertionError("a finished cell was fitted again")

    monkeypatch.setattr(defaults, "member_fit", refit)
    monkeypatch.setattr(defaults, "plain_net", refit)
    with (out / "cells.jsonl").open("a") as f:
        f.write('{"size": "small", "case": "toy"')  # a line torn by a kill mid-write is skipped
    again = defaults.main(argv)
    assert again["cases"]["toy"]["members"] == report["cases"]["toy"]["members"]
    # a run still going (or stopped) is summarised as far as it got: an unfinished member is left out, not fitted
    members = argv.index("--members") + 1
    partial = defaults.main([*argv[:members], "map,mc_dropout", *argv[members + 1:], "--finished-only"])
    assert list(partial["cases"]["toy"]["members"]) == ["plain net", "map"]


def test_a_changed_default_reruns_the_members_cells_not_the_plain_nets(small_run, monkeypatch, tmp_path):
    """A cell is reused only at the defaults' edition it was fitted at: a changed default, a preset or a resolving
    constant, fits its members again (the plain net, which no zoo default touches, is kept)."""
    out, argv, _ = small_run
    import zoo.sections

    before = defaults.defaults_edition("map", "classification")
    monkeypatch.setattr(zoo.sections, "DEFAULT_LR_HOLD", zoo.sections.DEFAULT_LR_HOLD / 2, raising=True)
    assert defaults.defaults_edition("map", "classification") != before
    fitted = []
    monkeypatch.setattr(defaults, "member_fit", lambda case, rows, seed, member, *a, **k: fitted.append(member) or
                        {"accuracy": 0.5, "nll": 1.0, "ece": 0.0, "brier": 0.5, "seconds": 1.0})
    monkeypatch.setattr(defaults, "plain_net", lambda *a, **k: pytest.fail("the plain net was fitted again"))
    cells = tmp_path / "cells.jsonl"
    cells.write_text((out / "cells.jsonl").read_text())
    defaults.main(["--size", "small", "--cases", "twoclass", "--members", "map", "--seeds", "0", "--cells", str(cells)])
    assert fitted == ["map"]


def test_the_options_a_choice_of_the_lr_runs_are_in_the_edition(monkeypatch):
    """A setting a fit chooses with its lr is a dataclass constant (sghmc's climb steps, SWAG's pretraining): a
    change to its options changes the editions of the members whose method reads it, and no other's."""
    from zoo.inference import sgmcmc
    from zoo.inference.lr_choice import JointSetting

    members = ("sgld", "cyclical_sghmc", "swag", "map")
    before = {m: defaults.defaults_edition(m, "classification") for m in members}
    monkeypatch.setattr(sgmcmc, "EXPLORE_STEP", JointSetting.over("explore_lr", (0.003, 0.01)))
    after = {m: defaults.defaults_edition(m, "classification") for m in members}
    assert [m for m in members if before[m] != after[m]] == ["sgld", "cyclical_sghmc"]


def test_a_guides_defaults_key_the_members_that_fit_it_and_not_swag_or_sg_mcmc(monkeypatch):
    """A guide module's constants (the candidates of a setting it leaves open) and its section's defaults enter the
    edition of a member whose method fits that guide; SWAG and SG-MCMC carry the spec's default guide but never read
    it, so neither keys theirs."""
    from guides import mean_field, mixture

    members = ("mean_field", "bayes_by_backprop", "swag", "sgld", "rank1_normal", "map")
    before = {m: defaults.defaults_edition(m, "classification") for m in members}
    monkeypatch.setattr(mean_field, "INIT_RHO_CANDIDATES", (-5.0, -7.0))
    after = {m: defaults.defaults_edition(m, "classification") for m in members}
    assert [m for m in members if before[m] != after[m]] == ["mean_field", "bayes_by_backprop"]
    monkeypatch.setattr(mixture, "INIT_SCALE_CANDIDATES", (0.03, 1e-3))
    assert defaults.defaults_edition("rank1_normal", "classification") != before["rank1_normal"]
    monkeypatch.undo()
    real = defaults.load_spec  # the mean-field guide's default start changed, as a preset would resolve it
    monkeypatch.setattr(defaults, "load_spec", lambda tree: real({**tree, "guide": {"init_rho": -6.0}}))
    members = members[:4]
    after = {m: defaults.defaults_edition(m, "classification") for m in members}
    assert [m for m in members if before[m] != after[m]] == ["mean_field", "bayes_by_backprop"]


def test_a_setting_only_regression_reads_keys_only_the_regression_cells(monkeypatch):
    """The predictive noise's setting (``inference.noise_by``) and its module's constants enter a regression cell's
    edition and not a classifier's, so a change to them reruns the regressions alone; a Laplace member, which sets
    its noise its own way, keeps its edition."""
    from zoo.inference import noise_choice

    before = {(m, t): defaults.defaults_edition(m, t) for m in ("map", "kfac_laplace")
              for t in ("classification", "regression")}
    monkeypatch.setattr(noise_choice, "LOG_NOISE_SEARCH", noise_choice.LOG_NOISE_SEARCH + 1)
    after = {key: defaults.defaults_edition(*key) for key in before}
    assert [key for key in before if before[key] != after[key]] == [("map", "regression")]
    assert defaults.defaults_edition("map", "classification") != before["map", "regression"]


def test_the_results_pages_tables_are_reprinted_from_the_json(small_run, capsys):
    out, _, report = small_run
    capsys.readouterr()
    defaults.main(["--from-json", str(out / "defaults.json")])
    printed = capsys.readouterr().out
    assert "| member | accuracy | NLL | ECE | fit time ÷ plain | bar |" in printed
    assert "| member | RMSE | NLL | fit time ÷ plain | bar |" in printed
    plain = report["cases"]["toy"]["members"]["plain net"]
    assert f"| plain net | {plain['rmse']:.3f} ± {plain['rmse_se']:.3f} |" in printed


def test_a_laplace_classifiers_cells_say_which_link_it_predicted_by(tmp_path, capsys):
    """A Laplace member's classification cell records its GLM's link (chosen on the fit's val rows), the summary
    lists them by seed, and the table names them beside the member."""
    argv = ["--size", "small", "--cases", "twoclass", "--members", "last_layer_laplace", "--seeds", "0-1",
            "--cells", str(tmp_path / "cells.jsonl"), "--json", str(tmp_path / "defaults.json")]
    row = defaults.main(argv)["cases"]["twoclass"]["members"]["last_layer_laplace"]
    cells = [json.loads(line) for line in (tmp_path / "cells.jsonl").read_text().splitlines()]
    links = [c["link"] for c in sorted(cells, key=lambda c: c["seed"]) if c["member"] == "last_layer_laplace"]
    assert row["links"] == links and len(links) == 2 and set(links) <= {"bridge", "probit", "mc"}
    assert all("link" not in c for c in cells if c["member"] == "plain net")
    capsys.readouterr()
    defaults.main(["--from-json", str(tmp_path / "defaults.json")])
    # the links first, then (where a seed's rows widened it) its MAP phase's prior scale factor per seed
    assert f"| last_layer_laplace (link per seed: {', '.join(links)}" in capsys.readouterr().out


def test_the_table_names_the_factor_a_laplace_prior_took_where_its_rows_rejected_it():
    """Where a seed's rows rejected a Laplace prior (its cell's choices hold inference.precision_scale), the summary
    lists each seed's factor (None: the evidence's own) and the table names them beside the links; a member whose
    rows rejected none keeps its label."""
    case = defaults.ALL_CASES["twoclass"]
    plain = [{"seed": s, "accuracy": 0.9, "nll": 0.3, "ece": 0.01, "seconds": 1.0} for s in (0, 1)]
    cells = [{**plain[s], "link": link, "choices": {"inference.link": link, **extra}}
             for s, link, extra in ((1, "probit", {}), (0, "mc", {"inference.precision_scale": 10 ** 2.5}))]
    row = defaults.summarise(case, cells, plain)
    assert row["precision_scales"] == [10 ** 2.5, None] and row["links"] == ["mc", "probit"]
    assert "precision_scales" not in defaults.summarise(case, [{**cells[0], "choices": {}}], plain)
    report = {"about": "", "epochs": 1, "batch_size": 1, "plain_lr": [0.01, 0.01], "task": "classification",
              "members": {"kfac_laplace": {**row, "meets_bar": True, "misses": ""}}}
    assert ("| kfac_laplace (link per seed: mc, probit; prior precision × per seed: 316, 1) |"
            in defaults.markdown_table("twoclass", report))


def test_the_table_names_the_prior_scale_factor_each_seeds_rows_chose_where_one_widened_it():
    """A point estimate's factor on its prior's scale (the MAP's inference.prior_scale_factor, a Laplace MAP phase's
    model.map.prior_scale_factor) is named per seed beside the member's other choices where a seed's is not 1."""
    case = defaults.ALL_CASES["toy"]
    plain = [{"seed": s, "rmse": 0.3, "nll": 0.5, "seconds": 1.0} for s in (0, 1)]
    mapped = [{**plain[s], "choices": {"inference.prior_scale_factor": f}} for s, f in ((1, 1.0), (0, 10.0))]
    row = defaults.summarise(case, mapped, plain)
    assert row["prior_scale_factors"] == [10.0, 1.0]
    laplace = [{**c, "choices": {"model.map.prior_scale_factor": c["choices"]["inference.prior_scale_factor"]}}
               for c in mapped]
    assert defaults.summarise(case, laplace, plain)["prior_scale_factors"] == [10.0, 1.0]
    assert "prior_scale_factors" not in defaults.summarise(case, [mapped[0]], plain)  # 1 everywhere: no note
    report = {"about": "", "epochs": 1, "batch_size": 1, "plain_lr": [0.01, 0.01], "task": "regression",
              "members": {"map": {**row, "meets_bar": True, "misses": ""}}}
    assert "| map (prior scale × per seed: 10, 1) |" in defaults.markdown_table("toy", report)


def test_mc_dropouts_cells_say_which_rate_each_seeds_fit_chose(tmp_path, capsys):
    """MC dropout's preset leaves its rate to the fit's val rows: each cell records the rate its fit kept, one of the
    candidates (or below them), and the table names them by seed; the cell keeps every choice the fit made
    (BNN.chosen)."""
    from guides.dropout import DROPOUT_RATE_CANDIDATES, DROPOUT_RATES_BELOW

    argv = ["--size", "small", "--cases", "toy", "--members", "mc_dropout", "--seeds", "0-1",
            "--cells", str(tmp_path / "cells.jsonl"), "--json", str(tmp_path / "defaults.json")]
    row = defaults.main(argv)["cases"]["toy"]["members"]["mc_dropout"]
    rates = [c.split(" ") for c in row["chosen"]]
    assert len(rates) == 2 and all(n == "dropout_rate" and float(r) in DROPOUT_RATE_CANDIDATES + DROPOUT_RATES_BELOW
                                   for n, r in rates)
    cells = sorted((json.loads(line) for line in (tmp_path / "cells.jsonl").read_text().splitlines()
                    if '"mc_dropout"' in line), key=lambda c: c["seed"])
    assert [float(r) for _, r in rates] == [c["choices"]["guide.dropout_rate"] for c in cells]
    assert all(set(c["choices"]) == {"inference.lr", "guide.dropout_rate", "likelihood.noise_prior.init",
                                     "inference.prior_scale_factor"} for c in cells)
    capsys.readouterr()
    defaults.main(["--from-json", str(tmp_path / "defaults.json")])
    assert f"| mc_dropout (dropout_rate per seed: {rates[0][1]}, {rates[1][1]}" in capsys.readouterr().out


def test_the_bar_is_the_plain_nets_accuracy_less_a_point_and_its_nll():
    case = defaults.CASES["digits"]
    base = {"accuracy": 0.95, "nll": 0.20}
    assert defaults.meets_bar(case, {"accuracy": 0.941, "nll": 0.19}, base) == (True, "")
    ok, why = defaults.meets_bar(case, {"accuracy": 0.93, "nll": 0.21}, base)
    assert not ok and "accuracy 0.930 < 0.940" in why and "NLL 0.210 > 0.200" in why
    regression = defaults.CASES["toy"]
    assert defaults.meets_bar(regression, {"rmse": 1.05, "nll": 0.5}, {"rmse": 1.0, "nll": 0.5})[0]
    assert not defaults.meets_bar(regression, {"rmse": 1.06, "nll": 0.5}, {"rmse": 1.0, "nll": 0.5})[0]


def test_the_reference_row_samples_the_posterior_and_reports_its_chains(tmp_path):
    """--reference adds the posterior by HMC at a fixed number of draws, with its R-hat and ESS in the row and the
    table, and is not run on a net too large for it."""
    report = defaults.main(["--size", "small", "--cases", "twoclass,digits", "--members", "map", "--seeds", "0",
                            "--reference", "--cells", str(tmp_path / "cells.jsonl")])
    row = report["cases"]["twoclass"]["members"][defaults.REFERENCE]
    assert row["accuracy"] > 0.5 and row["nll"] == row["nll"] and isinstance(row["meets_bar"], bool)
    # R-hat of 4 short chains may fall just under 1: finite and positive is what a sampled row always has
    assert math.isfinite(row["r_hat"]) and row["r_hat"] > 0 and row["min_ess"] > 0
    assert row["draws"] == "4 chains × (20 + 20)"
    table = defaults.markdown_table("twoclass", report["cases"]["twoclass"])
    assert f"the posterior (4 chains × (20 + 20); worst R-hat {row['r_hat']:.3f}" in table
    assert report["cases"]["digits"]["members"][defaults.REFERENCE]["error"].startswith("not run: HMC over 7,510")
    # the reference's cell is its own: a --set for the members neither reaches it nor refits it
    cells = (tmp_path / "cells.jsonl").read_text().splitlines()
    again = defaults.main(["--size", "small", "--cases", "twoclass", "--members", "map", "--seeds", "0",
                           "--reference", "--set", "lr=0.003", "--cells", str(tmp_path / "cells.jsonl")])
    assert again["cases"]["twoclass"]["members"][defaults.REFERENCE] == row
    assert len((tmp_path / "cells.jsonl").read_text().splitlines()) == len(cells) + 1  # the map cell at lr 0.003


def test_the_plain_net_is_the_mean_of_its_loaders_shuffles_the_first_the_users_own_order():
    """The bar reads the plain net's mean over shuffles of its loader: shuffle 0 is the loader as a user seeds it,
    the others other orders of the same rows, each trained by the whole recipe (its lr chosen)."""
    case = defaults.CASES["twoclass"]
    rows = case.rows(0, "small", None)
    users = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(rows.x_train, rows.y_train),
                                        batch_size=case.batch_size, shuffle=True,
                                        generator=torch.Generator().manual_seed(0))
    first = [y for _, y in defaults.loader(rows, case, 0)]
    assert all(torch.equal(a, b) for a, b in zip(first, [y for _, y in users], strict=True))
    assert not torch.equal(first[0], next(iter(defaults.loader(rows, case, 0, shuffle=1)))[1])
    mean = defaults.plain_net(case, rows, 0, defaults.SMALL_EPOCHS, shuffles=3)
    runs = [defaults.plain_run(case, rows, 0, defaults.SMALL_EPOCHS, shuffle=k) for k in range(3)]
    assert [run["nll"] for run in mean["shuffles"]] == pytest.approx([run["nll"] for run in runs])
    assert len({run["nll"] for run in runs}) == 3  # three orders, three nets
    for k in ("accuracy", "nll", "ece", "brier"):
        assert mean[k] == pytest.approx(sum(run[k] for run in runs) / 3)
    assert mean["lr"] == runs[0]["lr"]
    one = defaults.plain_net(case, rows, 0, defaults.SMALL_EPOCHS, shuffles=1)
    assert "shuffles" not in one and one["nll"] == pytest.approx(runs[0]["nll"])
    cell = mean | {"seed": 0}
    summary = defaults.summarise(case, [cell], [cell])
    assert summary["shuffles"] == 3
    spread = torch.tensor([r["nll"] for r in runs], dtype=torch.float64).std()
    assert summary["nll_shuffle_sd"] == pytest.approx(float(spread))


def test_a_members_other_shuffle_is_another_fit_from_the_same_initial_weights(monkeypatch):
    case = defaults.CASES["twoclass"]
    rows = case.rows(0, "small", None)
    starts, fit = [], defaults.fitted_member

    def recorded(case, rows, net, seed, *args):
        starts.append([t.clone() for t in net.state_dict().values()])
        return fit(case, rows, net, seed, *args)

    monkeypatch.setattr(defaults, "fitted_member", recorded)
    first = defaults.member_fit(case, rows, 0, "map", defaults.SMALL_EPOCHS, size="small")
    again = defaults.member_fit(case, rows, 0, "map", defaults.SMALL_EPOCHS, size="small", shuffle=0)
    other = defaults.member_fit(case, rows, 0, "map", defaults.SMALL_EPOCHS, size="small", shuffle=1)
    assert again["nll"] == first["nll"] and other["nll"] != first["nll"]
    assert all(torch.equal(a, b) for a, b in zip(starts[0], starts[2], strict=True))


def test_member_shuffles_fit_each_member_on_as_many_shuffles_and_keep_the_cells_apart(tmp_path, monkeypatch):
    """--member-shuffles K averages a member over K fits as the plain net is averaged: each fit from the same initial
    weights, on its own shuffle; the cells are kept apart from the single fits', the plain net's are shared, and
    the averaged cell stands for the single fit in later tables, labelled so."""
    fits = []

    def member(case, rows, seed, name, epochs, settings, size, shuffle=0):
        fits.append((name, shuffle))
        return {"accuracy": 0.9, "nll": 0.2 + 0.1 * shuffle, "ece": 0.0, "brier": 0.1, "seconds": 1.0,
                "choices": {"inference.lr": 0.01 * (shuffle + 1)}}

    monkeypatch.setattr(defaults, "member_fit", member)
    monkeypatch.setattr(defaults, "plain_net", lambda *a, **k: {"accuracy": 0.9, "nll": 0.22, "ece": 0.0,
                                                               "brier": 0.1, "seconds": 1.0, "lr": 0.01})
    cells = tmp_path / "cells.jsonl"
    argv = ["--cases", "twoclass", "--members", "map", "--seeds", "0", "--cells", str(cells)]
    assert defaults.main(argv)["cases"]["twoclass"]["members"]["map"]["meets_bar"]  # 0.2 against 0.22
    row = defaults.main([*argv, "--member-shuffles", "2"])["cases"]["twoclass"]["members"]["map"]
    assert fits == [("map", 0), ("map", 0), ("map", 1)]
    assert row["nll"] == pytest.approx(0.25) and not row["meets_bar"] and row["shuffles"] == 2
    last = json.loads(cells.read_text().splitlines()[-1])
    assert last["settings"] == "shuffles=2" and last["choices"] == {"inference.lr": 0.01}  # the first shuffle's
    assert len(cells.read_text().splitlines()) == 3  # the plain net's cell was read back
    again = defaults.main(argv)["cases"]["twoclass"]  # the averaged cell now stands for the single fit
    assert len(fits) == 3 and again["members"]["map"]["nll"] == pytest.approx(0.25)
    assert "| map (the mean of 2 fits a seed) |" in defaults.markdown_table("twoclass", again)
    with pytest.raises(ZooInputError, match="run by draws"):
        defaults.main([*argv, "--member-shuffles", "2", "--reference"])


def test_one_shuffle_is_the_bar_before_and_its_cells_are_kept_apart(tmp_path, monkeypatch):
    """--plain-shuffles 1 is the plain net on its loader's own order alone (the bar before 2026-12-06): its cells and
    the default's are kept apart, and the members' cells are read back, not fitted again."""
    trained = []

    def plain(case, rows, seed, epochs, lrs=defaults.PLAIN_LRS, shuffles=defaults.PLAIN_SHUFFLES):
        trained.append(shuffles)
        return {"accuracy": 0.9, "nll": 0.3 if shuffles == 1 else 0.2, "ece": 0.0, "brier": 0.1, "seconds": 1.0,
                "lr": 0.01}

    fitted, cells, argv = stubbed_suite(monkeypatch, tmp_path, plain)
    assert not defaults.main(argv)["cases"]["twoclass"]["members"]["map"]["meets_bar"]
    one = defaults.main([*argv, "--plain-shuffles", "1"])
    assert one["cases"]["twoclass"]["members"]["map"]["meets_bar"] and one["plain_shuffles"] == 1
    assert trained == [defaults.PLAIN_SHUFFLES, 1] and fitted == ["map"]
    editions = [json.loads(line)["edition"] for line in cells.read_text().splitlines()]
    assert editions[0] == f"shuffles={defaults.PLAIN_SHUFFLES}" and editions[2] == ""
    defaults.main(argv)  # both read back
    assert len(trained) == 2


def test_the_plain_net_is_scored_by_the_zoos_metrics():
    case = defaults.CASES["toy"]
    y = torch.tensor([0.0, 1.0])
    figures = defaults.scores(case, torch.tensor([0.0, 1.0]), y, noise=0.5, y_unit=2.0)
    assert figures["rmse"] == 0.0
    assert figures["nll"] == pytest.approx(-torch.distributions.Normal(0.0, 0.5).log_prob(torch.tensor(0.0)).item()
                                           + torch.log(torch.tensor(2.0)).item())


@pytest.mark.parametrize("argv, says", [
    (["--members", "hmc"], "run by draws"),
    (["--members", "no_such"], "use some of"),
    (["--cases", "cifar"], "use some of"),
    (["--set", "lr"], "KEY=VALUE"),
    (["--set", "net.hidden=3"], "the parts: prior, guide"),
    (["--seeds", "2-0"], "backwards"),
    (["--set", "epochs=3"], "the budget is --epochs E"),
    (["--set", "inference.num_steps=30"], "the budget is --epochs E"),
    (["--epochs", "0"], "from 1 to"),
    (["--epochs", "3", "--size", "small"], "drop one of them"),
    (["--plain-lrs", "0.01,0"], "positive learning rates"),
    (["--plain-lrs", "fast"], "positive learning rates"),
    (["--plain-shuffles", "0"], "from 1 to"),
    (["--member-shuffles", "21"], "from 1 to"),
])
def test_bad_options_are_refused_naming_them(argv, says, tmp_path):
    with pytest.raises(ZooInputError, match=says):
        defaults.main([*argv, "--cells", str(tmp_path / "cells.jsonl")])


def test_another_budget_trains_the_plain_net_and_the_members_for_it_and_keeps_their_cells_apart(tmp_path, monkeypatch):
    """--epochs E is the bar's budget on both sides: the plain net and every member train E epochs, and those cells
    are neither the defaults' cells nor read as them."""
    trained = []

    def plain(case, rows, seed, epochs, lrs, shuffles):
        trained.append(("plain net", epochs))
        return {"accuracy": 0.9, "nll": 0.3, "ece": 0.0, "brier": 0.1, "seconds": 1.0, "lr": 0.01}

    def member(case, rows, seed, name, epochs, settings, size, shuffle=0):
        trained.append((name, epochs))
        return {"accuracy": 0.9, "nll": 0.3, "ece": 0.0, "brier": 0.1, "seconds": 1.0}

    monkeypatch.setattr(defaults, "plain_net", plain)
    monkeypatch.setattr(defaults, "member_fit", member)
    cells = tmp_path / "cells.jsonl"
    argv = ["--cases", "twoclass", "--members", "map", "--seeds", "0", "--cells", str(cells)]
    report = defaults.main([*argv, "--epochs", "7", "--set", "lr=0.02"])
    assert trained == [("plain net", 7), ("map", 7)]
    assert report["cases"]["twoclass"]["epochs"] == 7
    settings = [json.loads(line)["settings"] for line in cells.read_text().splitlines()]
    assert settings == ["epochs=7", "epochs=7,lr=0.02"]
    defaults.main(argv)  # at the case's own epochs: nothing above is reused
    assert trained[2:] == [("plain net", defaults.CASES["twoclass"].epochs), ("map", defaults.CASES["twoclass"].epochs)]


def stubbed_suite(monkeypatch, tmp_path, plain):
    """The suite on `twoclass` seed 0 with ``plain`` for the plain net and a MAP stub at NLL 0.25: the members it
    fits, its cells file and its argv."""
    fitted = []

    def member(case, rows, seed, name, epochs, settings, size, shuffle=0):
        fitted.append(name)
        return {"accuracy": 0.9, "nll": 0.25, "ece": 0.0, "brier": 0.1, "seconds": 1.0}

    monkeypatch.setattr(defaults, "plain_net", plain)
    monkeypatch.setattr(defaults, "member_fit", member)
    cells = tmp_path / "cells.jsonl"
    return fitted, cells, ["--cases", "twoclass", "--members", "map", "--seeds", "0", "--cells", str(cells)]


def test_another_plain_grid_trains_only_the_plain_net_again_and_keeps_its_cells_apart(tmp_path, monkeypatch):
    """--plain-lrs gives the plain net another grid, to see whether the bar moves: its cells are kept apart from the
    recipe's, and the members' cells are the defaults' own, read back rather than fitted again."""
    grids = []

    def plain(case, rows, seed, epochs, lrs=defaults.PLAIN_LRS, shuffles=defaults.PLAIN_SHUFFLES):
        grids.append(lrs)
        return {"accuracy": 0.9, "nll": 0.3 if lrs == defaults.PLAIN_LRS else 0.2, "ece": 0.0, "brier": 0.1,
                "seconds": 1.0, "lr": lrs[-1]}

    fitted, cells, argv = stubbed_suite(monkeypatch, tmp_path, plain)
    assert defaults.main(argv)["cases"]["twoclass"]["members"]["map"]["meets_bar"]
    wide = defaults.main([*argv, "--plain-lrs", "0.03,0.001,0.003,0.01"])
    assert grids == [defaults.PLAIN_LRS, (0.001, 0.003, 0.01, 0.03)] and fitted == ["map"]
    assert wide["plain_lrs"] == (0.001, 0.003, 0.01, 0.03) and wide["cases"]["twoclass"]["plain_lr"] == [0.03]
    assert not wide["cases"]["twoclass"]["members"]["map"]["meets_bar"]  # against the plain net at the wider grid
    settings = [json.loads(line)["settings"] for line in cells.read_text().splitlines()]
    assert settings == ["", "", "plain_lrs=0.001,0.003,0.01,0.03"]


def test_the_held_out_cases_run_when_named_and_not_by_default(tmp_path):
    """Cases no default was chosen on (HELD_OUT) are there to check a new default before it is kept: --cases runs
    them like any case, and the default run leaves them out."""
    assert not set(defaults.HELD_OUT) & set(defaults.CASES)
    report = defaults.main(["--size", "small", "--cases", "mnist5k_mlp", "--members", "map", "--seeds", "0",
                            "--cells", str(tmp_path / "cells.jsonl")])
    row = report["cases"]["mnist5k_mlp"]["members"]["map"]
    assert "error" not in row and 0 <= row["accuracy"] <= 1


@pytest.mark.parametrize("name", ["breast_cancer", "diabetes"])
def test_scikit_learns_tabular_cases_split_their_rows_once_standardised_by_the_rows_they_train_on(name):
    """The shipped tabular sets: train, validation and test rows disjoint and all used, the same split for a seed
    and another for the next, features (and a regression's targets) standardised by the non-test rows alone."""
    from sklearn.datasets import load_breast_cancer, load_diabetes

    x, y = (load_breast_cancer if name == "breast_cancer" else load_diabetes)(return_X_y=True)
    case = defaults.HELD_OUT[name]
    rows = case.rows(0, "full", None)
    parts = (rows.x_train, rows.x_val, rows.x_test)
    assert sum(len(p) for p in parts) == len(x) and len(rows.x_test) == round(0.3 * len(x))
    seen = torch.cat(parts)
    assert len(torch.unique(seen, dim=0)) == len(x)  # no row twice
    fit_rows = torch.cat(parts[:2])
    assert torch.allclose(fit_rows.mean(0), torch.zeros(x.shape[1]), atol=1e-5)
    assert torch.allclose(fit_rows.std(0, unbiased=False), torch.ones(x.shape[1]), atol=1e-4)
    assert not torch.allclose(rows.x_test.mean(0), torch.zeros(x.shape[1]), atol=1e-3)  # not its own statistics
    if case.task == "regression":
        targets = torch.cat([rows.y_train, rows.y_val])
        assert abs(float(targets.mean())) < 1e-5 and float(targets.std(unbiased=False)) == pytest.approx(1, abs=1e-5)
        assert rows.y_unit == pytest.approx(float(y.std()), rel=0.1)  # the targets' own units, for RMSE and NLL
    else:
        assert rows.y_train.dtype == torch.long and set(rows.y_test.tolist()) == {0, 1}
    assert torch.equal(case.rows(0, "full", None).x_test, rows.x_test)
    assert not torch.equal(case.rows(1, "full", None).x_test, rows.x_test)
    assert name not in defaults.CASES


def test_a_set_reaches_the_fit_or_the_members_parts():
    """--set lr=... is the fit's; --set prior.scale=... (a part's key) merges into the member's preset."""
    fit, parts = defaults.split_settings({"lr": 0.01, "inference.epochs": 3, "prior.scale": 3.0,
                                          "guide.init_rho": -6.0, "likelihood.noise_prior.loc": -2.0})
    assert fit == {"lr": 0.01, "epochs": 3}
    assert parts == {"prior": {"scale": 3.0}, "guide": {"init_rho": -6.0},
                     "likelihood": {"noise_prior": {"loc": -2.0}}}
    seen = []

    class Recording(zoo.BNN):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen.append(self.spec)

    case = defaults.CASES["toy"]
    rows = case.rows(0, "small", None)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(defaults.zoo, "BNN", Recording)
        defaults.member_fit(case, rows, 0, "mean_field", 1, {"prior.scale": 3.0, "guide.init_rho": -6.0,
                                                             "likelihood.noise_prior.loc": -2.0}, "small")
    spec = seen[0]
    assert spec.prior.default.scale == 3.0 and spec.guide.name == "mean_field" and spec.guide.init_rho == -6.0
    assert spec.likelihood.name == "gaussian" and spec.likelihood.noise_prior.loc == -2.0
