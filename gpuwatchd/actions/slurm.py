"""Slurm: drain the node on quarantine, resume it on release, through `scontrol`.

- A node quarantine (and, with `gpu_quarantine: drain`, a GPU's or NVLink's)
  drains the node: `scontrol update NodeName=<node> State=DRAIN
  Reason="gpuwatchd: <subject> <reason>"`. Running jobs finish; no new ones
  start. A node already drained, by anyone, is left as it is.
- When nothing wants the drain any more, the node is resumed (`State=RESUME`)
  only if `scontrol show node` says it is drained with a reason gpuwatchd
  wrote (`gpuwatchd:`) and the journal records that drain: another admin's
  drain is never lifted, nor one this daemon no longer knows the reason for
  (its state was lost), which stays with a finding on the node.
- Quarantined parts that do not drain (a GPU with `gpu_quarantine: mark`, an
  InfiniBand port) are written to the node's Comment (`gpuwatchd: ...`),
  which `scontrol show node` and `sinfo -O comment` show; a Comment someone
  else wrote is left alone. Slurm cannot take a single GPU out of service
  without a GRES reconfiguration, so marking is all it can do for one.

Every `scontrol` call has a timeout; a failure raises ActionFailed with the
finding code `slurm_<show|drain|resume|comment>_failed`.
"""

from __future__ import annotations

import shlex
import socket
from dataclasses import dataclass

from gpuwatchd.actions.scheduler import (
    ActionFailed,
    Gate,
    Journaled,
    Outcome,
    SchedulerConfig,
    Want,
    want_of,
)
from gpuwatchd.process import TimedOut, run_bounded
from gpuwatchd.snapshot import Snapshot

OURS = "gpuwatchd:"
NULL = "(null)"


@dataclass(frozen=True)
class SlurmConfig(SchedulerConfig):
    # The scontrol to run: a name looked up on PATH, or a path.
    scontrol: str = "scontrol"


@dataclass(frozen=True)
class NodeState:
    """What `scontrol show node` says about the drain and the comment."""

    flags: tuple[str, ...]  # State=IDLE+DRAIN -> ("IDLE", "DRAIN")
    reason: str
    comment: str

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags

    @property
    def drained_by_us(self) -> bool:
        return self.drained and self.reason.startswith(OURS)


def parse_show_node(text: str) -> NodeState:
    """`scontrol show node` output. Reason and Comment hold spaces and are
    printed last on their own line, so they run to the end of it."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        stripped = line.strip()
        key, sep, value = stripped.partition("=")
        if sep and key in ("Reason", "Comment"):
            fields[key] = value
            continue
        for token in stripped.split():
            name, sep, value = token.partition("=")
            if sep:
                fields.setdefault(name, value)
    comment = fields.get("Comment", "")
    return NodeState(
        flags=tuple(fields.get("State", "").split("+")),
        reason=fields.get("Reason", ""),
        comment="" if comment == NULL else comment,
    )


def short_hostname() -> str:
    return socket.gethostname().split(".")[0]


class Slurm:
    name = "slurm"

    def __init__(self, config: SlurmConfig) -> None:
        self.config = config
        self.node = config.node_name or short_hostname()

    def want(self, snapshot: Snapshot) -> Want:
        return want_of(snapshot, self.config.gpu_quarantine, conditions=False)

    def plan(self, before: Want, after: Want) -> list[str]:
        lines = []
        if after.drain and not before.drain:
            lines.append(f"run: {self._command(self._drain_args(after))}")
        elif before.drain and not after.drain:
            lines.append(f"run: {self._command(self._resume_args())} (if gpuwatchd drained it)")
        if after.mark_text != before.mark_text:
            lines.append(f"run: {self._command(self._comment_args(after.mark_text or ''))}")
        return lines

    def apply(self, want: Want, gate: Gate, journaled: Journaled, done: list[str]) -> Outcome:
        state = parse_show_node(self._run(["show", "node", self.node], "slurm_show_failed"))
        drained, withheld, drained_for = state.drained_by_us, None, None
        if want.drain and not state.drained:
            verdict = gate() if want.automatic else None
            if verdict is not None and not verdict.allowed:
                withheld = verdict.reason
            else:
                self._run(self._drain_args(want), "slurm_drain_failed")
                done.append(f"drained {self.node}: {want.drain_reason}")
                drained, drained_for = True, want.drain_reason
        elif not want.drain and state.drained_by_us:
            if not journaled(state.reason):
                raise ActionFailed(
                    "slurm_drain_unexplained",
                    f"{self.node} is drained with gpuwatchd's tag ({state.reason}) but the "
                    "journal does not say why (state lost?): left drained; resume it by hand "
                    "once the fault is ruled out",
                )
            self._run(self._resume_args(), "slurm_resume_failed")
            done.append(f"resumed {self.node}, drained by gpuwatchd ({state.reason})")
            drained = False
        self._mark(want, state, done)
        return Outcome(drained=drained, withheld=withheld, drained_for=drained_for)

    def _mark(self, want: Want, state: NodeState, done: list[str]) -> None:
        text = want.mark_text
        ours = state.comment.startswith(OURS)
        if text is not None and text != state.comment and (ours or not state.comment):
            self._run(self._comment_args(text), "slurm_comment_failed")
            done.append(f"marked {self.node}: {text}")
        elif text is None and ours:
            self._run(self._comment_args(""), "slurm_comment_failed")
            done.append(f"cleared gpuwatchd's comment on {self.node}")

    def _drain_args(self, want: Want) -> list[str]:
        return ["update", f"NodeName={self.node}", "State=DRAIN", f"Reason={want.drain_reason}"]

    def _resume_args(self) -> list[str]:
        return ["update", f"NodeName={self.node}", "State=RESUME"]

    def _comment_args(self, text: str) -> list[str]:
        return ["update", f"NodeName={self.node}", f"Comment={text}"]

    def _command(self, args: list[str]) -> str:
        """The command line as a shell would take it, for logs and messages."""
        return shlex.join([self.config.scontrol, *args])

    def _run(self, args: list[str], code: str) -> str:
        try:
            finished = run_bounded([self.config.scontrol, *args], self.config.timeout)
        except OSError as error:
            raise ActionFailed(code, f"cannot run {self.config.scontrol}: {error}") from error
        except TimedOut as error:
            raise ActionFailed(
                code, f"{self._command(args)} timed out after {self.config.timeout:g}s"
            ) from error
        if finished.returncode != 0:
            why = (finished.stderr or finished.stdout).strip() or (
                f"exit status {finished.returncode}"
            )
            raise ActionFailed(code, f"{self._command(args)} failed: {why}")
        return finished.stdout
