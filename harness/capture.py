"""`python -m harness.capture HOST:PORT --steps 3` (harness/debug/client.py)."""

from harness.debug.client import main

if __name__ == "__main__":
    main()
