"""``kvgate top`` pointed at the gateway's client port (which has no admin API) says so,
naming the URL that answered 404 and the admin listener it needs."""

from __future__ import annotations

import pytest

from kvgate.cli import main
from tests.support.gateway_harness import ADMIN_TOKEN, Serve, start_gateway


def test_the_client_port_is_told_apart_from_the_admin_listener(
        serve: Serve, capsys: pytest.CaptureFixture[str]) -> None:
    gw = start_gateway(serve, [("a", "http://127.0.0.1:9")])
    code = main(["top", "--once", "--interval", "0.05", "--admin", gw.url,
                 "--token", ADMIN_TOKEN])
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"{gw.url}/admin/top answered 404" in err, err
    assert "admin listener" in err and "admin.listen" in err and "--admin" in err, err
    assert ADMIN_TOKEN not in err
    # the admin listener itself is read
    assert main(["top", "--once", "--interval", "0.05", "--admin", gw.admin,
                 "--token", ADMIN_TOKEN]) == 0
