"""The livestream service: per-device resumable DeviceLink streams over Host activity (LIVE-*)."""
