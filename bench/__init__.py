"""Benchmarks: ``python -m bench {train,np,features,series,scale,monitor,verify}``.

Each prints its measurements and ends with one JSON line. Speeds are reported as
ratios to a floor or reference measured in the same run, never as timed tests.
"""
