"""A worker of ``serve --workers N`` is told to stop once when its supervisor dies: the
kernel's parent-death signal comes each time a thread of the supervisor holding the worker
ends, and a worker took the second SIGTERM for an operator's "stop at once" (its answers
in flight cut, not drained)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from multiprocessing.connection import Connection


def _worker(supervisor: int, link: Connection, report: Connection) -> None:
    """Counts the SIGTERMs it gets until the supervisor is gone, and reports them; answers
    each message on ``link`` once the signals that came before it were handled."""
    from gateway.workers import die_with_parent

    stops: list[int] = []
    signal.signal(signal.SIGTERM, lambda sig, frame: stops.append(sig))
    die_with_parent(supervisor)
    link.send("ready")
    deadline = time.monotonic() + 30
    while (os.getppid() == supervisor or not stops) and time.monotonic() < deadline:
        if link.closed:
            time.sleep(0.01)
        elif link.poll(0.01):
            try:
                link.send(link.recv())
            except (EOFError, BrokenPipeError):  # the supervisor is gone
                link.close()
    report.send((os.getppid() != supervisor, len(stops)))


def _supervisor(report: Connection) -> None:
    """Starts the worker from a thread that then ends (the worker passes to the main
    thread, as when a dying supervisor's threads end one by one), then dies."""
    ctx = multiprocessing.get_context("spawn")
    link, theirs = ctx.Pipe()

    def start() -> None:
        ctx.Process(target=_worker, args=(os.getpid(), theirs, report)).start()
        assert link.poll(60)
        link.recv()

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    deadline = time.monotonic() + 10  # the thread gone from the kernel too
    while len(os.listdir("/proc/self/task")) > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    # the worker has handled what its thread's end sent it: two signals never merge
    link.send("handled?")
    assert link.poll(60)
    link.recv()
    os._exit(0)


def test_a_worker_is_told_to_stop_once_when_its_supervisor_dies() -> None:
    ctx = multiprocessing.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    supervisor = ctx.Process(target=_supervisor, args=(writer,))
    supervisor.start()
    writer.close()
    try:
        assert reader.poll(60), "the worker reported nothing"
        orphaned, stops = reader.recv()
    finally:
        supervisor.join(10)
        if supervisor.exitcode is None:
            supervisor.kill()
            supervisor.join()
        reader.close()
    # it went through to its end: the worker answered after handling the first signal, so
    # its death's signal could not merge with that one
    assert supervisor.exitcode == 0, supervisor.exitcode
    assert orphaned
    assert stops == 1  # a thread of the supervisor ending is no stop; its death is one
