"""Knowledge base: markdown entries (contracts, constraints, findings, playbooks) with YAML frontmatter.

`fingerprint` describes settings and scores similarity, `distill` reads a run out of the store,
`writeback` turns it into entries, `reuse` ranks priors for a new run, `approval` guards contracts.
"""

from orchestrator.knowledge.entries import Entry, parse_entry
from orchestrator.knowledge.fingerprint import workload_key
from orchestrator.knowledge.kb import KnowledgeBase

__all__ = ["Entry", "KnowledgeBase", "parse_entry", "workload_key"]
