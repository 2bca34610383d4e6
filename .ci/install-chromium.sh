#!/usr/bin/env bash
# Debian's chromium for the history page's browser test (tests/test_history.py, driven by playwright from the
# dev extras; playwright's own browser download cannot reach its host from here). Once per machine: nothing to
# do when /usr/bin/chromium is there. Quiet: one line when it installs, apt's output only on failure.
set -euo pipefail
[ -x /usr/bin/chromium ] && exit 0
log=$(mktemp)
echo "install-chromium: apt-get install chromium (the history page's browser test)"
if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; } \
    >"$log" 2>&1; then
  tail -20 "$log" >&2
  echo "install-chromium: apt-get failed (above)" >&2
  rm -f "$log"
  exit 1
fi
rm -f "$log"
