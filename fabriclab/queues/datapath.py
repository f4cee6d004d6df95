"""The eBPF half of the queue model: compile `fabricq.bpf.c`, load it with libbpf, pin it for tc,
and read and write its maps (through ctypes; libbpf1 is a Debian package the playbook installs).

One object is loaded per running fabric; its programs are attached to every lab port by tc
(`bpf da pinned ...`), so all ports share one set of maps, across the hosts' network namespaces.
The compiling, pinning and map helpers here also serve the routing apps' selection stage
(fabriclab.apps.select_stage): each run pins under /sys/fs/bpf/fabriclab/<run id>/<part>/.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import hashlib
import os
import pathlib
import shutil
import stat
import subprocess

from fabriclab.errors import LabError

SOURCE = pathlib.Path(__file__).with_name("fabricq.bpf.c")
# Root loads the objects compiled here: a folder only root can write (not /var/tmp, where a local
# user could create it first and plant an object or a symlink).
CACHE_DIR = pathlib.Path("/var/cache/fabriclab/bpf")
BPFFS = pathlib.Path("/sys/fs/bpf")
PIN_ROOT = BPFFS / "fabriclab"
NCLASS = 3
PROGRAMS = ("fq_egress", "fq_ingress", "fq_wire")
PINNED_MAPS = ("stats", "bias", "ctl", "events")


class Port(ctypes.Structure):
    _fields_ = [("idx", ctypes.c_uint32), ("peer", ctypes.c_uint32), ("node", ctypes.c_uint32),
                ("peer_node", ctypes.c_uint32), ("is_switch", ctypes.c_uint32),
                ("peer_is_switch", ctypes.c_uint32), ("peer_remote", ctypes.c_uint32)]


class QCfg(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint32) for name in
                ("ecn_mode", "kmin", "kmax", "pmax", "limit", "pfc", "xoff", "xon", "headroom_limit", "pad")]


STAT_FIELDS = ("tx_pkts", "tx_bytes", "marks", "drops", "lossless_drops", "wd_drops", "occ", "occ_hwm",
               "held", "held_hwm", "pause_tx", "xon_tx", "pause_rx", "pause_ns", "xoff_ts",
               "rx_pkts", "rx_bytes", "ce_queued")


class QStat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64 if name in ("occ", "held", "ce_queued") else ctypes.c_uint64)
                for name in STAT_FIELDS] + [("paused", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


class Ctl(ctypes.Structure):
    _fields_ = [("wd_drop_until", ctypes.c_uint64)]


AR_MAX_MEMBERS = 16          # fabricq.bpf.c's AR_MAX_MEMBERS (config.AR_MAX_MEMBERS)


class ArKey(ctypes.Structure):
    _fields_ = [("node", ctypes.c_uint32), ("net", ctypes.c_uint32)]


class ArGroup(ctypes.Structure):
    _fields_ = [("n", ctypes.c_uint32), ("idx", ctypes.c_uint32 * AR_MAX_MEMBERS)]


class Event(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_uint32), ("port", ctypes.c_uint32), ("target", ctypes.c_uint32),
                ("cls", ctypes.c_uint32), ("ts", ctypes.c_uint64), ("held", ctypes.c_int64)]


EV_XOFF, EV_XON = 1, 2

_SAMPLE_CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_libbpf = None


def libbpf():
    """The libbpf shared library, with the few signatures the lab calls."""
    global _libbpf
    if _libbpf is not None:
        return _libbpf
    name = ctypes.util.find_library("bpf") or "libbpf.so.1"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        raise LabError("the queue model needs libbpf (Debian package libbpf1); "
                       "run `fabriclab provision`") from None
    vp, cp, i, u32, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_size_t
    for fn, res, args in (
            ("bpf_object__open_file", vp, [cp, vp]),
            ("bpf_object__load", i, [vp]),
            ("bpf_object__close", None, [vp]),
            ("bpf_object__find_map_by_name", vp, [vp, cp]),
            ("bpf_object__find_program_by_name", vp, [vp, cp]),
            ("bpf_map__set_max_entries", i, [vp, u32]),
            ("bpf_map__set_inner_map_fd", i, [vp, i]),
            ("bpf_map_create", i, [i, cp, u32, u32, u32, vp]),
            ("bpf_map__fd", i, [vp]),
            ("bpf_program__pin", i, [vp, cp]),
            ("bpf_program__fd", i, [vp]),
            ("bpf_map__pin", i, [vp, cp]),
            ("bpf_map_delete_elem", i, [i, vp]),
            ("bpf_map_get_next_key", i, [i, vp, vp]),
            ("bpf_prog_test_run_opts", i, [i, vp]),
            ("bpf_obj_get", i, [cp]),
            ("bpf_map_lookup_elem", i, [i, vp, vp]),
            ("bpf_map_update_elem", i, [i, vp, vp, ctypes.c_uint64]),
            ("bpf_map_lookup_batch", i, [i, vp, vp, vp, vp, ctypes.POINTER(u32), vp]),
            ("ring_buffer__new", vp, [i, _SAMPLE_CB, vp, vp]),
            ("ring_buffer__poll", i, [vp, i]),
            ("ring_buffer__free", None, [vp])):
        func = getattr(lib, fn)
        func.restype, func.argtypes = res, args
    _libbpf = lib
    return lib


def missing_tools():
    """What is missing to build and load the data path ([] when everything is there)."""
    missing = [tool for tool in ("clang", "tc") if shutil.which(tool) is None]
    if not (ctypes.util.find_library("bpf") or _loadable("libbpf.so.1")):
        missing.append("libbpf")
    if not pathlib.Path("/usr/include/bpf/bpf_helpers.h").exists():
        missing.append("libbpf-dev headers")
    return missing


def _loadable(name):
    try:
        ctypes.CDLL(name)
        return True
    except OSError:
        return False


def check_private(path):
    """LabError unless `path` is no symlink, belongs to this user and nobody else can write it:
    what the lab compiles, writes and loads as root must be its own."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise LabError(f"cannot check {path}: {exc.strerror}") from None
    why = None
    if stat.S_ISLNK(st.st_mode):
        why = "it is a symlink"
    elif st.st_uid != os.geteuid():
        why = f"it belongs to uid {st.st_uid}, not {os.geteuid()}"
    elif st.st_mode & 0o022:
        why = f"others can write it (mode {stat.S_IMODE(st.st_mode):o})"
    if why:
        raise LabError(f"refusing {path}: {why}; the lab loads what it compiles there as root "
                       f"(remove it and run again)")


