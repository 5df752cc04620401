#!/usr/bin/env bash
# What the test suite needs from the system besides Python packages, installed when missing
# (run by `make test`; silent when everything is there):
#   chromium                 the console's browser tests (tests/webconsole/test_browser.py)
#   openjdk-17-jre-headless  a Java runtime for PySpark (tests/spark/)
#   strace                   the slow-disk test and drill (stalls fsyncs: broker/tools/faults.py)
#   iptables                 the drills' network partitions inside network namespaces (--net netns)
#   iproute2                 those namespaces, their veth pairs and bridge (ip)
#   fuse3                    the power-loss drills' file system (fusermount3, libfuse3 for mfusepy)
#   faketime                 the clock drills' skewed wall clocks (libfaketime)
# As root it installs them with apt-get (Debian); otherwise it names them in one line and fails.
set -euo pipefail

missing=()
need() {  # need COMMAND PACKAGE
  command -v "$1" >/dev/null 2>&1 || missing+=("$2")
}
need chromium chromium
need java openjdk-17-jre-headless
need strace strace
need iptables iptables
need ip iproute2
need fusermount3 fuse3
need faketime faketime

[ "${#missing[@]}" -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "make test: missing system package(s): ${missing[*]} (Debian, as root: apt-get install ${missing[*]})" >&2
  exit 1
fi
echo "make test: installing ${missing[*]} with apt-get ..." >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
