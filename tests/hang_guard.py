"""The one time limit the suite's subprocesses and process groups use.

It is a guard against a hang, never a speed requirement: a busy two-core machine may
take many times longer than an idle one, and a test must not fail for that.
"""

HANG_GUARD_S = 1800
