"""A strict HTML checker for the pages the project writes (the DAG trace, the run report)."""

from __future__ import annotations

from html.parser import HTMLParser


class PageChecker(HTMLParser):
    """Checks nesting, collects script bodies and every src/href, like a strict browser would not."""

    VOID = {
        "area",
        "base",
        "br",
        "col",
        "embed",
        "hr",
        "img",
        "input",
        "link",
        "meta",
        "source",
        "track",
        "wbr",
    }

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.problems: list[str] = []
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self.links: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        self.links += [value or "" for name, value in attrs if name in ("src", "href", "xlink:href")]
        if tag == "script":
            self.scripts.append((attributes, ""))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.links += [value or "" for name, value in attrs if name in ("src", "href", "xlink:href")]

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()

    def handle_data(self, data):
        if self.stack and self.stack[-1] == "script":
            attributes, body = self.scripts[-1]
            self.scripts[-1] = (attributes, body + data)
        else:
            self.text.append(data)
