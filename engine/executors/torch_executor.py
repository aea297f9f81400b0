"""The ``torch`` executor: a real Llama-family model over a paged KV cache.

It owns one key and one value tensor ``[num_blocks, block_size, num_kv_heads, head_dim]``
per layer; block ids in a ``SeqWork`` index their first axis, so ``num_blocks`` must equal
the core's block pool size (see ``engine.model.kv_bytes_per_token`` to size it from memory).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from engine import kernels
from engine.executor import Batch, SeqWork, StepResult
from engine.kernels.metadata import BlockIdsOutOfRange
from engine.model.config import ModelConfig, kv_bytes_per_token
from engine.model.llama import CausalLM, KVCache
from engine.model.loader import load_model
from engine.request import SamplingParams, TokenLogprob

_NO_COMPUTE = frozenset(("meta",))  # torch devices with shapes but no data


def pick_device(name: str = "auto") -> torch.device:
    """The device ``name`` names ("auto": CUDA where there is one, else the CPU);
    ``ValueError`` naming it when it is no device, or none this machine has."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"{name!r} is not a torch device (cpu, cuda, cuda:N, mps): "
                         f"{exc}") from None
    if device.type in _NO_COMPUTE:
        raise ValueError(f"{name!r} holds no data to compute on (cpu, cuda, cuda:N, mps)")
    backend = getattr(torch, device.type, None)  # torch.cuda, torch.mps, torch.xpu, ...
    available = getattr(backend, "is_available", None)
    if callable(available) and not available():
        raise ValueError(f"{name!r}: this machine has no {device.type} device")
    count = getattr(backend, "device_count", None)
    if device.index is not None and callable(count) and device.index >= count():
        raise ValueError(f"{name!r}: this machine has {count()} {device.type} device(s), "
                         f"numbered from 0")
    return device


