"""The offline tier through DCGM: `gpuwatchd canary --dcgm LEVEL`.

Runs `dcgmi diag -r LEVEL -i GPUS -j` within canary.dcgm's limit for the
level (run.py), reads its JSON in the shape DCGM publishes (output.py) and
judges it as DCGM's own tests do; each failed test is a finding on its GPU
(findings.py). Exit 0 when every test passed, 1 when one failed, 2 when it
could not run (no dcgmi, no host engine, output that is no diagnostic, past
its limit). The run, every result and dcgmi's output make a `DcgmRun`,
recorded by board (store/dcgm.py) for `gpuwatchd report`.

The daemon never runs this: the diagnostic takes the GPU, for seconds to
hours. It only keeps the runs the CLI sends it while it holds the database.
"""

from gpuwatchd.dcgm.findings import FAILED_CODE, NOT_RUN_CODE, describe, findings
from gpuwatchd.dcgm.output import DcgmResult, DcgmWarning, OutputError, parse_output
from gpuwatchd.dcgm.run import (
    EXIT_CANNOT_RUN,
    EXIT_FAIL,
    EXIT_PASS,
    DcgmBoard,
    DcgmRun,
    record_run,
    run_diagnostic,
    run_of,
)

__all__ = [
    "EXIT_CANNOT_RUN",
    "EXIT_FAIL",
    "EXIT_PASS",
    "FAILED_CODE",
    "NOT_RUN_CODE",
    "DcgmBoard",
    "DcgmResult",
    "DcgmRun",
    "DcgmWarning",
    "OutputError",
    "describe",
    "findings",
    "parse_output",
    "record_run",
    "run_diagnostic",
    "run_of",
]
