"""Foundations: the small leaf modules every layer may use (errors to one line, exit codes, SIGINT
handling, trial roles and stop exceptions, `Candidate`, frontmatter and TOML reading)."""
