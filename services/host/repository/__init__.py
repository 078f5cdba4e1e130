"""The host's repositories: the only modules of ``services.host`` that contain SQL.

Each repository is bound to the ``AsyncSession`` of one transaction and returns the plain
dataclasses of ``services.host.model.records`` / the domain modules. Domain commands receive a
:class:`~services.host.repository.transactions.HostRepositories` scope from
:func:`~services.host.repository.transactions.run` and never see a connection.
"""
