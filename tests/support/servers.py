"""Live gRPC servers on 127.0.0.1 port 0 for integration and contract tests."""
