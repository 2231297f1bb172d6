"""Knowledge base: markdown entries (contracts, constraints, findings) with YAML frontmatter."""

from orchestrator.knowledge.kb import Entry, KnowledgeBase, parse_entry, workload_key

__all__ = ["Entry", "KnowledgeBase", "parse_entry", "workload_key"]
