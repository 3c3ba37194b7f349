"""Who may call the HTTP APIs (web/apis/auth.py): A1111's HTTP Basic with the page's logins, bearer keys for
OpenAI and MCP, off on a reachable host unless asked for, and each caller told apart (for /interrupt)."""

import base64

import pytest

from web.apis.auth import ApiAccess
from web.apis.queue_call import Refused


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_logins_ask_a1111_callers_for_http_basic_and_tell_users_apart():
    access = ApiAccess(logins=(("ada", "pw"), ("bob", "pw2")), keys=("k1",))
    assert access.a1111_caller(basic("ada", "pw"), "10.0.0.1") == "user:ada"
    assert access.a1111_caller(basic("bob", "pw2"), "10.0.0.1") == "user:bob"
    assert access.a1111_caller("Bearer k1", "10.0.0.1").startswith("key:")
    for wrong in (None, basic("ada", "pw2"), "Basic %%%", "Bearer nope"):
        with pytest.raises(Refused) as refused:
            access.a1111_caller(wrong, "10.0.0.1")
        assert refused.value.status == 401


def test_keys_guard_openai_and_mcp_and_never_appear_in_the_identity():
    access = ApiAccess(keys=("secret-one",))
    caller = access.bearer_caller("Bearer secret-one", "h")
    assert caller.startswith("key:") and "secret" not in caller
    with pytest.raises(Refused):
        access.bearer_caller("Bearer other", "h")
    assert ApiAccess().bearer_caller(None, "1.2.3.4") == "host:1.2.3.4"  # open without keys and logins
    with pytest.raises(Refused):  # keys on a reachable host: A1111's API is not left open either
        ApiAccess(keys=("secret-one",), host="0.0.0.0").a1111_caller(None, "1.2.3.4")


@pytest.mark.parametrize(
    ("access", "enabled"),
    [
        (ApiAccess(host="127.0.0.1"), True),
        (ApiAccess(host="0.0.0.0"), False),
        (ApiAccess(host="0.0.0.0", api=True), True),
        (ApiAccess(host="0.0.0.0", logins=(("a", "b"),)), True),
        (ApiAccess(host="::1"), True),
    ],
)
def test_apis_are_off_on_a_reachable_host_without_logins_unless_asked(access, enabled):
    assert access.enabled is enabled
