"""An ArgumentParser whose usage errors are one line and a chosen exit code (no usage dump)."""

from __future__ import annotations

import argparse
from typing import NoReturn

EXIT_USAGE = 2


class OneLineArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")
