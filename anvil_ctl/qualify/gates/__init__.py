"""The gates of qualification, by the type name profiles use."""

from __future__ import annotations

from anvil_ctl.qualify.gates.base import Gate, GateContext, ReserveProbe, ReserveReading
from anvil_ctl.qualify.gates.capacity import Capacity, Endurance
from anvil_ctl.qualify.gates.coding import CodingAgent
from anvil_ctl.qualify.gates.functional import JsonOutput, Needle, ResponsesApi, Smoke
from anvil_ctl.qualify.gates.log_audit import LogAudit
from anvil_ctl.qualify.gates.media import Image, Ocr
from anvil_ctl.qualify.gates.reserve import VramReserve
from anvil_ctl.qualify.gates.thinking import ThinkingControl
from anvil_ctl.qualify.gates.tools import LongContextTool, StreamingTool, ToolResultContinuation, Tools

GATE_TYPES: dict[str, type[Gate]] = {
    cls.gate_type: cls
    for cls in (
        Smoke,
        JsonOutput,
        Tools,
        LongContextTool,
        StreamingTool,
        ToolResultContinuation,
        ResponsesApi,
        Image,
        Ocr,
        Needle,
        ThinkingControl,
        CodingAgent,
        Capacity,
        Endurance,
        VramReserve,
        LogAudit,
    )
}

__all__ = [
    "GATE_TYPES",
    "Capacity",
    "CodingAgent",
    "Endurance",
    "Gate",
    "GateContext",
    "Image",
    "JsonOutput",
    "LogAudit",
    "LongContextTool",
    "Needle",
    "Ocr",
    "ReserveProbe",
    "ReserveReading",
    "ResponsesApi",
    "Smoke",
    "StreamingTool",
    "ThinkingControl",
    "ToolResultContinuation",
    "Tools",
    "VramReserve",
]
