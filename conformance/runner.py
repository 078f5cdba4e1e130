"""Load and replay contract fixtures against live servers.

Fixture file format (YAML)::

    service: agentactivity.maintenance.v1.MaintenanceService   # full proto name
    server: maintenance          # logical server the steps are sent to
    cases:
      - name: retention defaults to 30 days
        spec: [MAINT-PREF-1]
        steps:
          - method: GetRetentionPreference
            principal: admin     # a name from principals.yaml, or "none" for no token
            request: {}          # proto3 JSON of the request
            response: {...}      # expected proto3 JSON of the response (exact match)
            ignore: [preference.updatedAtUnixMs]   # volatile paths left out of the match
          - method: SetRetentionPreference
            principal: admin
            request: {retention: RETENTION_PERIOD_UNSPECIFIED}
            error:               # expected typed failure instead of a response
              code: INVALID_ARGUMENT
              reason: INVALID_ARGUMENT                 # ErrorInfo.reason (optional)
              fieldViolations: [{field: retention}]    # BadRequest fields (optional)

Steps of one file run in order against one fresh server state, so a case may build
on the state an earlier case left. A step may set ``service`` to call another
service of the same server (for example ``grpc.health.v1.Health``).

A server that calls other servers (refresolve calls appcenter and issuemanager) names
them in a top-level ``backends: [appcenter, issuemanager]``. The harness starts those
first, on the same store, and points the server under test at them (its
``<backend>_address`` settings, with the ``service`` principal's token). A step may set
``server: appcenter`` to go to one of those backends instead, for example to load the
data the following steps resolve.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml
from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.message import Message
from google.rpc import error_details_pb2
from grpc_status import rpc_status

_CONTRACT_PACKAGES = ("agentactivity", "grpc_health.v1", "grpc_reflection.v1alpha")


def import_all_contracts() -> None:
    """Import every generated module so the default descriptor pool knows all services."""
    for package_name in _CONTRACT_PACKAGES:
        package = importlib.import_module(package_name)
        for module in pkgutil.walk_packages(package.__path__, prefix=f"{package_name}."):
            if module.name.endswith("_pb2"):
                importlib.import_module(module.name)


class MissingTokenError(LookupError):
    """Fixtures authenticate as principals no token was given for."""

    def __init__(self, principals: Iterable[str]) -> None:
        self.principals = sorted(set(principals))
        super().__init__(f"no token for principal(s) {', '.join(self.principals)}")


@dataclass(frozen=True)
class Step:
    """One RPC of a case."""

    service: str
    method: str
    principal: str
    server: str | None
    request: Mapping[str, Any]
    response: Mapping[str, Any] | None
    error: Mapping[str, Any] | None
    ignore: tuple[str, ...]


@dataclass(frozen=True)
class Case:
    """A named sequence of steps verifying some spec requirements."""

    name: str
    spec: tuple[str, ...]
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class FixtureFile:
    """One fixture file: the cases for one server."""

    path: Path
    server: str
    cases: tuple[Case, ...]
    backends: tuple[str, ...] = ()

    @property
    def spec_ids(self) -> set[str]:
        """Every spec ID the file's cases name."""
        return {spec_id for case in self.cases for spec_id in case.spec}

    @property
    def principals(self) -> set[str]:
        """Every principal the file's steps authenticate as (``none`` is no token)."""
        return {
            step.principal for case in self.cases for step in case.steps if step.principal != "none"
        }


@dataclass
class Failure:
    """A step whose outcome differed from the fixture."""

    case: str
    step: int
    method: str
    detail: str

    def __str__(self) -> str:
        return f"{self.case} / step {self.step} ({self.method}): {self.detail}"


@dataclass
class Report:
    """The result of replaying one fixture file."""

    path: Path
    steps_run: int = 0
    failures: list[Failure] = field(default_factory=list)


def load_fixture(path: Path) -> FixtureFile:
    """Parse and structurally validate one fixture file."""
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(document, dict):
        raise ValueError(f"{path}: expected a mapping")
    service = document.get("service")
    server = document.get("server")
    if not isinstance(service, str) or not isinstance(server, str):
        raise ValueError(f"{path}: 'service' and 'server' are required strings")
    backends = tuple(str(name) for name in document.get("backends") or ())
    cases = []
    for index, raw_case in enumerate(document.get("cases") or []):
        where = f"{path}: cases[{index}]"
        steps = []
        for step_index, raw in enumerate(raw_case.get("steps") or []):
            if ("response" in raw) == ("error" in raw):
                raise ValueError(f"{where}.steps[{step_index}]: give exactly one of response/error")
            steps.append(
                Step(
                    service=str(raw.get("service", service)),
                    method=str(raw["method"]),
                    principal=str(raw.get("principal", "none")),
                    server=_step_server(raw, server, backends, f"{where}.steps[{step_index}]"),
                    request=raw.get("request") or {},
                    response=raw.get("response"),
                    error=raw.get("error"),
                    ignore=tuple(raw.get("ignore") or ()),
                )
            )
        if not steps:
            raise ValueError(f"{where}: a case needs at least one step")
        cases.append(
            Case(
                name=str(raw_case["name"]),
                spec=tuple(raw_case.get("spec") or ()),
                steps=tuple(steps),
            )
        )
    return FixtureFile(path=path, server=server, cases=tuple(cases), backends=backends)


