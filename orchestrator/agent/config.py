"""`[agent]` in infergoal.toml: which model, where the key comes from, what a run may spend."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["AgentConfig"]


class AgentConfig(BaseModel):
    """The code agent (`proposer = "claude"` or `"hybrid"`). The API key itself is never stored here."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    model: str = "claude-sonnet-4-6"
    """Anthropic model id."""
    api_key_env: str = "ANTHROPIC_API_KEY"
    """Environment variable holding the API key (read at run start; never written to the store or logs)."""
    api_key_file: str = ""
    """A file holding the API key, used when the environment variable is unset."""
    base_url: str = ""
    """Messages API base URL; empty = the SDK's default (or ANTHROPIC_BASE_URL)."""
    max_tokens: int = Field(4096, ge=256)
    """Output token limit of one model turn."""
    max_turns_per_trial: int = Field(40, ge=1)
    """Model turns allowed between two trials; past it the proposer gives up (the run stops)."""
    max_cost_usd: float | None = None
    """Stop the run once the agent has spent this many dollars (None = no limit)."""
    price_input_per_mtok: float | None = None
    """Dollars per million input tokens; None = the built-in price of `model`."""
    price_output_per_mtok: float | None = None
    """Dollars per million output tokens; None = the built-in price of `model`."""
    compact_at_tokens: int = Field(120_000, ge=1000)
    """When a request's input reaches this many tokens, old turns are replaced by a summary."""
    command_timeout_s: float = Field(120.0, gt=0)
    """Timeout of one `run_command` call in the engine worktree."""
    max_output_chars: int = Field(8000, ge=200)
    """Tool output beyond this many characters is truncated (head and tail kept)."""
    max_retries: int = Field(6, ge=0)
    """Retries of one API call on 429, 529, 5xx and connection errors."""
    retry_max_wait_s: float = Field(60.0, gt=0)
    """Longest wait between retries (a longer `retry-after` is capped to this)."""
    request_timeout_s: float = Field(600.0, gt=0)
    """Timeout of one API request."""
    hybrid_search_trials: int = Field(3, ge=0)
    """Hybrid proposer: knob-search trials run on each structural commit before the agent goes on."""
    approval_wait_s: float = Field(0.0, ge=0)
    """When a trial needs approval, wait up to this long for `infergoal approve/reject N` before the
    agent goes on (0 = do not wait; the agent is told the trial awaits a person's decision)."""
    prediction_tolerance: float = Field(0.2, gt=0)
    """A prediction `expected_score` within this relative distance of the measured score is a hit."""
