"""docs/openapi.yaml against the live daemon's listener: schemathesis
generates requests from the document (valid and not) and every answer must
be below 500 and match the document. The daemon is the production one over
a simulated node, its StatusServer on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import schemathesis
from api_support import Api, api_on, serve
from daemon_support import simulated_daemon
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gpuwatchd.canary.config import CanaryConfig
from gpuwatchd.config import Config

DOCUMENT = Path(__file__).parent.parent / "docs" / "openapi.yaml"
schema = schemathesis.openapi.from_path(DOCUMENT)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    with api_on(tmp_path_factory.mktemp("schema")) as api:
        yield api


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_answer_is_below_500_and_as_documented(case: schemathesis.Case, live: Api) -> None:
    case.call_and_validate(
        base_url=live.url,
        headers={"Authorization": "Bearer alice-secret"},
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
        ],
    )


@pytest.mark.parametrize("gpus", [3, 1], ids=["suspect_then_confirmed", "watched"])
def test_the_status_of_gpus_under_doubt_is_as_documented(gpus: int, tmp_path: Path) -> None:
    # The live fixture's node runs no canaries: these documents have a GPU
    # whose canaries mismatched, poll by poll through its suspect and watch.
    node = f"node: {{gpus: {gpus}, nvlinks: 2, hcas: 1}}\n"
    scenario = node + "faults: [{at: 0s, kind: sdc, gpu: 0}]\n"
    config = Config(canary=CanaryConfig(interval=60.0))
    operation = schema["/api/v1/status"]["GET"]
    token_file = tmp_path / "api-token"
    token_file.write_text("secret\n")
    token_file.chmod(0o600)
    seen: set[str] = set()
    with simulated_daemon(scenario, tmp_path, config, canary=True) as sim:
        server = serve(sim, token_file)
        try:
            for _ in range(8):
                sim.daemon.step()
                sim.clock.advance(10)
                response = requests.get(f"{server.url}/api/v1/status", timeout=5)
                operation.validate_response(response)
                for canary in response.json()["canaries"]:
                    seen |= {key for key in ("suspect", "watch") if canary[key] is not None}
        finally:
            server.stop()
    assert seen == ({"suspect"} if gpus > 1 else {"suspect", "watch"})
