"""The read-only row views name exactly the columns of their tables (ADR 0022)."""

from __future__ import annotations

import inspect

import pytest

from services.host.repository import row_views
from store import models

VIEWS: dict[type[object], type[models.Base]] = {
    row_views.SessionRow: models.Session,
    row_views.TurnRow: models.Turn,
    row_views.MessageRow: models.Message,
    row_views.InteractionRow: models.Interaction,
    row_views.OperationRow: models.InteractionResponseOperation,
    row_views.CommandRow: models.RuntimeCommandOutbox,
    row_views.TargetRow: models.AgentTarget,
}


@pytest.mark.parametrize("view", list(VIEWS), ids=lambda view: view.__name__)
def test_a_view_has_one_read_only_property_per_column(view: type[object]) -> None:
    table = VIEWS[view].__table__
    properties = {name for name, member in inspect.getmembers(view) if isinstance(member, property)}
    assert properties == {column.key for column in table.columns}
    assert all(getattr(view, name).fset is None for name in properties)
