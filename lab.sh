#!/usr/bin/env bash
# fabriclab's entry point: set the machine up, then run the demo or the tests.
#
#   sudo ./lab.sh demo [args...]     set up, then `fabriclab demo args...`
#   sudo ./lab.sh test [pytest...]   set up, then pytest on tests/ and, without arguments, the
#                                    full-kernel tier's selection too (fabriclab fullkernel test)
#   sudo ./lab.sh test --repeat N [pytest...]
#                                    set up, then run those tests N times (the flake finder: each
#                                    test's pass rate and the spread of the figures it asserts on)
#   sudo ./lab.sh bootstrap          only set up
#
# Setting up means: a Python that can make venvs (apt), the lab's venv (FABRICLAB_VENV, default
# ./.venv, built from /usr/bin/python3 with system site packages so Debian's mininet is visible),
# fabriclab installed in it, then `fabriclab provision` (playbooks/site.yml). Safe to re-run.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${FABRICLAB_VENV:-$REPO/.venv}"
SYSTEM_PYTHON=/usr/bin/python3
STAMP="$VENV/.fabriclab-installed-pyproject.toml"   # the playbook's python_env role uses it too

say() { printf '==> %s\n' "$*"; }
die() { printf 'lab.sh: %s\n' "$*" >&2; exit 1; }

usage() {
    cat <<EOF
usage: sudo ./lab.sh demo [args...]     set up, then run the default experiment
       sudo ./lab.sh test [pytest args]  set up, then run the tests
       sudo ./lab.sh test --repeat N [pytest args]
                                         set up, then run those tests N times: pass rates, spreads
       sudo ./lab.sh bootstrap           only set up (packages, Open vSwitch, venv)
EOF
}

cmd="${1:-}"
case "$cmd" in
    demo|test|bootstrap) shift ;;
    -h|--help|help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
esac

[ "$(id -u)" -eq 0 ] || die "must run as root (it installs packages and builds networks): sudo ./lab.sh $cmd"

export DEBIAN_FRONTEND=noninteractive

ensure_system_python() {
    # The venv needs venv + ensurepip; ansible's apt module needs python3-apt.
    if [ -x "$SYSTEM_PYTHON" ] && "$SYSTEM_PYTHON" -c 'import venv, ensurepip, apt' 2>/dev/null; then
        return
    fi
    command -v apt-get >/dev/null || die "$SYSTEM_PYTHON cannot create a venv and apt-get is missing: install python3-venv by hand"
    say "installing python3-venv, python3-pip, python3-apt (apt)"
    apt-get update -q </dev/null >/dev/null
    apt-get install -y -q --no-install-recommends python3 python3-venv python3-pip python3-apt \
        </dev/null >/dev/null
}

ensure_venv() {
    if [ -x "$VENV/bin/python" ]; then
        # Keep it only if it is what we would build: /usr/bin/python3's, with system site packages.
        if grep -qx 'include-system-site-packages = true' "$VENV/pyvenv.cfg" 2>/dev/null \
            && "$VENV/bin/python" -c 'import sys; sys.exit(sys.base_prefix != "/usr")' 2>/dev/null; then
            return
        fi
        say "recreating $VENV (not built from $SYSTEM_PYTHON with --system-site-packages)"
        rm -rf "$VENV"
    else
        say "creating the venv $VENV"
    fi
    "$SYSTEM_PYTHON" -m venv --system-site-packages "$VENV"
}

ensure_installed() {
    # Up to date when this pyproject.toml is the one installed and the venv imports this checkout.
    if cmp -s "$REPO/pyproject.toml" "$STAMP" && [ -x "$VENV/bin/fabriclab" ] \
        && "$VENV/bin/python" -c 'import os, sys, fabriclab
sys.exit(os.path.realpath(fabriclab.__file__) != os.path.realpath(sys.argv[1]))' \
            "$REPO/fabriclab/__init__.py" 2>/dev/null; then
        return
    fi
    say "installing fabriclab and its Python dependencies into $VENV (pip)"
    local log="$VENV/pip-install.log"
    if ! "$VENV/bin/python" -m pip install --disable-pip-version-check -q -e "$REPO[test]" \
        </dev/null >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        die "pip install failed (full log: $log)"
    fi
    cp "$REPO/pyproject.toml" "$STAMP"
}