def device_memory_bytes(device: torch.device) -> int | None:
    """The memory of ``device`` (the host's for the CPU; None where torch does not say)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    if device.type == "cpu":
        from engine.kv_sizing import host_memory_bytes

        return host_memory_bytes()
    return None


class TorchExecutor:
    """Runs ``Batch``es on ``model``; one instance per engine, not thread-safe."""

    def __init__(self, model: CausalLM, *, num_blocks: int, block_size: int = 16) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks={num_blocks} and block_size={block_size} must be "
                             f"positive")
        self.model = model
        self.config: ModelConfig = model.config
        self.block_size = block_size
        self.num_blocks = num_blocks
        eos = self.config.eos_token_ids
        self.eos_token_id: int | None = eos[0] if eos else None
        self.eos_token_ids: frozenset[int] = frozenset(eos)
        self.vocab_size = self.config.vocab_size  # the ids a step may compute
        # the most float32 logits one slice of prompt log probabilities holds
        self.prompt_logprob_elements = PROMPT_LOGPROB_ELEMENTS
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        shape = (num_blocks, block_size, self.config.num_kv_heads, self.config.head_dim)
        self.kv_caches: list[KVCache] = self._allocate(shape)

    def _allocate(self, shape: tuple[int, int, int, int]) -> list[KVCache]:
        """One key and one value tensor of ``shape`` per layer, left uninitialised (a
        position is always written before anything reads it, and untouched pages of a large
        CPU pool then cost no memory). ``ValueError`` naming the pool's size when the device
        cannot hold it beside the model's weights (a CUDA out-of-memory error, or the host
        allocator's refusal), instead of the allocator's traceback."""
        caches: list[KVCache] = []
        try:
            for _ in range(self.config.num_layers):
                caches.append((torch.empty(shape, dtype=self.dtype, device=self.device),
                               torch.empty(shape, dtype=self.dtype, device=self.device)))
        except RuntimeError as exc:  # torch.OutOfMemoryError is one
            caches.clear()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            pool = self.num_blocks * self.block_size * self.bytes_per_token
            raise ValueError(
                f"a KV cache of {self.num_blocks:,} blocks of {self.block_size} tokens "
                f"({pool / 2**30:.4g} GiB) does not fit in the memory of {self.device} "
                f"beside the model's weights: lower --kv-cache-gib "
                f"({str(exc).splitlines()[0][:200]})") from None
        return caches

    @classmethod
    def from_dir(
        cls,
        model_dir: str | Path,
        *,
        num_blocks: int,
        block_size: int = 16,
        device: str = "auto",
        dtype: torch.dtype | None = None,
        backend: str = "auto",
    ) -> TorchExecutor:
        model = load_model(model_dir, device=pick_device(device), dtype=dtype,
                           backend=backend)
        return cls(model, num_blocks=num_blocks, block_size=block_size)

    @property
    def bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.config, self.dtype)

    def execute(self, batch: Batch) -> StepResult:
        begin = time.perf_counter()
        if not batch.seqs:
            return StepResult(next_tokens={}, seconds=0.0)
        with torch.inference_mode():
            hidden, starts = self._forward(batch.seqs)
            sampled = [s for s in batch.seqs if s.sample]
            logits = self._last_logits(hidden, starts, [s.sample for s in batch.seqs])
            next_tokens: dict[str, int] = {}
            logprobs: dict[str, TokenLogprob] = {}
            for s, row in zip(sampled, logits, strict=True):
                token, logprob = self._sample(s, row)
                next_tokens[s.request_id] = token
                if logprob is not None:
                    logprobs[s.request_id] = logprob
            prompt_logprobs: dict[str, tuple[TokenLogprob, ...]] = {}
            for i, s in enumerate(batch.seqs):
                tokens = s.prompt_tokens
                if tokens and s.params is not None and s.params.prompt_logprobs is not None:
                    # token t is predicted by position t - 1, the chunk's row t - 1 - start:
                    # tokens [start + 1, ...) by rows [starts[i], starts[i] + len(tokens))
                    rows = hidden[starts[i]: starts[i] + len(tokens)]
                    prompt_logprobs[s.request_id] = self.prompt_logprobs(
                        rows, s.history[tokens.start:tokens.stop], s.params.prompt_logprobs)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return StepResult(next_tokens=next_tokens, seconds=time.perf_counter() - begin,
                          logprobs=logprobs, prompt_logprobs=prompt_logprobs)

    @torch.inference_mode()
    def last_logits(self, seqs: Sequence[SeqWork], only: Sequence[bool] | None = None,
                    all_positions: bool = False) -> torch.Tensor:
        """Run one step and return float32 logits: of each sequence's last token (those
        with ``only[i]`` true, when given), or of every token when ``all_positions``."""
        hidden, starts = self._forward(seqs)
        if all_positions:
            return self.model.logits(hidden)
        return self._last_logits(hidden, starts, [True] * len(seqs) if only is None else only)

    def _last_logits(self, hidden: torch.Tensor, starts: list[int], only: Sequence[bool]
                     ) -> torch.Tensor:
        """The logits of the last row of each sequence ``i`` with ``only[i]`` true."""
        ends = [starts[i + 1] - 1 for i, keep in enumerate(only) if keep]
        return self.model.logits(
            hidden[torch.tensor(ends, dtype=torch.long, device=self.device)])

    def _forward(self, seqs: Sequence[SeqWork]) -> tuple[torch.Tensor, list[int]]:
        """Run one step: the hidden states of every token of ``seqs``, and where each
        sequence's rows start (``starts[i]:starts[i + 1]``, one more entry than seqs)."""
        for s in seqs:
            self._validate(s)
        try:
            meta = kernels.build_metadata(
                [(s.start, len(s.token_ids), s.block_ids) for s in seqs], self.block_size,
                self.device, num_blocks=self.num_blocks)
        except BlockIdsOutOfRange as exc:
            raise ValueError(f"request {seqs[exc.index].request_id}: block ids {exc.ids} "
                             f"outside [0, {exc.limit})") from None
        input_ids = torch.tensor([t for s in seqs for t in s.token_ids], dtype=torch.int64,
                                 device=self.device)
        hidden = self.model(input_ids, meta.positions, self.kv_caches, meta)
        return hidden, list(meta.query_start_host)

    def prompt_logprobs(self, hidden: torch.Tensor, targets: Sequence[int], top: int
                        ) -> tuple[TokenLogprob, ...]:
        """For each row of ``hidden``, ``targets[i]``'s log-probability under
        ``log_softmax(logits)`` (the raw logits, no temperature, as vLLM), its rank (how
        many tokens are at least as likely, itself included) and the ``top`` most likely
        tokens. Rows go through the vocabulary projection ``prompt_logprob_elements //
        vocab`` at a time, so a long chunk never holds all its float32 logits at once."""
        vocab = self.config.vocab_size
        step = max(1, self.prompt_logprob_elements // vocab)
        ids = torch.tensor(list(targets), dtype=torch.long, device=hidden.device)
        out: list[TokenLogprob] = []
        for lo in range(0, len(ids), step):
            logp = torch.log_softmax(self.model.logits(hidden[lo:lo + step]), dim=-1)
            want = ids[lo:lo + step, None]
            chosen = logp.gather(1, want)
            ranks = (logp >= chosen).sum(-1)
            k = min(top, logp.shape[-1])
            values, tops = torch.topk(logp, k, dim=-1)
            del logp
            for value, rank, vs, ts in zip(chosen[:, 0].tolist(), ranks.tolist(),
                                           values.tolist(), tops.tolist(), strict=True):
                out.append(TokenLogprob(value, tuple(zip(ts, vs, strict=True)), rank))
        return tuple(out)

    def _validate(self, s: SeqWork) -> None:
        if not s.token_ids:
            raise ValueError(f"request {s.request_id}: no tokens to compute")
        if len(s.block_ids) * self.block_size < s.context_len:
            raise ValueError(f"request {s.request_id}: {len(s.block_ids)} blocks cannot hold "
                             f"{s.context_len} positions")
        vocab = self.config.vocab_size
        token = next((t for t in s.token_ids if not 0 <= t < vocab), None)
        if token is not None:  # checked here: on a GPU the embedding lookup would assert
            raise ValueError(f"request {s.request_id}: token id {token} is outside the "
                             f"model's vocabulary [0, {vocab}) (its config.json vocab_size)")
        window = self.config.sliding_window
        if window is not None and s.context_len > window:
            raise ValueError(f"request {s.request_id}: context {s.context_len} exceeds the "
                             f"model's sliding window {window}, which is not implemented")
        if s.context_len > self.config.max_position_embeddings:
            raise ValueError(f"request {s.request_id}: context {s.context_len} exceeds "
                             f"max_position_embeddings={self.config.max_position_embeddings}")

    def _sample(self, s: SeqWork, logits: torch.Tensor) -> tuple[int, TokenLogprob | None]:
        """The next token of ``s`` from its last position's ``logits``, as vLLM samples:
        logit bias, penalties and ``min_tokens`` first, then greedy below
        ``GREEDY_BELOW`` of temperature, else temperature, min-p, top-k and top-p. With
        ``params.logprobs`` set, also its log-probability (see :func:`token_logprob`).
        Logits a request's values (an extreme repetition penalty) or the model made
        non-finite are sampled as :func:`finite_logits` reads them (on the CPU, where the
        draw is made; a greedy pick of unadjusted logits reads them as they are, with no
        second reduction on the device): nothing here raises for one request's values."""
        p = s.params
        filtered = p if p is not None and p.filters else None
        if filtered is not None:
            logits = finite_logits(adjust_logits(logits.float(), filtered, s.history,
                                                 s.num_prompt, self.eos_token_ids))
        greedy = s.temperature < GREEDY_BELOW
        if greedy:
            token = int(torch.argmax(logits))
        else:
            probs = tempered(finite_logits(logits.cpu()), s.temperature).softmax(dim=-1)
            if filtered is not None:
                probs = truncate(probs, filtered)
            if p is not None and p.seed is None:
                token = int(torch.multinomial(probs, 1))  # sampled afresh each time
            else:
                # seeded by request seed and position: reproducible however steps batch
                seed = (s.seed * 1_000_003 + s.context_len) & _SEED_MASK
                gen = torch.Generator(device="cpu").manual_seed(seed)
                token = int(torch.multinomial(probs, 1, generator=gen))
        if p is None or p.logprobs is None:
            return token, None
        return token, token_logprob(logits, token, 1.0 if greedy else s.temperature,
                                    p.logprobs)


# the most float32 logits one slice of prompt log probabilities holds, by default (32 Mi:
# 128 MiB, 256 positions of a 128k vocabulary; log_softmax holds as much again)
PROMPT_LOGPROB_ELEMENTS = 1 << 25
GREEDY_BELOW = 1e-5  # temperatures below this sample greedily (vLLM's epsilon)
_SEED_MASK = (1 << 63) - 1  # torch's generator takes a 64-bit seed
_FLOAT32_MAX = torch.finfo(torch.float32).max


def token_logprob(logits: torch.Tensor, token: int, temperature: float, top: int
                  ) -> TokenLogprob:
    """``token``'s log-probability under ``softmax(logits / temperature)``, the
    distribution it was sampled from before top-k, top-p and min-p cut it (SGLang's
    default; greedy tokens at temperature 1), and the ``top`` most likely tokens of it."""
    logp = torch.log_softmax(tempered(finite_logits(logits.cpu()), temperature), dim=-1)
    k = min(top, logp.shape[-1])
    values, ids = torch.topk(logp, k) if k else (logp[:0], logp[:0].long())
    return TokenLogprob(float(logp[token]), tuple(zip(ids.tolist(), values.tolist(),
                                                      strict=True)))


def finite_logits(logits: torch.Tensor) -> torch.Tensor:
    """``logits`` (one row, as float32) a sampler can always draw from: NaN as -inf (never
    drawn), +inf as the largest finite float32 (drawn among themselves, as their limit);
    a row with no finite value left as zeros (every token alike)."""
    logits = logits.float()
    if bool(torch.isfinite(logits).all()):
        return logits
    logits = torch.nan_to_num(logits, nan=-math.inf, posinf=_FLOAT32_MAX, neginf=-math.inf)
    if bool(logits.max() == -math.inf):
        return torch.zeros_like(logits)
    return logits


def tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits / temperature`` less its largest value: the same softmax, but finite
    logits divided by a small temperature cannot overflow to inf (whose softmax is NaN)."""
    return (logits - logits.max()) / temperature


def adjust_logits(logits: torch.Tensor, p: SamplingParams, history: Sequence[int],
                  num_prompt: int, eos_ids: frozenset[int]) -> torch.Tensor:
    """``logits`` (float32, one row) with ``p``'s logit bias, repetition penalty (over the
    prompt and output), presence and frequency penalties (over the output) applied, and
    the end-of-sequence and stop ids masked until ``min_tokens`` outputs."""
    logits = logits.clone()
    vocab = logits.shape[-1]
    for token, bias in p.logit_bias:
        if 0 <= token < vocab:
            logits[token] += bias
    output = list(history[num_prompt:])
    if p.repetition_penalty != 1 and history:
        seen = torch.unique(torch.tensor(list(history), dtype=torch.long,
                                         device=logits.device))
        seen = seen[seen < vocab]
        picked = logits[seen]
        logits[seen] = torch.where(picked > 0, picked / p.repetition_penalty,
                                   picked * p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and output:
        ids = torch.tensor(output, dtype=torch.long, device=logits.device)
        counts = torch.bincount(ids[ids < vocab], minlength=vocab)[:vocab].to(logits.dtype)
        logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(
            logits.dtype)
    if len(output) < p.min_tokens:
        banned = [t for t in (*(() if p.ignore_eos else eos_ids), *p.stop_token_ids)
                  if 0 <= t < vocab]
        if banned:
            logits[banned] = -math.inf
    return logits


def truncate(probs: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """``probs`` with the tokens outside ``p``'s cuts zeroed, in vLLM's order: min-p
    (below min_p x the top probability), then top-k (below the k-th probability), then
    top-p over what those two kept, renormalised (the smallest set of its most likely
    tokens whose share of the kept mass reaches top_p)."""
    keep = torch.ones_like(probs, dtype=torch.bool)
    if p.min_p > 0:
        keep &= probs >= p.min_p * probs.max()
    if p.top_k > 0 and p.top_k < probs.shape[-1]:
        kth = torch.topk(probs, p.top_k).values[-1]
        keep &= probs >= kth
    if p.top_p < 1:
        kept = torch.where(keep, probs, torch.zeros_like(probs))
        ordered, order = torch.sort(kept, descending=True)
        # share of the kept mass ranked above each token
        total = ordered.sum().clamp_min(torch.finfo(probs.dtype).tiny)
        before = (torch.cumsum(ordered, dim=-1) - ordered) / total
        inside = torch.empty_like(keep)
        inside[order] = before < p.top_p
        keep &= inside
    return torch.where(keep, probs, torch.zeros_like(probs))
