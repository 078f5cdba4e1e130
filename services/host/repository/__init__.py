"""The host's repositories: the only modules of ``services.host`` that contain SQL.

Each repository is bound to the ``AsyncSession`` of one transaction. Read paths return the
frozen records of ``services.host.model.records`` and ``row_records``; the write path of the
activity lifecycle gets read-only ``row_views`` and changes rows through repository methods,
which record the change for the activity outbox (``changes``). Domain commands receive one
:class:`~services.host.repository.unit_of_work.HostTransaction` from
:func:`~services.host.repository.unit_of_work.run` (``HostContext.transact``) and never see a
connection.
"""
