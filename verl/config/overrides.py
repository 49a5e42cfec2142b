"""verl's command line: Hydra-style overrides, parsed without Hydra.

verl's launch scripts pass their settings as Hydra overrides::

    key=value       set a key
    +key=value      add a key (Hydra refuses it for a key that exists; accepted here either way)
    ++key=value     add or set
    ~key            remove a key (here: back to the schema default); ~key=value removes it only if it has that value

Values are YAML as OmegaConf reads them (``1e-6`` is a float, ``[a,b]`` a list, ``null`` None, ``'x'`` a
string), as Hydra's grammar does for everything verl's scripts write; an empty value is the empty string, as in
Hydra. Hydra's multirun sweeps (``a,b``, ``range(..)``) have no meaning in one run and are not expanded.
(Hydra itself is not a dependency: its releases pin an older OmegaConf than this package needs.)
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


def parse_value(text: str) -> Any:
    """A value as OmegaConf reads it from a dotlist (YAML with OmegaConf's float rules); '' stays ''."""
    if text == "":
        return ""
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


@dataclass
class CommandLine:
    """A verl launch command line split into Hydra's flags and the overrides."""

    config_path: str | None = None
    """--config-path / -cp: directory of the config file"""
    config_name: str | None = None
    """--config-name / -cn: config file name (``.yaml`` optional) or one of our recipes"""
    print_config: bool = False
    """--print-config, or Hydra's ``--cfg job``: print the resolved config and what each verl key does here"""
    overrides: list[str] | None = None
    """the overrides, as typed"""


_VALUE_FLAGS = {
    "--config-path": "config_path",
    "-cp": "config_path",
    "--config-name": "config_name",
    "-cn": "config_name",
}
_UNSUPPORTED = {
    "--multirun": "Hydra multirun sweeps (-m/--multirun) start many runs; start one run per setting instead",
    "-m": "Hydra multirun sweeps (-m/--multirun) start many runs; start one run per setting instead",
    "--config-dir": "--config-dir adds a config search path; give the file with --config-path and --config-name",
    "-cd": "--config-dir adds a config search path; give the file with --config-path and --config-name",
    "--info": "Hydra's --info is not available; --print-config shows the resolved config",
    "--run": "Hydra's --run is implied",
}


def split_command_line(argv: list[str]) -> CommandLine:
    """Separate Hydra's flags (``--config-path X``, ``--config-path=X``, ``--cfg job``) from the overrides."""
    line = CommandLine(overrides=[])
    assert line.overrides is not None
    i = 0
    while i < len(argv):
        arg = argv[i]
        flag, eq, inline = arg.partition("=")
        if flag in _VALUE_FLAGS:
            if eq:
                value = inline
            elif i + 1 < len(argv):
                i += 1
                value = argv[i]
            else:
                raise ConfigError(f"{flag} needs a value")
            setattr(line, _VALUE_FLAGS[flag], value)
        elif arg in ("--print-config", "--cfg", "-c"):
            line.print_config = True
            if arg != "--print-config" and i + 1 < len(argv) and argv[i + 1] in ("job", "all", "hydra"):
                i += 1
        elif flag in _UNSUPPORTED:
            raise ConfigError(_UNSUPPORTED[flag])
        elif arg.startswith("-"):  # an override never starts with '-'
            raise ConfigError(
                f"unknown option {flag!r}; options: --config-path, --config-name, --print-config (or --cfg job)"
            )
        else:
            line.overrides.append(arg)
        i += 1
    return line
