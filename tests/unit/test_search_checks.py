"""Search checks are cheap for any range and catch what a trial would fail on."""

from __future__ import annotations

import ace3
from ace3.config.search_checks import search_space_problems


def test_a_huge_integer_range_is_probed_not_listed() -> None:
    config = ace3.HPConfig(search_space={"seed": ace3.hp.randint(0, 2**32 - 1)})
    assert search_space_problems(config) == ([], [])  # returns at once: 4e9 values are never built
    grid = ace3.HPConfig(search_space={"seed": ace3.hp.randint(0, 2**32 - 1)}, algorithm="grid")
    assert grid.grid_size == 2**32 and grid.trial_budget == 2**32


def test_values_that_do_not_fit_the_rest_of_the_config_are_refused() -> None:
    config = ace3.HPConfig(
        search_space={"batch_size": ace3.hp.choice([16, 33])},
        base_config=ace3.TrainingConfig(num_gpus=2),
    )
    unsupported, invalid = search_space_problems(config)
    assert unsupported == []
    assert (
        len(invalid) == 1 and invalid[0].startswith("batch_size: 33") and "divisible" in invalid[0]
    )
