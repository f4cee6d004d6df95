"""Entry point of the controller process: `python -m fabriclab.apps.runner --app NAME --run-dir DIR ...`
(the arguments are control.command_line's).

os-ken 4 ships no manager command, so the lab starts the app itself with AppManager.run_apps, after
pinning the listener (to loopback unless --listen names one other address) and choosing the hub
explicitly (native threads, so eventlet never monkey-patches the standard library). The app's configuration travels as one object: the
runner builds a control.AppConfig and puts it into AppManager's contexts, which os-ken hands to
each app's constructor (osken_app.CONFIG_CONTEXT); nothing is passed through the environment.
"""

import faulthandler
import os
import signal
import sys

os.environ.setdefault("OSKEN_HUB_TYPE", "native")

from fabriclab.apps import app_names, control  # noqa: E402

ECHO_INTERVAL_S = 1.0
ECHO_UNREPLIED = 30


def main(argv=None):
    args = control.argument_parser(app_names()).parse_args(argv)
    config = control.AppConfig.from_args(args)

    from os_ken import cfg, log
    from os_ken.base.app_manager import AppManager
    from os_ken.controller import controller  # noqa: F401  (registers the ofp listen options)

    # os-ken modules register command-line options when imported; all must be in before parsing.
    from fabriclab.apps import osken_app

    # Echo requests are what tells the app a switch has gone. Under the native hub a datapath whose
    # socket closed never goes DEAD by itself (hub.kill cannot stop its send thread, so serve()
    # never returns); the echo loop's next send fails, it closes the datapath and the app hears
    # of it within ECHO_INTERVAL_S. A switch that stays silent for ECHO_UNREPLIED of them is
    # dropped too: generous, as a loaded 2-core machine can stall OVS for seconds.
    conf_args = ["--ofp-listen-host", args.listen, "--ofp-tcp-listen-port", str(args.port)]
    if os.environ.get("FABRICLAB_CONTROLLER_DEBUG"):
        conf_args.append("--verbose")
    if args.log:
        conf_args += ["--log-file", args.log]
    cfg.CONF(args=conf_args, project="os_ken", default_config_files=[])
    cfg.CONF.set_override("echo_request_interval", ECHO_INTERVAL_S)
    cfg.CONF.set_override("maximum_unreplied_echo_requests", ECHO_UNREPLIED)
    log.init_log()
    # SIGTERM from the lab ends the process at once: os-ken's native hub threads cannot be
    # interrupted, and there is no state to flush (status writes are atomic renames).
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    # SIGUSR1 writes every thread's stack to the log (stderr): the lab asks for it when the app
    # stops answering, and puts where each thread waits into its error.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    AppManager.get_instance().contexts[osken_app.CONFIG_CONTEXT] = config
    AppManager.run_apps([_user_module(args.app) or osken_app.__name__])
    return 0


def _user_module(app):
    """The module name of an os-ken app of one's own (`osken:PATH.py[:Class]`, loaded here under
    a name of its own, which AppManager then imports), None for the lab's apps."""
    from fabriclab.apps import _import, app_info, is_osken_app

    if not is_osken_app(app):
        return None
    where = app_info(app).osken_app.rpartition(":")[0]
    return _import(where).__name__


if __name__ == "__main__":
    sys.exit(main())
