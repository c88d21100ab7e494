#!/usr/bin/env bash
# Set-up on a fresh machine: a virtual environment with the package and its dependencies.
# Reuses a torch that the base Python already has (GPU clusters bring their own build);
# otherwise installs TORCH_SPEC (default torch==2.13.0, a CPU build on this kind of machine).
# Idempotent: re-running only installs what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
EXTRAS=${EXTRAS:-test}

# pyproject's requires-python, said in one line before a venv is made from the wrong Python.
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "setup: the harness needs Python 3.11 or newer; $PYTHON is $("$PYTHON" -V 2>&1); run with PYTHON=python3.11 (or newer)" >&2
    exit 2
fi

if [ ! -x "$VENV/bin/python" ]; then
    if "$PYTHON" -c "import torch" 2>/dev/null; then
        echo "setup: reusing the torch of $PYTHON ($("$PYTHON" -c 'import torch; print(torch.__version__)'))"
        "$PYTHON" -m venv --system-site-packages "$VENV"
    else
        "$PYTHON" -m venv "$VENV"
    fi
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    echo "setup: installing $TORCH_SPEC"
    "${PIP[@]}" install "$TORCH_SPEC"
fi
# The stamp covers what the install builds from: the metadata and the native C sources.
stamp="$VENV/.installed-$(cat pyproject.toml setup.py harness/traces/native/_scan.c harness/traces/native/_rewrite.c harness/traces/native/_nest.c harness/traces/native/_json.h | sha1sum | cut -c1-12)-$EXTRAS"
if [ ! -f "$stamp" ]; then
    echo "setup: installing the harness and its dependencies into $VENV"
    "${PIP[@]}" install -e ".[$EXTRAS]"
    rm -f "$VENV"/.installed-*
    touch "$stamp"
fi
# An editable install ships no bytecode (pip compiles a regular install's modules as it installs
# them): compile ours here, or every command pays ~0.06 s compiling them at start-up on its first
# run, and on every run where PYTHONDONTWRITEBYTECODE is set. Only stale files are recompiled.
"$VENV/bin/python" -m compileall -q harness bench
"$VENV/bin/python" -c "import torch, harness; print(f'setup: ok (torch {torch.__version__}, cuda {torch.cuda.is_available()})')"
