"""The stub engine: a small OpenAI-compatible server that stands in for SGLang/vLLM.

Standard library only: it runs inside containers whose only Python is the host's
`/usr/bin/python3`, bind-mounted read-only. Run it as `python3 -m anvil_ctl.stub`.
The behaviour is specified in docs/CONTRACTS.md ("Stub engine"); `options` parses
the flags and their `ANVIL_STUB_*` env twins, `rules` decides what to answer and
how many tokens that costs, `server` serves it with simulated prefill and decode
timing.
"""
