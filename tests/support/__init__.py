"""The test harness: real servers in threads, real processes and fleets of them, waits on
conditions, builders of small engines, and stand-ins for what the gateway meets outside
(a scriptable replica, a DNS server, a Kubernetes API server's list/watch).

Tests import what they share from here and never from one another (``test_layers`` checks
that no test module imports another test module).
"""
