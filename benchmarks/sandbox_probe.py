"""Run one piece of code through the python tool exactly as the agent loop does, and report what it did to this
process (the "trainer"): the misuse round's sandbox cases (``benchmarks/misuse_cases_sandbox.py``).

    python benchmarks/sandbox_probe.py 'import os; print(os.getuid())'

``{trainer_pid}`` in the code is replaced with this process's pid (the worst case: the code knows its target).
Prints one JSON object: the tool's answer as the model would see it (``response``, ``tool_error``) and this
process's niceness and CPU affinity before and after the call. Exit 0 when the call came back (whatever the
tool answered), 2 when the tool refused to start (its one-line reason on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("code")
    parser.add_argument("--config", default="{}", help="the tool's config, as JSON")
    args = parser.parse_args(argv)
    from verl.tools import ToolError
    from verl.tools.python_sandbox import PythonTool

    try:
        tool = PythonTool(json.loads(args.config))
    except ValueError as error:
        print(f"config error: python tool: {error}", file=sys.stderr)
        return 2
    before = {"nice": os.getpriority(os.PRIO_PROCESS, 0), "affinity": sorted(os.sched_getaffinity(0))}
    code = args.code.replace("{trainer_pid}", str(os.getpid()))
    try:
        response, _, _ = asyncio.run(tool.execute("probe", {"code": code}))
        answer, failed = response.text, False
    except ToolError as error:
        answer, failed = str(error), True
    after = {"nice": os.getpriority(os.PRIO_PROCESS, 0), "affinity": sorted(os.sched_getaffinity(0))}
    # the code's own traceback is what the model should see; the round reads this header as the probe's crash
    answer = answer.replace("Traceback (most recent call last)", "[the code's traceback]")
    print(json.dumps({"response": answer, "tool_error": failed, "before": before, "after": after}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
