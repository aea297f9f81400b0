"""``kvgate serve --workers N`` leaves nothing behind over restarts: no shared memory when
every process of the box is killed at once (a container stopped), its metrics directory
gone at the next start, and a stop asked for while the workers start stops them all."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.marked_processes import children, is_worker
from tests.support.processes import REPO, Processes
from tests.support.servers import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "port": free_port(), "replicas": [{"id": "r0", "url": f"http://127.0.0.1:{free_port()}"}],
        "shutdown": {"grace_s": 0, "timeout_s": 1}}))
    return config


def _shared_memory(pid: int) -> set[str]:
    """The shared memory process ``pid`` maps: /dev/shm files and memfds."""
    found = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[1].endswith("s") and \
                fields[5].startswith(("/dev/shm/", "/memfd:")):
            found.add(fields[5].removesuffix(" (deleted)"))
    return found


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_box_killed_whole_leaves_no_shared_memory_nor_metrics_past_the_next_start(
        spawn: Processes, tmp_path: Path) -> None:
    config = _config(tmp_path)
    box = spawn("serve", "--config", str(config), "--workers", "2")
    shared: set[str] = set()
    metrics = ""
    try:
        def mapped() -> list[int]:
            """The workers, once both map the box's accounting and fleet snapshot."""
            workers = [pid for pid in children(box.pid) if is_worker(pid)]
            if len(workers) == 2 and all(len(_shared_memory(pid)) >= 2 for pid in workers):
                return workers
            return []

        workers = wait_until(mapped, 60, "both workers to map the shared blocks")
        shared = {path for pid in workers for path in _shared_memory(pid)}
        environ = Path(f"/proc/{workers[0]}/environ").read_bytes().split(b"\0")
        metrics = next(v.split(b"=", 1)[1].decode() for v in environ
                       if v.startswith(b"PROMETHEUS_MULTIPROC_DIR="))
        # every process at once, the resource tracker too, as a container's stop or a
        # cgroup's kill: stopped first, so none sees another die
        box_pids = [box.pid, *children(box.pid)]
        for pid in box_pids:
            os.kill(pid, signal.SIGSTOP)
        for pid in box_pids:
            os.kill(pid, signal.SIGKILL)
        box.wait(30)
        wait_until(lambda: all(_gone(pid) for pid in box_pids), 30, "the box's processes to end")
        assert [path for path in shared if os.path.exists(path)] == []
        assert os.path.isdir(metrics)  # the killed supervisor's: still read by no one
        spawn("serve", "--config", str(config), "--workers", "2")
        wait_until(lambda: not os.path.exists(metrics), 20,
                   f"the next start to remove {metrics}")
    finally:  # what a box killed left, when it did
        for path in shared:
            if path.startswith("/dev/shm/") and os.path.exists(path):
                os.unlink(path)
        if metrics:
            shutil.rmtree(metrics, ignore_errors=True)


# In the box's processes (PYTHONPATH): the first worker to start asks its supervisor to
# stop before it reads its start-up data, and the supervisor's sys.path makes that data
# longer than a pipe holds (64 KiB), so the supervisor is still starting that worker
# when the signal comes, whenever it comes.
SITECUSTOMIZE = """
import os, signal, sys
command = open("/proc/self/cmdline", "rb").read().split(b"\\0")
if b"--multiprocessing-fork" in command:
    try:
        os.close(os.open(os.environ["KVGATE_TEST_FIRST"], os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        pass
    else:
        os.kill(os.getppid(), signal.SIGTERM)
elif b"serve" in command:
    sys.path.extend("/nonexistent/" + "/".join([str(i) + "x" * 250] * 16) for i in range(32))
"""


def test_a_stop_asked_for_while_the_workers_start_stops_every_worker(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (
        str(site), os.environ.get("PYTHONPATH")))), KVGATE_TEST_FIRST=str(tmp_path / "first"))
    box = subprocess.Popen([sys.executable, "-m", "kvgate", "serve", "--config",
                            str(_config(tmp_path)), "--workers", "2"], cwd=REPO, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _, err = box.communicate(timeout=60)
    finally:
        if box.poll() is None:
            box.kill()
            box.communicate()
    assert (tmp_path / "first").exists()  # the signal came as worker 0 started
    # workers started after it were never told: they ran until killed, and the exit was 1
    assert b"still running" not in err, err.decode()[-2000:]
    assert b"leaked" not in err, err.decode()[-2000:]  # the resource tracker's warning
    assert box.returncode == 0, err.decode()[-2000:]
