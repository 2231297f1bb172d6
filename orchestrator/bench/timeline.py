"""Per-request event timeline.  Every time is ``time.perf_counter_ns()`` (monotonic, ns)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RequestRecord:
    """What happened to one request; metrics are pure functions of a list of these."""

    index: int
    prompt_tokens: int  # intended
    output_tokens: int  # intended (max_tokens)
    t_scheduled_ns: int = 0  # when the arrival process wanted it sent
    t_sent_ns: int = 0  # just before the POST is written
    t_first_chunk_ns: int | None = None  # first SSE data event of any kind (vLLM TTFT)
    t_first_token_ns: int | None = None  # first chunk with non-empty content (our TTFT)
    t_last_token_ns: int | None = None  # last content-bearing chunk (E2E end)
    t_done_ns: int | None = None  # stream fully read ([DONE] or close)
    chunk_ns: list[int] = field(default_factory=list)  # arrival time of each content chunk
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    client_chunks: int = 0  # content-bearing chunks seen
    client_tokens: int | None = None  # output tokens counted from the returned token ids (None: none returned)
    client_tokens_from_text: bool = False  # the engine returns no ids: client_tokens is the text re-tokenized
    output_ids: list[int] = field(default_factory=list)  # the generated token ids, where the engine returns them (the bench audit scores them)
    finish_reason: str | None = None  # the last finish_reason the stream carried ("length", "stop")
    done_seen: bool = False
    success: bool = False
    error: str | None = None  # short reason: timeout, connection_error, http_503, ...
    error_detail: str = ""
    http_status: int | None = None
    text: str = ""

    @property
    def osl(self) -> int:
        """Output length: the server's usage count, else the client's count."""
        if self.usage_completion_tokens is not None:
            return self.usage_completion_tokens
        if self.client_tokens is not None:
            return self.client_tokens
        return self.client_chunks

    @property
    def ttft_ns(self) -> int | None:
        return None if self.t_first_token_ns is None else self.t_first_token_ns - self.t_sent_ns

    @property
    def first_chunk_ns(self) -> int | None:
        return None if self.t_first_chunk_ns is None else self.t_first_chunk_ns - self.t_sent_ns

    @property
    def e2e_ns(self) -> int | None:
        return None if self.t_last_token_ns is None else self.t_last_token_ns - self.t_sent_ns

    @property
    def tpot_ns(self) -> float | None:
        """(E2E − TTFT)/(OSL − 1); undefined for one-token outputs (vLLM and AIPerf skip them)."""
        if self.ttft_ns is None or self.e2e_ns is None or self.osl <= 1:
            return None
        return (self.e2e_ns - self.ttft_ns) / (self.osl - 1)

    @property
    def chunk_gaps_ns(self) -> list[int]:
        """Gaps between consecutive content chunks (vLLM ``itl`` / AIPerf ``inter_chunk_latency``)."""
        c = self.chunk_ns
        return [c[i] - c[i - 1] for i in range(1, len(c))]

    @property
    def queue_ns(self) -> int:
        """Client-side queue time: how late the send was versus its schedule."""
        return max(0, self.t_sent_ns - self.t_scheduled_ns)

    def to_dict(self, *, origin_ns: int = 0) -> dict[str, Any]:
        d = asdict(self)
        d["osl"] = self.osl
        for k in ("ttft_ns", "first_chunk_ns", "e2e_ns", "tpot_ns", "queue_ns"):
            d[k.replace("_ns", "_ms")] = None if getattr(self, k) is None else getattr(self, k) / 1e6
        if origin_ns:
            for k in ("t_scheduled_ns", "t_sent_ns", "t_first_chunk_ns", "t_first_token_ns",
                      "t_last_token_ns", "t_done_ns"):
                if d[k] is not None:
                    d[k] -= origin_ns
            d["chunk_ns"] = [t - origin_ns for t in d["chunk_ns"]]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, origin_ns: int = 0) -> RequestRecord:
        """Back from `to_dict`; `origin_ns`: the one `to_dict` subtracted, added back."""
        names = cls.__dataclass_fields__
        rec = cls(**{k: v for k, v in d.items() if k in names})
        if origin_ns:
            for k in ("t_scheduled_ns", "t_sent_ns", "t_first_chunk_ns", "t_first_token_ns", "t_last_token_ns", "t_done_ns"):
                if getattr(rec, k) is not None:
                    setattr(rec, k, getattr(rec, k) + origin_ns)
            rec.chunk_ns = [t + origin_ns for t in rec.chunk_ns]
        return rec
