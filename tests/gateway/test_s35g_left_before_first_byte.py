"""A client that leaves after its request was sent, before the replica's first byte, ends
at that replica (its 499 and its access-log line name it and the model), as one that
leaves mid-answer does; one that leaves before any replica has it stays replica none."""

from __future__ import annotations

import json
import socket
import threading

from tests.support.access_lines import access_lines
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, metric, start_gateway, wait_for_metric
from tests.support.waiting import wait_until


def test_a_client_that_leaves_before_the_first_byte_ends_at_the_replica_it_waited_on(
        serve: Serve) -> None:
    held = Behaviour("held", hold=threading.Event())  # sends no byte until told
    try:
        with access_lines() as lines:
            gw = start_gateway(serve, [("held", serve(fake_replica(held)).url)],
                               access_log=True)
            body = json.dumps({"model": "sim-model", "prompt": "p", "stream": True}).encode()
            with socket.create_connection(("127.0.0.1", gw.port)) as sock:
                sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                             b"Content-Type: application/json\r\n"
                             + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
                wait_until(lambda: held.received, 5, "the replica to have the request")
            wait_for_metric(gw, 'kvgate_requests_total{replica="held",route="round_robin",'
                                'status="499"}', 1.0)
            wait_until(lambda: lines, 5, "the access line")
    finally:
        assert held.hold is not None
        held.hold.set()
    assert not metric(gw, 'kvgate_requests_total{replica="none",route="round_robin",'
                          'status="499"}')
    (line,) = lines
    assert (line["replica"], line["model"], line["status"]) == ("held", "sim-model", "499")
