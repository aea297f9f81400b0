"""Two ``kvgate serve`` copies peered with each other (``gateway.peers``), each one process
or several workers, started as real processes and returned once every link is up."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.support.metrics import Samples, per_worker
from tests.support.processes import Processes
from tests.support.servers import free_port

SECRET = "peer-secret-for-tests-0123"


def start_peered_pair(spawn: Processes, tmp_path: Path, config: dict[str, Any],
                      workers: int = 1,
                      before_second: Callable[[str], None] | None = None) -> list[str]:
    """The two copies' URLs, each serving ``config`` on a port of its own with ``workers``
    processes, once every worker's link out is up and every link in from the other
    copy's workers (summed over a box's workers, whichever answers). Each lists both
    copies, itself included, as a headless Service would. ``before_second``: called with
    the first copy's URL once it is ready, before the second starts."""
    ports = [free_port() for _ in range(2)]
    peer_ports = [free_port() for _ in range(2)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    for i in range(2):
        path = tmp_path / f"gateway{i}.yaml"
        path.write_text(yaml.safe_dump({
            **config, "port": ports[i],
            "peers": {"listen": f"127.0.0.1:{peer_ports[i]}",
                      "addresses": [f"127.0.0.1:{p}" for p in peer_ports],
                      "secret": SECRET}}))
        if i == 1 and before_second is not None:
            before_second(urls[0])
        spawn("serve", "--config", str(path), "--workers", str(workers),
              ready_url=f"{urls[i]}/ready")

    def linked(got: Samples) -> bool:
        return got.get(("kvgate_peer_links_up", ())) == workers \
            and got.get(("kvgate_peer_links_in", ())) == workers

    for url in urls:  # one link out each: the one to its own box is found and dropped
        per_worker(url, linked, f"{url} to link with the other", workers)
    return urls
