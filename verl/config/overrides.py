"""verl's command line: Hydra-style overrides, parsed without Hydra.

verl's launch scripts pass their settings as Hydra overrides::

    key=value       set a key
    +key=value      add a key (Hydra refuses it for a key that exists; accepted here either way)
    ++key=value     add or set
    ~key            remove a key (here: back to the entry point's default); ~key=value only if it has that value

Values follow Hydra's grammar: ``true`` / ``false`` (any case) are booleans, ``null`` is None, ``42`` and
``1_000`` integers, ``1e-6``, ``.5``, ``inf`` and ``nan`` (also YAML's ``.inf``, ``.nan``) floats, ``'x'`` / ``"x"`` quoted strings, ``[a,b]`` and
``{a: 1}`` lists and mappings (read as YAML flow collections), ``${...}`` interpolations; anything else,
``yes``, ``on``, ``010`` and ``1:30`` included, is the string as written (YAML would read those four as
True, True, 8 and 90). An empty value is the empty string. Hydra's multirun sweeps (``a,b``, ``range(..)``)
have no meaning in one run and are not expanded. (Hydra itself is not a dependency: its releases pin an
older OmegaConf than this package needs.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from verl.config.errors import ConfigError

KEY_RE = re.compile(r"[A-Za-z_][\w\-]*(\.[\w\-@]+)*")
"""a dotted key: sections and names of letters, digits, ``_`` and ``-`` (Hydra also allows ``@`` in packages)"""


@dataclass(frozen=True)
class Override:
    """One command-line override, parsed."""

    op: str
    """set | add (``+``) | force_add (``++``) | delete (``~``)"""
    key: str
    """dotted key"""
    value: Any = None
    """the YAML value (for delete: the value the key must have, if ``has_value``)"""
    has_value: bool = True
    """False for a bare ``~key``"""
    text: str = ""
    """the override as typed"""


_PREFIXES = (("++", "force_add"), ("+", "add"), ("~", "delete"))


_INT = re.compile(r"[+-]?(0|[1-9](_?[0-9])*)")
_FLOAT = re.compile(
    r"[+-]?(([0-9](_?[0-9])*)?\.[0-9](_?[0-9])*([eE][+-]?[0-9]+)?|[0-9](_?[0-9])*\.([eE][+-]?[0-9]+)?"
    r"|[0-9](_?[0-9])*[eE][+-]?[0-9]+|\.?inf|\.?nan)",
    re.IGNORECASE,
)


def parse_value(text: str) -> Any:
    """A value as Hydra reads it (see the module docstring); raises ConfigError for a malformed collection."""
    if text == "":
        return ""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "null":
        return None
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text.lower().replace(".inf", "inf").replace(".nan", "nan"))
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if not text.startswith(("[", "{")):
        return text
    try:
        parsed = OmegaConf.to_container(OmegaConf.from_dotlist([f"value={text}"]), resolve=False)
        return parsed["value"]
    except (yaml.YAMLError, OmegaConfBaseException) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(
            f"{first}; a list is written [a,b] and a string with YAML punctuation is quoted: key='a: b' (quote "
            "the whole override for the shell)"
        ) from None


def parse_override(text: str) -> Override:
    """Parse ``[+|++|~]key[=value]``; raises ConfigError naming the override when it is malformed."""
    if not isinstance(text, str):
        raise ConfigError(f"malformed override {text!r}: expected key=value (e.g. data.train_batch_size=16)")
    body, op = text.strip(), "set"
    for prefix, name in _PREFIXES:
        if body.startswith(prefix):
            body, op = body[len(prefix) :], name
            break
    key, sep, raw = body.partition("=")
    key = key.strip()
    if not sep and op != "delete":
        raise ConfigError(f"malformed override {text!r}: expected key=value (e.g. data.train_batch_size=16)")
    if not KEY_RE.fullmatch(key):
        raise ConfigError(f"malformed override {text!r}: expected key=value with a dotted key before '='")
    if not sep:
        return Override(op, key, None, has_value=False, text=text)
    try:
        value = parse_value(raw.strip())
    except ConfigError as e:
        raise ConfigError(f"malformed override {text!r} for {key}: {e}") from None
    return Override(op, key, value, has_value=True, text=text)


def nest(key: str, value: Any) -> dict[str, Any]:
    """``nest("a.b", 1) == {"a": {"b": 1}}``."""
    node: Any = value
    for part in reversed(key.split(".")):
        node = {part: node}
    return node
