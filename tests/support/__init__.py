"""The test harness: real servers in threads, real processes and fleets of them, waits on
conditions, and builders of small engines.

Tests import what they share from here and never from one another (``test_layers`` checks
that no test module imports another test module).
"""
