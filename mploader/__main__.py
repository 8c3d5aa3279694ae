"""``python -m mploader trace-summary run.json``, ``python -m mploader top [--once]``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mploader")
    commands = parser.add_subparsers(dest="command", required=True)
    summary = commands.add_parser("trace-summary", help="summarize a DataLoader(trace=...) file")
    summary.add_argument("path")
    summary.add_argument("--slowest", type=int, default=5)
    top = commands.add_parser("top", help="live view of this user's running loaders")
    top.add_argument("--once", action="store_true", help="print one plain-text frame and exit")
    top.add_argument("--pid", type=int, help="only the loaders of this process (or worker)")
    top.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    arguments = parser.parse_args(argv)
    if arguments.command == "top":
        if arguments.interval <= 0:
            parser.error("top: --interval must be more than 0 seconds")
        from mploader.monitor.top import run

        return run(arguments.once, arguments.pid, arguments.interval)
    from mploader.monitor.trace_summary import TraceError, summarize

    try:
        print(summarize(arguments.path, arguments.slowest))
    except TraceError as error:  # the file's problem, in one line: no traceback
        print(f"{parser.prog} trace-summary: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