ensure_system_python
ensure_venv
ensure_installed
say "provisioning (packages, Open vSwitch): fabriclab provision"
"$VENV/bin/fabriclab" provision --venv "$VENV" </dev/null

cd "$REPO"
case "$cmd" in
    bootstrap)
        say "ready: $VENV/bin/fabriclab doctor shows what this kernel offers"
        ;;
    demo)
        say "running: fabriclab demo $*"
        exec "$VENV/bin/fabriclab" demo "$@"
        ;;
    test)
        if [ "${1:-}" = "--repeat" ]; then
            [ $# -ge 2 ] || die "usage: ./lab.sh test --repeat N [pytest args]"
            n="$2"; shift 2
            say "running: pytest $* , $n times (python -m tests.repeat)"
            exec "$VENV/bin/python" -m tests.repeat "$n" "$@"
        fi
        # Run tests/ unless the arguments name test files or folders themselves.
        paths=(tests)
        for arg in "$@"; do
            if [ -e "${arg%%::*}" ]; then paths=(); break; fi
        done
        # pytest's own exit code, unchanged: 5 ("no tests collected") is a failure.
        if [ $# -gt 0 ]; then
            say "running: pytest ${paths[*]} -rs $*"
            exec "$VENV/bin/python" -m pytest "${paths[@]}" -rs "$@"
        fi
        # The whole suite also runs the full-kernel tier's selection (the `fullkernel` lab tests on
        # a kernel with OVS, RED, netem and rdma_rxe: a virtme-ng guest here, natively in the VM).
        # A guest (software-emulated: it keeps one core busy) boots beside the unit tests, which
        # use the other core and no network, and is done before the lab tests start: the lab tests
        # wait on shaped traffic and are never shared with it. A native tier runs after them.
        # --durations: every CI log names the slowest tests, the ones to trim when the run grows.
        # -rfE: the summary at the very end names each failure with its message, where a CI log's
        # tail still shows it after a long traceback (CI set: pytest then cuts no message short to
        # fit a terminal's width).
        rc=0; tier_rc=0; tier_pid=
        tier_status="$("$VENV/bin/fabriclab" fullkernel status 2>&1 || true)"
        if [[ "$tier_status" == "full-kernel tier: available (guest"* ]]; then
            tier_log="$(mktemp -t fabriclab-tier.XXXXXX)"
            say "running the full-kernel tier in a guest (fabriclab fullkernel test), beside pytest tests/unit"
            "$VENV/bin/fabriclab" fullkernel test >"$tier_log" 2>&1 </dev/null &
            tier_pid=$!
            # A background job of a script ignores SIGINT: Ctrl-C or an exit stops the guest's
            # runner with SIGTERM, which takes its guest down.
            trap '[ -n "$tier_pid" ] && kill -TERM "$tier_pid" 2>/dev/null; rm -f "$tier_log"' EXIT
            trap 'exit 130' INT
            trap 'exit 143' TERM
        fi
        say "running: pytest tests/unit -rfEs --durations=10"
        CI="${CI:-true}" "$VENV/bin/python" -m pytest tests/unit -rfEs --durations=10 || rc=$?
        if [ -n "$tier_pid" ]; then
            wait "$tier_pid" || tier_rc=$?
            tier_pid=
            say "the full-kernel tier's output (exit $tier_rc):"
            cat "$tier_log"
        fi
        say "running: pytest tests/lab -rfEs --durations=40"
        lab_rc=0
        CI="${CI:-true}" "$VENV/bin/python" -m pytest tests/lab -rfEs --durations=40 || lab_rc=$?
        [ "$rc" -eq 0 ] && rc=$lab_rc
        if [ -z "${tier_log:-}" ]; then
            say "running the full-kernel tier: fabriclab fullkernel test (-m fullkernel tests/lab)"
            "$VENV/bin/fabriclab" fullkernel test || tier_rc=$?
        fi
        [ "$rc" -ne 0 ] && exit "$rc"
        exit "$tier_rc"
        ;;
esac
