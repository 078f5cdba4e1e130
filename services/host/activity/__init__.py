"""The activity feed of Host: what happened to Sessions, durably and live.

It owns the durable event log, the live lane (broker), the delta lane, the event vocabulary,
WatchActivity and the idle-gate state.
"""
