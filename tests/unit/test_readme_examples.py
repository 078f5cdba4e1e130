"""The README's grpcurl examples are checked against the contracts, so they cannot drift
(OPS-2, CON-1): every method exists, every ``-d`` field is a real field under its JSON
name, every enum value is a real value name, and each example dials its service's port.
"""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import Descriptor

from conformance.runner import import_all_contracts
from grpcserver.settings import DEFAULT_PORTS
from services.demoruntime.settings import Settings as DemoSettings
from tests.support.readme import GrpcurlExample, grpcurl_examples

EXAMPLES = grpcurl_examples()
CALLS = [example for example in EXAMPLES if example.service is not None]


def _walk(descriptor: Descriptor, value: Any, where: str) -> list[str]:
    if descriptor.full_name.startswith("google.protobuf."):
        return []  # well-known types have JSON forms of their own
    if not isinstance(value, dict):
        return [f"{where}: expected an object for {descriptor.full_name}"]
    problems = []
    by_json = {field.json_name: field for field in descriptor.fields}
    for key, item in value.items():
        field = by_json.get(key)
        if field is None:
            known = ", ".join(sorted(by_json))
            hint = " (use the JSON name)" if key in descriptor.fields_by_name else ""
            problems.append(f"{where}.{key}: no such field of {descriptor.name}{hint}; {known}")
            continue
        if field.is_repeated and not isinstance(item, list):
            problems.append(f"{where}.{key}: expected a list")
            continue
        items = item if field.is_repeated else [item]
        for element in items:
            if field.message_type is not None:
                problems.extend(_walk(field.message_type, element, f"{where}.{key}"))
            elif field.enum_type is not None:
                names = field.enum_type.values_by_name
                if element not in names:
                    problems.append(
                        f"{where}.{key}: {element!r} is not a value of {field.enum_type.name}; "
                        f"{', '.join(names)}"
                    )
    return problems


def _problems(example: GrpcurlExample) -> list[str]:
    """What is wrong with one example (empty when it matches the contracts)."""
    import_all_contracts()
    assert example.service is not None
    assert example.method is not None
    pool = descriptor_pool.Default()
    try:
        service = pool.FindServiceByName(example.service)
    except KeyError:
        return [f"no service {example.service}"]
    method = service.methods_by_name.get(example.method)
    if method is None:
        return [f"{example.service} has no method {example.method}"]
    body = example.body if example.body is not None else {}
    problems = _walk(method.input_type, body, method.input_type.name)
    if not problems:
        try:
            json_format.ParseDict(body, message_factory.GetMessageClass(method.input_type)())
        except json_format.ParseError as error:
            problems.append(str(error))
    server = example.service.split(".")[1]
    port = example.address.rpartition(":")[2]
    if server in DEFAULT_PORTS and port != str(DEFAULT_PORTS[server]):
        problems.append(f"{example.service} listens on {DEFAULT_PORTS[server]}, not {port}")
    if not example.authorized:
        problems.append("no bearer token (every RPC but health and reflection needs one)")
    return problems


def _id(example: GrpcurlExample) -> str:
    return f"{example.method}-{EXAMPLES.index(example)}"


@pytest.mark.spec("OPS-2", "CON-1")
def test_the_readme_has_grpcurl_examples_with_bodies() -> None:
    assert len(CALLS) >= 10
    assert all(example.body is not None for example in CALLS)
    methods = {example.method for example in CALLS}
    assert {"RegisterAgentTarget", "CreateSession", "SendInput", "ResolveMention"} <= methods


@pytest.mark.spec("OPS-2", "CON-1")
@pytest.mark.parametrize("example", CALLS, ids=_id)
def test_a_readme_grpcurl_example_matches_the_contracts(example: GrpcurlExample) -> None:
    assert _problems(example) == [], example.command


@pytest.mark.spec("OPS-2")
def test_the_readme_names_what_a_newcomer_must_otherwise_discover() -> None:
    bodies = {example.method: example.body for example in CALLS}
    assert bodies["SendInput"] is not None
    assert bodies["SendInput"]["delivery"] == "DELIVERY_MODE_NEW_TURN"
    assert bodies["ResolveMention"] is not None
    assert bodies["ResolveMention"]["uri"].startswith("mention://workspace-reference/")


@pytest.mark.spec("OPS-2", "ARCH-3")
def test_the_readme_registers_no_target_over_the_demo_agents() -> None:
    demo = DemoSettings().demo_target_id
    registered = [
        example.body["target"]["agentTargetId"]
        for example in CALLS
        if example.method == "RegisterAgentTarget" and example.body is not None
    ]
    assert registered
    assert demo not in registered, "RegisterAgentTarget replaces the record: it breaks @explorer"


@pytest.mark.spec("OPS-2")
def test_the_check_catches_drift() -> None:
    (wrong,) = grpcurl_examples(
        "```sh\n"
        'grpcurl -plaintext -d \'{"workspace_id": "ws-1", "session": "s",\n'
        '    "delivery": "NEW_TURN", "references": [{"kind": "file", "colour": "red"}]}\' \\\n'
        "  127.0.0.1:50052 agentactivity.host.v1.HostService/SendInput\n"
        "```\n"
    )
    problems = "\n".join(_problems(wrong))
    assert "workspace_id: no such field of SendInputRequest (use the JSON name)" in problems
    assert ".session: no such field" in problems
    assert "'NEW_TURN' is not a value of DeliveryMode" in problems
    assert "references.colour: no such field of ReferenceMeta" in problems
    assert "listens on 50051, not 50052" in problems
    assert "no bearer token" in problems
