"""``--workers N``: N processes share the pod's ext_proc port; one supervisor keeps them running.

``cores`` picks the default N, ``supervisor`` starts and restarts the processes, ``role`` tells a
process which worker it is (and what it alone owns), ``aggregate`` merges the workers' /metrics
and ``siblings`` asks the other workers for their series and readiness (docs/workers.md).
"""
