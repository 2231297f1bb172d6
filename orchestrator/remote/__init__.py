"""Code that runs *on* a remote host, shipped there by `orchestrator.hosts.ssh`: `hostd` (one short
command per call), `worker` (the measurement worker), and what both sides share (`manifest`, `procs`).

Standard library only at import time (plus what the measurement worker needs): the host may have
nothing of infergoal's dependencies but Python, and hostd must start in milliseconds. This package
sits below `orchestrator.hosts` and never imports it.
"""
