"""Tool calls in model output (the Hermes/Qwen2.5 parser moves into a package of families)."""

from agentrl.toolcalls.hermes import ParsedToolCalls, ToolCall, parse_tool_calls

__all__ = ["ParsedToolCalls", "ToolCall", "parse_tool_calls"]
