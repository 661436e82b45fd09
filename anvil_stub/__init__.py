"""The stub engine: a small OpenAI-compatible server that stands in for SGLang/vLLM (docs/CONTRACTS.md).

Standard library only: it runs inside containers whose only Python is the host's, bind-mounted
read-only. Run it as `python3 -m anvil_stub`.
"""
