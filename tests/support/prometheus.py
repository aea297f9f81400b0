"""A real Prometheus server (Debian's ``prometheus`` binary) scraping loopback targets,
with its HTTP API for queries. Its storage lives in a temporary folder."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support.binaries import which
from tests.support.servers import free_port
from tests.support.waiting import wait_http, wait_until

BINARY = which("prometheus", "Debian's prometheus")


class Prometheus:
    """``targets``: job name -> ``host:port`` addresses, all scraped every ``interval``."""

    def __init__(self, folder: Path, targets: dict[str, list[str]],
                 interval: str = "1s") -> None:
        assert BINARY is not None
        config = folder / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": interval, "scrape_timeout": interval,
                       "evaluation_interval": interval},
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": hosts}]}
                               for job, hosts in targets.items()]}))
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [BINARY, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.http = httpx.Client(base_url=self.url, timeout=10)
        try:
            wait_http(f"{self.url}/-/ready", 30, self.proc)
        except BaseException:
            self.stop()
            raise

    def api(self, path: str, **params: Any) -> Any:
        """``/api/v1/<path>``'s ``data``; AssertionError with Prometheus' error if any."""
        body = self.http.get(f"/api/v1/{path}", params=params).json()
        assert body["status"] == "success", f"{path} {params}: {body.get('error')}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", f"{expr}: {data['resultType']}"
        return list(data["result"])

    def finite(self, expr: str) -> list[float]:
        """The finite values of an instant query (quantiles of empty rates are NaN)."""
        values = [float(s["value"][1]) for s in self.query(expr)]
        return [v for v in values if math.isfinite(v)]

    def wait_scraped(self, jobs: set[str], timeout_s: float = 30) -> None:
        """Until every target of ``jobs`` has been scraped successfully."""
        def healthy() -> bool:
            active = self.api("targets")["activeTargets"]
            return bool(active) and all(t["health"] == "up" for t in active
                                        if t["labels"]["job"] in jobs) \
                and {t["labels"]["job"] for t in active} >= jobs
        wait_until(healthy, timeout_s, f"Prometheus to scrape {sorted(jobs)}")

    def stop(self) -> None:
        self.http.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()
