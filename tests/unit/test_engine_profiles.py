"""Engine profiles: the registry, log triage and the facts observed of llama.cpp."""

from __future__ import annotations

import re

import pytest

from anvil_ctl.core.engine_profile import (
    ENGINE_PROFILES,
    LLAMA_CPP_PYTHON,
    OPENAI_COMPATIBLE,
    STUB,
    engine_profile,
)
from anvil_ctl.qualify.logs import classify, patterns_of

# Lines captured from llama-cpp-python 0.3.36 containers (docs/ENGINES.md).
LLAMA_CORRUPT_LOG = "\n".join(
    [
        "llama_model_loader: loaded meta data with 34 key-value pairs and 272 tensors",
        "llama_model_load: error loading model: tensor 'token_embd.weight' data is not within the "
        "file bounds, model is corrupted or incomplete",
        "llama_model_load_from_file_impl: failed to load model",
        "Traceback (most recent call last):",
        "ValueError: Failed to load model from file: /model/snapshots/x/SmolLM2-135M-Instruct.Q4_1.gguf",
    ]
)
LLAMA_PERF = "\n".join(
    [
        "llama_perf_context_print:        load time =       0.25 ms",
        "llama_perf_context_print: prompt eval time =     429.75 ms /    12 tokens "
        "(   35.81 ms per token,    27.92 tokens per second)",
        "llama_perf_context_print:        eval time =    2912.25 ms /    15 runs   "
        "(  194.15 ms per token,     5.15 tokens per second)",
        "llama_perf_context_print:       total time =    3433.55 ms /    27 tokens",
    ]
)


class TestTheRegistry:
    def test_every_profile_is_registered_under_its_own_name(self):
        assert set(ENGINE_PROFILES) == {
            "openai-compatible",
            "stub",
            "sglang",
            "vllm",
            "llama-cpp-python",
            "llama-cpp-python-cuda",
            "llama-server",
        }
        assert all(name == p.name for name, p in ENGINE_PROFILES.items())

    def test_the_command_lines_engine_choices_are_the_registered_profiles(self):
        """`--engine` offers a constant (so `--help` does not build the profiles): the same names."""
        from anvil_ctl.cli.serves import ENGINE_NAMES

        assert tuple(sorted(ENGINE_PROFILES)) == ENGINE_NAMES

    def test_an_unknown_or_empty_name_gets_the_openai_compatible_assumptions(self):
        assert engine_profile("exl3") is OPENAI_COMPATIBLE
        assert engine_profile("") is OPENAI_COMPATIBLE
        assert engine_profile(None) is OPENAI_COMPATIBLE
        assert engine_profile("llama-cpp-python") is LLAMA_CPP_PYTHON

    @pytest.mark.parametrize("profile", list(ENGINE_PROFILES.values()), ids=lambda p: p.name)
    def test_every_pattern_compiles_and_every_timing_regex_names_ms_and_tokens(self, profile):
        for pattern in (*profile.fatal_patterns, *profile.notice_log_patterns):
            re.compile(pattern.regex)
        if profile.timing is not None:
            for pattern in (profile.timing.prompt_eval, profile.timing.eval, profile.timing.total):
                assert {"ms", "tokens"} <= set(re.compile(pattern).groupindex)
        if profile.context_source == "refusal":
            assert profile.context_refusal is not None
            assert "limit" in re.compile(profile.context_refusal).groupindex

    @pytest.mark.parametrize("profile", list(ENGINE_PROFILES.values()), ids=lambda p: p.name)
    def test_a_profile_without_streamed_usage_says_how_it_counts_instead(self, profile):
        if not profile.streamed_usage:
            assert profile.prompt_tokens != "stream-usage"
            assert profile.completion_tokens != "stream-usage"
        assert profile.sources, "every profile says where its facts come from"


def llama_fatal_lines(log: str) -> list[str]:
    """The lines the log audit classifies fatal in a llama-cpp-python log, in order."""
    return [str(f["text"]) for f in classify(log.splitlines(), patterns_of(LLAMA_CPP_PYTHON)).fatal]


class TestLogTriage:
    def test_llama_cpps_own_fatal_lines_are_found_in_order(self):
        lines = llama_fatal_lines(LLAMA_CORRUPT_LOG)
        assert lines[0].startswith("llama_model_load: error loading model: tensor 'token_embd.weight'")
        assert lines[-1].startswith("ValueError: Failed to load model from file:")
        assert not any(line.startswith("llama_model_loader: loaded meta data") for line in lines)

    def test_timing_lines_are_not_fatal(self):
        assert llama_fatal_lines(LLAMA_PERF) == []

    def test_a_profile_reads_the_limit_from_a_context_refusal(self):
        message = (
            "This model's maximum context length is 2048 tokens. However, you requested 3063 "
            "tokens (3031 in the messages, 32 in the completion)."
        )
        assert LLAMA_CPP_PYTHON.refused_context(message) == 2048
        assert LLAMA_CPP_PYTHON.refused_context("something else") is None
        assert STUB.refused_context(message) is None


class TestRoutedModel:
    def test_an_engine_that_echoes_the_request_answers_with_the_alias(self):
        assert LLAMA_CPP_PYTHON.routed_model("smollm2-135m-q4_1", "llm.primary") == "llm.primary"
        assert STUB.routed_model("stub-model", "llm.primary") == "stub-model"


class TestRouterChecks:
    def test_a_router_checks_llama_cpp_where_a_running_completion_does_not_block(self):
        assert LLAMA_CPP_PYTHON.check_path == "/docs"
        assert STUB.check_path == "/health"
        assert OPENAI_COMPATIBLE.check_path == "/health"
