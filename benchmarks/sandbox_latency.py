"""What the python tool's OS isolation costs: the latency of one call, isolated (bubblewrap + seccomp) and not.

    python benchmarks/sandbox_latency.py              # 100 calls each, one at a time
    python benchmarks/sandbox_latency.py --calls 20 --code "import numpy; print(numpy.ones(3).sum())"

Each call is a whole tool call as the agent loop makes it (``PythonTool.execute``: start the process, send the
code, read the output, clean up). Calls alternate between the two modes so that a machine's load drifts over
both alike; the first call of each is a warm-up and not counted. Prints the median, 10th and 90th percentile in
milliseconds and the median's difference.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import time

from verl.tools import isolation
from verl.tools.python_sandbox import PythonTool


async def _one(tool: PythonTool, code: str) -> float:
    start = time.perf_counter()
    response, _, _ = await tool.execute("bench", {"code": code})
    elapsed = time.perf_counter() - start
    if not response.text.strip():
        raise SystemExit(f"the call printed nothing: {response.text!r}")
    return elapsed * 1000.0


def measure(calls: int, code: str) -> dict[str, list[float]]:
    tools = {
        "isolated (bwrap + seccomp)": PythonTool(),
        "not isolated (isolation: none)": PythonTool({"isolation": "none"}),
    }
    times: dict[str, list[float]] = {name: [] for name in tools}
    for tool in tools.values():  # warm-up: the page cache, the seccomp program
        asyncio.run(_one(tool, code))
    for _ in range(calls):
        for name, tool in tools.items():
            times[name].append(asyncio.run(_one(tool, code)))
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--code", default="print(sum(range(10)))")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)
    sandbox = isolation.require()
    times = measure(args.calls, args.code)
    print(
        f"{args.calls} calls of {args.code!r} each; bwrap: {sandbox.bwrap}; {platform.processor() or platform.machine()}"
    )
    print("| mode | median ms | p10 ms | p90 ms |")
    print("|---|---:|---:|---:|")
    rows = {}
    for name, values in times.items():
        deciles = statistics.quantiles(values, n=10)
        rows[name] = {"median_ms": statistics.median(values), "p10_ms": deciles[0], "p90_ms": deciles[-1]}
        print(f"| {name} | {rows[name]['median_ms']:.1f} | {deciles[0]:.1f} | {deciles[-1]:.1f} |")
    isolated, bare = (rows[name]["median_ms"] for name in times)
    print(f"isolation adds {isolated - bare:.1f} ms to the median call ({isolated / bare:.2f}x)")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"calls": args.calls, "code": args.code, "rows": rows}, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
