"""A simulated device's figures must be a device's: a huge step overhead or a tiny peak
rate (finite, so taken before) made every step take hours and stalled the engine."""

from __future__ import annotations

import pytest

from engine.cost_model import GPUSpec


@pytest.mark.parametrize(("change", "named"), [
    ({"step_overhead_ms": 1e12}, "gpu.step_overhead_ms"),
    ({"peak_tflops": 1e-12}, "gpu.peak_tflops"),
    ({"hbm_tb_per_s": 1e-9}, "gpu.hbm_tb_per_s"),
    ({"peak_tflops": 1e9}, "gpu.peak_tflops"),
    ({"step_overhead_ms": -1.0}, "gpu.step_overhead_ms"),
])
def test_a_figure_no_device_has_is_refused_naming_it(change: dict[str, float],
                                                     named: str) -> None:
    with pytest.raises(ValueError, match=named):
        GPUSpec(**{"name": "g", "peak_tflops": 121.0, "hbm_tb_per_s": 0.3, **change})


def test_real_devices_are_taken() -> None:
    for tflops, tbps in ((121.0, 0.3), (989.0, 3.35), (1979.0, 4.8)):  # L4, H100, B200-ish
        assert GPUSpec("g", tflops, tbps).peak_tflops == tflops
