"""One-line errors for every command: an ArgumentParser whose usage errors are one line (no
usage dump), and `fail` for the errors found after parsing. Exit 2 for both."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

EXIT_USAGE = 2


def fail(prog: str, message: str, *, label: str = "error", code: int = EXIT_USAGE) -> NoReturn:
    """Print `<prog>: <label>: <message>` on stderr and exit with `code` (never a traceback)."""
    print(f"{prog}: {label}: {message}", file=sys.stderr)
    raise SystemExit(code)


class OneLineArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")
