"""anvil_ctl: a transactional deployment controller with exact rollback for LLM-serving hosts."""

__version__ = "0.1.0"
