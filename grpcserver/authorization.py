"""The declared authorization of every RPC and its generic enforcement (SEC-1, SEC-3).

Every service declares, in one table per service (``services/<name>/authorization.py``),
a :class:`MethodPolicy` for each RPC it serves: the roles that may call it and where the
call's workspace comes from (:class:`WorkspaceSource`). The server interceptor enforces
the declaration before the handler runs:

1. the principal's role must be one of the declared roles (``PERMISSION_DENIED``
   ``ROLE_NOT_ALLOWED``);
2. the workspace named by the declared request field (or by the first stream message)
   must be one of the principal's workspaces (``PERMISSION_DENIED``
   ``WORKSPACE_SCOPE_MISMATCH``; ``INVALID_ARGUMENT`` when a required one is empty);
3. an *unset* optional workspace means the principal's own workspaces, and every
   workspace only for a deployment-wide principal (``workspaces: ["*"]`` in the token
   registry): the interceptor binds that set as the call's :class:`CallScope`, which the
   handler reads with :func:`current_scope` to restrict cross-workspace queries and
   purges, so no handler decides "all" on its own;
4. writes to deployment-wide records need a deployment-wide principal
   (``PERMISSION_DENIED`` ``DEPLOYMENT_SCOPE_REQUIRED``).

A method without a declaration fails closed with ``PERMISSION_DENIED``
``METHOD_NOT_DECLARED``. This module imports neither grpc nor any service: it is plain
data and checks over protobuf descriptors, so tables and rules are testable alone.
"""

from __future__ import annotations

import contextvars
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.descriptor import FieldDescriptor, ServiceDescriptor
from google.protobuf.message import Message

from domainerrors import FieldViolation, InvalidArgument, PermissionDenied
from grpcserver.auth import Principal, Role, bind_principal, unbind_principal

ANY_ROLE: tuple[Role, ...] = (Role.DEVICE, Role.SERVICE, Role.ADMIN)
"""Every role: the RPC is open to any authenticated principal (within its workspaces)."""

OPERATORS: tuple[Role, ...] = (Role.SERVICE, Role.ADMIN)
"""The roles of deployment operators and internal services (purge, cleanup, targets)."""


class WorkspaceSource(enum.StrEnum):
    """Where the workspace of a call comes from."""

    FIELD = "field"
    """A request field that must name one of the principal's workspaces."""
    OPTIONAL_FIELD = "optional_field"
    """An ``optional`` request field: when set as :attr:`FIELD`; unset means the
    principal's own workspaces (every workspace only for a deployment-wide principal)."""
    FIRST_MESSAGE = "first_message"
    """A field of the first message of a client stream (a hello), checked as
    :attr:`FIELD` before the handler sees the stream."""
    EACH_FRAME = "each_frame"
    """Every frame of a client stream names its own workspace; the stream handler
    confines each frame to :attr:`CallScope.workspaces` (the principal's workspaces)."""
    DEPLOYMENT = "deployment"
    """No workspace: the RPC acts on deployment-wide records."""


@dataclass(frozen=True)
class CallScope:
    """What the interceptor admitted a call for.

    Attributes:
        principal: The authenticated caller.
        workspaces: The workspaces the call may act on; ``None`` means every workspace
            (only ever for a deployment-wide principal).
    """

    principal: Principal
    workspaces: frozenset[str] | None


def _role_not_allowed(principal: Principal, roles: frozenset[Role]) -> PermissionDenied:
    allowed = ", ".join(sorted(role.value for role in roles))
    return PermissionDenied(
        f"role {principal.role.value!r} may not call this method (allowed: {allowed})",
        reason="ROLE_NOT_ALLOWED",
    )


def _scope_mismatch(principal: Principal, workspace_id: str) -> PermissionDenied:
    return PermissionDenied(
        f"{principal.subject} may not act in workspace {workspace_id!r}",
        reason="WORKSPACE_SCOPE_MISMATCH",
        metadata={"workspace_id": workspace_id},
    )


def method_not_declared(method: str) -> PermissionDenied:
    """PERMISSION_DENIED ``METHOD_NOT_DECLARED``: the fail-closed answer for ``method``."""
    return PermissionDenied(
        f"{method} has no authorization declaration", reason="METHOD_NOT_DECLARED"
    )


