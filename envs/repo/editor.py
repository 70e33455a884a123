"""FileEditor: the ``str_replace_editor`` tool (SWE-agent / OpenHands semantics) over a container.

What it is: the file editor models are trained with, run from the host against the episode's
container (files read and written through ``docker exec`` with ``cat``: the image needs no
Python). Commands:

  * ``view``: a file with line numbers (``cat -n`` style, ``view_range=[start, end]``, end -1
    for the last line), or a directory's files two levels deep (hidden ones left out);
  * ``create``: a new file with ``file_text`` (an existing file is refused);
  * ``str_replace``: ``old_str`` (which must occur exactly once) replaced by ``new_str``;
  * ``insert``: ``new_str`` inserted after line ``insert_line`` (0: at the top);
  * ``undo_edit``: the file as it was before its last edit.

Every mistake (a relative path, a missing file, ``old_str`` absent or not unique, a bad line
number) is a message the model reads, never an exception. Edits answer with a numbered snippet
around the change (``short``: the edited lines alone, numbered, for models with a small context). What it is not: a sandbox — the container is (``sandboxes/repo_pool.py``).
"""

from __future__ import annotations

import collections
import copy
import shlex
import typing
from collections.abc import Sequence
from typing import Any, Literal

from agentrl.errors import EnvError
from sandboxes.repo_pool import RepoSession

SNIPPET_LINES = 4
MAX_VIEW_CHARS = 16_000


def numbered(text: str, first: int = 1) -> str:
    """``cat -n``: each line with its number (6 columns, then a tab)."""
    return "\n".join(f"{i:6}\t{line}" for i, line in enumerate(text.split("\n"), start=first))


