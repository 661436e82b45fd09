"""structlog setup: JSON lines when not on a TTY, a readable console on a TTY.

structlog (which loads asyncio, rich and pygments) is imported only at the first line that
passes the configured level, so a quiet command never loads it; take loggers from `get_logger()`.
"""

from __future__ import annotations

import logging
import sys
import threading
from functools import partialmethod
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from structlog.typing import Processor


class _Setup:
    pending: tuple[str, str] | None = None
    """`configure`'s arguments while structlog is not loaded yet; applied when it is."""
    min_level = logging.NOTSET
    """The configured level while `pending` holds: a line below it is dropped unloaded."""


_setup = _Setup()
_applying = threading.Lock()


def configure(fmt: str = "auto", level: str = "info") -> None:
    if "structlog" in sys.modules:  # loaded already (a test, a library user): at once
        _setup.pending = None
        _apply(fmt, level)
    else:
        _setup.pending, _setup.min_level = (fmt, level), getattr(logging, level.upper())


def _uses_console(fmt: str) -> bool:
    return fmt == "console" or (fmt == "auto" and sys.stderr.isatty())


def _import_structlog(fmt: str) -> None:
    """Import structlog for lines in `fmt`; for JSON lines off a terminal, without rich.

    `structlog.dev` imports rich only for the console renderer; a `None` in `sys.modules` makes
    that one import fail, and is taken out again at once.
    """
    if "structlog" in sys.modules:
        return
    if _uses_console(fmt) or sys.stderr.isatty() or "rich" in sys.modules:
        import structlog

        return
    sys.modules["rich"] = None  # type: ignore[assignment]
    try:
        import structlog  # noqa: F401
    finally:
        del sys.modules["rich"]


def _apply(fmt: str, level: str) -> None:
    import structlog

    renderer: Processor = (
        structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
        if _uses_console(fmt)
        else structlog.processors.JSONRenderer(sort_keys=True)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        # stderr as it is when a logger is made, not when configured: a caller that replaced
        # it since (a test's capture, closed after it) is written to, not the closed one
        logger_factory=lambda *_args: structlog.PrintLogger(sys.stderr),
        cache_logger_on_first_use=False,
    )


class _Sink(Protocol):
    """A structlog logger: ours bind it, then call its level methods by name."""

    def bind(self, **values: object) -> _Sink: ...


def _structlog_logger(args: tuple[str, ...]) -> _Sink:
    """`structlog.get_logger(*args)`, structlog loaded and configured first."""
    if _setup.pending is not None:
        with _applying:  # once; another thread's first line waits until it is done
            if _setup.pending is not None:
                _import_structlog(_setup.pending[0])
                _apply(*_setup.pending)
                _setup.pending = None
    import structlog

    logger: _Sink = structlog.get_logger(*args)
    return logger


class Logger:
    """A structlog logger that loads structlog at its first line not below the level."""

    __slots__ = ("_args", "_bound", "_context")

    def __init__(self, args: tuple[str, ...] = (), context: dict[str, object] | None = None) -> None:
        self._args = args
        self._context = context or {}
        self._bound: _Sink | None = None

    def bind(self, **values: object) -> Logger:
        return Logger(self._args, {**self._context, **values})

    def _emit(self, method: str, event: str, **values: object) -> None:
        if _setup.pending is not None and getattr(logging, method.upper()) < _setup.min_level:
            return
        if not self._context:  # structlog's lazy proxy: the configuration at each call
            logger = _structlog_logger(self._args)
        else:  # a bound logger, as structlog's bind makes it: at the first line
            if self._bound is None:
                self._bound = _structlog_logger(self._args).bind(**self._context)
            logger = self._bound
        getattr(logger, method)(event, **values)

    debug = partialmethod(_emit, "debug")
    info = partialmethod(_emit, "info")
    warning = partialmethod(_emit, "warning")
    error = partialmethod(_emit, "error")


def get_logger(*args: str) -> Logger:
    """`structlog.get_logger(*args)`, loaded at its first line (the args reach the factory)."""
    return Logger(args)
