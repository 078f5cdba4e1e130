"""The maintenance service: retention purges, resource cleanup, compaction and status (MAINT-*)."""
