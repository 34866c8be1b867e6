"""benchmarks/common.py: the list options and the ``mean ± s.e.`` cell the benchmark scripts share."""

from __future__ import annotations

import pytest

from tests.conftest import load_benchmark
from zoo.errors import ZooInputError

common = load_benchmark("common", "common")  # the scripts import it by this name


@pytest.mark.parametrize("text, expected", [("0-2", [0, 1, 2]), ("3,0", [3, 0]), ("0-1,7, 1", [0, 1, 7, 1]),
                                            (" 4 - 5 ", [4, 5])])
def test_ranges_keep_the_order_written(text, expected):
    assert common.parse_ranges(text, "--seeds", "seed", "0-2 or 0,3,5") == expected


@pytest.mark.parametrize("text, says", [("", "give at least one seed"), ("a", "write seeds as 0-2 or 0,3,5"),
                                        ("2-0", "range 2-0 runs backwards; write 0-2"), ("-1", "write seeds as")])
def test_ranges_refuse_with_the_option_named(text, says):
    with pytest.raises(ZooInputError, match=says) as err:
        common.parse_seeds(text)
    assert err.value.field == "--seeds"


def test_counts_are_positive_integers():
    assert common.parse_counts("64, 16,4", "--chunks", "64,16,4") == [64, 16, 4]
    for text in ("", "0,4", "4,x", "-2"):
        with pytest.raises(ZooInputError, match="--chains: .*e.g. 64,256"):
            common.parse_counts(text, "--chains", "64,256")


def test_the_mean_se_cell():
    assert common.mean_se_cell(0.91234, 0.0041, 3) == "0.912 ± 0.004"
    assert common.mean_se_cell(-2.5, 0.125, 2) == "-2.50 ± 0.12"
