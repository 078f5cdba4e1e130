"""Wire mixins of ``HostService``: each module serves one group of RPCs.

``services.host.servicer.HostServicer`` composes them. A mixin only translates
proto -> domain call -> proto; rules live in the domain modules of ``services.host``.
"""
