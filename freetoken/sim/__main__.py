"""``python -m freetoken.sim cache|project ...``: the ``freetoken sim`` command, standalone."""

import argparse
import sys

from freetoken.sim import cli


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m freetoken.sim")
    sub = parser.add_subparsers(dest="command")
    cli.register(sub)
    args = parser.parse_args(["sim", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
