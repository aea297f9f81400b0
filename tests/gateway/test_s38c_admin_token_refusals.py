"""The admin API's 401 says whether no token came or a token that is not the admin token,
and tells nothing of the token itself."""

from __future__ import annotations

import httpx

from tests.support.gateway_harness import ADMIN_TOKEN, Serve, start_gateway


def test_a_refusal_tells_a_missing_token_from_a_wrong_one(serve: Serve) -> None:
    gw = start_gateway(serve, [("a", "http://127.0.0.1:9")])
    messages: dict[str | None, str] = {}
    for given in [None, "Bearer", f"Basic {ADMIN_TOKEN}", f"Bearer {ADMIN_TOKEN}x",
                  f"Bearer {ADMIN_TOKEN[:-1]}", "Bearer wrong"]:
        headers = {} if given is None else {"authorization": given}
        r = httpx.get(f"{gw.admin}/admin/replicas", headers=headers)
        assert r.status_code == 401, (given, r.text)
        error = r.json()["error"]
        assert error["code"] == "invalid_admin_token" and ADMIN_TOKEN[:8] not in r.text
        assert "Authorization: Bearer <admin token>" in error["message"]
        messages[given] = error["message"]
    for given in [None, "Bearer", f"Basic {ADMIN_TOKEN}"]:  # no bearer token at all
        assert messages[given].startswith("no bearer token was sent"), messages[given]
    wrong = {messages[g] for g in [f"Bearer {ADMIN_TOKEN}x", f"Bearer {ADMIN_TOKEN[:-1]}",
                                   "Bearer wrong"]}
    # one text for every wrong token: nothing of how it differs
    assert len(wrong) == 1 and wrong.pop().startswith("the bearer token sent is not the admin")
