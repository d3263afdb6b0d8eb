"""``python -m det.launch.wrap_rank COMMAND...``: run one worker, tagging its output.

torchrun starts each worker in a session of its own, out of reach of the agent's kill of the
task's process group; so this wrapper dies with torchrun and the worker dies with the wrapper
(``PR_SET_PDEATHSIG``), and no worker outlives its task. Each line the worker writes comes
out on the same stream prefixed with ``[rank=N] `` (``RANK`` from torchrun), so the task's
logs tell the ranks apart (the agent stores N in ``task_logs.rank``: :func:`split_rank`).
SIGTERM and SIGINT are passed on to the worker; the wrapper exits with the worker's code, or
dies of the same signal.
"""

import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
from typing import BinaryIO

_PR_SET_PDEATHSIG = 1

_TAG = re.compile(r"\[rank=(\d+)\] ")


def rank_tag(rank: str) -> str:
    """The tag that starts each line of worker ``rank`` (``RANK``, or ``?`` unset)."""
    return f"[rank={rank}] "


def split_rank(line: str) -> tuple[int | None, str]:
    """``(rank, line)`` with the :func:`rank_tag` taken off the start of ``line``, or
    ``(None, line)`` for a line without one (the agent stores the rank beside the line)."""
    m = _TAG.match(line)
    return (int(m.group(1)), line[m.end():]) if m else (None, line)


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _copy(src: BinaryIO, dst: BinaryIO, prefix: bytes) -> None:
    for line in iter(src.readline, b""):
        dst.write(prefix + line if line.endswith(b"\n") else prefix + line + b"\n")
        dst.flush()


def main(argv: list[str] | None = None) -> int:
    """Run ``argv`` (the worker's command) as described above; returns its exit code."""
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m det.launch.wrap_rank COMMAND [ARGS...]", file=sys.stderr)
        return 2
    _die_with_parent()
    if os.getppid() == 1:  # torchrun died before the line above took effect
        return 1
    prefix = rank_tag(os.environ.get("RANK", "?")).encode()
    try:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                preexec_fn=_die_with_parent)
    except OSError as e:
        print(f"det.launch: cannot start {args[0]!r}: {e}", file=sys.stderr)
        return 127
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: proc.send_signal(signum))
    pumps = [threading.Thread(target=_copy, args=(src, dst, prefix), daemon=True)
             for src, dst in ((proc.stdout, sys.stdout.buffer), (proc.stderr, sys.stderr.buffer))]
    for pump in pumps:
        pump.start()
    code = proc.wait()
    for pump in pumps:
        pump.join()
    if code < 0:  # die the same way, so torchrun reports the worker's signal
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main())
