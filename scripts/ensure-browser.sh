#!/usr/bin/env bash
# The browser the dashboard tests drive: Debian's chromium at /usr/bin/chromium (Playwright is
# pointed at it and never downloads a browser of its own).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "installing chromium (Debian package) for the dashboard's browser tests"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null \
        || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; }
    exit 0
fi
echo "the dashboard's browser tests need chromium: on Debian/Ubuntu 'sudo apt-get install chromium'," >&2
echo "elsewhere install Chromium and set ACE3_TEST_CHROMIUM=/path/to/chromium" >&2
exit 1