def cache_dir():
    """CACHE_DIR, made private if missing, and checked (with its parent) if not."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
    for path in (CACHE_DIR.parent, CACHE_DIR):
        check_private(path)
    return CACHE_DIR


def compile_object(source_path=SOURCE, what="the queue model"):
    """Compile an eBPF source once per version of its text; returns the object file's path."""
    source = source_path.read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:16]
    target = cache_dir() / f"{source_path.name.split('.')[0]}-{digest}.o"
    if os.path.lexists(target):
        check_private(target)
        return target
    missing = missing_tools()
    if missing:
        raise LabError(f"{what} needs {', '.join(missing)}; run `fabriclab provision`")
    multiarch = subprocess.run(["gcc", "-print-multiarch"], capture_output=True, text=True).stdout.strip()
    include = [f"-I/usr/include/{multiarch}"] if multiarch else []
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    proc = subprocess.run(["clang", "-O2", "-g", "-target", "bpf", "-mcpu=v3", *include, "-c",
                           str(source_path), "-o", str(tmp)], capture_output=True, text=True)
    if proc.returncode != 0:
        first = next((line for line in proc.stderr.splitlines() if "error" in line), proc.stderr.strip())
        raise LabError(f"compiling {source_path.name} failed: {first}")
    tmp.replace(target)
    return target


