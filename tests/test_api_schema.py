"""docs/openapi.yaml against the live daemon's listener: schemathesis
generates requests from the document (valid and not) and every answer must
be below 500 and match the document. The daemon is the production one over
a simulated node, its StatusServer on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from api_support import Api, api_on
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

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
