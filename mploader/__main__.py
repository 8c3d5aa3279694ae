"""``python -m mploader trace-summary run.json``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mploader")
    commands = parser.add_subparsers(dest="command", required=True)
    summary = commands.add_parser("trace-summary", help="summarize a DataLoader(trace=...) file")
    summary.add_argument("path")
    summary.add_argument("--slowest", type=int, default=5)
    arguments = parser.parse_args(argv)
    from mploader.monitor.trace_summary import summarize

    print(summarize(arguments.path, arguments.slowest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
