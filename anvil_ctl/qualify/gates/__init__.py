"""The gates of qualification, by the type name profiles use."""

from __future__ import annotations

from anvil_ctl.qualify.gates.base import Gate
from anvil_ctl.qualify.gates.capacity import Capacity, Endurance
from anvil_ctl.qualify.gates.coding import CodingAgent
from anvil_ctl.qualify.gates.functional import (
    Image,
    JsonOutput,
    Needle,
    Ocr,
    ResponsesApi,
    Smoke,
    ThinkingControl,
)
from anvil_ctl.qualify.gates.host import LogAudit, VramReserve
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
