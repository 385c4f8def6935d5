"""A real terminal for the CLI under test: a pty whose line discipline echoes and turns Ctrl-C
into SIGINT for the foreground process group, exactly as a user's terminal does, and `screen`,
what a terminal of that width shows once the bytes written to it have been applied.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import signal
import struct
import subprocess
import termios
import threading
import time

_CSI = re.compile(r"\x1b\[([?0-9;]*)([A-Za-z])")


class PtyProcess:
    """The CLI (`argv`) as a terminal's foreground job of `cols` x `rows`. The answer to
    `poll`, `communicate` and `returncode` is as `subprocess.Popen`'s; the output is the
    terminal's (stdout and stderr together, echo included)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str, cols: int = 80,
                 rows: int = 40):
        env = {**env, "COLUMNS": str(cols), "LINES": str(rows)}  # what rich would read first
        pid, fd = pty.fork()
        if pid == 0:  # the child: the pty is its controlling terminal and stdio
            try:
                fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
                signal.signal(signal.SIGINT, signal.SIG_DFL)  # a foreground job's disposition
                os.chdir(cwd)
                os.execve(argv[0], argv, env)
            finally:
                os._exit(127)
        self.pid, self.fd, self.cols = pid, fd, cols
        self.returncode: int | None = None
        self._out = bytearray()
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # EIO: every process holding the pty's other end has ended
                return
            if not chunk:
                return
            with self._lock:
                self._out += chunk

    @property
    def output(self) -> str:
        with self._lock:
            return self._out.decode("utf-8", "replace")

    def press_ctrl_c(self) -> None:
        os.write(self.fd, b"\x03")

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(0.05)
        assert self.returncode is not None
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout if timeout is not None else 60.0)
        self._reader.join(timeout=10)
        os.close(self.fd)
        return self.output, ""

    def terminate(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)


def screen(output: str, cols: int) -> list[str]:
    """The lines a terminal `cols` wide holds after `output`, applying what rich and the tty
    write: text with the wrap at the last column (deferred until the next character, as
    terminals do), CR, LF, cursor up (CSI n A), erase line (CSI 2 K, CSI K); colours and
    cursor visibility change nothing here."""
    lines: list[list[str]] = [[]]
    row = col = 0
    pending_wrap = False
    i = 0
    while i < len(output):
        ch = output[i]
        if ch == "\x1b":
            m = _CSI.match(output, i)
            if m is not None:
                arg, cmd = m.groups()
                if cmd == "A":
                    row, pending_wrap = max(0, row - int(arg or 1)), False
                elif cmd == "K":
                    lines[row] = [] if arg == "2" else lines[row][:col]
                i = m.end()
                continue
        elif ch == "\r":
            col, pending_wrap = 0, False
        elif ch == "\n":
            row, pending_wrap = row + 1, False
        elif ch >= " ":
            if pending_wrap:
                row, col, pending_wrap = row + 1, 0, False
            while len(lines) <= row:
                lines.append([])
            line = lines[row]
            line.extend(" " * (col + 1 - len(line)))
            line[col] = ch
            pending_wrap = col == cols - 1
            col = min(col + 1, cols - 1)
        while len(lines) <= row:
            lines.append([])
        i += 1
    return ["".join(line).rstrip() for line in lines]
