"""Turns and what they carry.

It owns SendInput submission, stop and listing, the lifecycle, @agent mentions, reference
metadata, transcript messages, tool payloads, Interactions and the runtime command outbox.
"""
