#!/usr/bin/env bash
# The browser the tests drive: Debian's chromium and chromium-driver (no browser download from
# the internet). Skips what is already installed; needs root or sudo to install. Off Debian it
# says so in one line and leaves the browser to the user: the browser test skips without one.
set -euo pipefail
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "install_browser: no apt-get here; install Chromium and ChromeDriver yourself, or the browser test skips" >&2
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    SUDO="sudo -n"
fi
echo "install_browser: installing Debian's chromium and chromium-driver"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null
