"""The harness's routes on torch's debug-server frontend, and its token's variable: shared by the
frontend (`frontend.py`) and the client (`client.py`, which imports no torch so that it answers at
once)."""

PAGE = "/harness"
STATE = "/harness/state"
CAPTURE = "/harness/capture"
TOKEN_VARIABLE = "HARNESS_DEBUG_TOKEN"
