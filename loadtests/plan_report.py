"""``kvgate plan``'s readable report, from the plan's JSON mapping."""

from __future__ import annotations

from typing import Any

from loadtests.plan_arithmetic import GIB, MIB


def _size(n_bytes: float) -> str:
    if n_bytes >= GIB:
        return f"{n_bytes / GIB:.2f} GiB"
    if n_bytes >= MIB:
        return f"{n_bytes / MIB:.0f} MiB"
    return f"{n_bytes / 1024:.0f} KiB"


def _times(ratio: float | None, fmt: str = ".0f") -> str:
    return "all of it" if ratio is None else f"{ratio:{fmt}}x"


def _weights(m: dict[str, Any]) -> str:
    """The weights a replica holds beside its KV (a quantized model's at its
    quantization's bytes, its embeddings at its dtype's); a mixture of experts' active
    share."""
    if m.get("quantization") is None:
        text = f"{m['params'] / 1e9:,.1f}B parameters x {m['dtype_bytes']} B"
    else:  # the quantized ones at their bytes, scales included; embeddings at the dtype's
        kept = m["params"] - m["quantized_params"]
        text = (f"{m['params'] / 1e9:,.1f}B parameters: {m['quantized_params'] / 1e9:,.1f}B "
                f"x {m['bytes_per_quantized_param']:.3g} B ({m['quantization']})"
                + (f" + {kept / 1e9:,.1f}B x {m['dtype_bytes']} B" if kept else ""))
    text += f" = {_size(m['weight_bytes'])}, held beside the idle KV"
    if m["active_params"] < m["params"]:
        text += (f"\n                     {m['active_params'] / 1e9:,.1f}B active per "
                 "token (a mixture of experts); a step reads the experts its tokens go "
                 "to: a lone token's few, nearly all in a large batch")
    return text


def _kv_per_token(m: dict[str, Any]) -> str:
    """How a token's KV is counted: a K and a V per KV head, or an MLA latent."""
    if m.get("mla_latent_width") is not None:
        return (f"{m['num_layers']} layers x MLA latent {m['mla_latent_width']} values per "
                f"token per layer x {m['dtype_bytes']} B")
    return (f"2 x {m['num_layers']} layers x {m['num_kv_heads']} KV heads x "
            f"{m['head_dim']} x {m['dtype_bytes']} B")


def render(plan: dict[str, Any]) -> str:
    m, fleet, w = plan["model"], plan["fleet"], plan["workload"]
    per_replica = plan["docs_per_replica"]
    seen = w["hot_docs_seen"]
    at_once = f" ({seen:,} in all, these at once)" if seen and seen != w["hot_docs"] else ""
    lines = [
        f"kvgate plan: {m['name']}, {fleet['replicas']} replicas x {fleet['idle_kv_gib']:g} "
        f"GiB idle KV, {fleet['arrival_rate']:g} requests/s",
        f"workload: {w['source']}{' (estimated from shared prefixes)' if w['estimated'] else ''}"
        f": {w['docs']:,} documents of ~{w['doc_tokens']:,.0f} tokens; the {w['hot_docs']:,} "
        f"hot ones{at_once} get {w['hot_share']:.0%} of requests; ~{w['tail_tokens']:.0f} tokens "
        "of each request its own",
        "",
        f"weights              {_weights(m)}",
        f"KV per token         {_kv_per_token(m)} = {_size(plan['kv_bytes_per_token'])}",
        f"KV per document      {w['doc_tokens']:,.0f} tokens = {_size(plan['bytes_per_doc'])}",
        f"idle KV per replica  {fleet['idle_kv_gib']:g} GiB = {per_replica} documents "
        f"(each with its question: {_size(plan['bytes_per_request'])})",
        f"hot set              {w['hot_docs']:,} documents; one replica holds {per_replica}, "
        f"the fleet {per_replica * fleet['replicas']:,}",
        f"prefix affinity      ~{plan['hot_docs_per_replica_affinity']:.1f} hot documents per "
        f"replica; {plan['distinct_docs_fleet_affinity']:,} distinct across the fleet",
        f"round robin          every replica sees all {w['hot_docs']:,} hot documents and keeps "
        f"the same {plan['distinct_docs_fleet_round_robin']:,}",
        f"verdict              {plan['verdict']}",
        f"hot prefill          {plan['hot_prefill_tokens_round_robin']:,.0f} tokens per hot "
        f"request under round robin, {plan['hot_prefill_tokens_affinity']:,.0f} under affinity:"
        f" {_times(plan['hot_prefill_reduction_arithmetic'])} less (arithmetic, no cold churn)",
    ]
    policies = plan["policies"]
    if policies:
        any_fig = next(iter(policies.values()))
        cpu = sum(f["cpu_seconds"] for f in policies.values())
        lines += ["", f"simulated: {any_fig['requests']:,} requests per policy, LRU engines, "
                  f"{cpu:.0f} s of CPU; token hit rate and hot prefill counted after the "
                  "warm-up (the first half)",
                  f"  {'policy':<16}{'token hit':>10}{'hot prefill tokens':>20}"
                  f"{'TTFT p50':>10}{'TTFT p95':>10}"]
        for name, f in policies.items():
            lines.append(f"  {name:<16}{f['token_hit_rate']:>10.3f}"
                         f"{f['hot_prefill_tokens']:>20,}{f['ttft_p50_s']:>9.3f}s"
                         f"{f['ttft_p95_s']:>9.3f}s")
        best = plan["hot_prefill_reduction_best_policy"]
        if best is not None:
            arith = plan["hot_prefill_reduction_arithmetic"]
            simulated = plan["hot_prefill_reduction_simulated"]
            lines.append(f"hot prefill reduction: arithmetic {_times(arith)}, simulated "
                         f"{_times(simulated, '.1f')} (round_robin over "
                         f"{plan['hot_prefill_reduction_best_policy']}; the simulator's "
                         "cold documents churn the caches)")
    lines += [f"note: {note}" for note in plan.get("notes", ())]
    rec = plan["recommendation"]
    lines += ["", f"recommendation: {rec['policy']} on {rec['replicas']} replicas: {rec['why']}"]
    return "\n".join(lines)
