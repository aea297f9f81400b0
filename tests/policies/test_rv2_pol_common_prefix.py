"""Common-prefix settings that could never learn are refused."""

import pytest

from policies.config import ConfigError
from policies.registry import build_policy


@pytest.mark.parametrize("name", ["cost", "prefix_affinity"])
def test_a_common_prefix_window_smaller_than_its_sample_floor_is_refused(name: str) -> None:
    # a window of 32 prompts never holds the 64 samples learning waits for: learning was
    # on in name only
    with pytest.raises(ConfigError, match=r"common_min_samples.*64.*common_window.*32"):
        build_policy({"name": name, "common_window": 32})
    build_policy({"name": name, "common_window": 32, "common_min_samples": 32})
    build_policy({"name": name, "common_window": 32, "learn_common_prefix": False})
