"""A third-party router's program named by a path that is not a program is refused with
the path and where it was named, before any fleet starts (it was a FileNotFoundError
traceback once the fleet's engines had started)."""

import os
import re
import stat
import subprocess
import sys

import pytest

from loadtests.third_party import ThirdPartyError, require_program
from tests.support.netns import isolated
from tests.support.processes import REPO


def test_rv27l_a_named_path_that_is_not_a_program_is_refused(tmp_path, monkeypatch):
    missing = str(tmp_path / "no-such-router")
    with pytest.raises(ThirdPartyError, match=re.escape(
            f"--sglang-router '{missing}' is not an executable file")):
        require_program("sglang", missing)
    plain = tmp_path / "router.txt"
    plain.write_text("#!/bin/sh\n")  # a file, not executable
    with pytest.raises(ThirdPartyError, match=r"--vllm-router '.*router\.txt'"):
        require_program("vllm", str(plain))
    monkeypatch.setenv("KVGATE_VLLM_ROUTER", missing)  # the environment's word, named so
    with pytest.raises(ThirdPartyError, match=re.escape(f"KVGATE_VLLM_ROUTER '{missing}'")):
        require_program("vllm")
    plain.chmod(plain.stat().st_mode | stat.S_IXUSR)
    assert require_program("vllm", str(plain)) == str(plain)


def test_rv27l_the_load_run_says_so_before_starting_a_fleet(tmp_path):
    missing = str(tmp_path / "no-such-router")
    env = dict(os.environ, KVGATE_FLEET_DIR=str(tmp_path / "fleets"))
    proc = subprocess.run(isolated([sys.executable, "-m", "loadtests.run", "--policies",
                                    "sglang:cache_aware", "--sglang-router", missing,
                                    "--duration", "1"]),
                          cwd=REPO, capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"--sglang-router '{missing}' is not an executable file" in proc.stderr
    assert "Traceback" not in proc.stderr
