"""Entry point of the controller process: `python -m fabriclab.apps.runner --app NAME --run-dir DIR ...`
(the arguments are control.command_line's).

os-ken 4 ships no manager command, so the lab starts the app itself with AppManager.run_apps, after
pinning the listener (to loopback unless --listen names one other address) and choosing the hub
explicitly (native threads, so eventlet never monkey-patches the standard library). The app's configuration travels as one object: the
runner builds a control.AppConfig and puts it into AppManager's contexts, which os-ken hands to
each app's constructor (osken_app.CONFIG_CONTEXT); nothing is passed through the environment.
"""

import os
import signal
import sys

os.environ.setdefault("OSKEN_HUB_TYPE", "native")

from fabriclab.apps import APPS, control  # noqa: E402


def main(argv=None):
    args = control.argument_parser(APPS).parse_args(argv)
    config = control.AppConfig.from_args(args)

    from os_ken import cfg, log
    from os_ken.base.app_manager import AppManager
    from os_ken.controller import controller  # noqa: F401  (registers the ofp listen options)

    # os-ken modules register command-line options when imported; all must be in before parsing.
    from fabriclab.apps import osken_app

    conf_args = ["--ofp-listen-host", args.listen, "--ofp-tcp-listen-port", str(args.port)]
    if os.environ.get("FABRICLAB_CONTROLLER_DEBUG"):
        conf_args.append("--verbose")
    if args.log:
        conf_args += ["--log-file", args.log]
    cfg.CONF(args=conf_args, project="os_ken", default_config_files=[])
    log.init_log()
    # SIGTERM from the lab ends the process at once: os-ken's native hub threads cannot be
    # interrupted, and there is no state to flush (status writes are atomic renames).
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    AppManager.get_instance().contexts[osken_app.CONFIG_CONTEXT] = config
    AppManager.run_apps([osken_app.__name__])
    return 0


if __name__ == "__main__":
    sys.exit(main())
