"""Which measured requests the bench audit scores (`orchestrator.trial.gating.audit_samples`)."""

from orchestrator.bench import builtin_scenarios
from orchestrator.bench.prompts import PromptFactory, load_tokenizer
from orchestrator.bench.timeline import RequestRecord
from orchestrator.trial.gating import audit_samples


def _requests(sc, tok, n, *, ids=20, counted=None):
    factory = PromptFactory(sc, tok)
    return [RequestRecord(index=i, prompt_tokens=sc.prompt_tokens, output_tokens=ids, success=True,
                          output_ids=list(range(ids)), client_tokens=counted if counted is not None else ids,
                          usage_prompt_tokens=len(factory.make(i).prompt)) for i in range(n)]


def test_concurrent_first_qualifying_only_and_drawn_at_random(tiny_model):
    tok = load_tokenizer(str(tiny_model))
    scen = builtin_scenarios()
    burst, single = scen["throughput"], scen["decode"]  # concurrency 8 and 1
    outputs = [(single, _requests(single, tok, 16)), (burst, _requests(burst, tok, 16))]
    picked = audit_samples(outputs, str(tiny_model), 8, 16)
    assert len(picked) == 8 and [p["scenario"] for p in picked[:4]] == ["throughput"] * 4
    for p in picked:  # the very prompt the bench sent, rebuilt from the scenario's seed
        sc = burst if p["scenario"] == "throughput" else single
        assert p["prompt_ids"] == PromptFactory(sc, tok).make(p["index"]).prompt
    # Not a fixed choice a server could learn: two draws over the same requests differ.
    draws = {tuple((p["scenario"], p["index"]) for p in audit_samples(outputs, str(tiny_model), 8, 16)) for _ in range(5)}
    assert len(draws) > 1
    # Too short, or ids missing for some counted tokens: not auditable.
    short = [(burst, _requests(burst, tok, 4, ids=8))]
    partial = [(burst, _requests(burst, tok, 4, counted=32))]
    assert audit_samples(short, str(tiny_model), 8, 16) == [] and audit_samples(partial, str(tiny_model), 8, 16) == []
