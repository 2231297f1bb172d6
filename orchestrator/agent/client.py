"""The Messages API client: the key, retries with backoff, and what each call costs.

The SDK's own retries are off (`max_retries=0`) so one policy, tenacity's, decides: retry 429,
529, 5xx and connection errors with exponential backoff, honouring `retry-after`; stop at once,
with a message saying what to fix, on a bad key (401/403), an unknown model (404) or a bad
request (400). The key is read from the environment or a file at start and kept only in the
client object: it is never logged, stored or put in a prompt.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from orchestrator.agent.config import AgentConfig
from orchestrator.agent.errors import AgentAPIError, AgentConfigError

__all__ = ["Usage", "LLMClient", "price_per_mtok", "read_api_key"]

# Dollars per million tokens (input, output), by model-id prefix; cache writes cost 1.25x input,
# cache reads 0.1x input (Anthropic's published prompt-caching multipliers).
_PRICES: tuple[tuple[str, float, float], ...] = (
    ("claude-opus-4-5", 5.0, 25.0), ("claude-opus-4", 15.0, 75.0), ("claude-sonnet-4", 3.0, 15.0),
    ("claude-3-7-sonnet", 3.0, 15.0), ("claude-haiku-4", 1.0, 5.0), ("claude-3-5-haiku", 0.8, 4.0),
)
_TRANSIENT = (anthropic.RateLimitError, anthropic.InternalServerError, anthropic.APIConnectionError)


def read_api_key(cfg: AgentConfig) -> str:
    key = os.environ.get(cfg.api_key_env, "").strip()
    if not key and cfg.api_key_file:
        path = Path(cfg.api_key_file).expanduser()
        if not path.is_file():
            raise AgentConfigError(f"agent.api_key_file {path} does not exist; create it or set {cfg.api_key_env}")
        key = path.read_text().strip()
    if not key:
        raise AgentConfigError(
            f"the claude/hybrid proposer needs an Anthropic API key: set {cfg.api_key_env} or agent.api_key_file "
            "(or run without an agent: --proposer search)"
        )
    return key


def price_per_mtok(cfg: AgentConfig) -> tuple[float, float]:
    table = next(((i, o) for prefix, i, o in _PRICES if cfg.model.startswith(prefix)), (3.0, 15.0))
    return (cfg.price_input_per_mtok if cfg.price_input_per_mtok is not None else table[0],
            cfg.price_output_per_mtok if cfg.price_output_per_mtok is not None else table[1])


@dataclass
class Usage:
    """Tokens and dollars, summed over API calls."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    cost_usd: float = 0.0
    calls: int = 0
    retries: int = 0

    def add(self, other: Usage) -> None:
        for k in self.__dataclass_fields__:
            setattr(self, k, getattr(self, k) + getattr(other, k))

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @property
    def context_tokens(self) -> int:
        return self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens


def _retry_after(exc: BaseException) -> float | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) or {}
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            return float(headers[name]) * scale
        except (KeyError, TypeError, ValueError):
            continue
    return None


class LLMClient:
    """One `create()` = one Messages API call, retried on transient errors."""

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self._client = anthropic.Anthropic(
            api_key=read_api_key(cfg), base_url=cfg.base_url or None, max_retries=0, timeout=cfg.request_timeout_s,
        )
        self.price_in, self.price_out = price_per_mtok(cfg)
        self._backoff = wait_exponential_jitter(initial=1.0, max=cfg.retry_max_wait_s)

    def _wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        hinted = _retry_after(exc) if exc else None
        return min(hinted, self.cfg.retry_max_wait_s) if hinted is not None else self._backoff(state)

    def create(self, **request: Any) -> tuple[Any, Usage]:
        """Send one request; return (message, usage with dollars). Raises AgentAPIError when it cannot."""
        usage = Usage()

        def count_retry(state: RetryCallState) -> None:
            usage.retries += 1

        try:
            for attempt in Retrying(
                retry=retry_if_exception(lambda e: isinstance(e, _TRANSIENT)), wait=self._wait,
                stop=stop_after_attempt(self.cfg.max_retries + 1), reraise=True, before_sleep=count_retry,
            ):
                with attempt:
                    message = self._client.messages.create(model=self.cfg.model, max_tokens=self.cfg.max_tokens, **request)
        except (anthropic.AuthenticationError, anthropic.PermissionDeniedError) as e:
            raise AgentAPIError(f"the Messages API refused the key ({e.status_code}); check {self.cfg.api_key_env} "
                                "or agent.api_key_file, then `infergoal resume`") from None
        except anthropic.NotFoundError as e:
            raise AgentAPIError(f"the Messages API does not know model {self.cfg.model!r} ({e.status_code}); "
                                "set agent.model to a valid model id, then `infergoal resume`") from None
        except _TRANSIENT as e:
            raise AgentAPIError(f"the Messages API is unavailable after {self.cfg.max_retries + 1} attempts "
                                f"({type(e).__name__}); `infergoal resume` continues when it is back") from None
        except anthropic.APIStatusError as e:
            raise AgentAPIError(f"the Messages API rejected the request ({e.status_code}): {e.message}") from None
        u = message.usage
        usage.calls = 1
        usage.input_tokens = u.input_tokens or 0
        usage.output_tokens = u.output_tokens or 0
        usage.cache_creation_input_tokens = u.cache_creation_input_tokens or 0
        usage.cache_read_input_tokens = u.cache_read_input_tokens or 0
        usage.cost_usd = (
            (usage.input_tokens + 1.25 * usage.cache_creation_input_tokens + 0.1 * usage.cache_read_input_tokens) * self.price_in
            + usage.output_tokens * self.price_out
        ) / 1e6
        return message, usage
