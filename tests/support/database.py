"""Database backend fixtures (SQLite and Postgres); see the store issue."""