def _step_server(
    raw: Mapping[str, Any], server: str, backends: tuple[str, ...], where: str
) -> str | None:
    name = raw.get("server")
    if name is None or name == server:
        return None
    if name not in backends:
        raise ValueError(f"{where}: server {name!r} is not listed in 'backends'")
    return str(name)


def load_fixtures(paths: Iterable[Path]) -> list[FixtureFile]:
    """Load every ``*.yaml`` fixture under the given files or directories, sorted."""
    files: list[Path] = []
    for path in paths:
        files.extend(sorted(path.rglob("*.yaml")) if path.is_dir() else [path])
    return [load_fixture(f) for f in files if f.name != "principals.yaml"]


def _drop(document: dict[str, Any], dotted: str) -> None:
    head, _, rest = dotted.partition(".")
    if head not in document:
        return
    if rest:
        child = document[head]
        if isinstance(child, dict):
            _drop(child, rest)
        elif isinstance(child, list):
            for item in child:
                if isinstance(item, dict):
                    _drop(item, rest)
    else:
        del document[head]


def _invoke(
    channel: grpc.Channel, step: Step, tokens: Mapping[str, str], timeout: float
) -> tuple[Message | None, grpc.RpcError | None]:
    pool = descriptor_pool.Default()
    method = pool.FindServiceByName(step.service).FindMethodByName(step.method)
    if method.client_streaming or method.server_streaming:
        raise ValueError(f"{step.service}/{step.method}: streaming steps are not supported yet")
    request_class = message_factory.GetMessageClass(method.input_type)
    response_class = message_factory.GetMessageClass(method.output_type)
    request = json_format.ParseDict(dict(step.request), request_class())
    call: grpc.UnaryUnaryMultiCallable[Message, Message] = channel.unary_unary(
        f"/{step.service}/{step.method}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=response_class.FromString,
    )
    metadata = None
    if step.principal != "none":
        if step.principal not in tokens:
            raise MissingTokenError([step.principal])
        metadata = (("authorization", f"Bearer {tokens[step.principal]}"),)
    try:
        return call(request, metadata=metadata, timeout=timeout), None
    except grpc.RpcError as error:
        return None, error


def _check_error(expected: Mapping[str, Any], error: grpc.RpcError) -> str | None:
    code = error.code().name
    if code != expected["code"]:
        return f"expected {expected['code']}, got {code}: {error.details()}"
    status = rpc_status.from_call(error)  # type: ignore[arg-type]  # a sync RpcError is a Call
    reasons: set[str] = set()
    fields: set[str] = set()
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reasons.add(info.reason)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            fields.update(v.field for v in bad.field_violations)
    if "reason" in expected and expected["reason"] not in reasons:
        return f"expected ErrorInfo reason {expected['reason']}, got {sorted(reasons)}"
    missing = {v["field"] for v in expected.get("fieldViolations", [])} - fields
    if missing:
        return f"missing field violations {sorted(missing)}; got {sorted(fields)}"
    return None


def replay(
    fixture: FixtureFile,
    channel: grpc.Channel,
    tokens: Mapping[str, str],
    *,
    timeout: float = 10.0,
    backends: Mapping[str, grpc.Channel] | None = None,
) -> Report:
    """Run every step of ``fixture`` over ``channel`` and collect mismatches.

    ``tokens`` maps principal names to bearer tokens; ``backends`` maps the names in the
    fixture's ``backends`` to channels for the steps that set ``server``.

    Raises:
        MissingTokenError: ``tokens`` lacks a principal the fixture uses (checked before
            any step runs).
    """
    missing = fixture.principals - set(tokens)
    if missing:
        raise MissingTokenError(missing)
    import_all_contracts()
    report = Report(path=fixture.path)
    for case in fixture.cases:
        for number, step in enumerate(case.steps, start=1):
            report.steps_run += 1
            target = channel if step.server is None else (backends or {})[step.server]
            response, error = _invoke(target, step, tokens, timeout)
            detail: str | None
            if step.error is not None:
                detail = (
                    "expected an error, got a response"
                    if error is None
                    else _check_error(step.error, error)
                )
            elif error is not None:
                detail = f"unexpected {error.code().name}: {error.details()}"
            else:
                assert response is not None
                actual = json_format.MessageToDict(response)
                expected = dict(step.response or {})
                for path in step.ignore:
                    _drop(actual, path)
                    _drop(expected, path)
                detail = None if actual == expected else f"expected {expected}, got {actual}"
            if detail is not None:
                report.failures.append(Failure(case.name, number, step.method, detail))
    return report
