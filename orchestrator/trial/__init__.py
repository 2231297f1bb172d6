"""One trial and its judgement, the parts the loop is made of: running it (`run`), the short bench
that screens it (`fidelity`), the verdict against a baseline (`verdict`), and the paired A/B
confirmation a claim rests on (`paired`)."""
