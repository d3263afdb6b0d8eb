"""``python3 -m determined.launch.wrap_rank RANK [--] CMD ...``: run CMD with every line of its
output prefixed by ``[rank=RANK] ``, so that the logs of several workers can be told apart."""

import subprocess
import sys
import threading
from typing import IO


def _copy(src: IO[bytes], dst: IO[bytes], prefix: bytes) -> None:
    for line in iter(src.readline, b""):
        dst.write(prefix + line)
        dst.flush()


def main(argv: list[str]) -> int:
    """Run the command; returns its exit code (2 for a usage error)."""
    if len(argv) < 2 or not argv[0].isdigit():
        print("usage: python3 -m determined.launch.wrap_rank RANK [--] CMD ...", file=sys.stderr)
        return 2
    rank, cmd = argv[0], argv[1:]
    cmd = cmd[1:] if cmd[:1] == ["--"] else cmd
    prefix = f"[rank={rank}] ".encode()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    copies = [threading.Thread(target=_copy, args=(src, dst, prefix))
              for src, dst in ((proc.stdout, sys.stdout.buffer), (proc.stderr, sys.stderr.buffer))]
    for t in copies:
        t.start()
    code = proc.wait()
    for t in copies:
        t.join()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
