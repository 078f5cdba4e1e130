"""``tutti``: the operator CLI (start the suite, serve one service, migrate, auth)."""
