"""Publisher hand-over between livestream replicas (SCALE-4, ADR 0043).

``state`` is the versioned, validated wire format of a publisher's state and its chunks;
``nats_transport`` answers and sends hand-over requests over NATS request/reply (imported
only with ``TUTTI_BUS=nats``: a single node needs no NATS client).
"""
