"""Are two runs' metrics the same, step by step? Compares every non-timing metric of two metrics.jsonl files.

    python benchmarks/compare_metrics.py outputs/before/metrics.jsonl outputs/after/metrics.jsonl

Timing and throughput metrics (``timing_s/``, ``timing_per_token_ms/``, ``perf/``) differ run to run and are skipped; every other
key must be present in both and equal to the last bit. Prints the first differences, or IDENTICAL.
Used to show that a refactor left a run's arithmetic unchanged (same seed, same thread count).
"""

from __future__ import annotations

import json
import sys

SKIP = ("timing_s/", "timing_per_token_ms/", "perf/")
"""verl.trainer.metrics.WALL_CLOCK_PREFIXES, written out: this script reads JSON only (no torch to import)"""


def load(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def differences(a: list[dict], b: list[dict], skip: tuple[str, ...] = SKIP) -> list[str]:
    """Every difference of two runs' rows, step by step, in the keys not starting with one of ``skip``."""
    found = []
    if len(a) != len(b):
        found.append(f"{len(a)} vs {len(b)} rows")
    for ra, rb in zip(a, b, strict=False):
        keys_a = {k for k in ra if not k.startswith(skip)}
        keys_b = {k for k in rb if not k.startswith(skip)}
        if keys_a != keys_b:
            found.append(f"step {ra.get('step')}: keys only on one side: {sorted(keys_a ^ keys_b)}")
        found += [
            f"step {ra.get('step')}: {k} {ra[k]!r} vs {rb[k]!r}"
            for k in sorted(keys_a & keys_b)
            if ra[k] != rb[k]
        ]
    return found


def main() -> int:
    a, b = load(sys.argv[1]), load(sys.argv[2])
    found = differences(a, b)
    for line in found[:20]:
        print(line)
    print(f"{len(found)} differences" if found else "IDENTICAL", f"({len(a)} rows)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
