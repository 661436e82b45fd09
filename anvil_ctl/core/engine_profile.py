"""Engine profiles: how the controller probes one kind of engine, as data.

Each way engines differ where the controller depends on them is one field of
`EngineProfile`, never an `if engine == ...`. `ENGINE_PROFILES` is the one registry;
an engine without a profile is probed as `OPENAI_COMPATIBLE`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Literal


@dataclass(frozen=True)
class FatalPattern:
    """A log line that means the serve failed, of one class."""

    kind: Literal["traceback", "cuda_error", "oom", "nccl_error", "crash", "engine_error", "restart"]
    regex: str


@dataclass(frozen=True)
class NoticePattern:
    """A log line known to be harmless, and why."""

    name: str
    regex: str
    reason: str


COMMON_FATAL: tuple[FatalPattern, ...] = (
    FatalPattern("traceback", r"Traceback \(most recent call last\)"),
    # OOM before CUDA error: "CUDA error: out of memory" is an OOM first.
    FatalPattern("oom", r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory"),
    FatalPattern("oom", r"cudaMalloc failed: out of memory|\bOOM[- ]kill|Out of memory: Killed process"),
    FatalPattern("cuda_error", r"CUDA error\b|cudaError[A-Z]\w*|CUDA_ERROR_\w+|CUBLAS_STATUS_(?!SUCCESS)\w+"),
    FatalPattern("cuda_error", r"an illegal memory access was encountered|device-side assert triggered"),
    FatalPattern("nccl_error", r"NCCL error|nccl\w*Error\b|NCCL WARN .*(?:[Ff]ail|[Ee]rror|[Tt]imeout)"),
    FatalPattern("nccl_error", r"Watchdog caught collective operation timeout"),
    FatalPattern("crash", r"Segmentation fault|Fatal Python error|core dumped|\bSIGSEGV\b|\bSIGABRT\b"),
)
"""Every engine's fatal lines: Python tracebacks, CUDA and NCCL failures, OOM, crashes."""

NCCL_PLUGIN = NoticePattern(
    "nccl-plugin-absent",
    r"NCCL INFO (?:NET|PROFILER|TUNER)/Plugin: (?:Could not find|Plugin load returned|"
    r"Failed to find|No plugin found)",
    "optional NCCL plugin not installed; NCCL says it uses its internal network plugin instead",
)
PYTHON_DEPRECATION = NoticePattern(
    "python-deprecation",
    r"\b(?:FutureWarning|DeprecationWarning|PendingDeprecationWarning)\b|\bis deprecated\b",
    "a Triton/Torch/library deprecation: it announces a future change and changes nothing now",
)


@dataclass(frozen=True)
class Tokenizer:
    """The engine's tokenize endpoint: POST {input_field: text} -> {count_field: N}."""

    path: str
    input_field: str = "input"
    count_field: str = "count"
    model_field: str | None = "model"
    """The body field naming the model, if the endpoint takes one."""


@dataclass(frozen=True)
class TimingLines:
    """The engine's own per-completion timing log lines; each regex has the groups `ms` and `tokens`."""

    prompt_eval: str
    eval: str
    total: str


@dataclass(frozen=True)
class GpuUse:
    """How an engine's processes hold their GPUs: what ownership and the VRAM-release gate rely on."""

    processes: str
    """Which processes NVML lists on a granted GPU (their PIDs map to the container by cgroup)."""
    holds: str
    """What the memory they hold is, and when it is taken."""
    release: str
    """When the memory comes back: what the VRAM-release gate waits for after a stop."""


