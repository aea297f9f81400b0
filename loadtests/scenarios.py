"""Named scenarios for the offline simulator: a workload, a fleet and an arrival rate.

* ``contracts``: the seed's contract library (2,000 documents of ~6,000 tokens, 250 hot
  ones get 80% of questions) on 8 H100 replicas with ~25 GiB of idle KV each.
* ``contracts-400``: a library shaped like fleets measured in the field: 400 documents of
  ~1,500 tokens, 50 hot ones get 80% of questions, 8 L4 replicas whose idle KV holds about
  8 documents each, Poisson arrivals that keep round robin's replicas ~55% busy.
* ``chat-apps``: four apps with 50/25/15/10% of the conversations, each with its own
  system prompt (500-800 tokens) and tools (400-800 tokens, in the ``tools`` field);
  conversations of 1-12 turns (mean 3.2), turns ~8 s apart, each a chat completion with
  the whole history; on the ``contracts-400`` fleet. Prompts go through the gateway as
  text (rendered and tokenized by the gateway's tokenizer, which counts other tokens
  than the replicas do).
* ``system-prompt``: one 2,000-token system prompt every request shares, then 50-300
  tokens of its own, on the ``contracts-400`` fleet at 60 requests/s (round robin's
  replicas ~50% busy prefilling, their decode slots ~90% full): hits are everywhere,
  and only the spread of the load decides time to first token.
* ``few-shot``: five prompt templates of 2,000-3,000 tokens (few-shot examples) with
  30/30/20/10/10% of the requests, then 300-800 tokens of their own, on the same fleet at
  20 requests/s.
* ``rag``: retrieval-augmented questions: a 600-token system prompt, then 3-5 chunks of
  250-400 tokens out of 2,000 (Zipf popularity) in retrieval's order, then the question,
  on the same fleet at 15 requests/s.
* ``chat``, ``tools``: multi-turn conversations (one shared system prompt; a tree of tool
  schema blocks).

Rates are for 8 replicas; the simulator scales them by the replica count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

L4_PROFILE = str(Path(__file__).parent / "profiles" / "llama3-8b-l4.yaml")


@dataclass(frozen=True, slots=True)
class Scenario:
    workload: str
    rate: float  # requests/s for 8 replicas
    params: dict[str, Any] = field(default_factory=dict)
    profile: str = "llama3-8b-h100"
    kv_pool_gib: float = 28.0
    idle_kv_gib: float = 25.0
    max_num_seqs: int = 20
    prompts: str = "ids"  # how the gateway sees prompts: token ids, or chat text


SCENARIOS: dict[str, Scenario] = {
    "contracts": Scenario("contracts", 44.0),
    "contracts-400": Scenario(
        "contracts", 13.0,
        {"num_docs": 400, "hot_docs": 50, "doc_tokens": 1500, "output_tokens": [8, 16]},
        profile=L4_PROFILE, kv_pool_gib=1.75, idle_kv_gib=1.46, max_num_seqs=8),
    "chat-apps": Scenario("chat-apps", 8.0, profile=L4_PROFILE, kv_pool_gib=1.75,
                          idle_kv_gib=1.46, max_num_seqs=8, prompts="text"),
    "system-prompt": Scenario("templates", 60.0, {"shares": [1.0]}, profile=L4_PROFILE,
                              kv_pool_gib=1.75, idle_kv_gib=1.46, max_num_seqs=8),
    "few-shot": Scenario(
        "templates", 20.0, {"shares": [0.3, 0.3, 0.2, 0.1, 0.1], "template_tokens": [2000, 3000],
                            "tail_tokens": [300, 800]},
        profile=L4_PROFILE, kv_pool_gib=1.75, idle_kv_gib=1.46, max_num_seqs=8),
    "rag": Scenario("rag", 15.0, profile=L4_PROFILE, kv_pool_gib=1.75, idle_kv_gib=1.46,
                    max_num_seqs=8),
    "chat": Scenario("chat", 60.0),
    "tools": Scenario("tools", 40.0),
}
