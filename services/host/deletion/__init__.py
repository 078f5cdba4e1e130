"""Delete, restore and purge of Session trees, the resource-cleanup outbox and project removal."""