@dataclass(frozen=True)
class EngineProfile:
    """How to probe one kind of engine; see the module docstring for the fields' use."""

    name: str
    description: str
    # The defaults are the OpenAI-compatible assumptions (`OPENAI_COMPATIBLE`).
    health_path: str | None = "/health"
    """A route answering 200 when healthy; None: readiness is /v1/models listing the served name."""
    context_source: Literal["models", "refusal", "none"] = "models"
    """Where the serving context length shows: /v1/models, the 400 to an over-long prompt, or nowhere."""
    response_model: Literal["served", "request"] = "served"
    """What a chat response's `model` carries: the served name, or whatever the request named."""
    streamed_usage: bool = True
    """True: `stream_options.include_usage` yields a final usage chunk."""
    prompt_tokens: Literal["stream-usage", "plain-usage", "tokenize"] = "stream-usage"
    """How a streamed request's prompt tokens are counted: the final usage chunk; the usage of
    the same request re-sent unstreamed with max_tokens 1; or the tokenizer endpoint (an undercount)."""
    completion_tokens: Literal["stream-usage", "stream-chunks"] = "stream-usage"
    """How a streamed request's completion tokens are counted: the final usage chunk, or one per chunk."""
    context_refusal: str | None = None
    """With context_source `refusal`: a regex whose group `limit` is the context in the 400 answer."""
    tokenizer: Tokenizer | None = None
    max_concurrency: int | None = None
    """Requests the engine runs at once whatever it is told (None: as configured)."""
    fatal_log_patterns: tuple[FatalPattern, ...] = ()
    """The engine's own lines that mean it failed (load or serve), beyond `COMMON_FATAL`."""
    notice_log_patterns: tuple[NoticePattern, ...] = ()
    """Worth reporting, not fatal: degraded settings, warnings an operator should read."""
    start_banner: str | None = None
    """The line the engine prints once per start; twice in one log means it restarted inside."""
    timing: TimingLines | None = None
    gpu: GpuUse | None = None
    """How its processes use the GPU; None: it runs on CPU, or nobody has watched it on one."""
    router_check_path: str | None = None
    """What a router's health checks GET, if not the health route: a path that answers mid-completion."""
    running_metric: str | None = None
    """The Prometheus gauge of requests in flight (None: the drain reads the router's count)."""
    stop_timeout_s: float = 30.0
    """Grace between SIGTERM (each profiled engine finishes and frees its memory) and a kill."""
    sources: tuple[str, ...] = field(default=())
    """Where the facts above were observed or read."""

    @property
    def fatal_patterns(self) -> tuple[FatalPattern, ...]:
        """The common fatal patterns, then the engine's own (the first match names a line)."""
        return (*COMMON_FATAL, *self.fatal_log_patterns)

    @property
    def own_log_patterns(self) -> bool:
        """False: the profile knows nothing of its engine's log beyond the common set."""
        return bool(self.fatal_log_patterns or self.notice_log_patterns or self.start_banner)

    def refused_context(self, message: str) -> int | None:
        """The context length a context-refusal answer names, or None."""
        if self.context_refusal is None:
            return None
        found = re.search(self.context_refusal, message)
        return int(found.group("limit")) if found else None

    @property
    def check_path(self) -> str:
        """The path a router in front of this engine checks its backends with."""
        return self.router_check_path or self.health_path or "/v1/models"

    def routed_model(self, served_model: str, alias: str) -> str:
        """The `model` a routed answer by `alias` carries from a serve of `served_model`."""
        return served_model if self.response_model == "served" else alias


OPENAI_COMPATIBLE = EngineProfile(
    name="openai-compatible",
    description="What the controller assumed of every engine before profiles: /health, "
    "max_model_len in /v1/models, the served name in responses, usage in streams",
    sources=("the controller's behaviour before engine profiles",),
)

STUB = EngineProfile(
    name="stub",
    description="anvil_stub, our own OpenAI-compatible engine (docs/CONTRACTS.md)",
    fatal_log_patterns=(
        FatalPattern("engine_error", r"anvil-stub: (?:fatal|error)\b"),
        FatalPattern("engine_error", r"OSError: \[Errno 98\] Address already in use"),
    ),
    notice_log_patterns=(
        NoticePattern(
            "stub-notice",
            r"anvil-stub: notice\b",
            "the stub's planted notice line: informational by its contract (docs/CONTRACTS.md)",
        ),
        NoticePattern(
            "stub-fault-armed",
            r"--fault ",
            "the stub was started with a planted fault (--fault): a test's own setting, "
            "reported so that a reader of the evidence sees it",
        ),
        NCCL_PLUGIN,
        PYTHON_DEPRECATION,
    ),
    start_banner=r"anvil-stub: serving ",
    running_metric="stub:num_requests_running",
    stop_timeout_s=10.0,
    sources=("anvil_stub (docs/CONTRACTS.md)",),
)

