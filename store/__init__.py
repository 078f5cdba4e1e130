"""The canonical store: one schema (SQLAlchemy 2), its Alembic migrations, engines and transactions.

The store knows no service. ``store.models`` defines every table of the suite (Host's canonical
tables and outboxes, maintenance's own tables, the AppCenter/IssueManager backend tables);
``store.migrate`` applies the migrations shipped in ``store/migrations``; ``store.engine`` builds
configured engines for SQLite and Postgres; ``store.transactions`` is the unit-of-work seam with
transaction participants (STORE-4).
"""
