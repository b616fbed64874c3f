"""`gpuwatchd report SUBJECT`: one archive with what a vendor's ticket needs
about a subject, most often a GPU quarantined for good.

The members, in one folder named after the subject and the time:

- manifest.json: what the bundle is, the subject and its board, where each
  part came from, each member's size and SHA-256, what was left out;
- status.json: the subject's health, findings (every field of a Finding)
  and quarantine, from the daemon's API when it answers, else as the state
  database last saved them;
- journal.json: the subject's journal, oldest first. A board's entries are
  those that hold its UUID; entries of its subjects that hold no UUID
  (journaled before entries held one) are matched by the index the board
  has now, and marked `matched_by: index`: they may be another board's, if
  the GPUs were renumbered since;
- identity.json: the board as NVML names it now (UUID, serial, part number,
  VBIOS, driver), or as its last saved sample did when NVML does not;
- canary.json: the canaries' verdicts on it with their evidence (canary,
  seed, expected and actual bits, SMs and lanes) and its mismatch records
  (the re-run on it, the sibling and the sibling's result);
- dcgm.json: the DCGM runs `canary --dcgm` recorded for it, with their
  findings and dcgmi's output;
- capture.json: the node's NVML and InfiniBand answers (`gpuwatchd capture`).

Every member is redacted (redact.py): no token, secret or host name is in
the archive; `--anonymize` replaces UUIDs, serials and node GUIDs too. A
tar.gz, as Linux support tooling makes and reads them (sosreport,
nvidia-bug-report.sh's gzip): `tar tzf` lists it anywhere; members are
written with fixed owners and modes so the same inputs give the same bytes.
"""

from gpuwatchd.report.bundle import Bundle, build, default_path, summary, write
from gpuwatchd.report.held import Held, SubjectError, from_daemon, from_database

__all__ = [
    "Bundle",
    "Held",
    "SubjectError",
    "build",
    "default_path",
    "from_daemon",
    "from_database",
    "summary",
    "write",
]
