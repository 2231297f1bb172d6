"""Code that runs *on* a remote host, shipped there by `orchestrator.hosts.ssh`.

Standard library only at import time (plus what the measurement worker needs): the host may have
nothing of infergoal's dependencies but Python, and the agent must start in milliseconds.
"""
