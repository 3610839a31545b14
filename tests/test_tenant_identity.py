"""Who is asking and in which band: the tenant and priority a request reaches the
controller with, from its body and headers (daemon/tenant_headers.py).

Covers: daemon/tenant_headers.py.
"""
from __future__ import annotations

import pytest

from daemon.core.controller_config import TenantsConfig
from ipc.tenancy import OBJECTIVE_HEADER, PRIORITY_HEADER, TENANT_HEADER
from tests.api_fakes import FakeController, api_client, call, expect_error

LIMITS = {"max_tokens_limit": 64}
OBJECTIVES = TenantsConfig(objective_priorities={"batch": -1, "critical": 10})


@pytest.mark.parametrize("body, headers, expected", [
    ({}, {}, ("default", 0)),
    ({"user": "alice"}, {}, ("alice", 0)),
    ({"user": "alice"}, {TENANT_HEADER: "team-a"}, ("team-a", 0)),   # the gateway's id wins
    ({"priority": -1}, {}, ("default", -1)),                            # sheddable
    ({}, {PRIORITY_HEADER: "5"}, ("default", 5)),
    ({"priority": 2}, {PRIORITY_HEADER: "5"}, ("default", 2)),         # the body wins
    ({}, {OBJECTIVE_HEADER: "batch"}, ("default", -1)),                # the objective's
    ({}, {OBJECTIVE_HEADER: "critical", PRIORITY_HEADER: "-3"}, ("default", -3)),
    ({}, {OBJECTIVE_HEADER: "unknown"}, ("default", 0)),
    ({"user": "u" * 1000}, {}, ("u" * 1000, 0)),    # OpenAI's user has no length limit
])
async def test_tenant_and_priority_reach_the_controller(tokenizer, body, headers, expected):
    controller = FakeController(tokenizer)
    controller.tenants = OBJECTIVES
    async with api_client(controller, **LIMITS) as client:
        resp, raw = await call(client, "POST", "/v1/completions",
                               {"prompt": "Hi", "max_tokens": 2, **body}, headers)
        assert resp.status == 200, raw
    assert controller.identities == [expected]


@pytest.mark.parametrize("body, headers, param, words", [
    ({"priority": -101}, {}, "priority", ()),
    ({"priority": 101}, {}, "priority", ()),
    ({}, {PRIORITY_HEADER: "high"}, PRIORITY_HEADER, ("not an integer",)),
    ({}, {PRIORITY_HEADER: "1000"}, PRIORITY_HEADER, ("[-100, 100]",)),
    ({}, {TENANT_HEADER: "x" * 300}, TENANT_HEADER, ("at most 256",)),
])
async def test_a_bad_priority_or_tenant_is_a_400_naming_the_field(tokenizer, body, headers,
                                                                  param, words):
    controller = FakeController(tokenizer)
    async with api_client(controller, **LIMITS) as client:
        await expect_error(client, "POST", "/v1/completions",
                           {"prompt": "Hi", "max_tokens": 2, **body}, 400, *words,
                           param=param, headers=headers)
    assert controller.identities == []


def test_tenant_weights_and_objectives_come_from_toml_and_flags(tmp_path):
    from daemon.config import load_config
    path = tmp_path / "a.toml"
    path.write_text('[tenants]\ntenant_weights = {"team-a" = 2, "team-b" = 1}\n'
                    'objective_priorities = {batch = -1}\n')
    config = load_config(str(path), {"fair_share": False})
    assert config.tenants.tenant_weights == {"team-a": 2.0, "team-b": 1.0}
    assert config.tenants.objective_priorities == {"batch": -1}
    assert config.tenants.fair_share is False
    with pytest.raises(ValueError, match="tenant_weights"):
        load_config(None, {"tenant_weights": {"a": "0"}})   # a weight is > 0


def test_the_tenant_weights_flag_parses_name_value_pairs():
    import argparse

    from daemon.config import add_config_flags, config_from_args
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    config = config_from_args(parser.parse_args(["--tenant-weights", "a=2,b=0.5"]))
    assert config.tenants.tenant_weights == {"a": 2.0, "b": 0.5}
    with pytest.raises(SystemExit):
        parser.parse_args(["--tenant-weights", "a"])
    assert TenantsConfig().fair_share is True   # the default shares by weight
