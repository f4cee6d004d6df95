"""The machines of an ansible inventory that a fabric spreads over: `Machine` is one of them, its
name, the address of its private network (where the tunnels and the controller's OpenFlow go,
never every interface), and how to reach it (this one, or over SSH as root with the inventory's
checked ssh options)."""

from __future__ import annotations

import ipaddress
import re
import shlex
import subprocess

from fabriclab.errors import LabError
from fabriclab.loading import excerpt

# The ssh options an inventory may give (ansible_ssh_common_args): how to authenticate and whom to
# trust, nothing that runs a command (ProxyCommand, LocalCommand) or forwards anything.
SSH_OPTIONS = {"userknownhostsfile", "stricthostkeychecking", "identitiesonly", "identityfile", "batchmode",
               "connecttimeout", "loglevel", "port", "serveraliveinterval", "serveralivecountmax"}
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}")


class Machine:
    """One machine of the cluster: `local` (this one) or reached over SSH as `user@host`."""

    def __init__(self, name, private_ip, local=False, host=None, user="root", ssh_options=(), python=None):
        self.name, self.private_ip, self.local = name, private_ip, local
        self.host, self.user, self.python = host, user, python
        self.ssh_options = list(ssh_options)
        self.control_path = None          # set by Cluster.connect: the lab's own SSH connection
        self.datapath = None              # and the OVS datapath its switches use there

    @classmethod
    def from_hostvars(cls, name, hv):
        """A Machine from an inventory's host variables, each checked (the inventory is input)."""
        where = f"inventory machine {excerpt(name)}"
        ip = hv.get("fabriclab_private_ip")
        try:
            private = ipaddress.IPv4Address(ip if isinstance(ip, str) else "")
        except ValueError:
            raise LabError(f"{where}: fabriclab_private_ip must be the IPv4 address of its private network, "
                           f"got {excerpt(ip)}") from None
        if private.is_loopback or private.is_unspecified or private.is_multicast:
            raise LabError(f"{where}: fabriclab_private_ip {private} is not an address other machines reach")
        venv, project = hv.get("venv_dir"), hv.get("project_dir")
        python = f"{venv}/bin/python" if isinstance(venv, str) else f"{project}/.venv/bin/python"
        if hv.get("ansible_connection") == "local":
            return cls(name, str(private), local=True, python=python)
        host = hv.get("ansible_host", name)
        user = hv.get("ansible_user", "root")
        if not isinstance(host, str) or not _HOST.fullmatch(host):
            raise LabError(f"{where}: ansible_host must be a host name or address, got {excerpt(host)}")
        if not isinstance(user, str) or not _USER.fullmatch(user):
            raise LabError(f"{where}: ansible_user must be a user name, got {excerpt(user)}")
        options = _ssh_options(hv.get("ansible_ssh_common_args", ""), where)
        key = hv.get("ansible_ssh_private_key_file")
        if key is not None:
            if not isinstance(key, str) or not key.startswith("/"):
                raise LabError(f"{where}: ansible_ssh_private_key_file must be an absolute path, got {excerpt(key)}")
            options += ["-i", key]
        return cls(name, str(private), host=host, user=user, ssh_options=options, python=python)

    def ssh_argv(self, tty=False):
        """ssh to this machine through the lab's connection (once `Cluster.connect` made it)."""
        mux = ["-o", f"ControlPath={self.control_path}", "-o", "ControlMaster=no"] if self.control_path else []
        return ["ssh", "-q", *self.ssh_options, *mux, "-tt" if tty else "-T", f"{self.user}@{self.host}"]

    def run(self, command, stdin_text=None, timeout=120.0):
        """A shell command in this machine's root namespace, as root: CompletedProcess (text)."""
        argv = ["bash", "-c", command] if self.local else [*self.ssh_argv(), command]
        return subprocess.run(argv, input=stdin_text, capture_output=True, text=True, timeout=timeout,
                              stdin=None if stdin_text is not None else subprocess.DEVNULL)

    def __repr__(self):
        return f"Machine({self.name})"


def machines_from_inventory(path):
    """The machines of an ansible inventory, this one (ansible_connection=local) first."""
    from fabriclab.system.inventory import machines

    found = [Machine.from_hostvars(name, hv) for name, hv in machines(path)]
    here = [m for m in found if m.local]
    if len(here) != 1:
        raise LabError(f"a fabric over several machines runs from one of them: the inventory must name exactly one "
                       f"machine with ansible_connection=local (it names {len(here)})")
    return here + [m for m in found if not m.local]


def _ssh_options(text, where):
    """`-o Name=Value` pairs of the allowed names, and `-i PATH`; anything else refused."""
    if not isinstance(text, str):
        raise LabError(f"{where}: ansible_ssh_common_args must be a string")
    try:
        words = shlex.split(text)
    except ValueError:
        raise LabError(f"{where}: ansible_ssh_common_args cannot be split: {excerpt(text)}") from None
    options = []
    while words:
        flag = words.pop(0)
        value = words.pop(0) if words else None
        if flag == "-i" and value and value.startswith("/"):
            options += ["-i", value]
            continue
        name = (value or "").partition("=")[0].lower()
        if flag != "-o" or name not in SSH_OPTIONS:
            raise LabError(f"{where}: ssh option {excerpt(' '.join(filter(None, (flag, value))))} is not one "
                           f"the lab passes on (allowed: -i PATH, -o with {', '.join(sorted(SSH_OPTIONS))})")
        options += ["-o", value]
    return options
