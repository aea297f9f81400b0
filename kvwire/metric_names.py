"""Names of the Prometheus metrics a replica exposes and the gateway's scraper reads.

The engine exposes vLLM's names (so dashboards and alerts work against vLLM and kvgate
alike) plus kvgate's queue gauge; the scraper also reads the older vLLM spellings and
SGLang's dialect. Counters are exposed with a ``_total`` suffix; vLLM labels every series
``model_name`` and ``engine`` (one sample per data-parallel rank).
"""

from __future__ import annotations

# -- what the engine exposes --------------------------------------------------------------
NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"
PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
NUM_PREEMPTIONS = "vllm:num_preemptions"
TTFT = "vllm:time_to_first_token_seconds"
E2E_LATENCY = "vllm:e2e_request_latency_seconds"
QUEUE_TIME = "vllm:request_queue_time_seconds"
INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"
REQUEST_PROMPT_TOKENS = "vllm:request_prompt_tokens"
REQUEST_GENERATION_TOKENS = "vllm:request_generation_tokens"
REQUEST_PREFILL_TIME = "vllm:request_prefill_time_seconds"
REQUEST_DECODE_TIME = "vllm:request_decode_time_seconds"
REQUEST_INFERENCE_TIME = "vllm:request_inference_time_seconds"
ITERATION_TOKENS = "vllm:iteration_tokens_total"  # a histogram, as in vLLM v1
REQUEST_SUCCESS = "vllm:request_success"  # label: finished_reason
CACHE_CONFIG_INFO = "vllm:cache_config_info"  # labels: block_size, num_gpu_blocks, engine
PROMPT_TOKENS_WAITING = "kvgate:num_prompt_tokens_waiting"
# the sim executor only: seconds its steps were modeled to take, and how much later than
# that they ended (a host too busy for its fleet: every first token comes that much later)
STEP_MODELED_SECONDS = "kvgate:engine_step_modeled_seconds"
STEP_LATE_SECONDS = "kvgate:engine_step_late_seconds"

# every series above carries these labels: the served model, the data-parallel rank
MODEL_NAME_LABEL = "model_name"
ENGINE_LABEL = "engine"
FINISHED_REASONS = ("stop", "length", "abort")

TOTAL = "_total"

# -- older vLLM spellings the scraper also reads ------------------------------------------
GPU_CACHE_USAGE = "vllm:gpu_cache_usage_perc"
GPU_PREFIX_CACHE_QUERIES = "vllm:gpu_prefix_cache_queries"
GPU_PREFIX_CACHE_HITS = "vllm:gpu_prefix_cache_hits"

# -- SGLang's dialect ---------------------------------------------------------------------
SGLANG_RUNNING = "sglang:num_running_reqs"
SGLANG_WAITING = "sglang:num_queue_reqs"
SGLANG_TOKEN_USAGE = "sglang:token_usage"
SGLANG_MAX_TOTAL_TOKENS = "sglang:max_total_num_tokens"
SGLANG_CACHE_HIT_RATE = "sglang:cache_hit_rate"
SGLANG_PROMPT_TOKENS = "sglang:prompt_tokens"
SGLANG_GENERATION_TOKENS = "sglang:generation_tokens"
