"""Benchmarks: our code beside its baseline in one run, reporting medians and ratios."""