class FileEditor:
    """``str_replace_editor`` for one episode's container (its undo history is per episode); ``short``:
    an edit answers with the edited lines alone (``numbered``), not SWE-agent's snippet and advice."""

    def __init__(self, session: RepoSession, *, short: bool = False, commands: Sequence[str] | None = None) -> None:
        self.session = session
        self.short = short
        self.commands = tuple(commands or COMMANDS)  # those offered; another is refused
        self.history: dict[str, list[str]] = collections.defaultdict(list)

    async def _read(self, path: str) -> str | None:
        try:
            return (await self.session.read_file(path)).decode(errors="replace")
        except FileNotFoundError:
            return None

    async def _write(self, path: str, text: str, *, remember: str | None) -> None:
        if remember is not None:
            self.history[path].append(remember)
        await self.session.write_file(path, text.encode())

    def _snippet(self, path: str, text: str, line: int, added: int) -> str:
        lines = text.split("\n")
        if self.short:
            return numbered("\n".join(lines[line:line + added + 1]), line + 1)
        start = max(0, line - SNIPPET_LINES)
        end = min(len(lines), line + added + SNIPPET_LINES)
        return (f"The file {path} has been edited. Here's the result of running `cat -n` on a snippet of {path}:\n"
                f"{numbered(chr(10).join(lines[start:end]), start + 1)}\n"
                "Review the changes and make sure they are as expected. Edit the file again if necessary.")

    async def __call__(self, command: str, path: str, file_text: str | None = None, old_str: str | None = None,
                       new_str: str | None = None, insert_line: int | None = None,
                       view_range: list[int] | None = None) -> str:
        if command not in self.commands:
            return (f"Unrecognized command {command}. The allowed commands for the str_replace_editor tool are: "
                    f"{', '.join(self.commands)}")
        if not path.startswith("/"):
            return f"The path {path} is not an absolute path; it should start with `/` (e.g. /testbed/{path})."
        if command == "create":
            if file_text is None:
                return "Parameter `file_text` is required for command: create."
            if await self._read(path) is not None:
                return f"File already exists at: {path}. Cannot overwrite files using command `create`."
            await self._write(path, file_text, remember=None)
            return f"File created successfully at: {path}"
        if command == "view":
            return await self._view(path, view_range)
        text = await self._read(path)
        if text is None:
            return f"The path {path} does not exist or is not a file."
        if command == "str_replace":
            if old_str is None:
                return "Parameter `old_str` is required for command: str_replace."
            count = text.count(old_str)
            if count == 0:
                return f"No replacement was performed, old_str `{old_str}` did not appear verbatim in {path}."
            if count > 1:
                lines = [i + 1 for i, line in enumerate(text.split("\n")) if old_str.split("\n")[0] in line]
                return (f"No replacement was performed. Multiple occurrences of old_str `{old_str}` in lines {lines}. "
                        "Please ensure it is unique.")
            new = new_str or ""
            await self._write(path, text.replace(old_str, new), remember=text)
            line = text.split(old_str)[0].count("\n")
            return self._snippet(path, text.replace(old_str, new), line, new.count("\n"))
        if command == "insert":
            if insert_line is None or new_str is None:
                return "Parameters `insert_line` and `new_str` are required for command: insert."
            lines = text.split("\n")
            if not 0 <= insert_line <= len(lines):
                return f"Invalid `insert_line` parameter: {insert_line}. It should be within the range of lines of the file: [0, {len(lines)}]"
            updated = "\n".join(lines[:insert_line] + new_str.split("\n") + lines[insert_line:])
            await self._write(path, updated, remember=text)
            return self._snippet(path, updated, insert_line, new_str.count("\n") + 1)
        if command == "undo_edit":
            if not self.history[path]:
                return f"No edit history found for {path}."
            await self._write(path, self.history[path].pop(), remember=None)
            return f"Last edit to {path} undone successfully."
        raise AssertionError(command)  # every offered command is handled above

    async def _view(self, path: str, view_range: list[int] | None) -> str:
        kind = await self.session.exec(["sh", "-c", 'if [ -d "$1" ]; then echo dir; elif [ -f "$1" ]; then echo file; fi',
                                        "sh", path], timeout_s=30)
        if kind.output.strip() == b"dir":
            listing = await self.session.exec(
                ["sh", "-c", f"find {shlex.quote(path)} -maxdepth 2 -not -path '*/.*' | sort"], timeout_s=60)
            return (f"Here's the files and directories up to 2 levels deep in {path}, excluding hidden items:\n"
                    + listing.output.decode(errors="replace")[:MAX_VIEW_CHARS])
        text = await self._read(path)
        if text is None:
            return f"The path {path} does not exist."
        first = 1
        if view_range is not None:
            lines = text.split("\n")
            if len(view_range) != 2 or not 1 <= view_range[0] <= len(lines) or not (
                    view_range[1] == -1 or view_range[0] <= view_range[1] <= len(lines)):
                return (f"Invalid `view_range`: {view_range}. It should be [start, end] with 1 <= start <= end <= "
                        f"{len(lines)} (end -1: to the last line).")
            first = view_range[0]
            text = "\n".join(lines[first - 1:] if view_range[1] == -1 else lines[first - 1:view_range[1]])
        out = numbered(text, first)
        if len(out) > MAX_VIEW_CHARS:
            out = out[:MAX_VIEW_CHARS] + "\n<response clipped: view a smaller view_range>"
        return f"Here's the result of running `cat -n` on {path}:\n{out}\n"


Command = Literal["view", "create", "str_replace", "insert", "undo_edit"]
COMMANDS: tuple[str, ...] = typing.get_args(Command)
USES = {"view": ((), ("view_range",)), "create": (("file_text",), ()), "str_replace": (("old_str",), ("new_str",)),
        "insert": (("insert_line", "new_str"), ()), "undo_edit": ((), ())}
"""command -> (the arguments it needs, those it may take) besides ``command`` and ``path``."""


def offered_parameters(parameters: dict[str, Any], commands: Sequence[str]) -> dict[str, Any]:
    """The editor's JSON-schema ``parameters`` offering ``commands`` alone: the ``command`` enum
    cut to them, only their arguments, and those every one of them needs required (not nullable)."""
    if not commands or set(commands) - set(COMMANDS):
        raise EnvError(f"editor commands must be some of {list(COMMANDS)}, got {list(commands)}")
    needed = set.intersection(*(set(USES[c][0]) for c in commands))
    used = {"command", "path"} | {arg for c in commands for part in USES[c] for arg in part}
    props = {}
    for name, prop in parameters["properties"].items():
        if name not in used:
            continue
        prop = copy.deepcopy(prop)
        if name == "command":
            prop.update(enum=list(commands), description=f"one of {', '.join(commands)}.")
        elif name in needed:
            prop["type"] = next(t for t in prop["type"] if t != "null")
            prop.pop("default", None)
        props[name] = prop
    return {**parameters, "properties": props, "required": [n for n in props if n in {"command", "path"} | needed]}
