"""The code agent's parts: config, API client, confined tools, persisted conversation, prompts.

`orchestrator.proposers.agent.AgentProposer` drives them; this package keeps each part small
and testable on its own. Importing it is cheap (no SDK import) so the workspace config can
use `AgentConfig`.
"""

from orchestrator.agent.config import AgentConfig
from orchestrator.agent.errors import AgentAPIError, AgentConfigError, AgentError

__all__ = ["AgentAPIError", "AgentConfig", "AgentConfigError", "AgentError"]