SGLANG = EngineProfile(
    name="sglang",
    description="SGLang's OpenAI-compatible server (python -m sglang.launch_server)",
    response_model="request",
    tokenizer=Tokenizer(path="/v1/tokenize", input_field="prompt", count_field="count"),
    fatal_log_patterns=(
        # Scheduler, TP worker and detokenizer failures are logged as "<Process> hit an
        # exception: <traceback>", then the child SIGQUITs the launcher.
        FatalPattern("engine_error", r"\b\w+ hit an exception\b"),
        FatalPattern("engine_error", r"Received sigquit from a child process"),
        FatalPattern("engine_error", r"Initialization failed\. warmup error"),
        FatalPattern("oom", r"Not enough memory\. Please try to increase --mem-fraction-static"),
    ),
    notice_log_patterns=(
        NCCL_PLUGIN,
        PYTHON_DEPRECATION,
        NoticePattern(
            "warning",
            r"\bWARNING\b",
            "SGLang logs degraded settings and fallbacks at WARNING: worth an operator's reading, "
            "and the serve goes on",
        ),
    ),
    start_banner=r"The server is fired up and ready to roll!",
    # Published with --enable-metrics (a recipe without it: the router's count is read).
    running_metric="sglang:num_running_reqs",
    stop_timeout_s=60.0,
    sources=(
        "sgl-project/sglang python/sglang/srt/entrypoints/openai/serving_tokenize.py (/v1/tokenize: "
        "prompt -> count, max_model_len), serving_chat.py (response model is the request's), "
        "srt/metrics/collector.py (the sglang:num_running_reqs gauge); "
        "not run here (no GPU): recipes/glm53-flash-ormandj-sglang-*.toml",
    ),
)

LLAMA_CPP_PYTHON = EngineProfile(
    name="llama-cpp-python",
    description="llama.cpp through the llama-cpp-python 0.3.x server (python -m llama_cpp.server)",
    health_path=None,
    context_source="refusal",
    context_refusal=r"maximum context length is (?P<limit>\d+) tokens",
    response_model="request",
    streamed_usage=False,
    prompt_tokens="plain-usage",
    completion_tokens="stream-chunks",
    tokenizer=Tokenizer(path="/extras/tokenize/count", input_field="input", count_field="count"),
    max_concurrency=1,
    fatal_log_patterns=(
        FatalPattern("engine_error", r"llama_model_load: error loading model"),
        FatalPattern("engine_error", r"failed to load model|Failed to load model from file"),
        FatalPattern("engine_error", r"gguf_init_from_reader: invalid magic characters"),
        FatalPattern("engine_error", r"Model path does not exist"),
        FatalPattern("oom", r"ggml_\w+: failed to allocate|unable to allocate \w+ buffer"),
    ),
    notice_log_patterns=(
        NoticePattern(
            "mlock-failed",
            r"warning: failed to mlock|Try increasing RLIMIT_MEMLOCK",
            "mlock fails under Docker's RLIMIT_MEMLOCK and llama.cpp only warns: the model "
            "stays mapped, its pages may be paged out (docs/ENGINES.md)",
        ),
        NoticePattern(
            "context-below-training",
            r"n_ctx_per_seq \(\d+\) < n_ctx_train \(\d+\)",
            "the recipe serves a shorter context than the model was trained for (n_ctx): "
            "its own choice, and the served context is what the gates measure",
        ),
        PYTHON_DEPRECATION,
    ),
    # uvicorn's line when llama-cpp-python's server process starts.
    start_banner=r"Started server process \[",
    timing=TimingLines(
        prompt_eval=(
            r"llama_perf_context_print: prompt eval time =\s*(?P<ms>[\d.]+) ms /\s*(?P<tokens>\d+) tokens"
        ),
        eval=r"llama_perf_context_print:\s+eval time =\s*(?P<ms>[\d.]+) ms /\s*(?P<tokens>\d+) runs",
        total=r"llama_perf_context_print:\s+total time =\s*(?P<ms>[\d.]+) ms /\s*(?P<tokens>\d+) tokens",
    ),
    # /v1/models waits for the model's lock behind a running completion, long enough for a
    # router's check to time out and take a serving backend out. /docs answers at once, and
    # only once the model is loaded (the server loads it before it listens).
    router_check_path="/docs",
    sources=("llama-cpp-python 0.3.36 in the test env's containers (docs/ENGINES.md)",),
)

