"""Write the list of the original verl's config keys that verl's launch scripts may set.

The compatibility layer (``verl/config/verl_compat.py``) must know every key a verl launch script can set
in order to accept it, map it or refuse it by name. The list is taken from verl's own generated configs,
at several releases (a script written for an older release still sets its keys), and saved as
``verl/config/verl_keys/<config>.json``: ``{key: {"default": value, "since": release, "until": release}}``
(``until`` is the last release that had the key, null while the newest still has it).

Run it against a git clone of https://github.com/verl-project/verl (no work tree needed)::

    python scripts/extract_verl_keys.py /path/to/verl.git
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

OUT = Path(__file__).resolve().parent.parent / "verl" / "config" / "verl_keys"

# (release, path of the full PPO config at that release): before v0.5 the YAML was written by hand.
PPO_SOURCES = [
    ("v0.4.1", "verl/trainer/config/ppo_trainer.yaml"),
    ("v0.5.0", "verl/trainer/config/_generated_ppo_trainer.yaml"),
    ("v0.6.0", "verl/trainer/config/_generated_ppo_trainer.yaml"),
    ("v0.7.0", "verl/trainer/config/_generated_ppo_trainer.yaml"),
    ("v0.8.0", "verl/trainer/config/_generated_ppo_trainer.yaml"),
    ("v0.9.0", "verl/trainer/config/_generated_ppo_trainer.yaml"),
    ("1dda039b9", "verl/trainer/config/_generated_ppo_trainer.yaml"),
]
# fsdp_sft_trainer's config until v0.7, then the engine-based sft_trainer's.
SFT_SOURCES = [
    ("v0.4.1", "verl/trainer/config/sft_trainer.yaml"),
    ("v0.5.0", "verl/trainer/config/sft_trainer.yaml"),
    ("v0.6.0", "verl/trainer/config/sft_trainer.yaml"),
    ("v0.7.0", "verl/trainer/config/sft_trainer.yaml"),
    ("v0.7.0", "verl/trainer/config/sft_trainer_engine.yaml"),
    ("v0.9.0", "verl/trainer/config/sft_trainer_engine.yaml"),
    ("1dda039b9", "verl/trainer/config/sft_trainer_engine.yaml"),
]


def _leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted leaf keys of a YAML mapping; an empty mapping is a leaf (a free-form section)."""
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "defaults" and not prefix:  # Hydra's composition list, not a key
                continue
            out.update(_leaves(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def _load(repo: str, release: str, path: str) -> dict[str, Any]:
    text = subprocess.run(
        ["git", "--git-dir", repo, "show", f"{release}:{path}"], capture_output=True, text=True, check=True
    ).stdout
    return yaml.safe_load(text) or {}


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merge(out[key], value) if both else value
    return out


def _compose(repo: str, release: str, path: str) -> dict[str, Any]:
    """A config with its Hydra defaults list applied (``group@package: name`` entries, then ``_self_``):
    enough for verl's configs, which use no overrides or optional entries in their defaults."""
    root = "verl/trainer/config"
    node = _load(repo, release, path)
    composed: dict[str, Any] = {}
    for entry in node.pop("defaults", []) or []:
        if entry == "_self_" or not isinstance(entry, dict):
            continue
        for group, name in entry.items():
            group, _, package = str(group).partition("@")
            sub = _compose(repo, release, f"{root}/{group}/{name}.yaml")
            for part in reversed((package or group).split(".")):
                sub = {part: sub}
            composed = _merge(composed, sub)
    return _merge(composed, node)


def _keys_at(repo: str, release: str, path: str) -> dict[str, Any]:
    return _leaves(_compose(repo, release, path))


def extract(repo: str, sources: list[tuple[str, str]]) -> dict[str, dict[str, Any]]:
    """Union of the keys over the releases: the newest default, the first and last release with the key."""
    table: dict[str, dict[str, Any]] = {}
    newest: set[str] = set()
    for release, path in sources:
        keys = _keys_at(repo, release, path)
        newest = set(keys) if release == sources[-1][0] else newest
        for key, default in keys.items():
            entry = table.setdefault(key, {"default": default, "since": release, "until": None})
            entry["default"] = default
            entry["until"] = release
    for key, entry in table.items():
        if key in newest:
            entry["until"] = None
    return dict(sorted(table.items()))


def _write(name: str, table: dict[str, dict[str, Any]]) -> None:
    lines = [f"  {json.dumps(k)}: {json.dumps(v, default=str)}" for k, v in table.items()]
    (OUT / f"{name}.json").write_text("{\n" + ",\n".join(lines) + "\n}\n")
    print(f"{name}: {len(table)} keys -> {OUT / (name + '.json')}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("repo", help="git directory of a verl clone (e.g. verl/.git or a bare mirror)")
    args = parser.parse_args()
    _write("ppo_trainer", extract(args.repo, PPO_SOURCES))
    _write("sft_trainer", extract(args.repo, SFT_SOURCES))


if __name__ == "__main__":
    main()
