"""What ``pip install kvgate`` (no extras; the gateway's image adds only ``kubernetes`` and
``otel``, the engine's CPU image none) must run: every gateway, policy, wire and engine
module but the GPU executor's imports, and every preset policy builds, with the extras'
packages blocked from importing."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the import name of each optional dependency's distribution
IMPORT_NAMES = {
    "torch": "torch", "triton": "triton", "safetensors": "safetensors", "numpy": "numpy",
    "locust": "locust", "matplotlib": "matplotlib", "kubernetes_asyncio": "kubernetes_asyncio",
    "opentelemetry-api": "opentelemetry", "opentelemetry-sdk": "opentelemetry",
    "opentelemetry-exporter-otlp-proto-http": "opentelemetry",
    "opentelemetry-proto": "opentelemetry", "pytest": "pytest", "uhashring": "uhashring",
    "pytest-asyncio": "pytest_asyncio", "pytest-timeout": "pytest_timeout", "pytest-xdist": "xdist",
    "hypothesis": "hypothesis", "ruff": "ruff", "mypy": "mypy",
    "transformers": "transformers", "openai": "openai", "httpx": "httpx", "dnslib": "dnslib",
    "kubernetes-validate": "kubernetes_validate",
}
# modules that only an extra's feature loads (when configured)
EXTRA_MODULES = {"gateway.discovery.kube_source": "kubernetes", "gateway.otel_tracing": "otel",
                 "engine.executors.torch_executor": "engine", "engine.kernels": "engine",
                 "engine.model": "engine"}

_PROBE = r"""
import importlib, importlib.abc, sys
BLOCKED = set(sys.argv[1].split(","))
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is not installed without extras")
        return None
sys.meta_path.insert(0, Block())
for module in sys.argv[2].split(","):
    importlib.import_module(module)
from policies.registry import build_policy, load_preset
for name in sys.argv[3].split(","):
    build_policy(load_preset(name))
print("ok")
"""


def _dist(requirement: str) -> str:
    for stop in "[<>=!~; ":
        requirement = requirement.split(stop)[0]
    return requirement


def test_the_base_install_runs_the_gateway_and_every_policy():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {_dist(r) for r in project["dependencies"]}
    extras = {_dist(r) for reqs in project["optional-dependencies"].values() for r in reqs
              if not r.startswith("kvgate")} - base
    unknown = extras - set(IMPORT_NAMES)
    assert not unknown, f"add the import names of {sorted(unknown)} to IMPORT_NAMES"
    blocked = sorted({IMPORT_NAMES[d] for d in extras})
    modules = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for package in ("kvwire", "policies", "gateway", "kvgate", "engine")
        for p in (ROOT / package).rglob("*.py"))
    modules = [m for m in modules if not m.endswith("__main__") and not any(
        m == extra or m.startswith(f"{extra}.") for extra in EXTRA_MODULES)]
    presets = sorted(p.stem for p in (ROOT / "policies" / "presets").glob("*.yaml"))
    out = subprocess.run([sys.executable, "-c", _PROBE, ",".join(blocked), ",".join(modules),
                          ",".join(presets)], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"
    assert "numpy" not in blocked and "torch" in blocked and "opentelemetry" in blocked
