"""The ``devrng`` command (also ``python -m devrng``): ``doctor``, ``selftest``, ``check-resume``
and ``check-determinism``.

Arguments are parsed before anything heavy is imported, so ``devrng``,
``devrng --help`` and ``devrng --version`` answer at once; torch is imported
when a command runs. A problem of the environment (a closed pipe, a full disk,
a backend that fails) is one line or one table row, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from devrng import __version__


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="devrng",
        description="Random number generation in PyTorch that is correct on every device: "
                    "check this machine's setup.",
    )
    parser.add_argument("--version", action="version", version=f"devrng {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    doctor = sub.add_parser(
        "doctor", help="backends, versions, determinism settings and known problems",
        description="Report installed backends, whether they work, determinism settings, "
                    "environment variables and known problems of the installed versions.")
    doctor.add_argument("--load", action="store_true",
                        help="import installed device packages (torch_xla, torchax) and check "
                             "that each backend works: device count, a draw, a state round trip")
    doctor.add_argument("--all", action="store_true",
                        help="also list device types this torch build cannot have")
    sub.add_parser(
        "selftest", help="fork, snapshot, seeding and seeded_jit round trips on every backend",
        description="Run fork, snapshot, seeding and seeded_jit round trips on every available "
                    "backend, printing a row as each finishes; exit 1 on any failure.")
    check = sub.add_parser(
        "check-resume", help="does your training script resume exactly? (for your CI)",
        usage="devrng check-resume [--steps N] [--stop K] [--keep DIR] -- COMMAND ...",
        description="Run COMMAND (a training script that uses devrng.TrainingRNG or a devrng "
                    "trainer integration) three times, each in a fresh working directory: "
                    "uninterrupted, stopped right after its first checkpoint at or after step K, "
                    "and resumed from that checkpoint; then compare the flight records of the "
                    "uninterrupted and the resumed run step by step. Exit 0 when the resume is "
                    "exact, 1 when it differs (the first differing step is named), 2 when it "
                    "could not be checked.")
    _run_options(check, "check fails")
    check.add_argument("--stop", type=int, metavar="K",
                       help="stop after the first checkpoint at or after step K (default: half "
                            "of the uninterrupted run's steps)")
    same = sub.add_parser(
        "check-determinism", help="do two runs of your training script from one seed match? "
                                  "where do they part?",
        usage="devrng check-determinism [--steps N] [--runs R] [--keep DIR] [--no-locate] "
              "-- COMMAND ...",
        description="Run COMMAND (a training script that uses devrng.TrainingRNG or a devrng "
                    "trainer integration) R times from scratch with one seed, each in a fresh "
                    "working directory, and compare their flight records step by step. Exit 0 "
                    "when every step matches; 1 when they differ: the first differing step is "
                    "named with what differed first (generators, data order, batch content, or "
                    "the computation), and a difference in the computation is located to its "
                    "module and op by two more runs of that step; 2 when it could not check.")
    _run_options(same, "runs differ")
    same.add_argument("--runs", type=int, default=2, metavar="R",
                      help="how many runs to compare (default 2)")
    same.add_argument("--no-locate", action="store_true",
                      help="do not run the script again to name the module and op of a "
                           "difference in the computation")
    return parser


def _run_options(check: argparse.ArgumentParser, kept: str) -> None:
    """What both checks that launch runs take: --steps, --keep and the command."""
    check.add_argument("--steps", type=int, metavar="N",
                       help="end each run after step N (default: let the script finish)")
    check.add_argument("--keep", metavar="DIR",
                       help="keep the runs' directories, records and output in DIR (kept "
                            f"anyway when the {kept})")
    check.add_argument("command_", nargs=argparse.REMAINDER, metavar="COMMAND",
                       help="after '--': the command that trains, e.g. python train.py")


def main(argv: Sequence[str] | None = None) -> int:
    if sys.stdout is None:  # started with standard output closed: `devrng doctor >&-`
        print("devrng: standard output is closed, so there is nowhere to write the report; "
              "run it with standard output open (a terminal, a pipe or a file).", file=sys.stderr)
        return 1
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command.startswith("check-"):
        command = args.command_[1:] if args.command_[:1] == ["--"] else args.command_
        if args.command == "check-resume":
            from devrng._checks.check_resume import check_resume

            return check_resume(command, steps=args.steps, stop=args.stop, keep=args.keep)
        from devrng._checks.check_determinism import check_determinism

        return check_determinism(command, steps=args.steps, runs=args.runs, keep=args.keep,
                                 locate=not args.no_locate)
    from devrng import _cli  # the commands import torch: only now

    try:
        code = _cli.doctor(load=args.load, everything=args.all) if args.command == "doctor" \
            else _cli.selftest()
        sys.stdout.flush()
    except BrokenPipeError:  # `devrng doctor | head -1`: the reader has what it wanted
        _silence_stdout()
        return 0
    except OSError as err:  # `devrng doctor > /dev/full`
        _silence_stdout()
        print(f"devrng {args.command}: could not write the report ({err.strerror or err}).",
              file=sys.stderr)
        return 1
    return code


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
