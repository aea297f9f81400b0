"""One policy state per model: what a policy learns of a fleet holds for one model's replicas.

A decision sees only the replicas that serve its request's model. A policy that keeps
fleet-wide state (``cost``: its hot placement, scratch set, load and pace estimates, the
aging of its cache models) would otherwise learn each model's requests over another
model's replicas: with two models on their own replicas, every decision placed the hot set
again over the other model's replicas (about 5x the reassignments, ``choose`` 87 -> 406
us), and each model's caches aged at half speed. ``PerModel`` keeps one instance per model
(made by ``make``, the first one given), all sharing what the first keeps once for every
model (``Policy.share_from``: its KV event index, kept per replica; radix's tree, whose
memory bound is the whole gateway's), and tells every instance of replicas that leave or
restart.

A LoRA adapter is decided by its base model's instance (``RouteRequest.base_model``, the
adapter's listed ``parent``): the adapters run on their base model's replicas, in their
caches and queues, so one instance has to see all of their load and place all of their
hot prefixes (their keys stay apart: each is rooted at its model's name). With an
instance per adapter, each learned a share of the replicas' load as if it were the whole,
placed its hot prefixes as if it had the caches to itself, and a fleet serving more
adapters than ``max_models`` let their instances go one after another, each forgetting
all it had learned.

At most ``max_models`` instances are kept (a model name a client makes up is refused
before routing once the fleet's models are known, but not before, nor where a replica lists
more models than the gateway keeps): a new model past them takes the place of the one used
least recently (a model that left the fleet, as a fleet rolls model versions or adapters;
the first instance, which holds the shared index, keeps its place). Names that ``listed``
says no replica lists share one instance, so that made-up names cannot push the fleet's
models out one by one. Not thread-safe, as the policies it holds.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

from policies.base import (
    Decision,
    Finished,
    Policy,
    ReplicaView,
    Routed,
    RouteEvent,
    RouteRequest,
    Unrouted,
)

MAX_MODELS = 16


class PerModel(Policy):
    """``first`` for the first model seen, ``make()`` for each other; see the module
    docstring."""

    def __init__(self, first: Policy, make: Callable[[], Policy],
                 max_models: int = MAX_MODELS,
                 listed: Callable[[str], bool] | None = None) -> None:
        if max_models < 1:
            raise ValueError(f"max_models must be >= 1, got {max_models!r}")
        self.first = first
        self._make = make
        self.max_models = max_models
        self._listed = listed
        self._by_model: OrderedDict[str | None, Policy] = OrderedDict()  # least recent 1st
        self.name = first.name  # type: ignore[misc]
        self.reasons = first.reasons  # type: ignore[misc]
        self.chunk_chars = first.chunk_chars
        self.wants_anchor = first.wants_anchor
        self.wants_fingerprint = first.wants_fingerprint
        self.kv_index = first.kv_index

    def policy_for(self, model: str | None, keep: bool = True) -> Policy:
        """The instance deciding for ``model`` (made on first use; one for every name no
        replica lists). ``keep`` false (``explain``): nothing made is kept and nothing moves
        in the recency order; a model without an instance is lent a fresh one (keeping it
        would let another model's learned state go)."""
        policy = self._by_model.get(model)
        if policy is not None:
            if keep and len(self._by_model) > 1:
                self._by_model.move_to_end(model)
            return policy
        if self._unlisted(model):
            return self.policy_for(None, keep)
        if not self._by_model:
            policy = self.first
        elif not keep:
            return self._fresh()
        else:
            if len(self._by_model) >= self.max_models:
                # the least recent but the first, as a 1-tuple: None is the name of the
                # instance of requests naming no model, not "none found"
                stale = next(((m,) for m, p in self._by_model.items() if p is not self.first),
                             None)
                if stale is None:
                    return self.first
                del self._by_model[stale[0]]
            policy = self._fresh()
        if keep:
            self._by_model[model] = policy
        return policy

    def _unlisted(self, model: str | None) -> bool:
        """Whether ``model`` is a name no replica lists (it shares the None instance)."""
        return model is not None and self._listed is not None and not self._listed(model)

    def _fresh(self) -> Policy:
        policy = self._make()
        policy.share_from(self.first)  # one KV event index, fed once, per replica (and so on)
        return policy

    def _all(self) -> list[Policy]:
        return list(self._by_model.values()) or [self.first]

    @staticmethod
    def _most(needs: list[int | None]) -> int | None:
        """The most of ``needs``: None (all of it) when any is None."""
        return None if None in needs else max(needs)  # type: ignore[type-var]

    @property
    def tokens_needed(self) -> int | None:  # type: ignore[override]
        """The most any instance needs (None, the whole prompt, when one does): the
        request builder asks before it knows which instance decides. Asked for every
        request: one model's instance answers alone."""
        if len(self._by_model) <= 1:
            return self.first.tokens_needed
        return self._most([p.tokens_needed for p in self._by_model.values()])

    @property
    def chunks_needed(self) -> int | None:  # type: ignore[override]
        if len(self._by_model) <= 1:
            return self.first.chunks_needed
        return self._most([p.chunks_needed for p in self._by_model.values()])

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> Decision:
        return self.policy_for(_served(request)).choose(request, replicas)

    def explain(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> Decision:
        return self.policy_for(_served(request), keep=False).explain(request, replicas)

    def observe(self, event: RouteEvent) -> None:
        if isinstance(event, Routed):
            self.policy_for(_served(event.request)).observe(event)
        elif isinstance(event, Finished | Unrouted):
            # a request whose model's instance was let go meanwhile tells a new one
            # nothing, and making one would push out a model in use
            model = _served(event.request)
            policy = self._by_model.get(model)
            if policy is None and self._unlisted(model):
                policy = self._by_model.get(None)
            if policy is not None:
                policy.observe(event)
        else:  # a replica left or restarted: every model's view of it is stale
            for policy in self._all():
                policy.observe(event)

    def describe(self) -> dict[str, object]:
        """The one instance's state, or each model's when there are several."""
        if len(self._by_model) <= 1:
            return self.first.describe()
        return {"models": {str(model): policy.describe()
                           for model, policy in self._by_model.items()}}

    def describe_for(self, request: RouteRequest) -> dict[str, object]:
        """The state of the instance that decides ``request`` (a fresh one's, learned
        nothing, for a model without one yet): never another model's."""
        return self.policy_for(_served(request), keep=False).describe()


def _served(request: RouteRequest) -> str | None:
    """The model whose instance decides ``request``: an adapter's base model."""
    return request.base_model or request.model
