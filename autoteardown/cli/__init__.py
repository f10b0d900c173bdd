"""The command-line tools (this subpackage; everything else in autoteardown/ is the runtime):
cli (here), doctor.py, demo.py and wandb_records.py (the run-file reader the demo and the
tests use).

The `autoteardown` command (also `python -m autoteardown`), and `autoteardown-run`,
its ddtrace-run-style alias for `autoteardown run`.

    autoteardown run [-d] [--] COMMAND [ARGS...]   run COMMAND with autoteardown in every Python process
    autoteardown doctor | demo | sitecustomize-path | --version | --help

`run` puts autoteardown's bootstrap sitecustomize first on PYTHONPATH (keeping
what was there) and execs COMMAND, so the exit status and signals are
COMMAND's own. Startup stays cheap: the package's import (about 2 ms, no
torch, wandb or ray) and argparse, then the exec.
"""

import os
import sys

from ..integrations import TABLE

PROG = "autoteardown"
RUN_ALIAS = "autoteardown-run"
# Every variable, for `autoteardown --help` and the README: (name, meaning, default).
VARIABLES = (
    ("AUTOTEARDOWN_DISABLE", "1: do nothing at all", "off"),
    ("AUTOTEARDOWN_DISABLED_INTEGRATIONS", "skip these integrations, comma-separated (* for all): "
     + ",".join(TABLE), "none"),
    ("AUTOTEARDOWN_TIMEOUT", "seconds the whole exit teardown may take", "10"),
    ("AUTOTEARDOWN_RAY_GRACE_S", "seconds a terminated Ray actor gets before its process is killed", "5"),
    ("AUTOTEARDOWN_DEBUG", "1: say how it was activated, each patch, and a teardown report, on stderr", "off"),
    ("AUTOTEARDOWN_REPORT", "path.jsonl: append one JSON line per process that recorded a resource, "
     "with its teardown report", "none"),
    ("AUTOTEARDOWN_NEXT_RUNTIME_ENV_HOOK", "with RAY_RUNTIME_ENV_HOOK=autoteardown.ray_runtime_env_hook: "
     "the hook to call first (one you had set)", "none"),
)
# Set by autoteardown for the processes it starts; not for users to set.
INTERNAL_VARIABLES = ("AUTOTEARDOWN_INTERNAL_VIA", "AUTOTEARDOWN_INTERNAL_WARNED", "AUTOTEARDOWN_NEXT_SETUP_HOOK",
                      "AUTOTEARDOWN_INTERNAL_RAY_ACTOR")


def _version():
    from .. import __version__

    return __version__


def environment_help():
    lines = ["environment (read by every process autoteardown is active in):"]
    for name, meaning, default in VARIABLES:
        lines.append(f"  {name}\n      {meaning} (default: {default})")
    lines.append("  set by autoteardown for the processes it starts (not to be set by hand):\n      "
                 + ", ".join(INTERNAL_VARIABLES))
    return "\n".join(lines)


def pythonpath_entries():
    """What PYTHONPATH needs: the bootstrap folder, and the one holding the package unless
    it is a site-packages (other Pythons would load its packages)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    entries = [os.path.join(package, "bootstrap")]
    if os.path.basename(os.path.dirname(package)) not in ("site-packages", "dist-packages"):
        entries.append(os.path.dirname(package))
    return entries


def _parser(prog=PROG, run_only=False):
    import argparse

    epilog = environment_help() + (
        "\n\nexamples:\n"
        f"  {prog} python train.py\n" if run_only else
        "\n\nexamples:\n"
        f"  {prog} run python train.py          (or: autoteardown-run python train.py)\n"
        f"  {prog} run -d -- torchrun --nproc-per-node 2 train.py\n"
        f"  PYTHONPATH=$({prog} sitecustomize-path) python train.py\n")
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a subcommand's own -d must not reset the one given before it (argparse's defaults would).
    common.add_argument("-d", "--debug", action="store_true", default=argparse.SUPPRESS,
                        help="set AUTOTEARDOWN_DEBUG=1: how it was activated, each patch, a teardown report")
    common.add_argument("--version", action="version", version=f"autoteardown {_version()}")
    formatter = argparse.RawDescriptionHelpFormatter
    if run_only:
        parser = argparse.ArgumentParser(
            prog=prog, parents=[common], formatter_class=formatter, epilog=epilog,
            description="Run COMMAND with autoteardown active in every Python process it starts.")
        _add_command(parser)
        return parser
    parser = argparse.ArgumentParser(
        prog=prog, parents=[common], formatter_class=formatter, epilog=epilog,
        description="Make unmodified ML training scripts end cleanly.")
    sub = parser.add_subparsers(dest="subcommand", metavar="SUBCOMMAND")
    parser.run_parser = run = sub.add_parser("run", parents=[common], formatter_class=formatter, epilog=environment_help(),
                         help="run COMMAND with autoteardown active in every Python process it starts",
                         description="Run COMMAND with autoteardown active in every Python process it starts "
                                     "(as ddtrace-run does). The exit status is COMMAND's own.")
    _add_command(run)
    sub.add_parser("doctor", parents=[common], help="versions, integrations, config, and whether it is active here")
    demo = sub.add_parser("demo", parents=[common],
                          help="small jobs run without and with autoteardown, side by side (about a minute)",
                          description="Run small jobs that show each symptom autoteardown fixes, without and "
                                      "with it, and print what differs.")
    demo.add_argument("--only", action="append", choices=("fork", "sigterm", "ray"), metavar="JOB",
                      help="run only this job (fork, sigterm or ray; may be repeated)")
    demo.add_argument("--fail-job", choices=("fork", "sigterm", "ray"), help=argparse.SUPPRESS)  # tests only
    sub.add_parser("sitecustomize-path", parents=[common],
                   help="print what to put on PYTHONPATH: PYTHONPATH=$(autoteardown sitecustomize-path)")
    return parser


def _add_command(parser):
    import argparse

    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND [ARGS...]",
                        help="the command to run (put -- before it if it starts with -)")


def _exec(parser, command, debug):
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        parser.error("a COMMAND to run is required, e.g. python train.py")
    entries = pythonpath_entries()
    paths = entries + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in entries]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    os.environ["AUTOTEARDOWN_INTERNAL_VIA"] = "autoteardown-run"  # for the activation line (config.py)
    if debug:
        os.environ["AUTOTEARDOWN_DEBUG"] = "1"
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"{parser.prog}: {command[0]}: {exc.strerror}", file=sys.stderr)
        return 127


def main(argv=None, prog=PROG):
    """`autoteardown ...` and `python -m autoteardown ...`; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser(prog)
    # `run` takes the rest of the line as the command, options included.
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    args.debug = getattr(args, "debug", False)
    if args.debug:
        os.environ["AUTOTEARDOWN_DEBUG"] = "1"
    if args.subcommand == "run":
        return _exec(parser.run_parser, args.command, args.debug)
    if args.subcommand == "doctor":
        from .doctor import doctor

        return doctor()
    if args.subcommand == "demo":
        from .demo import demo

        return demo(fail_job=args.fail_job, only=args.only)
    if args.subcommand == "sitecustomize-path":
        print(os.pathsep.join(pythonpath_entries()))
        return 0
    parser.print_help()
    return 2


def run(argv=None):
    """`autoteardown-run [-d] [--] COMMAND ...`: the same as `autoteardown run`."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser(RUN_ALIAS, run_only=True)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    return _exec(parser, args.command, getattr(args, "debug", False))