def _read_path(message: Message, path: str) -> tuple[str, ...] | None:
    """The string value(s) at dotted ``path``; ``None`` when a field with presence is unset."""
    current: Any = message
    *parents, last = path.split(".")
    for name in parents:
        descriptor = current.DESCRIPTOR.fields_by_name[name]
        if descriptor.has_presence and not current.HasField(name):
            return None
        current = getattr(current, name)
    descriptor = current.DESCRIPTOR.fields_by_name[last]
    if _is_repeated(descriptor):
        return tuple(getattr(current, last))
    if descriptor.has_presence and not current.HasField(last):
        return None
    return (getattr(current, last),)


def _is_repeated(descriptor: FieldDescriptor) -> bool:
    return bool(descriptor.is_repeated)


@dataclass(frozen=True)
class MethodPolicy:
    """The declared authorization of one RPC.

    Attributes:
        roles: Roles that may call the RPC.
        workspace: Where the call's workspace comes from.
        field: Dotted path of the workspace field in the request (or the first stream
            message) for :attr:`WorkspaceSource.FIELD`, ``OPTIONAL_FIELD`` and
            ``FIRST_MESSAGE``; a string or repeated string field.
        deployment_wide: The principal must be deployment-wide (``workspaces: ["*"]``):
            set for writes to deployment-wide records, which affect every workspace.
        missing_reason: ``ErrorInfo.reason`` of the ``INVALID_ARGUMENT`` when the workspace
            field is empty (a protocol may name its own, e.g. ``PROTOCOL_VIOLATION``).
    """

    roles: frozenset[Role]
    workspace: WorkspaceSource
    field: str | None = None
    deployment_wide: bool = False
    missing_reason: str | None = None

    def admit(self, principal: Principal, request: object) -> CallScope:
        """Check the role and, for a request field, the workspace; return the call's scope.

        ``request`` is the request message of a unary-request RPC; for a client stream it
        is the request iterator (the first message is checked by
        :meth:`admit_first_message` once it arrives).

        Raises:
            PermissionDenied: ``ROLE_NOT_ALLOWED``, ``WORKSPACE_SCOPE_MISMATCH``,
                ``DEPLOYMENT_SCOPE_REQUIRED``, or ``METHOD_NOT_DECLARED`` when the
                declaration does not fit the request (fail closed).
            InvalidArgument: a required workspace field is empty.
        """
        self.admit_caller(principal)
        if self.workspace in (WorkspaceSource.FIELD, WorkspaceSource.OPTIONAL_FIELD):
            if not isinstance(request, Message):
                raise method_not_declared("this streaming method (declared with a field)")
            return CallScope(principal, self._workspaces_of(principal, request))
        return CallScope(principal, principal.scope)

    def admit_caller(self, principal: Principal) -> None:
        """Check what needs no request: the role and the deployment-wide requirement.

        What :meth:`admit` checks first; also used for a request that cannot be decoded, so
        a caller of the wrong role hears ``PERMISSION_DENIED`` whatever its bytes.

        Raises:
            PermissionDenied: ``ROLE_NOT_ALLOWED`` or ``DEPLOYMENT_SCOPE_REQUIRED``.
        """
        if principal.role not in self.roles:
            raise _role_not_allowed(principal, self.roles)
        if self.deployment_wide and not principal.deployment_wide:
            raise PermissionDenied(
                f"{principal.subject} is not a deployment-wide principal; this method "
                "changes records of every workspace",
                reason="DEPLOYMENT_SCOPE_REQUIRED",
            )

    def admit_first_message(self, principal: Principal, message: object) -> CallScope:
        """Check the first message of a ``FIRST_MESSAGE`` stream; return the narrowed scope.

        Raises:
            PermissionDenied: ``WORKSPACE_SCOPE_MISMATCH``.
            InvalidArgument: the first message does not name a workspace.
        """
        if not isinstance(message, Message):
            raise method_not_declared("this stream (its first message is not a message)")
        return CallScope(principal, self._workspaces_of(principal, message))

    def _workspaces_of(self, principal: Principal, message: Message) -> frozenset[str] | None:
        assert self.field is not None  # guaranteed by ServiceAuthorization's checks
        values = _read_path(message, self.field)
        if values is None and self.workspace is WorkspaceSource.OPTIONAL_FIELD:
            return principal.scope
        if not values or not all(values):
            first = self.workspace is WorkspaceSource.FIRST_MESSAGE
            description = (
                "the first message must name a workspace" if first else "must name a workspace"
            )
            raise InvalidArgument(
                f"{self.field}: {description}",
                reason=self.missing_reason,
                field_violations=[FieldViolation(self.field, description)],
            )
        for workspace_id in values:
            if not principal.may_access(workspace_id):
                raise _scope_mismatch(principal, workspace_id)
        return frozenset(values)

    @property
    def role_names(self) -> list[str]:
        """The allowed roles, in the fixed order device, service, admin."""
        return [role.value for role in ANY_ROLE if role in self.roles]

    def describe_workspace(self) -> str:
        """One line saying where the workspace comes from (for ``docs/auth.md``)."""
        match self.workspace:
            case WorkspaceSource.FIELD:
                return f"`{self.field}` (required)"
            case WorkspaceSource.OPTIONAL_FIELD:
                return f"`{self.field}`; unset: the principal's workspaces"
            case WorkspaceSource.FIRST_MESSAGE:
                return f"first stream message: `{self.field}`"
            case WorkspaceSource.EACH_FRAME:
                return "each frame's `workspace_id`, within the principal's workspaces"
            case WorkspaceSource.DEPLOYMENT:
                if self.deployment_wide:
                    return "deployment-wide records; a deployment-wide principal only"
                return "deployment-wide records (read)"


