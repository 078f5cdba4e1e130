"""The Host service: Sessions, their Turns and activity (HostService, RuntimeLinkService)."""
