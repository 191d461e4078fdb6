#!/usr/bin/env python3
"""Run a program on a pseudo-terminal, answering each prompt (a line of
output ending in ": ") with the next answer; print the transcript and
exit with the program's exit code. Usage: pty_answers.py ANSWERS -- ARGV...
(ANSWERS: comma-separated)."""
import os
import pty
import sys

sep = sys.argv.index("--")
answers = [a.encode() for a in sys.argv[1].split(",")] if sys.argv[1] else []
argv = sys.argv[sep + 1:]
pid, fd = pty.fork()
if pid == 0:
    os.execvp(argv[0], argv)
out = b""
asked = 0
while True:
    try:
        data = os.read(fd, 1024)
    except OSError:
        break
    if not data:
        break
    out += data
    prompts = out.count(b": ")
    if out.endswith(b": ") and prompts > asked and asked < len(answers):
        os.write(fd, answers[asked] + b"\n")
        asked += 1
_, status = os.waitpid(pid, 0)
sys.stdout.write(out.decode(errors="replace").replace("\r\n", "\n"))
sys.exit(os.waitstatus_to_exitcode(status))
