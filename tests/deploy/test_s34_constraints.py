"""The images install pinned versions: every Dockerfile's ``pip install`` takes
``deploy/constraints.txt``, which pins each dependency kvgate names for them (its
``[engine,kubernetes,otel]`` ones, and theirs) to one version within what
pyproject.toml asks."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = ROOT / "deploy" / "constraints.txt"
IMAGE_EXTRAS = ("engine", "kubernetes", "otel")
# torch's CUDA wheel pins the triton it was built with: pinned here, the two could clash
LEFT_TO_TORCH = {"triton"}


def pins() -> dict[str, Version]:
    out: dict[str, Version] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep and version and "+" not in version, f"not an exact public pin: {line!r}"
        assert canonicalize_name(name) not in out, f"pinned twice: {line!r}"
        out[canonicalize_name(name)] = Version(version)
    return out


def test_every_dependency_of_the_images_is_pinned_within_pyproject() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    for extra in IMAGE_EXTRAS:
        wanted += [Requirement(r) for r in project["optional-dependencies"][extra]]
    pinned = pins()
    for requirement in wanted:
        name = canonicalize_name(requirement.name)
        if name in LEFT_TO_TORCH:
            assert name not in pinned
            continue
        assert name in pinned, f"{requirement} is not pinned in {CONSTRAINTS.name}"
        assert requirement.specifier.contains(pinned[name], prereleases=True), \
            f"{name}=={pinned[name]} is outside pyproject's {requirement}"


def test_every_image_installs_with_the_constraints() -> None:
    dockerfiles = sorted((ROOT / "deploy").rglob("Dockerfile*"))
    assert dockerfiles
    for path in dockerfiles:
        text = path.read_text()
        installs = re.findall(r"^RUN pip install (.*)$", text, flags=re.M)
        assert installs, f"{path} installs nothing"
        copied = re.findall(r"^COPY (.*) \./$", text, flags=re.M)
        assert any("deploy/constraints.txt" in line.split() for line in copied), path
        for install in installs:
            assert "-c constraints.txt" in install, f"{path}: {install}"
