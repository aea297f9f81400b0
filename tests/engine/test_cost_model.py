import argparse

import pytest

from engine.cli import add_arguments, make_executor
from engine.cost_model import PROFILE_DIR, CostModel, available_profiles, load_profile
from engine.executor import Batch, SeqWork
from engine.sim_executor import SimExecutor, sim_token
from kvwire.tokenizer import load_tokenizer


def test_profiles_load_with_documented_shapes() -> None:
    assert {"llama3-8b-h100", "llama3-8b-a100"} <= set(available_profiles())
    h100, a100 = load_profile("llama3-8b-h100"), load_profile("llama3-8b-a100")
    assert h100.model.kv_bytes_per_token == 128 * 1024
    assert (h100.gpu.peak_tflops, h100.gpu.hbm_tb_per_s) == (989.0, 3.35)
    assert (a100.gpu.peak_tflops, a100.gpu.hbm_tb_per_s) == (312.0, 2.0)
    with pytest.raises(ValueError, match="unknown profile"):
        load_profile("gpt-9")


def test_a_profile_file_with_a_key_twice_or_bad_yaml_is_refused_naming_it(tmp_path) -> None:
    twice = tmp_path / "mine.yaml"
    twice.write_text((PROFILE_DIR / "llama3-8b-h100.yaml").read_text() + "name: other\n")
    with pytest.raises(ValueError, match=r"mine.yaml: line \d+: key 'name' appears twice"):
        load_profile(str(twice))
    broken = tmp_path / "broken.yaml"
    broken.write_text("model: [unclosed\n")
    with pytest.raises(ValueError, match=r"broken\.yaml"):
        load_profile(str(broken))


def test_roofline_regimes() -> None:
    p = load_profile("llama3-8b-h100")
    cm = CostModel.from_profile(p)
    g, m = p.gpu, p.model
    # One decode token at an empty context: weight bandwidth bound.
    weights = m.params * m.dtype_bytes / (g.hbm_tb_per_s * 1e12 * g.bandwidth_efficiency)
    kv = 2 * m.kv_bytes_per_token / (g.hbm_tb_per_s * 1e12 * g.bandwidth_efficiency)
    assert cm.step_seconds([(0, 1)]) == pytest.approx(weights + kv + g.step_overhead_ms / 1e3)
    # A 6,000-token prefill: compute bound, 2*P*N plus attention over the triangle.
    n = 6000
    flops = 2 * m.params * n + 4 * m.num_layers * m.num_heads * m.head_dim * n * (n + 1) / 2
    want = flops / (g.peak_tflops * 1e12 * g.compute_efficiency) + g.step_overhead_ms / 1e3
    assert cm.step_seconds([(0, n)]) == pytest.approx(want)
    # Longer contexts and bigger batches never get cheaper; A100 is slower than H100.
    assert cm.step_seconds([(6000, 1)] * 32) > cm.step_seconds([(100, 1)] * 32)
    a100 = CostModel.from_profile(load_profile("llama3-8b-a100"))
    assert a100.step_seconds([(0, n)]) > cm.step_seconds([(0, n)])
    assert cm.step_seconds([]) == 0.0


def test_sim_executor_is_deterministic() -> None:
    cm = CostModel.from_profile(load_profile("llama3-8b-h100"))
    ex = SimExecutor(cm, token_range=(10, 20))
    batch = Batch((SeqWork("a", [1, 2, 3], 0, [0], True, seed=5),
                   SeqWork("b", [1, 2], 0, [1], False, seed=5)))
    r1, r2 = ex.execute(batch), ex.execute(batch)
    assert r1 == r2 and set(r1.next_tokens) == {"a"}
    assert r1.next_tokens["a"] == 10 + sim_token(5, 3, 10)
    assert len({sim_token(5, p, 1000) for p in range(100)}) > 80


def test_cli_builds_a_sim_executor_from_the_kv_budget() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--kv-cache-gib", "25", "--eviction", "frequency"])
    ex, info = make_executor(args, load_tokenizer(None))
    assert info.num_blocks == 25 * 1024**3 // (128 * 1024 * 16) == 12800
    assert info.max_model_len == 8192 and ex.block_size == 16
    assert info.model_id == "meta-llama/Meta-Llama-3-8B-Instruct"
    with pytest.raises(SystemExit):
        parser.parse_args(["--eviction", "lfu"])


@pytest.mark.parametrize(("change", "error"), [
    (("  num_layers: 32\n", ""), r"section 'model' lacks keys \['num_layers'\]"),
    (("peak_tflops: 989.0", 'peak_tflops: "989"'), r"gpu\.peak_tflops must be a finite "
                                                   r"number, got '989'"),
    (("params: 8.03e+9", "params: .inf"), r"model\.params must be a positive number, "
                                          r"got inf"),
])
def test_a_profile_missing_a_key_or_with_a_value_not_a_finite_number_is_refused_naming_it(
        tmp_path, change: tuple[str, str], error: str) -> None:
    text = (PROFILE_DIR / "llama3-8b-h100.yaml").read_text()
    assert change[0] in text
    mine = tmp_path / "mine.yaml"
    mine.write_text(text.replace(change[0], change[1]))
    with pytest.raises(ValueError, match=error):
        load_profile(str(mine))
