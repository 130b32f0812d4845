"""python-ironicclient's `baremetal` CLI for the Rust tests (tests/clients.rs), one command per
line of JSON (its argv) on stdin, each answered by one line of JSON
({"rc", "stdout", "stderr"}) on stdout.

Every command runs the CLI's own entry point (`ironicclient.shell.main`, what
`.venv/bin/baremetal` runs) with a fresh cliff App, its own stdout and stderr and logging
set up anew, as a new process would. Only the imports are shared: they cost ~0.8 s of CPU per
`baremetal` process, paid here once per test thread instead of once per command (the CLI
tests ran ~230 of them).
"""

import contextlib
import io
import json
import logging
import sys
import traceback

sys.argv[0] = "baremetal"  # cliff names the program after it when the module is imported
from ironicclient import shell  # noqa: E402


def fresh_logging():
    """Forget every handler a previous command's App installed (they hold its old streams)."""
    loggers = [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    for lg in loggers:
        for h in list(lg.handlers):
            lg.removeHandler(h)
        lg.propagate = True
        lg.setLevel(logging.NOTSET)
    logging.getLogger().setLevel(logging.WARNING)


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    fresh_logging()
    sys.argv = ["baremetal"] + argv
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = shell.main(argv)
        except SystemExit as e:  # argparse errors and --help exit this way
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # noqa: B902 - a crash is the command's failure, not ours
            traceback.print_exc()
            rc = 1
    return {"rc": rc or 0, "stdout": out.getvalue(), "stderr": err.getvalue()}


def main():
    for line in sys.stdin:
        reply = run(json.loads(line))
        sys.__stdout__.write(json.dumps(reply) + "\n")
        sys.__stdout__.flush()


if __name__ == "__main__":
    main()
