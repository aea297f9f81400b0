"""A kubeconfig ``exec`` credential plugin, run bounded.

kubernetes_asyncio runs the plugin (on the event loop's subprocess support, so the loop
itself is never blocked) with no time limit, as kubectl does: client-go's ``cmd.Run()`` has
no deadline. A plugin that never exits (a cloud CLI waiting on an unreachable metadata
server, one prompting for a login) stalled discovery for good, with no failure counted.
Here the plugin:

- gets its stdin from /dev/null and ``spec.interactive: false``: client-go's rule is that
  only an interactive plugin gets stdin, and a gateway has nobody at a terminal to answer;
- runs in a session of its own, and when it has not answered within ``EXEC_TIMEOUT_S``
  (or discovery stops while it runs) the whole group is killed (a shell plugin's children
  too, which would hold its stdout open) and the plugin reaped;
- fails with ``ExecPluginError`` naming the command, which the Kubernetes source counts,
  logs and retries after its back-off, as any other credential failure.

EXEC_TIMEOUT_S is 30 s, the bound discovery already puts on one list request
(``kube_source.LIST_TIMEOUT_S``): the common plugins (``aws eks get-token``,
``gke-gcloud-auth-plugin``, ``kubelogin`` non-interactive) answer in well under 5 s, a
token exchange over a slow network in a few more; one still running after 30 s is stuck,
and discovery is better off retrying it.

Only the standard library here (the base install imports every module); kube_source hands
it kubernetes_asyncio's provider's command, environment and apiVersion.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Mapping, Sequence
from typing import Any

EXEC_TIMEOUT_S = 30.0


class ExecPluginError(Exception):
    """An exec credential plugin gave no credential: it hung (and was killed), exited
    with an error, or wrote no ExecCredential."""


async def run_exec_plugin(args: Sequence[str], env: Mapping[str, str], api_version: str,
                          previous_response: str | None = None) -> Any:
    """Run the plugin ``args`` (the command, then its arguments) with ``env``, and return
    the ``status`` of the ExecCredential it writes (token, or client certificate and key),
    as kubernetes_asyncio's ExecProvider.run does; ExecPluginError naming the command when
    it gives none, after at most EXEC_TIMEOUT_S."""
    command, timeout_s = args[0], EXEC_TIMEOUT_S
    spec: dict[str, Any] = {"interactive": False}
    if previous_response:
        spec["response"] = previous_response
    info = {"apiVersion": api_version, "kind": "ExecCredential", "spec": spec}
    proc = await asyncio.create_subprocess_exec(
        *args, env={**env, "KUBERNETES_EXEC_INFO": json.dumps(info)},
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, start_new_session=True)
    answered = False
    try:
        async with asyncio.timeout(timeout_s):
            stdout, stderr = await proc.communicate()
        answered = True
    except TimeoutError:
        raise ExecPluginError(f"exec plugin {command!r} gave no credential within "
                              f"{timeout_s:g} s; killed") from None
    finally:
        if not answered:  # timed out, or discovery stopped: end it, and reap it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its session's group: its children too
            await proc.wait()
    if proc.returncode != 0:
        detail = stderr.decode(errors="replace").strip()[:1024]
        raise ExecPluginError(f"exec plugin {command!r} exited with {proc.returncode}"
                              + (f": {detail}" if detail else ""))
    try:
        data = json.loads(stdout)
    except ValueError as exc:
        raise ExecPluginError(f"exec plugin {command!r} wrote no JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ExecPluginError(f"exec plugin {command!r} wrote a {type(data).__name__}, "
                              "not an ExecCredential")
    for key in ("apiVersion", "kind", "status"):
        if key not in data:
            raise ExecPluginError(f"exec plugin {command!r}: its ExecCredential has no "
                                  f"{key!r}")
    if data["apiVersion"] != api_version:
        raise ExecPluginError(f"exec plugin {command!r} answered apiVersion "
                              f"{data['apiVersion']!r}, not {api_version!r}")
    return data["status"]
