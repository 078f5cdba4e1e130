"""The gRPC server bootstrap every service runs on.

It owns what all services share at the wire edge: the ``grpc.aio`` server lifecycle
(health, reflection, SIGTERM drain), bearer-token authentication, workspace scoping,
the mapping of domain errors to ``google.rpc.Status``, telemetry and structured logs.
Domain code never imports this package.
"""
