"""Screenshot of a run's report, as in docs/report.md: ``python scripts/report_screenshot.py RUN_DIR OUT.png``.

Builds ``RUN_DIR/report.html`` (``verl report RUN_DIR``) and photographs its top in headless Chromium
(chromium, chromium-browser or google-chrome on PATH), with the same routine as the report's browser test.
"""

from __future__ import annotations

import argparse
import sys

from verl.report.browser import find_browser, screenshot_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="the run's directory, with metrics.jsonl")
    parser.add_argument("png", help="where to write the screenshot")
    parser.add_argument("--width", type=int, default=1200, help="pixels (default 1200)")
    parser.add_argument("--height", type=int, default=1500, help="pixels (default 1500)")
    args = parser.parse_args(argv)
    if find_browser() is None:
        print("no chromium / chromium-browser / google-chrome on PATH", file=sys.stderr)
        return 2
    png = screenshot_report(args.run_dir, args.png, width=args.width, height=args.height)
    print(png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