def workspace_field(*roles: Role, path: str = "workspace_id") -> MethodPolicy:
    """A workspace-scoped RPC: ``path`` must name one of the principal's workspaces."""
    return MethodPolicy(frozenset(roles), WorkspaceSource.FIELD, path)


def optional_workspace(*roles: Role, path: str = "workspace_id") -> MethodPolicy:
    """A cross-workspace RPC: ``path`` set narrows it; unset means the principal's workspaces."""
    return MethodPolicy(frozenset(roles), WorkspaceSource.OPTIONAL_FIELD, path)


def first_message(*roles: Role, path: str, missing_reason: str | None = None) -> MethodPolicy:
    """A client stream whose first message names its workspaces at ``path``.

    ``missing_reason`` is the refusal's reason when it names none.
    """
    return MethodPolicy(
        frozenset(roles), WorkspaceSource.FIRST_MESSAGE, path, missing_reason=missing_reason
    )


def each_frame(*roles: Role) -> MethodPolicy:
    """A client stream whose every frame names a workspace within the principal's."""
    return MethodPolicy(frozenset(roles), WorkspaceSource.EACH_FRAME)


def deployment_read(*roles: Role) -> MethodPolicy:
    """A read of deployment-wide records (no workspace)."""
    return MethodPolicy(frozenset(roles), WorkspaceSource.DEPLOYMENT)


def deployment_write(*roles: Role) -> MethodPolicy:
    """A write to deployment-wide records: the principal must also be deployment-wide."""
    return MethodPolicy(frozenset(roles), WorkspaceSource.DEPLOYMENT, deployment_wide=True)


def _check_field(service: ServiceDescriptor, method: str, policy: MethodPolicy) -> None:
    descriptor = service.methods_by_name[method]
    where = f"{service.full_name}/{method}"
    streams = descriptor.client_streaming
    if policy.workspace is WorkspaceSource.FIRST_MESSAGE or (
        policy.workspace is WorkspaceSource.EACH_FRAME
    ):
        if not streams:
            raise ValueError(f"{where}: {policy.workspace} needs a client-streaming method")
    elif policy.workspace in (WorkspaceSource.FIELD, WorkspaceSource.OPTIONAL_FIELD) and streams:
        raise ValueError(f"{where}: a client stream declares its workspace by its first message")
    if policy.workspace in (WorkspaceSource.EACH_FRAME, WorkspaceSource.DEPLOYMENT):
        if policy.field is not None:
            raise ValueError(f"{where}: {policy.workspace} takes no field")
        return
    if policy.field is None:
        raise ValueError(f"{where}: {policy.workspace} needs a field")
    message = descriptor.input_type
    *parents, last = policy.field.split(".")
    for name in parents:
        parent = message.fields_by_name.get(name)
        if parent is None or parent.message_type is None or _is_repeated(parent):
            raise ValueError(f"{where}: {policy.field!r} does not resolve to a field")
        message = parent.message_type
    target = message.fields_by_name.get(last)
    if target is None or target.type != FieldDescriptor.TYPE_STRING:
        raise ValueError(f"{where}: {policy.field!r} is not a string field")
    if policy.workspace is WorkspaceSource.OPTIONAL_FIELD and not target.has_presence:
        raise ValueError(f"{where}: {policy.field!r} is not optional")


