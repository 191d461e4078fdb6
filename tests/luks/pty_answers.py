#!/usr/bin/env python3
"""Run a program on a pseudo-terminal, answering each prompt (output
ending in ": ") with the next answer; print the transcript and exit with
the program's exit code (124 if it is still running after 30 s).
Usage: pty_answers.py ANSWERS -- ARGV... (ANSWERS: comma-separated).

An answer is written only once the prompt has been quiet for a moment:
a program may flush terminal input after printing its prompt."""
import os
import pty
import select
import signal
import sys
import time

sep = sys.argv.index("--")
answers = [a.encode() for a in sys.argv[1].split(",")] if sys.argv[1] else []
argv = sys.argv[sep + 1:]
pid, fd = pty.fork()
if pid == 0:
    os.execvp(argv[0], argv)
out = b""
asked = 0
deadline = time.monotonic() + 30
while True:
    if time.monotonic() > deadline:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        sys.stdout.write(out.decode(errors="replace"))
        sys.exit(124)
    ready, _, _ = select.select([fd], [], [], 0.3)
    if not ready:
        # Quiet: answer a pending prompt.
        if out.endswith(b": ") and out.count(b": ") > asked and asked < len(answers):
            os.write(fd, answers[asked] + b"\n")
            asked += 1
        continue
    try:
        data = os.read(fd, 1024)
    except OSError:
        break
    if not data:
        break
    out += data
_, status = os.waitpid(pid, 0)
sys.stdout.write(out.decode(errors="replace").replace("\r\n", "\n"))
sys.exit(os.waitstatus_to_exitcode(status))
