"""A griffe extension (mkdocs.yml, mkdocstrings' `extensions`): rankwise's docstrings write tensor shapes and
indexing in brackets, `P = Vh[:r] [r, in]` or `R[j](atoms[k])`, which Markdown reads as reference or inline links
(and the strict build then fails on targets that cannot exist). Outside code, every "[" of a docstring is escaped, so
that shapes render as written; code spans, fenced blocks, indented blocks and doctest lines are left as they are."""

from __future__ import annotations

import re

import griffe

UNESCAPED = re.compile(r"(?<!\\)\[")  # a "[" not escaped already (an object seen twice stays as it is)
CODE_SPAN = re.compile(r"(`+)(?:.|\n)*?(?<!`)\1(?!`)")
FENCE = re.compile(r"^\s*(```|~~~)")


def _escape_text(text: str) -> str:
    """`[` -> `\\[` outside the code spans of one line."""
    out, last = [], 0
    for m in CODE_SPAN.finditer(text):
        out += [UNESCAPED.sub(r"\\[", text[last:m.start()]), m[0]]
        last = m.end()
    out.append(UNESCAPED.sub(r"\\[", text[last:]))
    return "".join(out)


def escape_brackets(docstring: str) -> str:
    lines, fenced, previous_blank, in_indented = [], False, True, False
    for line in docstring.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            lines.append(line)
            continue
        blank = not line.strip()
        # an indented block starts after a blank line; a non-indented line ends it
        in_indented = (in_indented or previous_blank) and line.startswith("    ") and not blank or (in_indented and blank)
        previous_blank = blank
        code = fenced or in_indented or line.lstrip().startswith((">>>", "..."))
        lines.append(line if code else _escape_text(line))
    return "\n".join(lines)


class EscapeShapes(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **_: object) -> None:
        if not isinstance(obj, griffe.Alias) and obj.docstring is not None:
            obj.docstring.value = escape_brackets(obj.docstring.value)
