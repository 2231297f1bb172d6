"""Errors of the code agent, by type: what the user must fix vs what the API did."""

from __future__ import annotations

__all__ = ["AgentAPIError", "AgentConfigError", "AgentError", "ToolError"]


class AgentError(Exception):
    """Base of the agent's errors."""


class AgentConfigError(AgentError, ValueError):
    """The agent cannot start (no API key, bad config); the message says what to set."""


class AgentAPIError(AgentError, RuntimeError):
    """The Messages API refused for good (bad key, unknown model) or stayed down past the retries."""


class ToolError(AgentError):
    """A tool call the agent made cannot be done; goes back to the model as an `is_error` result."""