LLAMA_CPP_CUDA = replace(
    LLAMA_CPP_PYTHON,
    name="llama-cpp-python-cuda",
    description="llama.cpp through the llama-cpp-python 0.3.x server, built with GGML_CUDA: "
    "the model's layers offloaded to one GPU (--n_gpu_layers -1)",
    fatal_log_patterns=(
        *LLAMA_CPP_PYTHON.fatal_log_patterns,
        FatalPattern("cuda_error", r"ggml_cuda_init: failed to initialize CUDA"),
        FatalPattern("cuda_error", r"ggml_cuda_compute_forward: \w+ failed|ggml-cuda\.cu:\d+: .*error"),
        FatalPattern(
            "oom", r"ggml_backend_cuda_buffer_type_alloc_buffer: allocating [\d.]+ MiB on device \d+: "
        ),
    ),
    notice_log_patterns=(
        *LLAMA_CPP_PYTHON.notice_log_patterns,
        NoticePattern(
            "no-gpu-offload",
            r"llama_model_load_from_file_impl: (?:no CUDA devices|using device CPU)|"
            r"offloaded 0/\d+ layers to GPU",
            "the engine found no GPU or offloaded nothing: it serves, slowly, from the CPU "
            "(the ownership record then shows no process on the granted GPU)",
        ),
    ),
    gpu=GpuUse(
        processes="one: the server's Python process (a child of docker-init, not the "
        "container's init PID) opens one CUDA context on each granted GPU",
        holds="the offloaded weights, the KV cache for n_ctx and the CUDA compute buffers, "
        "allocated while the model loads, before the server listens; it grows once more with "
        "the first long prompts (cuBLAS workspace and larger batches: +218 MiB on an H200 at "
        "8k), so a VRAM need is measured after a long prompt, not at load",
        release="at the process's exit, when the driver destroys its context: SIGTERM through "
        "docker-init ends it; there is no sleep or unload API",
    ),
    sources=(
        "llama-cpp-python 0.3.36 built with -DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90, run on "
        "an H200 under anvilctl (scripts/gpu_story.py; docs/ENGINES.md)",
    ),
)

VLLM = EngineProfile(
    name="vllm",
    description="vLLM's OpenAI-compatible server (vllm serve): probed with the OpenAI-compatible "
    "assumptions; its own fatal lines and start banner for the log audit",
    fatal_log_patterns=(
        FatalPattern("engine_error", r"EngineCore (?:encountered a fatal error|failed to start)"),
        FatalPattern("engine_error", r"EngineDeadError|AsyncEngineDeadError"),
        FatalPattern("engine_error", r"Engine core initialization failed|WorkerProc hit an exception"),
    ),
    notice_log_patterns=(NCCL_PLUGIN, PYTHON_DEPRECATION),
    start_banner=r"Starting vLLM API server",
    running_metric="vllm:num_requests_running",
    stop_timeout_s=60.0,
    sources=(
        "vllm-project/vllm vllm/v1/engine/core.py and vllm/entrypoints/openai/api_server.py "
        "(log lines), vllm/v1/metrics/loggers.py (the vllm:num_requests_running gauge); "
        "not run here (no GPU)",
    ),
)

LLAMA_SERVER = EngineProfile(
    name="llama-server",
    description="llama.cpp's own C++ server (llama-server): the drain reads its running-requests "
    "gauge, published only when the server is started with --metrics; the other fields are the "
    "OpenAI-compatible assumptions, not observed here",
    # Without --metrics, GET /metrics answers 501 and the router's count is read instead.
    running_metric="llamacpp:requests_processing",
    sources=(
        "ggml-org/llama.cpp tools/server/server.cpp, the /metrics handler: 501 'Start it with "
        "`--metrics`' without the flag; the gauge llamacpp:requests_processing is the number of "
        "slots processing a request (n_processing_slots), llamacpp:requests_deferred the requests "
        "waiting for a slot, which take one as soon as it frees; not run here (the test "
        "environment's llama.cpp image is llama-cpp-python's server, which publishes neither)",
    ),
)

ENGINE_PROFILES: dict[str, EngineProfile] = {
    p.name: p for p in (OPENAI_COMPATIBLE, STUB, SGLANG, VLLM, LLAMA_CPP_PYTHON, LLAMA_CPP_CUDA, LLAMA_SERVER)
}
"""Every engine profile by name: the one registry."""

ENGINE_ALIASES: dict[str, str] = {
    "llama.cpp": "llama-cpp-python",
    "llama-cpp": "llama-cpp-python",
    "llamacpp": "llama-cpp-python",
    "llama_cpp": "llama-cpp-python",
    "llama.cpp-cuda": "llama-cpp-python-cuda",
    "llama.cpp-server": "llama-server",
    "llama-cpp-server": "llama-server",
    "sglang-sm120": "sglang",
}
"""Other spellings of an engine's name (a recipe's `engine`) -> its profile's name."""


def find_engine_profile(name: str | None) -> EngineProfile | None:
    """The profile `name` (or an alias of it, in any case) names; None if none does."""
    key = (name or "").strip().lower()
    return ENGINE_PROFILES.get(ENGINE_ALIASES.get(key, key))


def engine_profile(name: str | None) -> EngineProfile:
    """The profile `name` names; the OpenAI-compatible assumptions for an empty or unknown name."""
    return find_engine_profile(name) or OPENAI_COMPATIBLE
