"""``peers``: the gateway copies in front of one fleet that tell each other what they
route (``gateway.peers``). Off unless ``listen`` or ``addresses`` is set; then a secret
of at least 16 characters is required (``secret``, ``secret_file`` or ``secret_env``),
which every copy proves when it connects.

Example (two copies behind a Kubernetes Service, found through a headless one)::

    peers: {listen: "0.0.0.0:8002", addresses: ["kvgate-peers.llm.svc:8002"],
            secret_env: KVGATE_PEER_SECRET}

Times are seconds: ``resolve_s`` at least 0.01, ``pending_s`` at least 0.001.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.least_seconds import LEAST_INTERVAL_S, LEAST_TIMEOUT_S, at_least
from gateway.peer_wire import MAX_FRAME
from kvwire.secret_source import resolve_secret

MIN_SECRET = 16


def split_address(value: str, where: str, any_port: bool = False) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for an IPv6 address) as (host, port); ``any_port``:
    port 0 (a listener's: the system picks one) is allowed."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) \
            or not (0 if any_port else 1) <= int(port) < 65536:
        raise ValueError(f"{where}: {value!r} is not host:port")
    host = host.strip("[]")
    try:  # as the resolver encodes a name: an empty label, or one past 63 characters, fails
        host.encode("idna")
    except UnicodeError:
        raise ValueError(f"{where}: {value!r} is not host:port (its host is not a name "
                         "a resolver takes: an empty label, or one past 63 characters)"
                         ) from None
    return host, int(port)


@dataclass(frozen=True, slots=True)
class PeersConfig:
    # host:port this copy hears its peers on (null: it only sends)
    listen: str | None = None
    # host:port of the copies; a name resolving to several addresses (a headless Service)
    # is one peer per address, looked up again every resolve_s; this copy's own address
    # is found and skipped
    addresses: list[str] = field(default_factory=list)
    secret: str | None = None
    secret_file: str | None = None
    secret_env: str | None = None
    resolve_s: float = 10.0
    # frames and bytes waiting for one peer at most (a peer further behind is disconnected,
    # which lets go of what this copy had pending there: a slow peer never holds this
    # copy's memory, and never keeps load it missed the end of)
    queue_frames: int = 4096
    queue_bytes: int = 16 * 1024 * 1024
    # a peer's request still pending after this long is let go (its word lost)
    pending_s: float = 600.0
    # tell the peers each stored response's replica and tenant (``/v1/responses``), so
    # that every copy refuses another tenant's continuation of it; false while a copy of
    # a release that does not know that frame is among the peers (it drops the link)
    tell_responses: bool = True

    @property
    def on(self) -> bool:
        return self.listen is not None or bool(self.addresses)

    def validate(self) -> None:
        if self.listen is not None:
            split_address(self.listen, "listen", any_port=True)
        for i, address in enumerate(self.addresses):
            split_address(address, f"addresses[{i}]")
        for key in ("queue_frames", "queue_bytes"):
            if not getattr(self, key) > 0:
                raise ValueError(f"{key} must be > 0, got {getattr(self, key)!r}")
        at_least(self, LEAST_INTERVAL_S, "resolve_s")  # a lookup every resolve_s
        at_least(self, LEAST_TIMEOUT_S, "pending_s")
        if self.queue_bytes < MAX_FRAME:  # one large frame would overflow the link each time
            raise ValueError(f"queue_bytes must be at least one frame's limit ({MAX_FRAME}), "
                             f"got {self.queue_bytes!r}")
        if self.on:
            self.checked_secret()

    def checked_secret(self) -> str:
        """The secret, checked at every read: a file or variable read again when the
        gateway builds its state may have changed since the config was validated."""
        secret = resolve_secret(self.secret, self.secret_file, self.secret_env, "secret")
        if secret is None or len(secret) < MIN_SECRET:
            raise ValueError(f"peers need a secret of at least {MIN_SECRET} characters "
                             "(secret, secret_file or secret_env): every copy proves "
                             f"it to the others, got {0 if secret is None else len(secret)}")
        return secret
