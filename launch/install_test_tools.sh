#!/usr/bin/env bash
# The tools the tests drive beside Python: Debian's chromium and chromium-driver (the real-browser
# test of the TensorBoard view; no browser download from the internet) and tmux (the console read
# in a 100-column terminal). Skips what is already installed; needs root or sudo to install. Off
# Debian it says so in one line and leaves them to the user: the tests that need them skip.
set -euo pipefail
missing=()
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
    missing+=(chromium chromium-driver)
fi
if ! command -v tmux >/dev/null; then
    missing+=(tmux)
fi
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "install_test_tools: no apt-get here; install ${missing[*]} yourself, or the tests that need them skip" >&2
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    SUDO="sudo -n"
fi
echo "install_test_tools: installing Debian's ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