def ensure_bpffs():
    if not os.path.ismount(BPFFS):
        proc = subprocess.run(["mount", "-t", "bpf", "bpf", str(BPFFS)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise LabError(f"cannot mount the BPF filesystem on {BPFFS}: {proc.stderr.strip()}")


def pin_dir(fabric_name):
    return PIN_ROOT / fabric_name


def remove_pins(fabric_name=None, target=None):
    """Unpin one run's programs and maps (or every run's, or the folder `target`): the kernel frees
    them once tc lets go."""
    target = target or (pin_dir(fabric_name) if fabric_name else PIN_ROOT)
    if target.exists():
        for path in sorted(target.rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        target.rmdir()
    parent = target.parent
    if parent != PIN_ROOT and parent.parent == PIN_ROOT and parent.is_dir() and not any(parent.iterdir()):
        try:
            parent.rmdir()      # the run's folder, once its last part is gone
        except OSError:
            pass                # another part pinned something meanwhile


def pinned_runs():
    """Run ids that have programs pinned (a killed run leaves its pins behind)."""
    return sorted(p.name for p in PIN_ROOT.iterdir()) if PIN_ROOT.is_dir() else []


class Map:
    def __init__(self, fd, key_type, value_type):
        self.fd, self.key_type, self.value_type = fd, key_type, value_type

    def lookup(self, key):
        k, v = self.key_type(key) if not isinstance(key, ctypes.Structure) else key, self.value_type()
        if libbpf().bpf_map_lookup_elem(self.fd, ctypes.byref(k), ctypes.byref(v)) != 0:
            return None
        return v

    def lookup_all(self, count):
        """Entries 0..count-1 of an array map as a ctypes array, in one bpf(2) call where the
        kernel has batch lookups (5.6+), else key by key."""
        values = (self.value_type * count)()
        keys = (ctypes.c_uint32 * count)()
        n, out = ctypes.c_uint32(count), ctypes.c_uint32()
        if libbpf().bpf_map_lookup_batch(self.fd, None, ctypes.byref(out), keys, values,
                                         ctypes.byref(n), None) == 0 or n.value == count:
            return values
        for i in range(count):
            libbpf().bpf_map_lookup_elem(self.fd, ctypes.byref(ctypes.c_uint32(i)), ctypes.byref(values[i]))
        return values

    def update(self, key, value):
        k = self.key_type(key) if not isinstance(key, ctypes.Structure) else key
        if libbpf().bpf_map_update_elem(self.fd, ctypes.byref(k), ctypes.byref(value), 0) != 0:
            err = ctypes.get_errno()
            raise LabError(f"writing an eBPF map failed: {os.strerror(err)}")

    def delete(self, key):
        k = self.key_type(key) if not isinstance(key, ctypes.Structure) else key
        libbpf().bpf_map_delete_elem(self.fd, ctypes.byref(k))

    def keys(self):
        """Every key of a hash map (a snapshot; entries may come and go meanwhile)."""
        out, prev = [], None
        while True:
            k = self.key_type()
            if libbpf().bpf_map_get_next_key(self.fd, ctypes.byref(prev) if prev is not None else None,
                                             ctypes.byref(k)) != 0:
                return out
            out.append(k)
            prev = k

    @classmethod
    def pinned(cls, path, key_type, value_type):
        """Open a map another process pinned (None when it is not there)."""
        fd = libbpf().bpf_obj_get(str(path).encode())
        return cls(fd, key_type, value_type) if fd >= 0 else None

    def close(self):
        if self.fd is not None and self.fd >= 0:
            os.close(self.fd)
            self.fd = None


class DataPath:
    """The loaded object of one fabric: maps sized to its ports, programs pinned for tc."""

    def __init__(self, fabric_name, nports):
        self.fabric_name = fabric_name
        self.nports = nports
        self.obj = None
        self.pins = pin_dir(fabric_name) / "queues"

    def load(self):
        lib = libbpf()
        path = compile_object()
        ensure_bpffs()
        obj = lib.bpf_object__open_file(str(path).encode(), None)
        if not obj:
            raise LabError(f"libbpf cannot open {path}: {os.strerror(ctypes.get_errno())}")
        self.obj = obj
        rows = max(1, self.nports) * NCLASS
        for name, size in (("ports", max(1, self.nports)), ("qcfg", rows), ("stats", rows), ("ctl", rows),
                           ("bias", rows), ("cut", rows)):
            lib.bpf_map__set_max_entries(self._map_ptr(name), size)
        err = lib.bpf_object__load(obj)
        if err:
            raise LabError(f"the kernel refused the queue model's eBPF program: {os.strerror(-err)} "
                           f"(libbpf printed the verifier's reason above)")
        remove_pins(target=self.pins)
        self.pins.mkdir(parents=True)
        for prog in PROGRAMS:
            ptr = lib.bpf_object__find_program_by_name(obj, prog.encode())
            err = lib.bpf_program__pin(ptr, str(self.pins / prog).encode())
            if err:
                raise LabError(f"cannot pin {prog} under {self.pins}: {os.strerror(-err)}")
        # Maps pinned too: `stats` for the routing apps' adaptive routing, which reads the
        # occupancies; those the PFC agent's process opens (queues/agentproc.py).
        for name in PINNED_MAPS:
            if lib.bpf_map__pin(self._map_ptr(name), str(self.pins / name).encode()):
                raise LabError(f"cannot pin the queue model's {name} map under {self.pins}")
        self.ports = Map(self._fd("ports"), ctypes.c_uint32, Port)       # by port index
        self.qcfg = Map(self._fd("qcfg"), ctypes.c_uint32, QCfg)
        self.stats = Map(self._fd("stats"), ctypes.c_uint32, QStat)
        self.ctl = Map(self._fd("ctl"), ctypes.c_uint32, Ctl)
        self.bias = Map(self._fd("bias"), ctypes.c_uint32, ctypes.c_int64)    # see queues/leaks.py
        self.dscp_class = Map(self._fd("dscp_class"), ctypes.c_uint32, ctypes.c_uint32)
        self.wire = Map(self._fd("wire"), ctypes.c_uint32, ctypes.c_uint32)  # VXLAN id -> port
        self.ar_groups = Map(self._fd("ar_groups"), ArKey, ArGroup)        # ECN_AR's groups
        self.cut = Map(self._fd("cut"), ctypes.c_uint32, ctypes.c_uint32)    # row -> bytes (a buffer fault)
        return self

    def program_pin(self, prog):
        return self.pins / prog

    def _map_ptr(self, name):
        ptr = libbpf().bpf_object__find_map_by_name(self.obj, name.encode())
        if not ptr:
            raise LabError(f"the queue model's object has no map {name!r}")
        return ptr

    def _fd(self, name):
        return libbpf().bpf_map__fd(self._map_ptr(name))

    def events_fd(self):
        return self._fd("events")

    def close(self):
        remove_pins(target=self.pins)
        if self.obj:
            libbpf().bpf_object__close(self.obj)
            self.obj = None


def pinned_events(pins):
    """A descriptor of the event ring pinned under `pins` (None when it is not there)."""
    fd = libbpf().bpf_obj_get(str(pins / "events").encode())
    return fd if fd >= 0 else None


class RingBuffer:
    """Consume a BPF ring buffer; `handler(Event)` runs in the polling thread."""

    def __init__(self, map_fd, handler):
        def sample(_ctx, data, size):
            if size >= ctypes.sizeof(Event):
                handler(Event.from_buffer_copy(ctypes.string_at(data, ctypes.sizeof(Event))))
            return 0
        self._cb = _SAMPLE_CB(sample)         # keep a reference: libbpf calls it later
        self.rb = libbpf().ring_buffer__new(map_fd, self._cb, None, None)
        if not self.rb:
            raise LabError(f"cannot open the queue model's event ring: {os.strerror(ctypes.get_errno())}")

    def poll(self, timeout_ms):
        n = libbpf().ring_buffer__poll(self.rb, int(timeout_ms))
        if n < 0 and -n != errno.EINTR:
            raise LabError(f"polling the queue model's event ring failed: {os.strerror(-n)}")
        return max(n, 0)

    def close(self):
        if self.rb:
            libbpf().ring_buffer__free(self.rb)
            self.rb = None
