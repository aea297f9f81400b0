"""With tenants isolated, an attacker tenant's time to first token tells nothing of what a
victim tenant sent, while within one tenant a cache hit is plain to see (real engine and
gateway processes; sim engines with a cost model)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from engine.cost_model import PROFILE_DIR
from loadtests.timing_probe import auc, gateway_config, probe
from tests.support.fleets import SIM_ENGINE, start_fleet
from tests.support.processes import Processes

pytestmark = pytest.mark.slow
PROBES, WORDS = 300, 1500


def _fast_profile(tmp_path: Path) -> Path:
    """The H100 profile with 8x its compute: a miss's prefill takes an eighth of the
    time (~30 ms for a probe's document instead of ~240), so the probes run several times
    faster, and what a gateway-side cache would save (the same size either way) stands out
    against the engine's steps, whose jitter shrinks with them."""
    data = yaml.safe_load((PROFILE_DIR / "llama3-8b-h100.yaml").read_text())
    data["name"] = "llama3-8b-h100-x8"
    data["gpu"]["peak_tflops"] *= 8
    path = tmp_path / "fast.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_auc_counts_faster_after_sending() -> None:
    assert auc([1.0, 2.0], [3.0, 4.0]) == 1.0
    assert auc([3.0, 4.0], [1.0, 2.0]) == 0.0
    assert auc([1.0, 3.0], [2.0, 3.0]) == 0.625


def test_an_isolated_tenant_cannot_time_another_tenants_prefixes(
        spawn: Processes, tmp_path: Path) -> None:
    engine = (*SIM_ENGINE, "--profile", str(_fast_profile(tmp_path)))
    # prefix_affinity on token ids: the gateway tokenizes, through its tokenizer memo, the
    # gateway-side cache whose hit a probe could time (its memo of text pieces saves too
    # little to time)
    policy = {"name": "prefix_affinity", "chunk_chars": 0}
    fleet = start_fleet(spawn, tmp_path, policy, engine=engine, **gateway_config())
    within = probe(fleet.gateway, "sim-llama", "victim", "victim", 30, WORDS, seed=2)
    across = probe(fleet.gateway, "sim-llama", "attacker", "victim", PROBES, WORDS, seed=1)
    assert within >= 0.9
    # Chance is 0.5; isolated, three runs measured 0.51-0.57. With the tokenizer memo
    # shared across tenants (its group left out of the key, on purpose), 0.66; on the
    # H100 profile itself the same leak measured 0.59 and passed, and keyed on text
    # pieces (the piece memo shared too) 0.49. Over 300 probes the spread under chance is
    # ~0.033 (`python -m loadtests.timing_probe` measures it over more probes).
    assert across <= 0.62
