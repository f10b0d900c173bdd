"""The `autoteardown` command, as `python -m autoteardown` and through cli.main/cli.run (the
console scripts `autoteardown` and `autoteardown-run` call these)."""

import os
import re
import sys
import time

from helpers import ROOT, python

# The interpreter's arguments that run the command.
CLI = ["-m", "autoteardown"]
# autoteardown-run, without needing the console script installed.
RUN_ALIAS = ["-c", "import sys; from autoteardown.cli import run; sys.exit(run())"]


def cli(*args, command=CLI, timeout=60):
    return python([*command, *args], shim=False, pythonpath=ROOT, timeout=timeout)


def variables_in_the_source():
    names = set()
    for folder, _, files in os.walk(ROOT / "autoteardown"):
        for name in files:
            if name.endswith(".py"):
                text = open(os.path.join(folder, name)).read()
                names |= set(re.findall(r"\bAUTOTEARDOWN_[A-Z][A-Z_]*[A-Z]\b", text))
    return names


def test_version():
    from autoteardown import __version__

    for command in (CLI, RUN_ALIAS):
        result = cli("--version", command=command)
        assert result.returncode == 0 and result.stdout.strip() == f"autoteardown {__version__}", result


def test_run_passes_the_exit_status_through_with_or_without_dashes():
    for command, prefix in ((CLI, ["run"]), (RUN_ALIAS, [])):
        for dashes in ([], ["--"]):
            result = cli(*prefix, *dashes, sys.executable, "-c", "import sys; sys.exit(3)", command=command)
            assert result.returncode == 3, (command, dashes, result)


def test_run_leaves_the_commands_own_options_alone():
    code = "import sys, autoteardown; print(sys.argv[1:])"
    result = cli("run", sys.executable, "-c", code, "-d", "--version", "--", "x")
    assert result.returncode == 0 and result.stdout.strip() == "['-d', '--version', '--', 'x']", result


def test_debug_flag_sets_the_variable_for_the_command_only():
    code = "import os; print(os.environ.get('AUTOTEARDOWN_DEBUG'))"
    for args in (["-d", "run"], ["run", "-d"], ["run", "--debug", "--"]):
        result = cli(*args, sys.executable, "-c", code)
        assert result.returncode == 0 and result.stdout.strip() == "1", (args, result)
    assert cli("run", sys.executable, "-c", code).stdout.strip() == "None"
    result = cli("-d", sys.executable, "-c", code, command=RUN_ALIAS)
    assert result.stdout.strip() == "1", result


def test_help_lists_every_variable():
    names = variables_in_the_source()
    assert {"AUTOTEARDOWN_DEBUG", "AUTOTEARDOWN_TIMEOUT", "AUTOTEARDOWN_REPORT"} <= names
    for command, args in ((CLI, ["--help"]), (CLI, ["run", "--help"]), (RUN_ALIAS, ["--help"])):
        result = cli(*args, command=command)
        assert result.returncode == 0, result
        missing = [n for n in names if n not in result.stdout]
        assert missing == [], (args, missing, result.stdout)
    out = cli("--help").stdout
    for sub in ("run", "doctor", "demo", "sitecustomize-path"):
        assert re.search(rf"^    {sub}\b", out, re.M), out


def test_argparse_style_errors():
    for args, command in ((["bogus"], CLI), (["--bogus"], CLI), (["run"], CLI), ([], RUN_ALIAS),
                          (["demo", "--only", "nothing"], CLI)):
        result = cli(*args, command=command)
        assert result.returncode == 2, (args, result)
        assert result.stderr.startswith("usage:") and "error:" in result.stderr, (args, result)
        assert "Traceback" not in result.stderr
    assert cli().returncode == 2  # no subcommand: the help, as an error


def test_a_missing_command_is_127():
    result = cli("run", "no-such-command-here")
    assert result.returncode == 127 and "no-such-command-here" in result.stderr, result


def test_demo_help_does_not_run_the_demo():
    started = time.monotonic()
    result = cli("demo", "--help")
    assert result.returncode == 0 and "usage:" in result.stdout and "[1/" not in result.stdout, result
    assert time.monotonic() - started < 20


def test_sitecustomize_path_activates_python():
    result = cli("sitecustomize-path")
    assert result.returncode == 0, result
    entries = result.stdout.strip().split(os.pathsep)
    assert os.path.isfile(os.path.join(entries[0], "sitecustomize.py")), entries
    probe = python("import sys; print('autoteardown' in sys.modules)", shim=False, pythonpath=result.stdout.strip(),
                   timeout=60)
    assert probe.stdout.strip() == "True", probe


def test_cli_startup_imports_no_library():
    code = ("import sys, io, contextlib; from autoteardown import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    cli.main(['sitecustomize-path']); cli.main(['--version'])\n"
            "print(sorted(m for m in ('torch', 'wandb', 'ray', 'psutil', 'wrapt') if m in sys.modules))")
    result = python(code, shim=False, pythonpath=ROOT, timeout=60)
    assert result.stdout.strip() == "[]", result
