"""Process wiring of the issuemanager service: ``tutti serve issuemanager``."""

from __future__ import annotations

from agentactivity.issuemanager.v1 import issuemanager_pb2, issuemanager_pb2_grpc
from grpcserver.app import ServiceDefinition, definition_for
from services.issuemanager.authorization import AUTHORIZATION
from services.issuemanager.load_validation import LoadBounds
from services.issuemanager.servicer import IssueManagerServicer
from services.issuemanager.settings import Settings
from services.issuemanager.topic_store import TopicStore
from store.database import Database

__all__ = ["Settings", "build"]


def build(settings: Settings) -> ServiceDefinition:
    """Assemble the issuemanager service for :func:`grpcserver.app.serve`."""
    database = Database(
        settings.resolved_database_url(),
        sqlite_write_queue_seconds=settings.sqlite_write_queue_seconds,
        sqlite_group_commit=settings.sqlite_group_commit,
        sqlite_synchronous=settings.sqlite_synchronous,
    )
    servicer = IssueManagerServicer(
        TopicStore(database, detail_max_outputs=settings.issuemanager_detail_max_outputs),
        LoadBounds(
            max_issues=settings.issuemanager_load_max_issues,
            max_outputs=settings.issuemanager_load_max_outputs,
        ),
    )
    return definition_for(
        "issuemanager",
        [
            (
                issuemanager_pb2.DESCRIPTOR.services_by_name["IssueManagerService"],
                issuemanager_pb2_grpc.add_IssueManagerServiceServicer_to_server,
                servicer,
            )
        ],
        authorization=AUTHORIZATION,
        on_start=[database.start],
        on_stop=[database.stop],
    )