@dataclass(frozen=True)
class ServiceAuthorization:
    """The authorization table of one gRPC service: method name -> policy.

    Construction checks every entry against the service descriptor (the method exists,
    the workspace field resolves to a string field of the right kind), so a typo fails
    at import, not at the first call. A missing method is not an error here (it fails
    closed at run time); ``tests/unit/test_authorization.py`` proves none is missing.
    """

    service: ServiceDescriptor
    policies: Mapping[str, MethodPolicy] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for method, policy in self.policies.items():
            if method not in self.service.methods_by_name:
                raise ValueError(f"{self.service.full_name} has no method {method!r}")
            if not policy.roles:
                raise ValueError(f"{self.service.full_name}/{method}: no role may call it")
            _check_field(self.service, method, policy)

    def by_path(self) -> dict[str, MethodPolicy]:
        """Policies keyed by the full gRPC method path (``/pkg.Service/Method``)."""
        return {f"/{self.service.full_name}/{m}": p for m, p in self.policies.items()}

    def undeclared(self) -> list[str]:
        """Methods of the service that have no policy, in proto order."""
        return [m.name for m in self.service.methods if m.name not in self.policies]


def policies_by_path(tables: Iterable[ServiceAuthorization]) -> dict[str, MethodPolicy]:
    """Merge service tables into the ``/pkg.Service/Method -> policy`` map the server uses."""
    merged: dict[str, MethodPolicy] = {}
    for table in tables:
        merged.update(table.by_path())
    return merged


_scope: contextvars.ContextVar[CallScope] = contextvars.ContextVar("tutti_call_scope")


@dataclass(frozen=True)
class CallBinding:
    """Undo information of :func:`bind_call`."""

    principal_token: contextvars.Token[Principal]
    scope_token: contextvars.Token[CallScope]


def bind_call(scope: CallScope) -> CallBinding:
    """Make ``scope`` (and its principal) current for the running task."""
    return CallBinding(bind_principal(scope.principal), _scope.set(scope))


def narrow_call(scope: CallScope) -> None:
    """Replace the current scope once a stream's first message was admitted.

    The :class:`CallBinding` of :func:`bind_call` still restores the state before the call.
    """
    _scope.set(scope)


def unbind_call(binding: CallBinding) -> None:
    """Undo :func:`bind_call`.

    A cancelled streaming call's handler generator may be finalized by asyncio in another
    context than the one it ran in; its bindings then died with their context and there
    is nothing to undo (resetting would raise ``ValueError``).
    """
    try:
        _scope.reset(binding.scope_token)
        unbind_principal(binding.principal_token)
    except ValueError:
        return


def current_scope() -> CallScope:
    """The scope the interceptor admitted the running call for.

    Raises:
        PermissionDenied: ``METHOD_NOT_DECLARED`` when no scope is bound (wiring is
            broken; fail closed).
    """
    try:
        return _scope.get()
    except LookupError:
        raise method_not_declared("this call") from None


def render_table(tables: Iterable[tuple[str, Iterable[ServiceAuthorization]]]) -> str:
    """The Markdown table of every declared RPC (``docs/auth.md``; scripts/auth_table.py)."""
    lines = [
        "| service | RPC | roles | workspace |",
        "| --- | --- | --- | --- |",
    ]
    for server, services in tables:
        for table in services:
            for method in table.service.methods:
                policy = table.policies.get(method.name)
                roles = ", ".join(policy.role_names) if policy else "**not declared**"
                where = policy.describe_workspace() if policy else "refused (fails closed)"
                lines.append(
                    f"| {server} | `{table.service.name}.{method.name}` | {roles} | {where} |"
                )
    return "\n".join(lines) + "\n"
