"""A chaos harness for the portal's exactly-once promise (ARCHITECTURE.md section 7).

`python -m tests.chaos --help` runs it; see tests/chaos/harness.py for what a run does and
tests/chaos/checks.py for what it judges. Importing this package loads nothing heavy: pytest
collects tests/chaos/test_chaos_short.py through it.
"""
