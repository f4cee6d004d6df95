"""Entry point of the controller process: `python -m fabriclab.apps.runner --app NAME ...`.

os-ken 4 ships no manager command, so the lab starts apps itself with AppManager.run_apps, after
pinning the listener to loopback and choosing the hub explicitly (native threads, so eventlet
never monkey-patches the standard library).
"""

import argparse
import os
import signal
import sys

os.environ.setdefault("OSKEN_HUB_TYPE", "native")

from fabriclab.apps import APPS  # noqa: E402
from fabriclab.apps.base_app import ENV_APP, ENV_FABRIC, ENV_OPTIONS, ENV_RUN_ID, ENV_STATUS  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(prog="fabriclab-controller")
    parser.add_argument("--app", required=True, choices=sorted(APPS))
    parser.add_argument("--fabric", required=True, help="fabric JSON written by the lab")
    parser.add_argument("--status", required=True, help="status JSON the app keeps up to date")
    parser.add_argument("--port", type=int, required=True, help="OpenFlow listen port on 127.0.0.1")
    parser.add_argument("--options", default="{}", help="the app's options as JSON (see fabriclab.apps)")
    parser.add_argument("--run-id", default="", help="the lab run this controller serves")
    parser.add_argument("--log", help="log file (default: stderr)")
    args = parser.parse_args(argv)

    os.environ[ENV_FABRIC] = args.fabric
    os.environ[ENV_STATUS] = args.status
    os.environ[ENV_OPTIONS] = args.options
    os.environ[ENV_RUN_ID] = args.run_id
    os.environ[ENV_APP] = args.app
    import importlib

    from os_ken import cfg, log
    from os_ken.base.app_manager import AppManager
    from os_ken.controller import controller  # noqa: F401  (registers the ofp listen options)

    # os-ken modules register command-line options when imported; all must be in before parsing.
    importlib.import_module(APPS[args.app].module)

    conf_args = ["--ofp-listen-host", "127.0.0.1", "--ofp-tcp-listen-port", str(args.port)]
    if os.environ.get("FABRICLAB_CONTROLLER_DEBUG"):
        conf_args.append("--verbose")
    if args.log:
        conf_args += ["--log-file", args.log]
    cfg.CONF(args=conf_args, project="os_ken", default_config_files=[])
    log.init_log()
    # SIGTERM from the lab ends the process at once: os-ken's native hub threads cannot be
    # interrupted, and there is no state to flush (status writes are atomic renames).
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    AppManager.run_apps([APPS[args.app].module])
    return 0


if __name__ == "__main__":
    sys.exit(main())
