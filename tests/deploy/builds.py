"""The image builds the project documents: the ``docker build -f FILE -t IMAGE .`` lines in
the Dockerfiles' header comments and in docs/deploy.md, which the manifests (compose,
kustomize) must name the images of."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEPLOY_DOC = ROOT / "docs" / "deploy.md"
BUILD = re.compile(r"docker build -f (\S+) -t (\S+) \.")


def builds_in(text: str) -> dict[str, str]:
    """Dockerfile path -> image reference, for every ``docker build`` line in ``text``."""
    found: dict[str, str] = {}
    for dockerfile, image in BUILD.findall(text):
        assert found.setdefault(dockerfile, image) == image, f"{dockerfile} built twice"
    return found


def dockerfile_builds() -> dict[str, str]:
    """Dockerfile path -> the image its header comment builds (each Dockerfile names
    itself; one without a build line is left out)."""
    out: dict[str, str] = {}
    for path in sorted((ROOT / "deploy").rglob("Dockerfile*")):
        header = "".join(line for line in path.read_text().splitlines(keepends=True)
                         if line.startswith("#"))
        builds = builds_in(header)
        if not builds:
            continue
        ((dockerfile, image),) = builds.items()
        assert dockerfile == str(path.relative_to(ROOT)), f"{path} documents {dockerfile}"
        out[dockerfile] = image
    return out


def split_image(image: str) -> tuple[str, str | None]:
    """``[registry/path/]name[:tag]`` -> (``name``, tag or None); digests are not used."""
    last = image.rsplit("/", 1)[-1]
    name, _, tag = last.partition(":")
    return name, tag or None


USER = re.compile(r"^USER\s+(\S+)\s*$", re.MULTILINE)
USERADD = re.compile(r"\buseradd\b[^\n]*?--uid\s+(\d+)[^\n]*?\s(\w+)\s*$", re.MULTILINE)


def dockerfile_user(dockerfile: str) -> tuple[str, dict[str, int]]:
    """The last ``USER`` of ``dockerfile`` (a path under the repository) as written, and
    the users its ``useradd --uid N ... NAME`` lines create (name -> uid)."""
    text = (ROOT / dockerfile).read_text()
    users = USER.findall(text)
    assert users, f"{dockerfile} runs as root: no USER"
    return users[-1], {name: int(uid) for uid, name in USERADD.findall(text)}
