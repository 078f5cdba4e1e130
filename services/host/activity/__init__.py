"""The activity feed: the durable event log, the live lane (broker), the delta lane, the event
vocabulary, WatchActivity and the idle-gate state.
"""
