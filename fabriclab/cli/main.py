"""The `fabriclab` command line: verb subcommands, each registered by the module that owns it."""

import argparse
import importlib
import sys

from fabriclab.cli import running
from fabriclab.errors import LabError, Terminated

# Each module exposes register(subparsers), which adds its parser(s) and sets
# `func` (a callable taking the parsed args and returning an exit code).
COMMAND_MODULES = [
    "fabriclab.cli.machine",      # provision, doctor, fullkernel, clean
    "fabriclab.cli.fabric",       # check, specs, up, run, demo
    "fabriclab.cli.collective",
    "fabriclab.cli.replay",
    "fabriclab.cli.benchmark",
    "fabriclab.cli.model",
    "fabriclab.cli.experiment",
    "fabriclab.cli.reproduce",
    "fabriclab.cli.scenario",
    "fabriclab.cli.sweep",
    "fabriclab.cli.results",      # report, compare
    "fabriclab.cli.export",
    "fabriclab.cli.capture",
]


def build_parser():
    parser = argparse.ArgumentParser(
        prog="fabriclab",
        description="Emulation lab for AI training fabrics (Mininet + Open vSwitch + os-ken).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv=None):
    """Run one verb. Exit codes, the same everywhere (fabriclab.cli.running): 0 valid, 1 completed
    but not valid, 2 bad input or a one-line lab error, 130 interrupted (Ctrl-C, SIGTERM)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args) or running.EXIT_VALID
    except Terminated as exc:
        print(f"fabriclab: {exc}", file=sys.stderr)
        return running.EXIT_INTERRUPTED
    except LabError as exc:
        print(f"fabriclab: error: {exc}", file=sys.stderr)
        return running.EXIT_ERROR
    except KeyboardInterrupt:
        print("fabriclab: interrupted", file=sys.stderr)
        return running.EXIT_INTERRUPTED
    except BrokenPipeError:
        # `fabriclab ... | head` closed our stdout: nothing left to say, and nobody to say it to.
        sys.stdout = None
        return running.EXIT_VALID


if __name__ == "__main__":
    sys.exit(main())
