"""The tool-use example's calculator as an MCP server (FastMCP, stdio): what examples/tool_agent_mcp.yaml trains with.

    python examples/mcp_calculator.py            # speaks MCP on stdin/stdout
    python examples/mcp_calculator.py --port N   # streamable HTTP at http://127.0.0.1:N/mcp

The same tool the tiny model was trained on (``agentrl.model.arith_data.CALCULATOR_TOOL``): the
name, the description and the one string argument, so the prompt the model reads is the Python
tool's to the token (agentrl drops the schema titles FastMCP adds). A bad expression is an error
result, which the env shows the model as ``error: calculator failed: ...``.
"""

from __future__ import annotations

import sys

from mcp.server.fastmcp import FastMCP

from agentrl.model.arith_data import calculate

server = FastMCP("calculator", log_level="WARNING")  # not a rich log line per request on stderr


@server.tool()
def calculator(expression: str) -> str:
    """Evaluate an integer arithmetic expression."""
    return calculate(expression)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--port":
        server.settings.host, server.settings.port = "127.0.0.1", int(sys.argv[2])
        server.run("streamable-http")
    else:
        server.run()
